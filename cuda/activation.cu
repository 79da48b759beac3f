// Elementwise ops: gated activations, residual add, scale, softcap.
#include "common.cuh"

// Gated FFN activations over rows of n: g and u rows are ld_in apart (so a fused [gate|up]
// matvec output can be read in place), y rows are n apart. grid (ceil(n/256), rows).
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

// y = a + b (y may alias a).
extern "C" __global__ void add_f32(float* y, const float* a, const float* b, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float* x, float s, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// x = cap * tanh(x / cap): gemma's final-logit softcap.
extern "C" __global__ void softcap_f32(float* x, float cap, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}
