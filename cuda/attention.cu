// Attention over an f16 KV cache: the KV write, and one split-K flash kernel used for decode,
// verify and prefill alike (same kernel, same reduction order), plus the combine step.
//
// Cache layout per layer: K and V each [n_kv][n_ctx][HD] half. Query token t sits at position
// pos[t] (device memory) and sees keys max(0, pos[t] + 1 - window) .. pos[t] (window 0: all).
// The key range is cut into chunks of split_len keys (split s: keys start + s*split_len ...); grid.y
// covers the most splits any row needs, and a block with no keys writes m = -inf, l = 0. Each
// block writes an unnormalized partial output with its running max m and sum l; attn_combine
// merges the splits (flash-decoding). With one split and `out` given, the block writes the final
// output itself (bit-identical to the combine of one split) and the combine launch is skipped. Because the chunk boundaries depend only on the row's own
// position, a row's result is the same bit for bit whatever grid.y is: decode, verify and
// prefill agree, and a graph captured for a larger KV bucket gives eager's numbers.
#include "common.cuh"
#include "quants.cuh"

#define ATTN_WARPS 4
#define GMAX 8  // query heads per block (one kv head's GQA group, up to 8; more -> grid.x groups)

// k, v [T][*] with rows k_ld / v_ld floats apart, heads of HD inside a row.
// grid (T, n_kv); block 128.
extern "C" __global__ void kv_write_f16(const float* k, const float* v, half* kc, half* vc, const int* pos,
                                        int k_ld, int v_ld, int head_dim, int n_ctx) {
    pdl_entry();
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t dst = ((size_t)h * n_ctx + pos[t]) * head_dim;
    const float* ks = k + (size_t)t * k_ld + (size_t)h * head_dim;
    const float* vs = v + (size_t)t * v_ld + (size_t)h * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        kc[dst + i] = __float2half(ks[i]);
        vc[dst + i] = __float2half(vs[i]);
    }
}

// grid (n_kv * n_hgroups, n_splits, T), block 32 * ATTN_WARPS.
// q [T][q_ld] (heads of HD inside). opart [T][S][n_head][HD], ml [T][S][n_head][2].
// Each warp takes tiles of 32 keys (warp w: keys j0 + 32w, j0 + 32w + 128, ...). Scores: one key
// per lane, all the group's heads at once (the K row is read once). Values: the tile's
// probabilities go through shared memory; a V row is HD/8 lanes of one 16-byte load each, so a
// warp reads 32/(HD/8) rows per step and each lane issues all its loads of a tile (8 at a time)
// before the first use: one memory round trip per tile for HD 64, not one per key. The key groups'
// partial sums are added by shuffles once, at the end.
// xq: when not null and the block writes the final output (one split), that output is also
// written as q8_1 rows of xq_stride bytes (for the o matvec; quants.cuh's quantize_block_q8_1).
template <int HD>
__device__ void attn_split(const float* __restrict__ q, int q_ld, const half* __restrict__ kc,
                           const half* __restrict__ vc, float* __restrict__ opart, float* __restrict__ ml,
                           const int* __restrict__ pos, int n_head, int n_kv, int n_ctx, int window, float scale,
                           float softcap, int split_len, float* __restrict__ out, int8_t* __restrict__ xq,
                           int xq_stride) {
    constexpr int LPR = HD / 8;    // lanes per V row (8 dims, one 16-byte load each)
    constexpr int KG = 32 / LPR;   // V rows a warp reads per step (key groups)
    constexpr int KPL = 32 / KG;   // keys of a 32-key tile per lane (a multiple of 8)
    static_assert(KPL % 8 == 0, "V loads go 8 at a time");
    __shared__ __align__(16) float q_s[GMAX][HD];
    __shared__ float p_s[ATTN_WARPS][GMAX][32];
    __shared__ float m_w[ATTN_WARPS][GMAX], l_w[ATTN_WARPS][GMAX];
    __shared__ float o_w[ATTN_WARPS][GMAX][HD];

    const int group = n_head / n_kv;
    const int n_hgroups = (group + GMAX - 1) / GMAX;
    const int kvh = blockIdx.x / n_hgroups, hg = blockIdx.x % n_hgroups;
    const int h0 = kvh * group + hg * GMAX;
    const int g = min(GMAX, group - hg * GMAX);
    const int s = blockIdx.y, S = gridDim.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kg = lane / LPR, dseg = lane % LPR;

    const int p = pos[t];
    const int start = window > 0 ? max(0, p + 1 - window) : 0;
    const int j0 = start + s * split_len, j1 = min(p + 1, j0 + split_len);

    for (int i = threadIdx.x; i < GMAX * HD; i += blockDim.x) {
        const int hh = i / HD, d = i % HD;
        q_s[hh][d] = hh < g ? q[(size_t)t * q_ld + (size_t)(h0 + hh) * HD + d] * scale : 0.0f;
    }
    __syncthreads();

    float m[GMAX], l[GMAX], o[GMAX][8];  // o: dims dseg*8 .. +8 over this lane's keys
#pragma unroll
    for (int hh = 0; hh < GMAX; ++hh) {
        m[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[hh][e] = 0.0f;
    }

    const half* kbase = kc + (size_t)kvh * n_ctx * HD;
    const half* vbase = vc + (size_t)kvh * n_ctx * HD;
    for (int base = j0 + warp * 32; base < j1; base += 32 * ATTN_WARPS) {
        const int j = base + lane;
        const bool valid = j < j1;
        float sc[GMAX];
#pragma unroll
        for (int hh = 0; hh < GMAX; ++hh) sc[hh] = 0.0f;
        if (valid) {
            const int4* krow = reinterpret_cast<const int4*>(kbase + (size_t)j * HD);
#pragma unroll
            for (int c0 = 0; c0 < HD / 8; c0 += 8) {
                int4 raw[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) raw[u] = krow[c0 + u];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int c = c0 + u;
                    const half2* kh = reinterpret_cast<const half2*>(&raw[u]);
                    float kf[8];
#pragma unroll
                    for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(kh[i]); kf[2 * i] = f.x; kf[2 * i + 1] = f.y; }
#pragma unroll
                    for (int hh = 0; hh < GMAX; ++hh) {
                        if (hh < g) {
                            const float4 qa = *reinterpret_cast<const float4*>(&q_s[hh][8 * c]);
                            const float4 qb = *reinterpret_cast<const float4*>(&q_s[hh][8 * c + 4]);
                            sc[hh] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                                      qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < GMAX; ++hh) {
            if (hh >= g) continue;
            float x = sc[hh];
            if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
            x = valid ? x : -INFINITY;
            const float m_new = fmaxf(m[hh], warp_max(x));
            const float corr = expf(m[hh] - m_new);  // m = -inf at first: 0
            const float pj = valid ? expf(x - m_new) : 0.0f;
            l[hh] = l[hh] * corr + warp_sum(pj);
            m[hh] = m_new;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[hh][e] *= corr;
            p_s[warp][hh][lane] = pj;  // 0 for keys past the end
        }
        __syncwarp();
        // rows past the end are clamped to the last valid row (finite values, weight p = 0)
        const int last = min(32, j1 - base) - 1;
        const int4* vtile = reinterpret_cast<const int4*>(vbase + (size_t)base * HD) + dseg;
#pragma unroll
        for (int i0 = 0; i0 < KPL; i0 += 8) {
            int4 raw[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) raw[u] = vtile[(size_t)min(kg + KG * (i0 + u), last) * (HD / 8)];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int k = kg + KG * (i0 + u);
                const half2* vh = reinterpret_cast<const half2*>(&raw[u]);
                float v[8];
#pragma unroll
                for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(vh[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
#pragma unroll
                for (int hh = 0; hh < GMAX; ++hh) {
                    if (hh < g) {
                        const float pk = p_s[warp][hh][k];
#pragma unroll
                        for (int e = 0; e < 8; ++e) o[hh][e] += pk * v[e];
                    }
                }
            }
        }
        __syncwarp();
    }
    // add the key groups' partial sums (lanes dseg, dseg + LPR, ...)
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1) {
#pragma unroll
        for (int hh = 0; hh < GMAX; ++hh) {
            if (hh < g) {
#pragma unroll
                for (int e = 0; e < 8; ++e) o[hh][e] += __shfl_xor_sync(0xffffffffu, o[hh][e], off);
            }
        }
    }

    // merge the warps of this block
#pragma unroll
    for (int hh = 0; hh < GMAX; ++hh) {
        if (lane == 0) { m_w[warp][hh] = m[hh]; l_w[warp][hh] = l[hh]; }
        if (kg == 0) {
#pragma unroll
            for (int e = 0; e < 8; ++e) o_w[warp][hh][dseg * 8 + e] = o[hh][e];
        }
    }
    __syncthreads();
    // g * HD is a multiple of 32 and blockDim of 32: each warp's iteration is one whole q8_1 block
    for (int i = threadIdx.x; i < g * HD; i += blockDim.x) {
        const int hh = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) M = fmaxf(M, m_w[w][hh]);
        float acc = 0.0f, L = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < ATTN_WARPS; ++w) {
                const float c = expf(m_w[w][hh] - M);
                acc += c * o_w[w][hh][d];
                L += c * l_w[w][hh];
            }
        }
        if (out != nullptr && S == 1) {  // one split: the final output, as attn_combine would write it
            const float val = (1.0f * acc) / (1.0f * L);
            const int col = (h0 + hh) * HD + d;
            out[(size_t)t * n_head * HD + col] = val;
            if (xq) {
                int8_t* row = xq + (size_t)t * xq_stride;
                quantize_block_q8_1(val, row + col, reinterpret_cast<float2*>(row + n_head * HD) + (col >> 5));
            }
            continue;
        }
        const size_t row = ((size_t)t * S + s) * n_head + h0 + hh;
        opart[row * HD + d] = acc;
        if (d == 0) { ml[row * 2] = M; ml[row * 2 + 1] = L; }
    }
}

#define ATTN_KERNEL(HD)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * ATTN_WARPS) attn_split_hd##HD(                             \
        const float* q, int q_ld, const half* kc, const half* vc, float* opart, float* ml, const int* pos,       \
        int n_head, int n_kv, int n_ctx, int window, float scale, float softcap, int split_len,                 \
        float* out, int8_t* xq, int xq_stride) { pdl_entry();                                                                 \
        attn_split<HD>(q, q_ld, kc, vc, opart, ml, pos, n_head, n_kv, n_ctx, window, scale, softcap, split_len,  \
                       out, xq, xq_stride);                                                                      \
    }
// memra-kernel: attn_split_hd64(PiPPPPPiiiiffiPPi)
ATTN_KERNEL(64)
// memra-kernel: attn_split_hd128(PiPPPPPiiiiffiPPi)
ATTN_KERNEL(128)
// memra-kernel: attn_split_hd256(PiPPPPPiiiiffiPPi)
ATTN_KERNEL(256)

// out[t][h*HD + d] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s. grid (n_head, T), block HD.
// The split weights are computed once into shared memory; the sums run in split order, so an
// empty split (m = -inf: weight exactly 0) changes nothing. xq not null: out is also written as
// q8_1 rows of xq_stride bytes (a warp's 32 dims are one block).
#define COMBINE_MAX_SPLITS 1024
extern "C" __global__ void attn_combine(const float* opart, const float* ml, float* out, int n_head, int head_dim,
                                        int n_splits, int8_t* xq, int xq_stride) {
    pdl_entry();
    __shared__ float c_s[COMBINE_MAX_SPLITS];
    __shared__ float red[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const float* mlr = ml + ((size_t)t * n_splits * n_head + h) * 2;  // split s at mlr[s * n_head * 2]
    float M = -INFINITY;
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) M = fmaxf(M, mlr[(size_t)s * n_head * 2]);
    M = block_max(M, red);
    for (int s = threadIdx.x; s < n_splits; s += blockDim.x) c_s[s] = expf(mlr[(size_t)s * n_head * 2] - M);
    __syncthreads();
    float L = 0.0f;
    for (int s = 0; s < n_splits; ++s) L += c_s[s] * mlr[(size_t)s * n_head * 2 + 1];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_splits; ++s) acc += c_s[s] * opart[(((size_t)t * n_splits + s) * n_head + h) * head_dim + d];
        const float val = acc / L;
        const int col = h * head_dim + d;
        out[(size_t)t * n_head * head_dim + col] = val;
        if (xq) {
            int8_t* row = xq + (size_t)t * xq_stride;
            quantize_block_q8_1(val, row + col, reinterpret_cast<float2*>(row + n_head * head_dim) + (col >> 5));
        }
    }
}
