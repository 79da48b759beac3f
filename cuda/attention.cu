// Attention over the KV cache: the f16 KV write, and one split-K flash kernel used for decode,
// verify and prefill alike (same kernel, same arithmetic for a row whatever the batch).
//
// Cache layout per layer: K and V each [n_kv][n_ctx][HD], f16 values, or for q8_0 int8 values
// plus a separate half scale per 32 values ([n_kv][n_ctx][HD/32], ggml's Q8_0 block split into
// planes). Query token t sits at position pos[t] (device memory) and sees keys
// max(0, pos[t] + 1 - window) .. pos[t] (window 0: all).
//
// Work split. A row's n keys are cut into at most ATTN_MAX_SPLITS splits of split_len keys,
// split_len = CHUNK * 2^k, the smallest that fits; one block per (kv head, head group, split,
// row) walks its split CHUNK keys at a time (online softmax). The split length depends only on
// the row's own key count, so a row's result is the same bit for bit whatever grid.y the launch
// has (graph buckets) and whether it is decoded alone or verified in a batch. Short contexts get
// several blocks (a 128-key decode row: 2-4), not one SM doing every key.
//
// Head dims 64 and 128 with an f16 cache run attn_rows_mma64 / attn_rows_mma128 (QK and PV on
// tensor cores); head dim 256 and q8_0 caches run attn_rows. Same split rule, same output either way.
//
// Merge: a row with one split writes its output directly. Otherwise each split writes an
// unnormalized partial (o, m, l) and attn_merge, launched right after (PDL overlaps its launch),
// merges the splits in split order.
//
// Cluster variant (attn_cl_*, sm_90+): grid.y is a multiple of the cluster size CS and every CS
// consecutive splits form a thread-block cluster that merges its splits through distributed shared
// memory, so a row of up to CS splits needs no second launch (that launch cost 2.6 / 5.5 us at
// hd64 / hd256, more than the attention itself). CS is 16 for attn_rows_mma64 (a non-portable
// size: the runtime opts in) and 8 otherwise (attn_plan below). Rows too long for one cluster
// (up to 64 splits) write one partial per cluster, and attn_cl_merge merges those.
#include <cooperative_groups.h>
#include "common.cuh"
#include "tensor_core.cuh"
#include "quants.cuh"

#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_MAX_SPLITS 32     // split + merge-kernel path (attn_*)
#define ATTN_MAX_SPLITS_CL 64  // cluster path (attn_cl_*): so attn_cl_merge merges at most 8 partials

// Which kernel a (head dim, cache type) runs, in blocks of how many threads, in clusters of how many
// blocks, and how many chunks a split of a one-cluster row may walk (ops.attn_plan mirrors this).
// attn_rows_mma64 takes 128 keys per loop trip (8 warps of 16): clusters of 16 keep rows of up to
// 128 chunks (8192 keys) in one cluster at <= 4 trips a split, which costs less than a second
// launch. attn_rows takes one chunk per step: clusters of 8, splits of <= 2 chunks, as measured.
__host__ __device__ constexpr bool attn_mma(int hd, bool q8) { return hd == 64 && !q8; }
__host__ __device__ constexpr int attn_threads(int hd, bool q8) { return attn_mma(hd, q8) ? 256 : ATTN_THREADS; }
__host__ __device__ constexpr int attn_cluster(int hd, bool q8) { return attn_mma(hd, q8) ? 16 : 8; }
__host__ __device__ constexpr int attn_cl_chunks(int hd, bool q8) { return attn_mma(hd, q8) ? 8 : 2; }
// attn_rows_mma64 at <= 128 registers (8 bytes spill): two blocks an SM, so under PDL its blocks
// (and their L2 prefetch) find room while the previous kernel still runs, and a 16-block cluster
// needs 8 SMs.
// attn_rows_mma128 at <= 168 registers: three blocks an SM, as attn_rows had (ATTN_CL_BLOCKS).
__host__ __device__ constexpr int attn_min_blocks(int hd, bool q8) { return attn_mma(hd, q8) ? 2 : hd == 128 && !q8 ? 3 : 1; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ATTN_DIMS_true(HD, Q8)  // never launched before sm_90 (ops.attention_launch); compiled so every fatbin has it
#else
#define ATTN_DIMS_true(HD, Q8) __cluster_dims__(1, attn_cluster(HD, Q8), 1)
#endif
#define ATTN_DIMS_false(HD, Q8)

// k, v [T][*] with rows k_ld / v_ld floats apart, heads of HD inside a row.
// grid (T, n_kv); block 128.
extern "C" __global__ void kv_write_f16(const float* k, const float* v, half* kc, half* vc, const int* pos,
                                        int k_ld, int v_ld, int head_dim, int n_ctx) {
    pdl_entry();
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t dst = ((size_t)h * n_ctx + pos[t]) * head_dim;
    const float* ks = k + (size_t)t * k_ld + (size_t)h * head_dim;
    const float* vs = v + (size_t)t * v_ld + (size_t)h * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        kc[dst + i] = __float2half(ks[i]);
        vc[dst + i] = __float2half(vs[i]);
    }
}

template <int HD>
struct AttnShape {
    static constexpr int CHUNK = HD == 64 ? 64 : 32;         // keys per block step (ops.attn_chunk)
    static constexpr int SEGS = HD / 8;                      // 8-value segments per K/V row
    static constexpr int ROWS_PER_PASS = ATTN_THREADS / SEGS;
    static constexpr int E = CHUNK / ROWS_PER_PASS;          // K (and V) rows per thread per step
    static constexpr int RW = SEGS < 32 ? SEGS : 32;         // lanes of a warp that share a row
    static_assert(E >= 1 && CHUNK % ROWS_PER_PASS == 0, "chunk must cover whole passes");
    static_assert(ATTN_MAX_SPLITS <= 32, "attn_merge gives each split one lane");
};

// 8 consecutive values of one cache row: one 16-byte load (f16) or 8 bytes + the block scale (q8_0).
template <bool Q8> struct Kv8;
template <> struct Kv8<false> {
    int4 raw;
    __device__ __forceinline__ void load(const void* base, const half*, size_t row, int seg, int hd) {
        raw = reinterpret_cast<const int4*>(reinterpret_cast<const half*>(base) + row * hd)[seg];
    }
    __device__ __forceinline__ void get(float f[8]) const {
        const half2* h = reinterpret_cast<const half2*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) { const float2 v = __half22float2(h[i]); f[2 * i] = v.x; f[2 * i + 1] = v.y; }
    }
};
template <> struct Kv8<true> {
    int2 raw;
    half d;
    __device__ __forceinline__ void load(const void* base, const half* scales, size_t row, int seg, int hd) {
        raw = reinterpret_cast<const int2*>(reinterpret_cast<const int8_t*>(base) + row * hd)[seg];
        d = scales[row * (hd / 32) + seg / 4];
    }
    __device__ __forceinline__ void get(float f[8]) const {
        const float s = __half2float(d);
        const int8_t* q = reinterpret_cast<const int8_t*>(&raw);
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = (float)q[i] * s;
    }
};

// The query heads of block x (grid.x = n_kv * ceil(group / G)): kv head kvh's GQA group is cut
// in tiles of G heads, and this block takes heads h0 .. h0 + g - 1 of it.
struct AttnHeads {
    int kvh, h0, g;
};
template <int G>
__device__ __forceinline__ AttnHeads attn_heads(int n_head, int n_kv) {
    const int group = n_head / n_kv, n_hgroups = (group + G - 1) / G;
    const int kvh = blockIdx.x / n_hgroups, hg = blockIdx.x % n_hgroups;
    return {kvh, kvh * group + hg * G, min(G, group - hg * G)};
}

// A row's split rule. Split path: its n keys go to at most ATTN_MAX_SPLITS splits of chunk * 2^k
// keys, the smallest that fits. Cluster path (cs blocks a cluster): the row's chunks spread evenly
// over one cluster while a split walks at most cl_chunks of them (hd256: gemma3's 512-key sliding
// window in one cluster; hd64: up to 8192 keys); longer rows get splits of cl_chunks (or more, so
// that at most max_cl, clamped to cs .. ATTN_MAX_SPLITS_CL) over several clusters. max_cl is the
// model's (ops.attn_max_splits: from its kv heads and group, never the grid), so a row's split depends
// on its position only (bit-identical rows across grids, decode and verify alike).
__device__ __forceinline__ int attn_splits_of_row(int p, int window, int chunk, bool cluster, int cs, int cl_chunks,
                                                  int max_cl, int& start, int& split_len) {
    start = window > 0 ? max(0, p + 1 - window) : 0;
    const int n_keys = p + 1 - start;
    if (!cluster) {
        split_len = chunk;
        while ((n_keys + split_len - 1) / split_len > ATTN_MAX_SPLITS) split_len *= 2;
        return (n_keys + split_len - 1) / split_len;
    }
    max_cl = min(max(max_cl, cs), ATTN_MAX_SPLITS_CL);
    const int chunks = (n_keys + chunk - 1) / chunk;
    int per = (chunks + cs - 1) / cs;
    if (per > cl_chunks) per = max(cl_chunks, (chunks + max_cl - 1) / max_cl);
    split_len = per * chunk;
    return (chunks + per - 1) / per;
}

// out = o / l for heads h0 .. h0 + g of row t, and its q8_1 copy for the o matvec: g * HD is a
// multiple of 32, so each warp's iteration is one whole q8_1 block of one head.
template <int HD, int G>
__device__ __forceinline__ void attn_write_out(const float (*o)[HD], const float* l, int g, int h0, int t, int n_head,
                                               float* out, int8_t* xq, int xq_stride) {
    for (int i = threadIdx.x; i < g * HD; i += blockDim.x) {
        const int hh = i / HD, d = i % HD;
        const float val = o[hh][d] / l[hh];
        const int col = (h0 + hh) * HD + d;
        out[(size_t)t * n_head * HD + col] = val;
        if (xq) {
            int8_t* xrow = xq + (size_t)t * xq_stride;
            quantize_q8_1_at(val, xrow, n_head * HD, col);
        }
    }
}

// Cluster path epilogue, called by every block of a cluster whose row has several splits: the
// cluster's splits (o, m, l in each block's shared memory) merged in split order through
// distributed shared memory. A row of one cluster writes its output (and q8_1 copy) here; a longer
// row writes the cluster's partial to slot blockIdx.y / CS for attn_cl_merge. The output's 32-value
// blocks are spread over the cluster's CS blocks and their warps.
template <int HD, int G, int CS>
__device__ void attn_cluster_merge(const float (*o_blk)[HD], const float* m_blk, const float* l_blk, int n_act,
                                   int g, int h0, int t, int n_head, int n_slots, float* __restrict__ opart,
                                   float* __restrict__ ml, float* __restrict__ out, int8_t* __restrict__ xq,
                                   int xq_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    static_assert(CS <= 32, "one lane per split");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int c = blockIdx.y / CS, rank = blockIdx.y % CS;
    const int n_in = min(CS, n_act - c * CS);  // splits of this cluster with keys
    cluster.sync();  // every split's o, m, l written
    // A warp's 32 values belong to one head: its splits' o values and (lane k) split k's m, l are
    // loaded in one round, and split k's weight comes from lane k by shuffle.
    const float* o0 = &o_blk[0][0];
    for (int b = rank + CS * warp; b < g * HD / 32; b += CS * n_warps) {
        const int idx = 32 * b + lane, hh = idx / HD;
        float v[CS];
#pragma unroll
        for (int k = 0; k < CS; ++k) v[k] = k < n_in ? cluster.map_shared_rank(o0, k)[idx] : 0.0f;
        float m = -INFINITY, l = 0.0f;
        if (lane < n_in) {
            m = cluster.map_shared_rank(m_blk, lane)[hh];
            l = cluster.map_shared_rank(l_blk, lane)[hh];
        }
        const float M = warp_max(m);
        const float cw = lane < n_in ? expf(m - M) : 0.0f;
        const float L = warp_sum(cw * l);
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < CS; ++k) acc += __shfl_sync(0xffffffffu, cw, k) * v[k];
        if (n_act <= CS) {  // the row's output; b is warp-uniform: one q8_1 block per warp
            const float val = acc / L;
            const int col = h0 * HD + idx;
            out[(size_t)t * n_head * HD + col] = val;
            if (xq) {
                int8_t* xrow = xq + (size_t)t * xq_stride;
                quantize_q8_1_at(val, xrow, n_head * HD, col);
            }
        } else {
            const size_t r = ((size_t)t * n_slots + c) * n_head + h0;
            opart[r * HD + idx] = acc;
            if (idx % HD == 0) {  // the head's first 32 values: its m, l
                ml[(r + hh) * 2] = M;
                ml[(r + hh) * 2 + 1] = L;
            }
        }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_80-89: ops.attention_launch never picks the cluster kernels
#endif
}

// A block's result for its heads (o unnormalized in o_s, m_s, l_s; thread i wrote o_s values
// i, i + blockDim.x, ... and thread h < g m_s[h], l_s[h]): a row of one split writes its output,
// otherwise its split's partial goes to the cluster merge (clusters of CS) or to attn_merge.
template <int HD, int G, bool CL, int CS>
__device__ __forceinline__ void attn_block_out(const float (*o_s)[HD], const float* m_s, const float* l_s, int n_act,
                                               int g, int h0, int t, int n_head, float* __restrict__ opart,
                                               float* __restrict__ ml, float* __restrict__ out,
                                               int8_t* __restrict__ xq, int xq_stride) {
    const int tid = threadIdx.x;
    if (n_act == 1) {
        __syncthreads();
        attn_write_out<HD, G>(o_s, l_s, g, h0, t, n_head, out, xq, xq_stride);
        return;
    }
    if constexpr (CL) {
        attn_cluster_merge<HD, G, CS>(o_s, m_s, l_s, n_act, g, h0, t, n_head, gridDim.y / CS, opart, ml, out, xq,
                                      xq_stride);
    } else {  // a partial for attn_merge
        const size_t prow0 = ((size_t)t * gridDim.y + blockIdx.y) * n_head + h0;
        for (int i = tid; i < g * HD; i += blockDim.x) opart[prow0 * HD + i] = o_s[i / HD][i % HD];
        if (tid < g) { ml[(prow0 + tid) * 2] = m_s[tid]; ml[(prow0 + tid) * 2 + 1] = l_s[tid]; }
    }
}

// grid (n_kv * n_hgroups, n_splits >= any row's splits, T), block attn_threads(HD, Q8); CL: n_splits a
// multiple of CS = attn_cluster(HD, Q8), clusters of CS blocks along y.
// q [T][q_ld] (heads of HD inside). Partials: opart [T][slots][n_head][HD], ml [T][slots][n_head][2],
// slots = n_splits (split path) or n_splits / CS (cluster path: one per cluster).
// Thread layout per step: thread i holds segment i % SEGS (8 dims) of rows i / SEGS + pass * ROWS_PER_PASS
// of the chunk, for K and for V; all its loads of a step are issued before the first use.
template <int HD, int G, bool Q8, bool CL>
__device__ void attn_rows(const float* __restrict__ q, int q_ld, const void* __restrict__ kc,
                          const void* __restrict__ vc, const half* __restrict__ kd, const half* __restrict__ vd,
                          float* __restrict__ opart, float* __restrict__ ml, const int* __restrict__ pos,
                          int n_head, int n_kv, int n_ctx, int window, float scale,
                          float softcap, float* __restrict__ out, int8_t* __restrict__ xq, int xq_stride,
                          int max_cl) {
    using S = AttnShape<HD>;
    __shared__ __align__(16) float q_s[G][HD];
    __shared__ float p_s[G][S::CHUNK];
    __shared__ float m_s[G], l_s[G], corr_s[G];
    __shared__ __align__(16) float o_s[ATTN_WARPS][G][HD];

    const auto [kvh, h0, g] = attn_heads<G>(n_head, n_kv);
    const int s = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seg = tid % S::SEGS, r0 = tid / S::SEGS;

    // Before the PDL wait: the position (written before the step's graph launch, never inside it)
    // and an L2 prefetch of this split's K/V rows (its first two chunks). Those rows are final except the
    // newest, which the previous kernel may still be writing: L2 is where that write lands, so
    // the prefetch cannot leave a stale copy. The K/V loads after the wait then hit L2.
    const int p = pos[t];
    int start, split_len;
    constexpr int CS = attn_cluster(HD, Q8);
    const int n_act = attn_splits_of_row(p, window, S::CHUNK, CL, CS, attn_cl_chunks(HD, Q8), max_cl, start, split_len);
    // split path: blocks past the row's splits have nothing to do. Cluster path: whole clusters
    // past them leave; the rest of the last cluster stays for the cluster barriers (and merges).
    if (CL ? (s / CS) * CS >= n_act || (n_act == 1 && s > 0) : s >= n_act) return;
    const bool active = s < n_act;
    const int j0 = start + s * split_len, j1 = min(p + 1, j0 + split_len);
    if (active) {
        constexpr int ROW_BYTES = HD * (Q8 ? 1 : 2), LINES = ROW_BYTES >= 128 ? ROW_BYTES / 128 : 1;
        const size_t kv_row0 = (size_t)kvh * n_ctx + j0;
        for (int i = tid; i < 2 * S::CHUNK * LINES; i += ATTN_THREADS) {  // up to 2 chunks
            const int r = i / LINES;
            if (j0 + r >= j1) break;
            const size_t off = (kv_row0 + r) * ROW_BYTES + (i % LINES) * 128;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(kc) + off));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(vc) + off));
        }
    }
    const size_t row0 = (size_t)kvh * n_ctx;
    // K/V rows of a step; rows past the end read the last valid row (weight 0 below). The next
    // step's rows are loaded before this step's math (long splits: one memory wait per split).
    // The first step's load before the PDL wait when all its rows are older than the forward's
    // first position (as in attn_rows_mma64).
    Kv8<Q8> kr[S::E], vr[S::E], kn[S::E], vn[S::E];
    auto load_first = [&]() {
#pragma unroll
        for (int e = 0; e < S::E; ++e) {
            const size_t row = row0 + min(j0 + r0 + e * S::ROWS_PER_PASS, j1 - 1);
            kn[e].load(kc, kd, row, seg, HD);
            vn[e].load(vc, vd, row, seg, HD);
        }
    };
    const bool early = active && min(j0 + S::CHUNK, j1) <= pos[0];
    if (early) load_first();
    pdl_entry();
    for (int i = tid; i < G * HD; i += ATTN_THREADS) {
        const int hh = i / HD, d = i % HD;
        q_s[hh][d] = hh < g ? q[(size_t)t * q_ld + (size_t)(h0 + hh) * HD + d] * scale : 0.0f;
    }

    if (tid < G) { m_s[tid] = -INFINITY; l_s[tid] = 0.0f; }

    float o[G][8];
#pragma unroll
    for (int hh = 0; hh < G; ++hh)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[hh][e] = 0.0f;

    if (active && !early) load_first();
    for (int c0 = j0; active && c0 < j1; c0 += S::CHUNK) {
#pragma unroll
        for (int e = 0; e < S::E; ++e) {
            kr[e] = kn[e];
            vr[e] = vn[e];
        }
        if (c0 + S::CHUNK < j1) {
#pragma unroll
            for (int e = 0; e < S::E; ++e) {
                const size_t row = row0 + min(c0 + S::CHUNK + r0 + e * S::ROWS_PER_PASS, j1 - 1);
                kn[e].load(kc, kd, row, seg, HD);
                vn[e].load(vc, vd, row, seg, HD);
            }
        }
        __syncthreads();  // q_s ready (first step); p_s free (later steps)
        // partial dots first, then the lane reductions level by level over all of them: E * G
        // independent shuffle chains in flight instead of one chain at a time
        float sc[S::E][G];
#pragma unroll
        for (int e = 0; e < S::E; ++e) {
            float kf[8];
            kr[e].get(kf);
#pragma unroll
            for (int hh = 0; hh < G; ++hh) {
                const float4 qa = *reinterpret_cast<const float4*>(&q_s[hh][8 * seg]);
                const float4 qb = *reinterpret_cast<const float4*>(&q_s[hh][8 * seg + 4]);
                sc[e][hh] = (qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3]) +
                            (qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7]);
            }
        }
#pragma unroll
        for (int off = S::RW / 2; off > 0; off >>= 1)
#pragma unroll
            for (int e = 0; e < S::E; ++e)
#pragma unroll
                for (int hh = 0; hh < G; ++hh) sc[e][hh] += __shfl_xor_sync(0xffffffffu, sc[e][hh], off);
        if (seg == 0) {
#pragma unroll
            for (int e = 0; e < S::E; ++e) {
                const int r = r0 + e * S::ROWS_PER_PASS;
#pragma unroll
                for (int hh = 0; hh < G; ++hh) {
                    float x = sc[e][hh];
                    if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
                    p_s[hh][r] = c0 + r < j1 ? x : -INFINITY;
                }
            }
        }
        __syncthreads();
        // online softmax over the step's keys: warp w takes heads w, w + ATTN_WARPS, ...
        for (int hh = warp; hh < g; hh += ATTN_WARPS) {
            float x[(S::CHUNK + 31) / 32];
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < (S::CHUNK + 31) / 32; ++i) {
                x[i] = lane + 32 * i < S::CHUNK ? p_s[hh][lane + 32 * i] : -INFINITY;
                mx = fmaxf(mx, x[i]);
            }
            const float m_old = m_s[hh], l_old = l_s[hh];
            const float m_new = fmaxf(m_old, warp_max(mx));  // finite: every step has a valid key
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < (S::CHUNK + 31) / 32; ++i) {
                const float e = expf(x[i] - m_new);
                sum += e;
                if (lane + 32 * i < S::CHUNK) p_s[hh][lane + 32 * i] = e;
            }
            sum = warp_sum(sum);
            const float corr = expf(m_old - m_new);  // 0 at the first step
            __syncwarp();
            if (lane == 0) { m_s[hh] = m_new; l_s[hh] = l_old * corr + sum; corr_s[hh] = corr; }
        }
        __syncthreads();
#pragma unroll
        for (int hh = 0; hh < G; ++hh) {
            const float corr = hh < g ? corr_s[hh] : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) o[hh][i] *= corr;
        }
#pragma unroll
        for (int e = 0; e < S::E; ++e) {
            float vf[8];
            vr[e].get(vf);
            const int r = r0 + e * S::ROWS_PER_PASS;
#pragma unroll
            for (int hh = 0; hh < G; ++hh) {
                const float pk = hh < g ? p_s[hh][r] : 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) o[hh][i] += pk * vf[i];
            }
        }
    }
    // threads with the same segment: first inside the warp, then across warps in warp order
#pragma unroll
    for (int off = S::SEGS; off < 32; off <<= 1)
#pragma unroll
        for (int hh = 0; hh < G; ++hh)
#pragma unroll
            for (int i = 0; i < 8; ++i) o[hh][i] += __shfl_xor_sync(0xffffffffu, o[hh][i], off);
    if (lane < S::SEGS) {
#pragma unroll
        for (int hh = 0; hh < G; ++hh)
#pragma unroll
            for (int i = 0; i < 8; ++i) o_s[warp][hh][8 * seg + i] = o[hh][i];
    }
    __syncthreads();

    // the block's output for its heads, summed over warps in warp order, into o_s[0]
    for (int i = tid; i < G * HD; i += ATTN_THREADS) {
        const int hh = i / HD, d = i % HD;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) acc += o_s[w][hh][d];
        o_s[0][hh][d] = acc;
    }
    attn_block_out<HD, G, CL, CS>(o_s[0], m_s, l_s, n_act, g, h0, t, n_head, opart, ml, out, xq, xq_stride);
}

// ---- hd64 with an f16 cache: QK and PV on tensor cores ---------------------------------------
// attn_rows' issue time grows with the keys x heads a block computes in scalar FMAs (a 64-key
// step ~1 us however its rows are spread over threads, docs/gpu-log.md round 6); mma.sync
// m16n8k16 (f16 in, f32 accumulate) does QK and PV in a tenth of the instructions. Same chunk,
// prologue and output as attn_rows; blocks of 8 warps, so a loop trip takes 128 keys (two chunks):
// each warp takes 16 of them (two 8-key n-tiles) with its own online softmax, and the warps merge
// once at the end. The next trip's loads are issued before this trip's math, and the first trip's
// before the PDL wait where its rows allow. Measured against this (docs/gpu-log.md rounds 7, 8):
// 10 warps, a split staged in shared memory by cp.async, two register sets taking turns, and
// 32 keys a warp per trip without the next-trip loads were all slower in the decode graph.
// The MMA's rows 0-7 are the block's heads (G <= 8) with q's (and p's) f16 hi halves, rows 8-15 the
// same heads with the lo halves (below): lane (r = lane / 4, c = lane % 4) holds head r's scores
// of keys 2c, 2c + 1 of each n-tile as d0 + d2, d1 + d3, and those are PV's A operand once split
// again (FlashAttention-2's register reuse). Loads need no shuffles:
// - QK's k dimension walks the 64 dims in a per-lane order: lane c reads dims 16c .. 16c + 15 of
//   its key (32 bytes) and k-step j takes their words 2j, 2j + 1; q takes the same order.
// - PV's output dims are permuted: tile jd, column n is dim 8n + jd, so lane r reads dims
//   8r .. 8r + 7 of a V row (16 bytes) and picks half jd.
// Precision: q and p go in as f16 hi + lo halves (|x - hi - lo| <= 2^-22 |x|) in the two row halves
// of one MMA, so the products keep float32 accuracy at one MMA each; K and V are f16 values already.
__device__ __forceinline__ uint32_t word_of(const int4& v, int w) {
    return (uint32_t)(w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w);
}

// The tensor-core kernels' q operand: a lane's 4 * N consecutive q values (zero for a row past the
// block's heads), scaled, as f16x2 hi / lo pairs (the MMA's rows 0-7 and 8-15).
template <int N>
__device__ __forceinline__ void attn_q_hilo(const float* q, bool valid, float scale, uint32_t (&qh)[2 * N],
                                            uint32_t (&ql)[2 * N]) {
    const float4* qr = reinterpret_cast<const float4*>(q);
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float4 v = valid ? qr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        split_f16x2(v.x * scale, v.y * scale, qh[2 * i], ql[2 * i]);
        split_f16x2(v.z * scale, v.w * scale, qh[2 * i + 1], ql[2 * i + 1]);
    }
}

// A tensor-core kernel's warp result for its heads: lane (r, c) holds head r's dims JD (2c) + jd and
// JD (2c + 1) + jd of tile jd (JD = HD / 8) as p hi and lo parts, its m and its own keys' l.
template <int HD, int G>
__device__ __forceinline__ void attn_warp_out(const float (&o)[HD / 8][4], float m, float l, int r, int c,
                                              float (*o_w)[HD], float* mw, float* lw) {
    constexpr int JD = HD / 8;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (r < G) {
#pragma unroll
        for (int jd = 0; jd < JD; ++jd) {
            o_w[r][JD * (2 * c) + jd] = o[jd][0] + o[jd][2];
            o_w[r][JD * (2 * c + 1) + jd] = o[jd][1] + o[jd][3];
        }
        if (c == 0) { mw[r] = m; lw[r] = l; }
    }
}

// The tensor-core kernels' epilogue: each warp's o (unnormalized), m and l for the block's heads
// (o_s[w], mw_s[w], lw_s[w]) merged in warp order into o_s[0], m_s, l_s; a warp without keys has
// m = -inf, weight 0.
template <int HD, int G, int NW>
__device__ __forceinline__ void attn_merge_warps(float (*o_s)[G][HD], const float (*mw_s)[G], const float (*lw_s)[G],
                                                 float* m_s, float* l_s) {
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int hh = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, mw_s[w][hh]);
        float acc = 0.0f, lsum = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float cw = mw_s[w][hh] == -INFINITY ? 0.0f : expf(mw_s[w][hh] - M);
            acc += cw * o_s[w][hh][d];
            lsum += cw * lw_s[w][hh];
        }
        o_s[0][hh][d] = acc;
        if (d == 0) { m_s[hh] = M; l_s[hh] = lsum; }
    }
    __syncthreads();  // m_s, l_s: written by other threads than attn_block_out's readers
}

template <int G, bool CL>
__device__ void attn_rows_mma64(const float* __restrict__ q, int q_ld, const half* __restrict__ kc,
                                const half* __restrict__ vc, float* __restrict__ opart, float* __restrict__ ml,
                                const int* __restrict__ pos, int n_head, int n_kv, int n_ctx, int window,
                                float scale, float softcap, float* __restrict__ out, int8_t* __restrict__ xq,
                                int xq_stride, int max_cl) {
    constexpr int HD = 64, CHUNK = AttnShape<HD>::CHUNK, NT = attn_threads(HD, false), NW = NT / 32;
    constexpr int KW = 16, TRIP = NW * KW, CS = attn_cluster(HD, false);  // keys per warp / per block, a trip
    static_assert(G <= 8 && TRIP % CHUNK == 0, "heads in MMA rows 0-7; a trip takes whole chunks");
    __shared__ __align__(16) float o_s[NW][G][HD];
    __shared__ float mw_s[NW][G], lw_s[NW][G], m_s[G], l_s[G];

    const auto [kvh, h0, g] = attn_heads<G>(n_head, n_kv);
    const int s = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int p = pos[t];  // before the PDL wait, with the L2 prefetch: as in attn_rows
    int start, split_len;
    const int n_act = attn_splits_of_row(p, window, CHUNK, CL, CS, attn_cl_chunks(HD, false), max_cl, start, split_len);
    if (CL ? (s / CS) * CS >= n_act || (n_act == 1 && s > 0) : s >= n_act) return;
    const bool active = s < n_act;
    const int j0 = start + s * split_len, j1 = min(p + 1, j0 + split_len);
    const size_t row0 = (size_t)kvh * n_ctx;
    if (active) {
        for (int r = tid; j0 + r < j1; r += NT) {  // the whole split (<= 8 chunks on the cluster path), 128-byte rows
            asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + (row0 + j0 + r) * HD));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + (row0 + j0 + r) * HD));
        }
    }
    const int r = lane >> 2, c = lane & 3;  // MMA row (head) / n-tile key / V dims, and column pair
    // K: n-tile u's key r, dims 16c .. 16c + 15; V: keys 2c, 2c + 1, 2c + 8, 2c + 9, dims 8r .. 8r + 7.
    // Rows past the end read the last valid row (weight 0). The next trip's rows load before this
    // trip's math.
    int4 kr[2][2], vr[4], kn[2][2], vn[4];
    auto load = [&](int c0) {
        const int kb = c0 + KW * warp;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int4* src = reinterpret_cast<const int4*>(kc + (row0 + min(kb + 8 * u + r, j1 - 1)) * HD + 16 * c);
            kn[u][0] = src[0];
            kn[u][1] = src[1];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int key = 2 * c + (i & 1) + 8 * (i >> 1);
            vn[i] = *reinterpret_cast<const int4*>(vc + (row0 + min(kb + key, j1 - 1)) * HD + 8 * r);
        }
    };
    // The first trip's rows load before the PDL wait when all are older than the forward's first
    // position: a step writes only its own rows (pos[0] on, ascending), and those may still be in
    // flight from the previous kernel. Rows before pos[0] were final before this launch.
    const bool early = active && min(j0 + TRIP, j1) <= pos[0];
    if (early) load(j0);
    pdl_entry();
    if (active && !early) load(j0);

    uint32_t qh[8], ql[8];  // head r's dims 16c .. 16c + 15 (scaled) as hi / lo pairs
    attn_q_hilo<4>(q + (size_t)t * q_ld + (size_t)(h0 + r) * HD + 16 * c, r < g, scale, qh, ql);
    float o[8][4];  // output tile jd, dims 8 (2c) + jd, 8 (2c + 1) + jd of head r: p hi (0, 1) and p lo (2, 3) parts
#pragma unroll
    for (int jd = 0; jd < 8; ++jd) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // head r over this warp's keys (l: this lane's keys)

    for (int c0 = j0; active && c0 < j1; c0 += TRIP) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            kr[i >> 1][i & 1] = kn[i >> 1][i & 1];
            vr[i] = vn[i];
        }
        if (c0 + TRIP < j1) load(c0 + TRIP);
        const int kb = c0 + KW * warp;
        if (kb >= j1) continue;  // warp-uniform: none of this warp's keys are in the split
        float sc[2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            sc[u][0] = sc[u][1] = sc[u][2] = sc[u][3] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t b0 = word_of(kr[u][j >> 1], 2 * (j & 1)), b1 = word_of(kr[u][j >> 1], 2 * (j & 1) + 1);
                mma_16816(sc[u], qh[2 * j], ql[2 * j], qh[2 * j + 1], ql[2 * j + 1], b0, b1);
            }
        }
        // head r's scores of keys 2c, 2c + 1 (n-tile 0) and 8 + 2c, 9 + 2c (n-tile 1)
        float x[4] = {sc[0][0] + sc[0][2], sc[0][1] + sc[0][3], sc[1][0] + sc[1][2], sc[1][1] + sc[1][3]};
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (softcap > 0.0f) x[i] = softcap * tanhf(x[i] / softcap);
            x[i] = kb + 2 * c + (i & 1) + 8 * (i >> 1) < j1 ? x[i] : -INFINITY;
            mx = fmaxf(mx, x[i]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);  // finite: the warp's first key is valid
        const float corr = expf(m - m_new);  // 0 at the warp's first step
        m = m_new;
        float pk[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) pk[i] = expf(x[i] - m_new);
        l = l * corr + ((pk[0] + pk[1]) + (pk[2] + pk[3]));
        uint32_t ph0, pl0, ph2, pl2;  // P as PV's A operand: keys 2c, 2c + 1 | 8 + 2c, 9 + 2c
        split_f16x2(pk[0], pk[1], ph0, pl0);
        split_f16x2(pk[2], pk[3], ph2, pl2);
#pragma unroll
        for (int jd = 0; jd < 8; ++jd) {
            o[jd][0] *= corr;  // rows r (hi) and r + 8 (lo) alike
            o[jd][1] *= corr;
            o[jd][2] *= corr;
            o[jd][3] *= corr;
            const uint32_t sel = (jd & 1) ? 0x7632u : 0x5410u;  // half jd of each key's 8 dims
            const uint32_t b0 = __byte_perm(word_of(vr[0], jd >> 1), word_of(vr[1], jd >> 1), sel);
            const uint32_t b1 = __byte_perm(word_of(vr[2], jd >> 1), word_of(vr[3], jd >> 1), sel);
            mma_16816(o[jd], ph0, pl0, ph2, pl2, b0, b1);
        }
    }
    attn_warp_out<HD, G>(o, m, l, r, c, o_s[warp], mw_s[warp], lw_s[warp]);
    attn_merge_warps<HD, G, NW>(o_s, mw_s, lw_s, m_s, l_s);
    attn_block_out<HD, G, CL, CS>(o_s[0], m_s, l_s, n_act, g, h0, t, n_head, opart, ml, out, xq, xq_stride);
}

// ---- hd128 with an f16 cache: QK and PV on tensor cores, fed from registers -------------------
// attn_rows_mma64's arithmetic at twice the head dim, in attn_rows' blocks (4 warps, 32-key chunks,
// clusters of 8, the same split rule and cap), so the grid and every row's split stay as they were.
// attn_rows spent ~1.8 us a 32-key step at 4,224 keys on scalar FMAs, the 16-lane shuffle sums
// and three block barriers (docs/gpu-log.md, sessions 44-47); here each warp takes 8 keys of a
// chunk a trip (one n-tile) with its own online softmax and no barrier until the end. An 8-key
// tile keeps a lane's K and V rows and the next trip's in 64 registers:
// - QK (m16n8k16): lane (r, c) reads dims 32c .. 32c + 31 of key r (64 bytes); k-step j takes
//   its words 2j, 2j + 1, and q takes the same dim order.
// - PV (m16n8k8, one MMA a dim tile): lane (r, c) reads dims 16r .. 16r + 15 of keys 2c, 2c + 1;
//   tile jd's column n is dim 16n + jd, so its B register is half jd of both rows (one byte_perm).
// q and p go in as f16 hi (rows 0-7) + lo (rows 8-15) halves, as in attn_rows_mma64.
template <int G, bool CL>
__device__ void attn_rows_mma128(const float* __restrict__ q, int q_ld, const half* __restrict__ kc,
                                 const half* __restrict__ vc, float* __restrict__ opart, float* __restrict__ ml,
                                 const int* __restrict__ pos, int n_head, int n_kv, int n_ctx, int window,
                                 float scale, float softcap, float* __restrict__ out, int8_t* __restrict__ xq,
                                 int xq_stride, int max_cl) {
    constexpr int HD = 128, CHUNK = AttnShape<HD>::CHUNK, NT = attn_threads(HD, false), NW = NT / 32;
    constexpr int KW = 8, TRIP = NW * KW, CS = attn_cluster(HD, false);  // keys per warp / per block, a trip
    static_assert(G <= 8 && TRIP == CHUNK, "heads in MMA rows 0-7; a trip is one chunk");
    __shared__ __align__(16) float o_s[NW][G][HD];
    __shared__ float mw_s[NW][G], lw_s[NW][G], m_s[G], l_s[G];

    const auto [kvh, h0, g] = attn_heads<G>(n_head, n_kv);
    const int s = blockIdx.y, t = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int p = pos[t];  // before the PDL wait, with the L2 prefetch of the first two chunks: as in attn_rows
    int start, split_len;
    const int n_act = attn_splits_of_row(p, window, CHUNK, CL, CS, attn_cl_chunks(HD, false), max_cl, start, split_len);
    if (CL ? (s / CS) * CS >= n_act || (n_act == 1 && s > 0) : s >= n_act) return;
    const bool active = s < n_act;
    const int j0 = start + s * split_len, j1 = min(p + 1, j0 + split_len);
    const size_t row0 = (size_t)kvh * n_ctx;
    if (active) {
        for (int i = tid; i < 2 * CHUNK * 2; i += NT) {  // 256-byte rows: two lines each
            const int r = i / 2;
            if (j0 + r >= j1) break;
            const size_t off = (row0 + j0 + r) * HD + (i % 2) * 64;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + off));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + off));
        }
    }
    const int r = lane >> 2, c = lane & 3;  // MMA row (head) / n-tile key / V dims, and column pair
    // Rows past the end read the last valid row (weight 0). The next trip's rows load before this
    // trip's math.
    int4 kr[4], vr[4], kn[4], vn[4];  // K: key r, dims 32c + 8i ..; V: key 2c + (i >> 1), dims 16r + 8 (i & 1) ..
    auto load = [&](int c0) {
        const int kb = c0 + KW * warp;
        const int4* ks = reinterpret_cast<const int4*>(kc + (row0 + min(kb + r, j1 - 1)) * HD + 32 * c);
#pragma unroll
        for (int i = 0; i < 4; ++i) kn[i] = ks[i];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int4* vs = reinterpret_cast<const int4*>(vc + (row0 + min(kb + 2 * c + k, j1 - 1)) * HD + 16 * r);
            vn[2 * k] = vs[0];
            vn[2 * k + 1] = vs[1];
        }
    };
    const bool early = active && min(j0 + TRIP, j1) <= pos[0];  // as in attn_rows_mma64
    if (early) load(j0);
    pdl_entry();
    if (active && !early) load(j0);

    uint32_t qh[16], ql[16];  // head r's dims 32c .. 32c + 31 (scaled) as hi / lo pairs
    attn_q_hilo<8>(q + (size_t)t * q_ld + (size_t)(h0 + r) * HD + 32 * c, r < g, scale, qh, ql);
    float o[16][4];  // dim tile jd: dims 16 (2c) + jd, 16 (2c + 1) + jd of head r; p hi (0, 1) and p lo (2, 3) parts
#pragma unroll
    for (int jd = 0; jd < 16; ++jd) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // head r over this warp's keys (l: this lane's keys)

    for (int c0 = j0; active && c0 < j1; c0 += TRIP) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            kr[i] = kn[i];
            vr[i] = vn[i];
        }
        if (c0 + TRIP < j1) load(c0 + TRIP);
        const int kb = c0 + KW * warp;
        if (kb >= j1) continue;  // warp-uniform: none of this warp's keys are in the split
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 8; ++j)
            mma_16816(sc, qh[2 * j], ql[2 * j], qh[2 * j + 1], ql[2 * j + 1], word_of(kr[j >> 1], 2 * (j & 1)),
                      word_of(kr[j >> 1], 2 * (j & 1) + 1));
        float x[2] = {sc[0] + sc[2], sc[1] + sc[3]};  // head r, keys 2c and 2c + 1
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (softcap > 0.0f) x[i] = softcap * tanhf(x[i] / softcap);
            x[i] = kb + 2 * c + i < j1 ? x[i] : -INFINITY;
        }
        float mx = fmaxf(x[0], x[1]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);  // finite: the warp's first key is valid
        const float corr = expf(m - m_new);  // 0 at the warp's first step
        m = m_new;
        const float p0 = expf(x[0] - m_new), p1 = expf(x[1] - m_new);
        l = l * corr + (p0 + p1);
        uint32_t ph, pl;
        split_f16x2(p0, p1, ph, pl);
#pragma unroll
        for (int jd = 0; jd < 16; ++jd) {
            o[jd][0] *= corr;  // rows r (hi) and r + 8 (lo) alike
            o[jd][1] *= corr;
            o[jd][2] *= corr;
            o[jd][3] *= corr;
            const uint32_t sel = (jd & 1) ? 0x7632u : 0x5410u;  // half jd of each key's 16 dims
            const int w = jd >> 1;
            const uint32_t b0 = __byte_perm(word_of(vr[w >> 2], w & 3), word_of(vr[2 + (w >> 2)], w & 3), sel);
            mma_1688(o[jd], ph, pl, b0);
        }
    }
    attn_warp_out<HD, G>(o, m, l, r, c, o_s[warp], mw_s[warp], lw_s[warp]);
    attn_merge_warps<HD, G, NW>(o_s, mw_s, lw_s, m_s, l_s);
    attn_block_out<HD, G, CL, CS>(o_s[0], m_s, l_s, n_act, g, h0, t, n_head, opart, ml, out, xq, xq_stride);
}

// Merge of the partials in slots 0 .. n_parts - 1 of row t (slot order) for heads h0 .. h0 + g,
// dims d0 .. d0 + ATTN_MERGE_DIMS (one block per slice: more blocks, one float4 per thread).
// Each thread issues its first MAXP slots' loads before the weights are known (indices clamped,
// so no branch keeps them apart; slots past n_parts get weight 0): one memory wait, not two.
// Weights: warp w takes heads w, w + ATTN_WARPS, ..., one lane per slot.
#define ATTN_MERGE_DIMS 64
template <int HD, int G, int MAXP>
__device__ void attn_merge_parts(const float* __restrict__ opart, const float* __restrict__ ml, int n_parts,
                                 int n_slots, int g, int h0, int d0, int t, int n_head, float* __restrict__ out,
                                 int8_t* __restrict__ xq, int xq_stride) {
    static_assert(ATTN_MAX_SPLITS <= 32 && ATTN_MAX_SPLITS_CL / 8 <= 32, "one lane per slot");
    static_assert(G * ATTN_MERGE_DIMS / 4 <= ATTN_THREADS, "one float4 per thread");
    __shared__ __align__(16) float o_s[G][ATTN_MERGE_DIMS];
    __shared__ float c_s[G][32], l_s[G];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hh = (4 * tid) / ATTN_MERGE_DIMS, d = (4 * tid) % ATTN_MERGE_DIMS;
    const bool mine = tid < g * ATTN_MERGE_DIMS / 4;
    const size_t slot_stride = (size_t)n_head * HD / 4;
    const float4* src = reinterpret_cast<const float4*>(opart + ((size_t)t * n_slots * n_head + h0 + hh) * HD + d0 + d);
    float4 v[MAXP];
    if (mine) {
#pragma unroll
        for (int k = 0; k < MAXP; ++k) v[k] = src[(size_t)min(k, n_parts - 1) * slot_stride];
    }
    for (int h = warp; h < g; h += ATTN_WARPS) {
        const size_t r = ((size_t)t * n_slots + lane) * n_head + h0 + h;
        const float m = lane < n_parts ? ml[r * 2] : -INFINITY;
        const float l = lane < n_parts ? ml[r * 2 + 1] : 0.0f;
        const float M = warp_max(m);
        const float c = lane < n_parts ? expf(m - M) : 0.0f;
        const float L = warp_sum(c * l);
        c_s[h][lane] = c;
        if (lane == 0) l_s[h] = L;
    }
    __syncthreads();
    if (mine) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int sp0 = 0; sp0 < n_parts; sp0 += MAXP) {
            if (sp0 > 0) {
#pragma unroll
                for (int k = 0; k < MAXP; ++k) v[k] = src[(size_t)min(sp0 + k, n_parts - 1) * slot_stride];
            }
#pragma unroll
            for (int k = 0; k < MAXP; ++k) {
                const float c = c_s[hh][(sp0 + k) & 31];
                acc.x += c * v[k].x; acc.y += c * v[k].y; acc.z += c * v[k].z; acc.w += c * v[k].w;
            }
        }
        *reinterpret_cast<float4*>(&o_s[hh][d]) = acc;
    }
    __syncthreads();
    // o / l, and its q8_1 copy: each warp iteration is one whole 32-value q8_1 block of one head
    for (int i = tid; i < g * ATTN_MERGE_DIMS; i += ATTN_THREADS) {
        const int h = i / ATTN_MERGE_DIMS, dd = i % ATTN_MERGE_DIMS;
        const float val = o_s[h][dd] / l_s[h];
        const int col = (h0 + h) * HD + d0 + dd;
        out[(size_t)t * n_head * HD + col] = val;
        if (xq) {
            int8_t* xrow = xq + (size_t)t * xq_stride;
            quantize_q8_1_at(val, xrow, n_head * HD, col);
        }
    }
}

// Merge the rows with several partials (others: attention wrote them). grid (n_kv * n_hgroups,
// HD / ATTN_MERGE_DIMS, T), block ATTN_THREADS. Split path: one partial per split (c_s holds 32,
// 16 loads in flight); cluster path: one per cluster of the (HD, Q8) kernel (at most 8, all in
// flight at once).
template <int HD, int G, bool Q8, bool CL>
__device__ void attn_merge_rows(const float* __restrict__ opart, const float* __restrict__ ml,
                                const int* __restrict__ pos, int n_head, int n_kv, int n_slots, int window,
                                float* __restrict__ out, int8_t* __restrict__ xq, int xq_stride, int max_cl) {
    const auto [kvh, h0, g] = attn_heads<G>(n_head, n_kv);
    const int t = blockIdx.z;
    int start, split_len;
    constexpr int CS = attn_cluster(HD, Q8);
    const int n_act = attn_splits_of_row(pos[t], window, AttnShape<HD>::CHUNK, CL, CS, attn_cl_chunks(HD, Q8), max_cl,
                                         start, split_len);
    const int n_parts = CL ? (n_act + CS - 1) / CS : n_act;
    // Every block waits, those with nothing to merge too: if all of a launch's blocks left before
    // the wait, the next kernel could start before the attention kernel has finished.
    pdl_entry();
    if (n_parts == 1) return;  // attention wrote this row
    attn_merge_parts<HD, G, CL ? ATTN_MAX_SPLITS_CL / 8 : 16>(
        opart, ml, n_parts, n_slots, g, h0, blockIdx.y * ATTN_MERGE_DIMS, t, n_head, out, xq, xq_stride);
}

#define ATTN_KERNEL(NAME, HD, G, Q8, CL)                                                                        \
    extern "C" __global__ void __launch_bounds__(attn_threads(HD, Q8), attn_min_blocks(HD, Q8)) ATTN_DIMS_##CL(HD, Q8) NAME( \
        const float* q, int q_ld, const void* kc, const void* vc, const half* kd, const half* vd, float* opart,  \
        float* ml, const int* pos, int n_head, int n_kv, int n_ctx, int window, float scale, float softcap,     \
        float* out, int8_t* xq, int xq_stride, int max_cl) {                                                     \
        if constexpr (HD == 64 && !Q8)                                                                          \
            attn_rows_mma64<G, CL>(q, q_ld, static_cast<const half*>(kc), static_cast<const half*>(vc), opart,  \
                                   ml, pos, n_head, n_kv, n_ctx, window, scale, softcap, out, xq, xq_stride,     \
                                   max_cl);                                                                      \
        else if constexpr (HD == 128 && !Q8)                                                                    \
            attn_rows_mma128<G, CL>(q, q_ld, static_cast<const half*>(kc), static_cast<const half*>(vc), opart, \
                                    ml, pos, n_head, n_kv, n_ctx, window, scale, softcap, out, xq, xq_stride,    \
                                    max_cl);                                                                     \
        else                                                                                                     \
            attn_rows<HD, G, Q8, CL>(q, q_ld, kc, vc, kd, vd, opart, ml, pos, n_head, n_kv, n_ctx, window,       \
                                     scale, softcap, out, xq, xq_stride, max_cl);                                \
    }
// memra-kernel: attn_hd64_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g1_f16, 64, 1, false, false)
// memra-kernel: attn_hd64_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g2_f16, 64, 2, false, false)
// memra-kernel: attn_hd64_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g4_f16, 64, 4, false, false)
// memra-kernel: attn_hd64_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g8_f16, 64, 8, false, false)
// memra-kernel: attn_hd128_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g1_f16, 128, 1, false, false)
// memra-kernel: attn_hd128_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g2_f16, 128, 2, false, false)
// memra-kernel: attn_hd128_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g4_f16, 128, 4, false, false)
// memra-kernel: attn_hd128_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g8_f16, 128, 8, false, false)
// memra-kernel: attn_hd256_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g1_f16, 256, 1, false, false)
// memra-kernel: attn_hd256_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g2_f16, 256, 2, false, false)
// memra-kernel: attn_hd256_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g4_f16, 256, 4, false, false)
// memra-kernel: attn_hd256_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g8_f16, 256, 8, false, false)
// memra-kernel: attn_hd64_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g1_q8_0, 64, 1, true, false)
// memra-kernel: attn_hd64_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g2_q8_0, 64, 2, true, false)
// memra-kernel: attn_hd64_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g4_q8_0, 64, 4, true, false)
// memra-kernel: attn_hd64_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd64_g8_q8_0, 64, 8, true, false)
// memra-kernel: attn_hd128_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g1_q8_0, 128, 1, true, false)
// memra-kernel: attn_hd128_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g2_q8_0, 128, 2, true, false)
// memra-kernel: attn_hd128_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g4_q8_0, 128, 4, true, false)
// memra-kernel: attn_hd128_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd128_g8_q8_0, 128, 8, true, false)
// memra-kernel: attn_hd256_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g1_q8_0, 256, 1, true, false)
// memra-kernel: attn_hd256_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g2_q8_0, 256, 2, true, false)
// memra-kernel: attn_hd256_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g4_q8_0, 256, 4, true, false)
// memra-kernel: attn_hd256_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_hd256_g8_q8_0, 256, 8, true, false)
// memra-kernel: attn_cl_hd64_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g1_f16, 64, 1, false, true)
// memra-kernel: attn_cl_hd64_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g2_f16, 64, 2, false, true)
// memra-kernel: attn_cl_hd64_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g4_f16, 64, 4, false, true)
// memra-kernel: attn_cl_hd64_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g8_f16, 64, 8, false, true)
// memra-kernel: attn_cl_hd128_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g1_f16, 128, 1, false, true)
// memra-kernel: attn_cl_hd128_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g2_f16, 128, 2, false, true)
// memra-kernel: attn_cl_hd128_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g4_f16, 128, 4, false, true)
// memra-kernel: attn_cl_hd128_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g8_f16, 128, 8, false, true)
// memra-kernel: attn_cl_hd256_g1_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g1_f16, 256, 1, false, true)
// memra-kernel: attn_cl_hd256_g2_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g2_f16, 256, 2, false, true)
// memra-kernel: attn_cl_hd256_g4_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g4_f16, 256, 4, false, true)
// memra-kernel: attn_cl_hd256_g8_f16(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g8_f16, 256, 8, false, true)
// memra-kernel: attn_cl_hd64_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g1_q8_0, 64, 1, true, true)
// memra-kernel: attn_cl_hd64_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g2_q8_0, 64, 2, true, true)
// memra-kernel: attn_cl_hd64_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g4_q8_0, 64, 4, true, true)
// memra-kernel: attn_cl_hd64_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd64_g8_q8_0, 64, 8, true, true)
// memra-kernel: attn_cl_hd128_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g1_q8_0, 128, 1, true, true)
// memra-kernel: attn_cl_hd128_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g2_q8_0, 128, 2, true, true)
// memra-kernel: attn_cl_hd128_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g4_q8_0, 128, 4, true, true)
// memra-kernel: attn_cl_hd128_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd128_g8_q8_0, 128, 8, true, true)
// memra-kernel: attn_cl_hd256_g1_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g1_q8_0, 256, 1, true, true)
// memra-kernel: attn_cl_hd256_g2_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g2_q8_0, 256, 2, true, true)
// memra-kernel: attn_cl_hd256_g4_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g4_q8_0, 256, 4, true, true)
// memra-kernel: attn_cl_hd256_g8_q8_0(PiPPPPPPPiiiiffPPii)
ATTN_KERNEL(attn_cl_hd256_g8_q8_0, 256, 8, true, true)

#define ATTN_MERGE(NAME, HD, G, Q8, CL)                                                                          \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) NAME(                                             \
        const float* opart, const float* ml, const int* pos, int n_head, int n_kv, int n_slots, int window,      \
        float* out, int8_t* xq, int xq_stride, int max_cl) {                                                     \
        attn_merge_rows<HD, G, Q8, CL>(opart, ml, pos, n_head, n_kv, n_slots, window, out, xq, xq_stride,       \
                                       max_cl);                                                                  \
    }
// memra-kernel: attn_merge_hd64_g1(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd64_g1, 64, 1, false, false)
// memra-kernel: attn_merge_hd64_g2(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd64_g2, 64, 2, false, false)
// memra-kernel: attn_merge_hd64_g4(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd64_g4, 64, 4, false, false)
// memra-kernel: attn_merge_hd64_g8(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd64_g8, 64, 8, false, false)
// memra-kernel: attn_merge_hd128_g1(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd128_g1, 128, 1, false, false)
// memra-kernel: attn_merge_hd128_g2(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd128_g2, 128, 2, false, false)
// memra-kernel: attn_merge_hd128_g4(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd128_g4, 128, 4, false, false)
// memra-kernel: attn_merge_hd128_g8(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd128_g8, 128, 8, false, false)
// memra-kernel: attn_merge_hd256_g1(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd256_g1, 256, 1, false, false)
// memra-kernel: attn_merge_hd256_g2(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd256_g2, 256, 2, false, false)
// memra-kernel: attn_merge_hd256_g4(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd256_g4, 256, 4, false, false)
// memra-kernel: attn_merge_hd256_g8(PPPiiiiPPii)
ATTN_MERGE(attn_merge_hd256_g8, 256, 8, false, false)
// memra-kernel: attn_cl_merge_hd64_g1_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g1_f16, 64, 1, false, true)
// memra-kernel: attn_cl_merge_hd64_g1_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g1_q8_0, 64, 1, true, true)
// memra-kernel: attn_cl_merge_hd64_g2_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g2_f16, 64, 2, false, true)
// memra-kernel: attn_cl_merge_hd64_g2_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g2_q8_0, 64, 2, true, true)
// memra-kernel: attn_cl_merge_hd64_g4_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g4_f16, 64, 4, false, true)
// memra-kernel: attn_cl_merge_hd64_g4_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g4_q8_0, 64, 4, true, true)
// memra-kernel: attn_cl_merge_hd64_g8_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g8_f16, 64, 8, false, true)
// memra-kernel: attn_cl_merge_hd64_g8_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd64_g8_q8_0, 64, 8, true, true)
// memra-kernel: attn_cl_merge_hd128_g1_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g1_f16, 128, 1, false, true)
// memra-kernel: attn_cl_merge_hd128_g1_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g1_q8_0, 128, 1, true, true)
// memra-kernel: attn_cl_merge_hd128_g2_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g2_f16, 128, 2, false, true)
// memra-kernel: attn_cl_merge_hd128_g2_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g2_q8_0, 128, 2, true, true)
// memra-kernel: attn_cl_merge_hd128_g4_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g4_f16, 128, 4, false, true)
// memra-kernel: attn_cl_merge_hd128_g4_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g4_q8_0, 128, 4, true, true)
// memra-kernel: attn_cl_merge_hd128_g8_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g8_f16, 128, 8, false, true)
// memra-kernel: attn_cl_merge_hd128_g8_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd128_g8_q8_0, 128, 8, true, true)
// memra-kernel: attn_cl_merge_hd256_g1_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g1_f16, 256, 1, false, true)
// memra-kernel: attn_cl_merge_hd256_g1_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g1_q8_0, 256, 1, true, true)
// memra-kernel: attn_cl_merge_hd256_g2_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g2_f16, 256, 2, false, true)
// memra-kernel: attn_cl_merge_hd256_g2_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g2_q8_0, 256, 2, true, true)
// memra-kernel: attn_cl_merge_hd256_g4_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g4_f16, 256, 4, false, true)
// memra-kernel: attn_cl_merge_hd256_g4_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g4_q8_0, 256, 4, true, true)
// memra-kernel: attn_cl_merge_hd256_g8_f16(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g8_f16, 256, 8, false, true)
// memra-kernel: attn_cl_merge_hd256_g8_q8_0(PPPiiiiPPii)
ATTN_MERGE(attn_cl_merge_hd256_g8_q8_0, 256, 8, true, true)
