// Writing rows of the q8_0 KV cache (layout: engine/gpu/kv_cache.py). Shared by kv_cache.cu and
// rope.cu, which both write cache rows.
#pragma once
#include "common.cuh"

#define KV_Q8_0_BLOCK 32
#define KV_MAX_HEAD_DIM 256  // the largest head_dim with an attention kernel (staging buffers)

// Quantize one cache row x[head_dim] (head_dim a multiple of 32) into qs[head_dim] int8 and
// d[head_dim / 32] half, bit for bit as ggml's quantize_row_q8_0_ref (and engine/cpu/kv_cache.py):
// d = amax / 127, id = d ? 1/d : 0, q = roundf(x * id), d stored as half (round to nearest even).
// Called by the whole block; blockDim.x must be a multiple of 32: warp w quantizes the 32-value
// blocks w, w + n_warps, ..., one value per lane.
__device__ __forceinline__ void store_row_q8_0(const float* x, int head_dim, int8_t* qs, half* d) {
    const int lane = threadIdx.x & 31, n_warps = blockDim.x >> 5;
    for (int b = threadIdx.x >> 5; b < head_dim / KV_Q8_0_BLOCK; b += n_warps) {
        const float xv = x[b * KV_Q8_0_BLOCK + lane];
        const float amax = warp_max(fabsf(xv));
        const float dv = amax / 127.0f;
        const float id = dv != 0.0f ? 1.0f / dv : 0.0f;
        qs[b * KV_Q8_0_BLOCK + lane] = (int8_t)roundf(xv * id);
        if (lane == 0) d[b] = __float2half_rn(dv);
    }
}
