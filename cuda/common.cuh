// Shared helpers for every kernel family: warp/block reductions, f16 conversion, Philox.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define WARP 32

// Programmatic dependent launch (sm_90+). Captured decode graphs launch every kernel with
// PROGRAMMATIC_STREAM_SERIALIZATION, so a kernel's blocks are scheduled while its predecessor
// still runs. Every kernel calls this first, before touching global memory: wait until the
// predecessor has finished and its writes are visible, then let our successor launch. Without
// the attribute (eager launches) or before sm_90 it costs nothing.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats.
// Fixed reduction order (warp tree, then warp 0 over warp sums): deterministic run to run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    v = warp_max(v);
    return v;
}

// Philox4x32-10: counter-based RNG (Salmon et al. 2011). Same (key, counter) -> same numbers
// on every run and every GPU, which is what "same seed, same reply" needs.
struct philox_out { uint32_t x[4]; };

__device__ __forceinline__ philox_out philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                                 uint32_t k0, uint32_t k1) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += W0; k1 += W1;
    }
    philox_out o; o.x[0] = c0; o.x[1] = c1; o.x[2] = c2; o.x[3] = c3;
    return o;
}

// Uniform in (0, 1): never 0, so -log(-log(u)) is finite.
__device__ __forceinline__ float u32_to_unit(uint32_t v) {
    return ((float)(v >> 8) + 0.5f) * (1.0f / 16777216.0f);
}
