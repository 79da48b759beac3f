// Rotary position embedding, in place, on q and k together (one launch per layer).
// x layout [T][n_heads][head_dim]; token t sits at position pos[t] (device memory, so a captured
// decode graph picks up the new position every replay). neox: rotate pairs (i, i + rot/2);
// normal (GPT-J / ggml mode 0): pairs (2i, 2i + 1). Only the first rot_dim dims rotate.
#include "common.cuh"

__device__ __forceinline__ void rope_head(float* x, int rot_dim, int pos, float theta_base, int neox) {
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        // inv_freq = base^(-2i/rot): same formula as the numpy reference, in float.
        const float inv_freq = powf(theta_base, -2.0f * (float)i / (float)rot_dim);
        float s, c;
        sincosf((float)pos * inv_freq, &s, &c);
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

// grid (n_q_heads + n_k_heads, T); block >= 32. q rows are q_ld floats apart per token, k rows k_ld.
extern "C" __global__ void rope_qk_f32(float* q, float* k, const int* pos, int n_q_heads, int n_k_heads,
                                       int head_dim, int rot_dim, int q_ld, int k_ld, float theta_base, int neox) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int p = pos[t];
    float* x = h < n_q_heads ? q + (size_t)t * q_ld + (size_t)h * head_dim
                             : k + (size_t)t * k_ld + (size_t)(h - n_q_heads) * head_dim;
    rope_head(x, rot_dim, p, theta_base, neox);
}
