// The per-256 activation, q8_k256 (layout and producer: quants.cuh), for the column-independent
// tile-layout matvecs of issue 14 (prototyped in scripts/proto/mma_q4k.cu; docs/gpu-log.md,
// session 56): one activation scale per 256 values lets a Q4_K super-block's integer sums stay
// exact, so 1 or 8 columns take the same float steps and verify rows keep decode's bits.
#include "common.cuh"
#include "quants.cuh"

// x f32 [T][K] -> q8_k256 rows, `stride` bytes apart. Grid (nb, T), 256 threads: thread j of block
// b quantizes value 256 b + j (0 past K) against the super-block's amax.
extern "C" __global__ void __launch_bounds__(256) quantize_q8_k256(const float* __restrict__ x, uint8_t* __restrict__ xq,
                                                                   int cols, int stride) {
    pdl_entry();
    __shared__ float wmax[8];
    const int t = blockIdx.y, j = blockIdx.x * 256 + threadIdx.x;
    const float xj = j < cols ? x[(size_t)t * cols + j] : 0.0f;
    const float m = warp_absmax(xj);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = wmax[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) amax = fmaxf(amax, wmax[w]);
    q8_k256_store(xj, amax, xq + (size_t)t * stride, gridDim.x, j);
}
