// RMSNorm family. One block per row; rows are tokens (or heads, for qwen3/gemma3 q/k norm).
// Gemma's (1 + w) is already folded into the GGUF norm weights by llama.cpp's converter, so
// every architecture multiplies by w as stored.
#include "common.cuh"

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w over rows of n. Row r is head r % heads of token
// r / heads: x rows of tokens are x_ld floats apart (views of a fused qkv output), y's y_ld.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, int n, int heads, int x_ld,
                                        int y_ld, float eps) {
    __shared__ float scratch[32];
    const int t = blockIdx.x / heads, h = blockIdx.x % heads;
    const float* xr = x + (size_t)t * x_ld + (size_t)h * n;
    float* yr = y + (size_t)t * y_ld + (size_t)h * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// Fused residual add + norm: h[r] += d[r]; y[r] = rms_norm(h[r]) * w. Saves a launch and a
// round trip of h through memory per layer.
extern "C" __global__ void add_rms_norm_f32(float* h, const float* d, const float* w, float* y, int n, float eps) {
    __shared__ float scratch[32];
    float* hr = h + (size_t)blockIdx.x * n;
    const float* dr = d + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = hr[i] + dr[i];
        hr[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = hr[i] * inv * w[i];
}
