// Attention's split rule and the merge of split partials: shared by attention.cu (the attention
// and merge kernels) and matvec.cu (the o matvec that merges a decode row's cluster partials in
// its prologue, matvec_<type>_amerge_*). Both merges call the same functions, so a row merged
// either way has the same bits.
#pragma once
#include "common.cuh"
#include "quants.cuh"

#define ATTN_MAX_SPLITS 32     // split + merge-kernel path (attn_*)
#define ATTN_CLUSTER 8         // blocks per cluster (the portable maximum)
#define ATTN_MAX_SPLITS_CL 64  // cluster path (attn_cl_*): at most 8 clusters, so attn_cl_merge merges <= 8

// A row's split rule: its n keys go to at most ATTN_MAX_SPLITS splits of chunk * 2^k keys, the
// smallest that fits. The cluster path allows ATTN_MAX_SPLITS_CL, and rows past ATTN_CLUSTER
// chunks get splits of at least 2 chunks: up to 16 chunks that keeps a row in one cluster (no
// merge launch up to 1024 keys at hd64, 512 at hd256: gemma3's sliding window), and longer rows
// get half as many clusters to merge. Depends on the row's position only (bit-identical rows
// across grids).
__device__ __forceinline__ int attn_splits_of_row(int p, int window, int chunk, bool cluster, int& start,
                                                  int& split_len) {
    start = window > 0 ? max(0, p + 1 - window) : 0;
    const int n_keys = p + 1 - start;
    const int max_splits = cluster ? ATTN_MAX_SPLITS_CL : ATTN_MAX_SPLITS;
    split_len = cluster && n_keys > ATTN_CLUSTER * chunk ? 2 * chunk : chunk;
    while ((n_keys + split_len - 1) / split_len > max_splits) split_len *= 2;
    return (n_keys + split_len - 1) / split_len;
}

__host__ __device__ constexpr int attn_chunk(int hd) { return hd == 64 ? 64 : 32; }  // keys per block step

// Partials of a row on the cluster path: one per cluster of its splits.
__device__ __forceinline__ int attn_cl_parts(int p, int window, int hd) {
    int start, split_len;
    const int n_act = attn_splits_of_row(p, window, attn_chunk(hd), true, start, split_len);
    return (n_act + ATTN_CLUSTER - 1) / ATTN_CLUSTER;
}

// One head's merge weights, one warp: lane k < n_parts holds partial k's (m, l). Returns lane k's
// weight c_k = exp(m_k - M) (0 past n_parts); L = sum c_k l_k in every lane.
__device__ __forceinline__ float attn_merge_weight(float m, float l, int n_parts, float& L) {
    const int lane = threadIdx.x & 31;
    m = lane < n_parts ? m : -INFINITY;
    l = lane < n_parts ? l : 0.0f;
    const float M = warp_max(m);
    const float c = lane < n_parts ? expf(m - M) : 0.0f;
    L = warp_sum(c * l);
    return c;
}

// acc + c * v, one rounding (both merges accumulate partials in slot order with this).
__device__ __forceinline__ float attn_merge_add(float acc, float c, float v) { return __fmaf_rn(c, v, acc); }
