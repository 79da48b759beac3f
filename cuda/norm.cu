// RMSNorm family. One block per row; rows are tokens (or heads, for qwen3/gemma3 q/k norm).
// Gemma's (1 + w) is already folded into the GGUF norm weights by llama.cpp's converter, so
// every architecture multiplies by w as stored.
#include "common.cuh"
#include "quants.cuh"

// Write y's row r (already in global memory, written by this block) as q8_1 too, through
// quants.cuh's quantize_q8_1_at (the one q8_1 producer): the bytes quantize_q8_1 would write.
__device__ __forceinline__ void quantize_row(const float* yr, int8_t* xq_row, int n) {
    __syncthreads();  // the row's y values were written by other threads of the block
    const int kq = (n + 31) & ~31;
    for (int base = 0; base < kq; base += blockDim.x) {  // warp-uniform bounds: blockDim % 32 == 0
        const int i = base + threadIdx.x;
        if (i < kq) quantize_q8_1_at(i < n ? yr[i] : 0.0f, xq_row, kq, i);
    }
}

// The same when every thread holds the one value it wrote (rows of n <= blockDim.x, the launches'
// round_up(n, 32) threads up to 1024): no barrier, no re-read of the row. yi: y[threadIdx.x].
__device__ __forceinline__ void quantize_own(float yi, int8_t* xq_row, int n) {
    const int kq = (n + 31) & ~31;
    if ((int)threadIdx.x < kq) quantize_q8_1_at((int)threadIdx.x < n ? yi : 0.0f, xq_row, kq, threadIdx.x);
}

// Rows of up to NORM_VPT * blockDim.x values (decode's d = 4096 at 1024 threads) keep their values
// in registers, thread t holding values t, t + blockDim.x, ...: the multi-pass loops' per-thread
// order, so the same bits, without writing the row and reading it back between passes (the 8B's
// add_rms_norm took 5.2 µs a launch that way, for 16 KB). The q8_1 copy: quantize_row's loop
// with each value from a register.
#define NORM_VPT 4

__device__ __forceinline__ void quantize_regs(const float (&yv)[NORM_VPT], int8_t* xq_row, int n) {
    const int kq = (n + 31) & ~31;
#pragma unroll
    for (int k = 0; k < NORM_VPT; ++k) {
        const int i = k * blockDim.x + threadIdx.x;  // warp-uniform bound: blockDim % 32 == 0
        if (k * (int)blockDim.x < kq && i < kq) quantize_q8_1_at(i < n ? yv[k] : 0.0f, xq_row, kq, i);
    }
}

// y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w over rows of n. Row r is head r % heads of token
// r / heads: x rows of tokens are x_ld floats apart (views of a fused qkv output), y's y_ld.
// xq: when not null (heads == 1 only), y is also written as q8_1 rows of xq_stride bytes; xk: when not
// null (heads == 1, blockDim a multiple of 256), as q8_k256 rows (q8_k256_row_bytes(n) apart) too.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, int n, int heads, int x_ld,
                                        int y_ld, float eps, int8_t* xq, int xq_stride, uint8_t* xk) {
    pdl_entry();
    __shared__ float scratch[32];
    const int t = blockIdx.x / heads, h = blockIdx.x % heads;
    const float* xr = x + (size_t)t * x_ld + (size_t)h * n;
    float* yr = y + (size_t)t * y_ld + (size_t)h * n;
    if (n <= (int)blockDim.x) {  // one value per thread, kept in registers (same arithmetic as below)
        const int i = threadIdx.x;
        const float xi = i < n ? xr[i] : 0.0f;
        const float inv = rsqrtf(block_sum(xi * xi, scratch) / (float)n + eps);
        const float yi = i < n ? xi * inv * w[i] : 0.0f;
        if (i < n) yr[i] = yi;
        if (xq) quantize_own(yi, xq + (size_t)blockIdx.x * xq_stride, n);
        if (xk) q8_k256_row(yr, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
        return;
    }
    if (n <= NORM_VPT * (int)blockDim.x) {
        float xv[NORM_VPT], yv[NORM_VPT], ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int i = k * blockDim.x + threadIdx.x;
            xv[k] = i < n ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k)
            if (k * blockDim.x + threadIdx.x < n) ss += xv[k] * xv[k];
        const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int i = k * blockDim.x + threadIdx.x;
            yv[k] = i < n ? xv[k] * inv * w[i] : 0.0f;
            if (i < n) yr[i] = yv[k];
        }
        if (xq) quantize_regs(yv, xq + (size_t)blockIdx.x * xq_stride, n);
        if (xk) q8_k256_row(yr, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
    if (xq) quantize_row(yr, xq + (size_t)blockIdx.x * xq_stride, n);
    if (xk) q8_k256_row(yr, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
}

// Fused residual add + norm: h = a + b; y = rms_norm(h) * w (rows of n). Saves the add's launch
// and one round trip of h through memory per layer. h may alias a.
extern "C" __global__ void add_rms_norm_f32(float* h, const float* a, const float* b, const float* w, float* y, int n,
                                            float eps, int8_t* xq, int xq_stride, uint8_t* xk) {
    pdl_entry();
    __shared__ float scratch[32];
    const size_t r = (size_t)blockIdx.x * n;
    if (n <= (int)blockDim.x) {  // one value per thread, kept in registers (same arithmetic as below)
        const int i = threadIdx.x;
        const float v = i < n ? a[r + i] + b[r + i] : 0.0f;
        if (i < n) h[r + i] = v;
        const float inv = rsqrtf(block_sum(v * v, scratch) / (float)n + eps);
        const float yi = i < n ? v * inv * w[i] : 0.0f;
        if (i < n) y[r + i] = yi;
        if (xq) quantize_own(yi, xq + (size_t)blockIdx.x * xq_stride, n);
        if (xk) q8_k256_row(y + r, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
        return;
    }
    if (n <= NORM_VPT * (int)blockDim.x) {
        float hv[NORM_VPT], yv[NORM_VPT], ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int i = k * blockDim.x + threadIdx.x;
            hv[k] = i < n ? a[r + i] + b[r + i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int i = k * blockDim.x + threadIdx.x;
            if (i < n) {
                h[r + i] = hv[k];
                ss += hv[k] * hv[k];
            }
        }
        const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int i = k * blockDim.x + threadIdx.x;
            yv[k] = i < n ? hv[k] * inv * w[i] : 0.0f;
            if (i < n) y[r + i] = yv[k];
        }
        if (xq) quantize_regs(yv, xq + (size_t)blockIdx.x * xq_stride, n);
        if (xk) q8_k256_row(y + r, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = a[r + i] + b[r + i];
        h[r + i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[r + i] = h[r + i] * inv * w[i];
    if (xq) quantize_row(y + r, xq + (size_t)blockIdx.x * xq_stride, n);
    if (xk) q8_k256_row(y + r, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
}

// Decode's add + norm over several blocks a row (n of 1025..4096: the 8B's 4096, the 1B's 2048).
// With one block a row the row's q8_1 copy was quantized on one SM (4.7 µs a launch at d = 4096,
// for 16 KB). Here block s of a row writes values [256 s, 256 s + 256) of h, y and the q8_1 copy,
// and every block of the row sums the row's squares itself (a and b again, 32 KB from L2) in the
// order add_rms_norm_f32 takes at 1024 threads: warp w of 8 plays warps w, w + 8, w + 16, w + 24 of
// its 32, each lane that thread's 4 values in turn, through the same shuffle trees. So the same
// bits. h must not alias a or b: other blocks of the row read them after this one writes h.
#define NORM_SPLIT 256

extern "C" __global__ void __launch_bounds__(NORM_SPLIT) add_rms_norm_split_f32(
        float* h, const float* a, const float* b, const float* w, float* y, int n, float eps, int8_t* xq,
        int xq_stride, uint8_t* xk) {
    __shared__ float scratch[32];
    const int s = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int i = NORM_SPLIT * s + threadIdx.x;  // this thread's value of the slice
    const float wi = i < n ? w[i] : 0.0f;        // weights are constant: loaded before the wait
    pdl_entry();
    const size_t r = (size_t)blockIdx.y * n;
    float hv[4][NORM_VPT];  // [j][k]: value 32 (wid + 8 j) + lane + 1024 k = threadIdx.x + 256 (j + 4 k)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            const int v = threadIdx.x + NORM_SPLIT * (j + 4 * k);
            hv[j][k] = v < n ? a[r + v] + b[r + v] : 0.0f;
        }
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < NORM_VPT; ++k) {
            if ((int)threadIdx.x + NORM_SPLIT * (j + 4 * k) < n) ss += hv[j][k] * hv[j][k];
            if (j + 4 * k == s) mine = hv[j][k];
        }
        ss = warp_sum(ss);
        if (lane == 0) scratch[wid + 8 * j] = ss;
    }
    __syncthreads();
    const float inv = rsqrtf(warp_sum(scratch[lane]) / (float)n + eps);
    const float yi = i < n ? mine * inv * wi : 0.0f;
    if (i < n) {
        h[r + i] = mine;
        y[r + i] = yi;
    }
    const int kq = (n + 31) & ~31;
    if (xq && i < kq) quantize_q8_1_at(yi, xq + (size_t)blockIdx.y * xq_stride, kq, i);  // warp-uniform: kq % 32 == 0
    if (xk) q8_k256_block(yi, xk + (size_t)blockIdx.y * q8_k256_row_bytes(n), (n + 255) >> 8, i);  // a block, a super-block
}

// Gemma's sandwich norms: yb = rms_norm(b) * wb (the post-attention / post-FFN norm), then
// h = a + yb, y = rms_norm(h) * w (the next norm), one block per row of n. The same arithmetic,
// in the same order, as rms_norm_f32 then add_rms_norm_f32 with the same block size: saves a
// launch per pair. h may alias a.
extern "C" __global__ void norm_add_rms_norm_f32(float* h, const float* a, const float* b, const float* wb,
                                                 float* yb, float eps_b, const float* w, float* y, int n, float eps,
                                                 int8_t* xq, int xq_stride, uint8_t* xk) {
    pdl_entry();
    __shared__ float scratch[32];
    const size_t r = (size_t)blockIdx.x * n;
    if (n <= (int)blockDim.x) {  // one value per thread, kept in registers (same arithmetic as below)
        const int i = threadIdx.x;
        const float bi = i < n ? b[r + i] : 0.0f, ai = i < n ? a[r + i] : 0.0f;
        const float inv_b = rsqrtf(block_sum(bi * bi, scratch) / (float)n + eps_b);
        const float nb = i < n ? __fmul_rn(__fmul_rn(bi, inv_b), wb[i]) : 0.0f;
        const float v = ai + nb;
        if (i < n) { yb[r + i] = nb; h[r + i] = v; }
        const float inv = rsqrtf(block_sum(v * v, scratch) / (float)n + eps);
        const float yi = i < n ? v * inv * w[i] : 0.0f;
        if (i < n) y[r + i] = yi;
        if (xq) quantize_own(yi, xq + (size_t)blockIdx.x * xq_stride, n);
        if (xk) q8_k256_row(y + r, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
        return;
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += b[r + i] * b[r + i];
    const float inv_b = rsqrtf(block_sum(ss, scratch) / (float)n + eps_b);
    ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float nb = __fmul_rn(__fmul_rn(b[r + i], inv_b), wb[i]);  // rounded as stored, not fused into the add
        yb[r + i] = nb;
        const float v = a[r + i] + nb;
        h[r + i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[r + i] = h[r + i] * inv * w[i];
    if (xq) quantize_row(y + r, xq + (size_t)blockIdx.x * xq_stride, n);
    if (xk) q8_k256_row(y + r, xk + (size_t)blockIdx.x * q8_k256_row_bytes(n), n);
}
