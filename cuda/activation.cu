// Elementwise ops: gated activations, residual add, bias add, scale, softcap, column copy.
#include "common.cuh"

// Gated FFN activations over rows of n: g and u rows are ld_in apart (so the fused [gate|up]
// matvec output is read in place), y rows are n apart. grid (ceil(n/256), rows).
extern "C" __global__ void silu_mul_f32(const float* g, const float* u, float* y, int n, int ld_in) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    const float a = g[r * ld_in + i];
    y[r * n + i] = a / (1.0f + expf(-a)) * u[r * ld_in + i];
}

extern "C" __global__ void gelu_tanh_mul_f32(const float* g, const float* u, float* y, int n, int ld_in) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    const float a = g[r * ld_in + i];
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    y[r * n + i] = 0.5f * a * (1.0f + tanhf(c * (a + 0.044715f * a * a * a))) * u[r * ld_in + i];
}

// y = a + b over n floats.
extern "C" __global__ void add_f32(float* y, const float* a, const float* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

// y[r][i] = a[r][i] + bias[i]; rows of n. grid (ceil(n/256), rows).
extern "C" __global__ void add_bias_f32(float* y, const float* a, const float* bias, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    y[r * n + i] = a[r * n + i] + bias[i];
}

extern "C" __global__ void scale_f32(float* y, const float* x, float s, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}

// y = cap * tanh(x / cap): gemma's final-logit softcap.
extern "C" __global__ void softcap_f32(float* y, const float* x, float cap, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cap * tanhf(x[i] / cap);
}

// dst[r][i] = src[r][i] for i < n; src rows src_ld apart, dst rows dst_ld apart (stacking the
// outputs of a fused weight whose parts have different quant types). grid (ceil(n/256), rows).
extern "C" __global__ void copy_rows_f32(float* dst, const float* src, int n, int dst_ld, int src_ld) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const size_t r = blockIdx.y;
    dst[r * dst_ld + i] = src[r * src_ld + i];
}
