// Elementwise ops: gated activations, residual add, bias add, scale, softcap, column copy.
#include "common.cuh"
#include "quants.cuh"

__device__ __forceinline__ float silu_mul(float a, float b) { return a / (1.0f + expf(-a)) * b; }

__device__ __forceinline__ float gelu_tanh_mul(float a, float b) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * a * (1.0f + tanhf(c * (a + 0.044715f * a * a * a))) * b;
}

// Gated FFN activations over rows of n: g and u rows are ld_in apart (so the fused [gate|up]
// matvec output is read in place), y rows are n apart. grid (ceil(kq/256), rows), kq = n rounded
// up to 32. xq not null: y is also written as q8_1 rows (xq_stride bytes) for the down matvec;
// yh not null: as f16 rows of yh_ld (n rounded up to 8, zero past n) for the prefill GEMM; xk not
// null: as q8_k256 rows for a Q4_K down matvec (k256.cu; the launch's blocks are 256 threads).
template <float (*F)(float, float)>
__device__ __forceinline__ void gated(const float* g, const float* u, float* y, int n, int ld_in, int8_t* xq,
                                      int xq_stride, half* yh, int yh_ld, uint8_t* xk) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const size_t r = blockIdx.y;
    const float v = i < n ? F(g[r * ld_in + i], u[r * ld_in + i]) : 0.0f;
    if (i < n) y[r * n + i] = v;
    const int kq = (n + 31) & ~31;
    if (xq && i < kq) quantize_q8_1_at(v, xq + r * xq_stride, kq, i);  // warp-uniform: kq % 32 == 0
    if (yh && i < yh_ld) yh[r * yh_ld + i] = __float2half_rn(v);
    if (xk) q8_k256_block(v, xk + r * q8_k256_row_bytes(n), (n + 255) >> 8, i);  // blocks of 256: a super-block each
}

extern "C" __global__ void silu_mul_f32(const float* g, const float* u, float* y, int n, int ld_in, int8_t* xq,
                                        int xq_stride, half* yh, int yh_ld, uint8_t* xk) {
    pdl_entry();
    gated<silu_mul>(g, u, y, n, ld_in, xq, xq_stride, yh, yh_ld, xk);
}

extern "C" __global__ void gelu_tanh_mul_f32(const float* g, const float* u, float* y, int n, int ld_in, int8_t* xq,
                                             int xq_stride, half* yh, int yh_ld, uint8_t* xk) {
    pdl_entry();
    gated<gelu_tanh_mul>(g, u, y, n, ld_in, xq, xq_stride, yh, yh_ld, xk);
}

// y = a + b over n floats.
extern "C" __global__ void add_f32(float* y, const float* a, const float* b, int n) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

// y[r][i] = a[r][i] + bias[i]; rows of n. grid (ceil(n/256), rows).
extern "C" __global__ void add_bias_f32(float* y, const float* a, const float* bias, int n) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    y[r * n + i] = a[r * n + i] + bias[i];
}

extern "C" __global__ void scale_f32(float* y, const float* x, float s, int n) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}

// y = cap * tanh(x / cap): gemma's final-logit softcap.
extern "C" __global__ void softcap_f32(float* y, const float* x, float cap, int n) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cap * tanhf(x[i] / cap);
}

// dst[r][i] = src[r][i] for i < n; src rows src_ld apart, dst rows dst_ld apart (stacking the
// outputs of a fused weight whose parts have different quant types). grid (ceil(n/256), rows).
extern "C" __global__ void copy_rows_f32(float* dst, const float* src, int n, int dst_ld, int src_ld) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    dst[r * dst_ld + i] = src[r * src_ld + i];
}
