// Rotary position embedding, out of place: x [T][*] (rows x_ld floats apart, heads of head_dim
// inside) -> y [T][n_heads][head_dim] (rows y_ld apart). Token t sits at position pos[t] (device
// memory, so a captured decode graph picks up the new position every replay).
// neox: rotate pairs (i, i + hd/2); normal (GPT-J / ggml mode 0): pairs (2i, 2i + 1).
// angle = pos * pos_scale * base^(-2i/hd) / freq_factors[i] (freq_factors may be null).
#include "common.cuh"

// grid (n_heads, T), block >= 32.
extern "C" __global__ void rope_f32(const float* x, float* y, const int* pos, const float* freq_factors,
                                    int head_dim, int x_ld, int y_ld, float theta_base, float pos_scale, int neox) {
    const int h = blockIdx.x, t = blockIdx.y;
    const float* xh = x + (size_t)t * x_ld + (size_t)h * head_dim;
    float* yh = y + (size_t)t * y_ld + (size_t)h * head_dim;
    const float p = (float)pos[t] * pos_scale;
    const int half = head_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float inv_freq = powf(theta_base, -2.0f * (float)i / (float)head_dim);
        if (freq_factors) inv_freq /= freq_factors[i];
        float s, c;
        sincosf(p * inv_freq, &s, &c);
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = xh[a], x1 = xh[b];
        yh[a] = x0 * c - x1 * s;
        yh[b] = x0 * s + x1 * c;
    }
}
