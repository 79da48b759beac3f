// Rotary position embedding, out of place: x [T][*] (rows x_ld floats apart, heads of head_dim
// inside) -> y [T][n_heads][head_dim] (rows y_ld apart). Token t sits at position pos[t] (device
// memory, so a captured decode graph picks up the new position every replay).
// neox: rotate pairs (i, i + hd/2); normal (GPT-J / ggml mode 0): pairs (2i, 2i + 1).
// angle = pos * pos_scale * base^(-2i/hd) / freq_factors[i] (freq_factors may be null).
#include "common.cuh"
#include "kv_q8_0.cuh"
#include "rope.cuh"

// Pair i of one head turned by the angle's (c, s). nw not null: x is first RMS-normed per head
// (x * inv * nw, as rms_norm_f32 writes it).
__device__ __forceinline__ void rope_pair(const float* xh, int head_dim, int i, float c, float s, int neox, int& a,
                                          int& b, float& ya, float& yb, float inv = 1.0f,
                                          const float* nw = nullptr) {
    a = neox ? i : 2 * i;
    b = neox ? i + head_dim / 2 : 2 * i + 1;
    const float x0 = nw ? xh[a] * inv * nw[a] : xh[a], x1 = nw ? xh[b] * inv * nw[b] : xh[b];
    rope_turn(x0, x1, c, s, ya, yb);
}

// grid (n_heads, T), block >= 32.
extern "C" __global__ void rope_f32(const float* x, float* y, const int* pos, const float* freq_factors,
                                    int head_dim, int x_ld, int y_ld, float theta_base, float pos_scale, int neox) {
    pdl_entry();
    const int h = blockIdx.x, t = blockIdx.y;
    const float* xh = x + (size_t)t * x_ld + (size_t)h * head_dim;
    float* yh = y + (size_t)t * y_ld + (size_t)h * head_dim;
    const float p = (float)pos[t] * pos_scale;
    for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
        int a, b;
        float c, s, ya, yb;
        rope_angle(i, head_dim, p, freq_factors, theta_base, c, s);
        rope_pair(xh, head_dim, i, c, s, neox, a, b, ya, yb);
        yh[a] = ya;
        yh[b] = yb;
    }
}

// One launch per layer for what attention needs before it reads the cache: rope q into q_out,
// rope k straight into the K cache and write v into the V cache, at position pos[t].
// grid (ceil((n_q + n_kv) / heads_per_block), T): a block takes heads_per_block heads of one token
// (1 for decode and verify; a few for prefill, ops.PREFILL_ROPE_HEADS: a token's pair angles,
// powf and sincosf, are the same for all its heads, so a block takes them once into shared
// memory; more heads a block run one after another, each a load and a block_sum deep).
// Every head's values are the same bits either way. Same arithmetic as rope_f32, then the cache's rounding, as kv_write_*:
// - f16 (Q8 false): kc, vc are half [n_kv][n_ctx][head_dim]; kd, vd unused;
// - q8_0 (Q8 true): kc, vc are int8 and kd, vd the half scales (cuda/kv_q8_0.cuh); the roped k
//   row is staged in shared memory so a warp can take each 32-value block's amax. The block
//   size must then be a multiple of 32 (the launches use 32..128 or head_dim threads).
// qn_w / kn_w not null (qwen3, gemma3): q and k heads are RMS-normed first, with the sum of
// squares taken exactly as rms_norm_f32 does when the block has head_dim threads (launch it so:
// the same bits as the separate norm launch).
template <bool Q8>
__device__ __forceinline__ void rope_qk_kv(const float* q, float* q_out, const float* k, const float* v, void* kc,
                                           void* vc, half* kd, half* vd, const int* pos, const float* freq_factors,
                                           int n_q, int n_kv, int head_dim, int q_ld, int k_ld, int v_ld, int n_ctx,
                                           float theta_base, float pos_scale, int neox, const float* qn_w,
                                           const float* kn_w, float eps, int heads_per_block) {
    __shared__ float scratch[32];
    __shared__ float k_s[Q8 ? KV_MAX_HEAD_DIM : 1];
    __shared__ float2 cs[KV_MAX_HEAD_DIM / 2];  // (cos, sin) of pair i
    const int t = blockIdx.y;
    const float p = (float)pos[t] * pos_scale;
    for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
        float c, s;
        rope_angle(i, head_dim, p, freq_factors, theta_base, c, s);
        cs[i] = make_float2(c, s);
    }
    __syncthreads();
    const int h0 = blockIdx.x * heads_per_block, h1 = min(n_q + n_kv, h0 + heads_per_block);
    for (int h = h0; h < h1; ++h) {
        const bool is_q = h < n_q;
        const int kvh = h - n_q;
        const float* xh = is_q ? q + (size_t)t * q_ld + (size_t)h * head_dim : k + (size_t)t * k_ld + (size_t)kvh * head_dim;
        const float* nw = is_q ? qn_w : kn_w;
        float inv = 1.0f;
        if (nw) {
            float ss = 0.0f;
            for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += xh[i] * xh[i];
            inv = rsqrtf(block_sum(ss, scratch) / (float)head_dim + eps);
        }
        if (is_q) {
            float* yh = q_out + ((size_t)t * n_q + h) * head_dim;
            for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
                int a, b;
                float ya, yb;
                rope_pair(xh, head_dim, i, cs[i].x, cs[i].y, neox, a, b, ya, yb, inv, nw);
                yh[a] = ya;
                yh[b] = yb;
            }
            continue;
        }
        const size_t row = (size_t)kvh * n_ctx + pos[t];  // the cache row of this kv head and position
        const float* vh = v + (size_t)t * v_ld + (size_t)kvh * head_dim;
        half* kr = (half*)kc + row * head_dim;
        for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
            int a, b;
            float ya, yb;
            rope_pair(xh, head_dim, i, cs[i].x, cs[i].y, neox, a, b, ya, yb, inv, nw);
            if constexpr (Q8) {
                k_s[a] = ya;
                k_s[b] = yb;
            } else {
                kr[a] = __float2half(ya);
                kr[b] = __float2half(yb);
            }
        }
        if constexpr (Q8) {
            const size_t scales = row * (head_dim / KV_Q8_0_BLOCK);
            __syncthreads();
            store_row_q8_0(k_s, head_dim, (int8_t*)kc + row * head_dim, kd + scales);
            store_row_q8_0(vh, head_dim, (int8_t*)vc + row * head_dim, vd + scales);
            __syncthreads();  // k_s is read before the next head writes it
        } else {
            half* vr = (half*)vc + row * head_dim;
            for (int i = threadIdx.x; i < head_dim; i += blockDim.x) vr[i] = __float2half(vh[i]);
        }
    }
}

// memra-kernel: rope_qk_kv_f16(PPPPPPPPiiiiiiiffiPPfi)
extern "C" __global__ void rope_qk_kv_f16(const float* q, float* q_out, const float* k, const float* v, half* kc,
                                          half* vc, const int* pos, const float* freq_factors, int n_q, int n_kv,
                                          int head_dim, int q_ld, int k_ld, int v_ld, int n_ctx, float theta_base,
                                          float pos_scale, int neox, const float* qn_w, const float* kn_w, float eps,
                                          int heads_per_block) {
    pdl_entry();
    rope_qk_kv<false>(q, q_out, k, v, kc, vc, nullptr, nullptr, pos, freq_factors, n_q, n_kv, head_dim, q_ld, k_ld,
                      v_ld, n_ctx, theta_base, pos_scale, neox, qn_w, kn_w, eps, heads_per_block);
}

// memra-kernel: rope_qk_kv_q8_0(PPPPPPPPPPiiiiiiiffiPPfi)
extern "C" __global__ void rope_qk_kv_q8_0(const float* q, float* q_out, const float* k, const float* v, int8_t* kc,
                                           int8_t* vc, half* kd, half* vd, const int* pos, const float* freq_factors,
                                           int n_q, int n_kv, int head_dim, int q_ld, int k_ld, int v_ld, int n_ctx,
                                           float theta_base, float pos_scale, int neox, const float* qn_w,
                                           const float* kn_w, float eps, int heads_per_block) {
    pdl_entry();
    rope_qk_kv<true>(q, q_out, k, v, kc, vc, kd, vd, pos, freq_factors, n_q, n_kv, head_dim, q_ld, k_ld, v_ld, n_ctx,
                     theta_base, pos_scale, neox, qn_w, kn_w, eps, heads_per_block);
}
