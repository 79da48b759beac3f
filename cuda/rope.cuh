// The rotation of one rope pair, shared by rope.cu's kernels and the fused qkv matvec
// (matvec.cu): one definition, so both give the same bits (decode fuses it, verify and prefill
// do not, and docs/design.md §5 rule 3 wants their rows identical). The products are spelled out
// (__fmul_rn / __fmaf_rn) so no contraction choice is left to the compiler in either context.
// angle = p * base^(-2i/hd) / freq_factors[i] (freq_factors may be null), p = pos * pos_scale.
#pragma once

// The angle's cosine and sine (pair i; the same for every head of a token, so prefill's rope
// takes them once a token and pair), then the rotation itself.
__device__ __forceinline__ void rope_angle(int i, int head_dim, float p, const float* freq_factors, float theta_base,
                                           float& c, float& s) {
    float inv_freq = powf(theta_base, -2.0f * (float)i / (float)head_dim);
    if (freq_factors) inv_freq /= freq_factors[i];
    sincosf(p * inv_freq, &s, &c);
}

__device__ __forceinline__ void rope_turn(float x0, float x1, float c, float s, float& y0, float& y1) {
    y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
    y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

__device__ __forceinline__ void rope_rotate(float x0, float x1, int i, int head_dim, float p,
                                            const float* freq_factors, float theta_base, float& y0, float& y1) {
    float c, s;
    rope_angle(i, head_dim, p, freq_factors, theta_base, c, s);
    rope_turn(x0, x1, c, s, y0, y1);
}
