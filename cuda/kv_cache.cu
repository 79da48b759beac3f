// KV cache writes for the cache types other than f16 (kv_write_f16 lives with attention.cu).
// Layout per layer (engine/gpu/kv_cache.py): K and V each int8 qs[n_kv][n_ctx][head_dim] and,
// at the buffer's scale offset, half d[n_kv][n_ctx][head_dim / 32]. Token t goes to position
// pos[t] (device memory, so a captured decode graph writes where the step buffer says).
#include "common.cuh"
#include "kv_q8_0.cuh"

// k, v [T][*] with rows k_ld / v_ld floats apart, heads of head_dim inside a row.
// grid (T, n_kv); block a multiple of 32 (min(128, head_dim)).
// memra-kernel: kv_write_q8_0(PPPPPPPiiii)
extern "C" __global__ void kv_write_q8_0(const float* k, const float* v, int8_t* kc, int8_t* vc, half* kd, half* vd,
                                         const int* pos, int k_ld, int v_ld, int head_dim, int n_ctx) {
    pdl_entry();
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t row = (size_t)h * n_ctx + pos[t];
    const size_t scales = row * (head_dim / KV_Q8_0_BLOCK);
    store_row_q8_0(k + (size_t)t * k_ld + (size_t)h * head_dim, head_dim, kc + row * head_dim, kd + scales);
    store_row_q8_0(v + (size_t)t * v_ld + (size_t)h * head_dim, head_dim, vc + row * head_dim, vd + scales);
}
