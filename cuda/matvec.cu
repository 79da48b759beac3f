// Decode matvec: quantize the activation once to q8_1, then y[t][r] = sum_k W[r][k] x[t][k] with
// int8 dot products (dp4a) per weight type; F16/BF16/F32 weights take a float path.
//
// One warp per R rows, MV_WARPS warps per block. Lane l walks units l, l+32, ... of the row (a
// unit: one 32-value block, or a quarter K-quant super-block), so a warp's weight loads are
// contiguous 16-byte loads over the repacked planes (quants.cuh). The activation unit is loaded
// once per column and reused for the R rows. Partial sums then go through one warp tree.
//
// Batched (C columns, for speculative verify) reads each weight unit once for all C columns, R
// rows per warp (2 or 4) sharing each column's activation loads.
// Per column, the order of every float operation is that of the one-column kernel (same units
// per lane, same tree), so verify gives bit-identical rows to decode (docs/design.md §5 rule 3).
//
// q8_1 activation buffer, per token t at t*stride (stride = q8_1_stride(K), see quant_ops.py):
//   int8 qs[Kq] | int8 qs2[Kq] | float4 ds[Kq/32] = (d1, sum, d2, 0)  (Kq = K rounded up to 32;
//   two int8 terms, the second the first's rounding residual: quants.cuh, 3.).
#include "common.cuh"
#include "quants.cuh"
#include "rope.cuh"
#include "tensor_core.cuh"

#define MV_WARPS 4

// ---- quantize_q8_1: x f32 [T][K] -> q8_1 rows -----------------------------------------------
// One warp per 32-value block, quantize_q8_1_at (quants.cuh) per lane.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int8_t* __restrict__ xq, int cols, int stride) {
    pdl_entry();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int kq = (cols + 31) & ~31;
    if (i >= kq) return;  // whole warps only: kq is a multiple of 32
    quantize_q8_1_at(i < cols ? x[(size_t)t * cols + i] : 0.0f, xq + (size_t)t * stride, kq, i);
}

// A warp's partial sums (per lane, before the warp tree) of rows row[0..R) for C columns. The
// rows are any valid rows: each row's arithmetic (units per lane, their order) does not depend
// on which other rows the warp holds. U units per lane per step: all their weight loads are
// issued before the first dot, so more bytes are in flight per thread (lane order of the units,
// hence every sum, is unchanged).
// LW: lanes a row (32, or 16 for rows of at most 16 units: two rows side by side in a warp).
template <class T, int R, int C, int U, int LW = 32>
__device__ __forceinline__ void matvec_dots(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                            const int8_t* __restrict__ xq, const int (&row)[R], int cols,
                                            int n_tokens, int stride, float (&acc)[R][C]) {
    const int lane = threadIdx.x & (LW - 1);
    const int nb = cols / T::QK;
    const int nu = nb * T::UNITS;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;

    for (int u0 = lane; u0 < nu; u0 += LW * U) {
        typename T::W w[U][R];
#pragma unroll
        for (int i = 0; i < U; ++i) {
            const int u = min(u0 + LW * i, nu - 1);  // clamped: loads stay in bounds, dots skipped
            const int b = u / T::UNITS, j = u % T::UNITS;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const size_t blk = (size_t)row[r] * nb + b;
                T::load_w(w[i][r], wq + blk * T::QB, wm + blk * T::MB, j);
            }
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (c < n_tokens) {
                const q8_1_row xrow = q8_1_row_at(xq + (size_t)c * stride, nb * T::QK);
                typename T::A a[U];
#pragma unroll
                for (int i = 0; i < U; ++i) {
                    const int u = min(u0 + LW * i, nu - 1);
                    T::load_a(a[i], xrow, u / T::UNITS, u % T::UNITS);
                }
#pragma unroll
                for (int i = 0; i < U; ++i) {
                    if (u0 + LW * i < nu) {
#pragma unroll
                        for (int r = 0; r < R; ++r) acc[r][c] = fadd(acc[r][c], T::dot(w[i][r], a[i]));
                    }
                }
            }
        }
    }
}

// U = 0: one unit per step with the next step's weight bytes loaded before this step's dots (a
// register double buffer). The K-quants split load_w in two, the raw loads now and the scale
// decode when the step runs, so the decode does not stall on the load just issued; other types
// load W a step early. Only the loads move: units per lane, their order and every float
// operation are U = 1's, so rows stay bit-identical to every other variant. H200, Q4_K 4096 x
// 14336 (the 8B's ffn_down): r1u1 24.3, r2u1 23.1, r2 double-buffered 19.6 µs (exp run, gpu-log).
template <class T>
struct prefetch_of {  // default: W itself, loaded a step early
    typedef typename T::W Raw;
    static QDEV void fetch(Raw& raw, const uint8_t* q, const uint8_t* m, int j) { T::load_w(raw, q, m, j); }
    static QDEV void unpack(typename T::W& w, const Raw& raw, int) { w = raw; }
};

template <>
struct prefetch_of<q4_K_t> {
    struct Raw { int4 q0, q1, m; };
    static QDEV void fetch(Raw& raw, const uint8_t* q, const uint8_t* m, int j) {
        raw.q0 = ld16(q + 32 * j);
        raw.q1 = ld16(q + 32 * j + 16);
        raw.m = ld16(m);
    }
    static QDEV void unpack(q4_K_t::W& w, const Raw& raw, int j) {
        w.q0 = raw.q0;
        w.q1 = raw.q1;
        kquant_scales_of(raw.m, j, w.dsc0, w.dsc1, w.dmn0, w.dmn1);
    }
};

template <>
struct prefetch_of<q5_K_t> {
    struct Raw { int4 h0, h1, q0, q1, m; };
    static QDEV void fetch(Raw& raw, const uint8_t* q, const uint8_t* m, int j) {
        raw.h0 = ld16(q);
        raw.h1 = ld16(q + 16);
        raw.q0 = ld16(q + 32 + 32 * j);
        raw.q1 = ld16(q + 32 + 32 * j + 16);
        raw.m = ld16(m);
    }
    static QDEV void unpack(q5_K_t::W& w, const Raw& raw, int j) {
        w.h0 = raw.h0;
        w.h1 = raw.h1;
        w.q0 = raw.q0;
        w.q1 = raw.q1;
        w.j = j;
        kquant_scales_of(raw.m, j, w.dsc0, w.dsc1, w.dmn0, w.dmn1);
    }
};

template <>
struct prefetch_of<q6_K_t> {
    struct Raw { int4 a, b, h; uint2 s8; float d; };
    static QDEV void fetch(Raw& raw, const uint8_t* q, const uint8_t* m, int j) {
        const int h = j >> 1, l0 = 16 * (j & 1);
        raw.a = ld16(q + 64 * h + l0);
        raw.b = ld16(q + 64 * h + 32 + l0);
        raw.h = ld16(q + 128 + 32 * h + l0);
        raw.s8 = *reinterpret_cast<const uint2*>(q + 192 + 8 * h);
        raw.d = ld_half(m);  // a conversion, not a decode: the load's use waits for it either way
    }
    static QDEV void unpack(q6_K_t::W& w, const Raw& raw, int j) {
        w.a = raw.a;
        w.b = raw.b;
        w.h = raw.h;
        q6_K_t::scales_of(w, raw.s8, j);
        w.d = raw.d;
    }
};

template <class T, int R, int C>
__device__ __forceinline__ void matvec_dots_db(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                               const int8_t* __restrict__ xq, const int (&row)[R], int cols,
                                               int n_tokens, int stride, float (&acc)[R][C]) {
    typedef prefetch_of<T> P;
    const int lane = threadIdx.x & 31;
    const int nb = cols / T::QK;
    const int nu = nb * T::UNITS;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
    typename P::Raw cur[R], next[R];
    auto fetch = [&](int u, typename P::Raw (&raw)[R]) {
        u = min(u, nu - 1);  // clamped: loads stay in bounds (the last step's fetch is not used)
        const int b = u / T::UNITS, j = u % T::UNITS;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const size_t blk = (size_t)row[r] * nb + b;
            P::fetch(raw[r], wq + blk * T::QB, wm + blk * T::MB, j);
        }
    };
    fetch(lane, cur);
    for (int u = lane; u < nu; u += 32) {
        fetch(u + 32, next);
        typename T::W w[R];
#pragma unroll
        for (int r = 0; r < R; ++r) P::unpack(w[r], cur[r], u % T::UNITS);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (c < n_tokens) {
                typename T::A a;
                T::load_a(a, q8_1_row_at(xq + (size_t)c * stride, nb * T::QK), u / T::UNITS, u % T::UNITS);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[r][c] = fadd(acc[r][c], T::dot(w[r], a));
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) cur[r] = next[r];
    }
}

// The sum over a row's LW lanes: warp_sum's butterfly from offset LW / 2 down. For a row of at most
// 16 units in 16 lanes this is warp_sum's result bit for bit: there lanes 16-31 hold +0.0 (no unit)
// and no lane holds -0.0 (fadd(0, x) is never -0), so warp_sum's first step adds exact zeros.
template <int LW>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
    for (int o = LW / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- int8 matvec -----------------------------------------------------------------------------
// FUSED: x is f32 and the block first quantizes it into shared memory (C rows of `stride` bytes,
// dynamic shared memory), saving the quantize_q8_1 launch; worth it for small K only.
template <class T, int R, int C, int U, bool FUSED, int LW = 32>
__device__ __forceinline__ void matvec_q(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                         const void* __restrict__ xsrc, float* __restrict__ y,
                                         int rows, int cols, int n_tokens, int stride) {
    extern __shared__ int4 xq_shared[];
    const int lane = threadIdx.x & 31;
    const int8_t* xq;
    if (FUSED) {
        const float* x = static_cast<const float*>(xsrc);
        int8_t* sq = reinterpret_cast<int8_t*>(xq_shared);
        const int kq = (cols + 31) & ~31;
        // all of a warp's loads of x first (up to 8 blocks per batch), then the reductions:
        // one L2 round trip per batch instead of one per block
        constexpr int PRE = 8;
        for (int t = 0; t < n_tokens && t < C; ++t)
            for (int blk0 = threadIdx.x >> 5; blk0 < kq >> 5; blk0 += PRE * MV_WARPS) {
                float xi[PRE];
#pragma unroll
                for (int p = 0; p < PRE; ++p) {
                    const int i = (blk0 + p * MV_WARPS) * 32 + lane;
                    xi[p] = i < cols ? x[(size_t)t * cols + i] : 0.0f;
                }
#pragma unroll
                for (int p = 0; p < PRE; ++p) {
                    const int blk = blk0 + p * MV_WARPS;
                    if (blk < kq >> 5) quantize_q8_1_at(xi[p], sq + t * stride, kq, blk * 32 + lane);
                }
            }
        __syncthreads();
        xq = sq;
    } else {
        xq = static_cast<const int8_t*>(xsrc);
    }
    static_assert(LW == 32 || (LW == 16 && U >= 1), "half-warp rows: the plain loop only");
    const int warp_row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * (32 / LW) * R;
    if (warp_row0 >= rows) return;  // whole warps only: the halves of a warp share its shuffles
    const int row0 = warp_row0 + (lane / LW) * R;
    int row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = min(row0 + r, rows - 1);  // clamped: loads stay in bounds
    float acc[R][C];
    if constexpr (U == 0) matvec_dots_db<T, R, C>(wq, wm, xq, row, cols, n_tokens, stride, acc);
    else matvec_dots<T, R, C, U, LW>(wq, wm, xq, row, cols, n_tokens, stride, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float v = lanes_sum<LW>(acc[r][c]);
            if (lane % LW == 0 && row0 + r < rows && c < n_tokens) y[(size_t)c * rows + row0 + r] = v;
        }
}

// ---- float matvec (F16/BF16/F32 weights, f32 activations) ------------------------------------
// Weight rows padded to ldw = round_up(cols, 8) values. x rows are `cols` floats; vector loads of
// x only when cols % 8 == 0 (then every row stays 16-byte aligned).
// MF_U units a lane a step: the step's weight loads are issued before its dots (the MoE router,
// K = 2048 in f32, is 8 units a lane, and the loop once kept about one unit's loads in flight).
// Units per lane, their order per column and every float operation are one unit a step's, so the
// same bits; the aligned-x test is taken once, outside the loop.
#define MF_U 4
template <class F, int C, bool VEC>
__device__ __forceinline__ void matvec_f_dots(const uint8_t* __restrict__ wrow, const float* __restrict__ x, int cols,
                                              int nu, int n_tokens, float (&acc)[C]) {
    const int lane = threadIdx.x & 31;
    for (int u0 = lane; u0 < nu; u0 += 32 * MF_U) {
        float wv[MF_U][8];
#pragma unroll
        for (int i = 0; i < MF_U; ++i)  // clamped: loads stay in bounds, dots skipped
            F::load8(wrow + (size_t)min(u0 + 32 * i, nu - 1) * F::QB, wv[i]);
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (c < n_tokens) {
#pragma unroll
                for (int i = 0; i < MF_U; ++i) {
                    const int u = u0 + 32 * i;
                    if (u < nu) {
                        const float* xr = x + (size_t)c * cols + 8 * u;
                        float xv[8];
                        if (VEC) {
                            const float4 a = *reinterpret_cast<const float4*>(xr), b = *reinterpret_cast<const float4*>(xr + 4);
                            xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w; xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
                        } else {
#pragma unroll
                            for (int e = 0; e < 8; ++e) xv[e] = 8 * u + e < cols ? xr[e] : 0.0f;
                        }
                        float s = 0.0f;
#pragma unroll
                        for (int e = 0; e < 8; ++e) s = fmaf(wv[i][e], xv[e], s);
                        acc[c] = fadd(acc[c], s);
                    }
                }
            }
        }
    }
}

template <class F, int C>
__device__ __forceinline__ void matvec_f(const uint8_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                         int rows, int cols, int n_tokens) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int nu = (cols + 7) >> 3;
    const uint8_t* wrow = w + (size_t)row * nu * F::QB;
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = 0.0f;
    if ((cols & 7) == 0) matvec_f_dots<F, C, true>(wrow, x, cols, nu, n_tokens, acc);  // x rows 16-byte aligned
    else matvec_f_dots<F, C, false>(wrow, x, cols, nu, n_tokens, acc);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float v = warp_sum(acc[c]);
        if (lane == 0 && c < n_tokens) y[(size_t)c * rows + row] = v;
    }
}

// ---- weight prefetch before the PDL wait ---------------------------------------------------
// Weights never change during a step, so a block may touch them before pdl_entry() waits for
// the previous kernel: under PDL this block is often resident while that kernel still runs.
// Each lane asks L2 for one 128-byte line of each of its warp's rows (q and meta planes; the
// first 4 KB of a row), so the first weight loads after the wait hit L2, not DRAM.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <class T, int R>
__device__ __forceinline__ void matvec_prefetch_rows(const uint8_t* wq, const uint8_t* wm, const int (&row)[R], int cols) {
    const int lane = threadIdx.x & 31;
    const size_t nb = cols / T::QK, qbytes = nb * T::QB, mbytes = nb * T::MB;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (128 * lane < qbytes) prefetch_l2(wq + (size_t)row[r] * qbytes + 128 * lane);
        if (128 * lane < mbytes) prefetch_l2(wm + (size_t)row[r] * mbytes + 128 * lane);
    }
}

template <class T, int R>
__device__ __forceinline__ void matvec_prefetch_q(const uint8_t* wq, const uint8_t* wm, int rows, int cols) {
    const int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * R;
    if (row0 >= rows) return;
    int row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = min(row0 + r, rows - 1);
    matvec_prefetch_rows<T, R>(wq, wm, row, cols);
}

template <class F>
__device__ __forceinline__ void matvec_prefetch_f(const uint8_t* w, int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const size_t bytes = (size_t)((cols + 7) >> 3) * F::QB;
    if (row < rows && 128 * lane < bytes) prefetch_l2(w + (size_t)row * bytes + 128 * lane);
}

// ---- one-token q|k|v matvec with rope and the KV write (llama, qwen2: no q/k norm) -------------
// Each warp takes one rope pair of rows of the stacked q|k|v weight: (i, i + hd/2) of a head for
// neox, (2i, 2i + 1) otherwise, so after the warp tree lane 0 holds both values of the pair. It
// adds the bias (qwen2), rotates q and k pairs with rope_rotate and writes q to q_out [n_q][hd]
// and k, v as f16 straight into the cache row at position pos[0] (kc, vc: half [n_kv][n_ctx][hd]).
// This replaces matvec + add_bias + rope_qk_kv for decode with the same bits: matvec_dots' sums
// do not depend on the rows a warp holds, x + bias is add_bias_f32's add, and rope_rotate is
// rope_qk_kv's rotation (prefill keeps the three launches). A verify pass's tokens are the grid's
// second dimension, token t at xq row t, pos[t] and q_out row t: each computed as its decode step.
// grid (ceil(rows / 2 / MV_WARPS), tokens), block 128; rows = q_rows + 2 * kv_rows, heads of head_dim.
template <class T>
__device__ __forceinline__ void matvec_qkv_rope(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                                const int8_t* __restrict__ xq, const float* __restrict__ bias,
                                                float* __restrict__ q_out, half* __restrict__ kc,
                                                half* __restrict__ vc, const int* __restrict__ pos,
                                                const float* __restrict__ freq_factors, int rows, int cols,
                                                int stride, int q_rows, int kv_rows, int head_dim, int n_ctx,
                                                float theta_base, float pos_scale, int neox) {
    xq += (size_t)blockIdx.y * stride;  // token blockIdx.y of a verify pass: its input, position, q row
    pos += blockIdx.y;
    q_out += (size_t)blockIdx.y * q_rows;
    const int pair = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const int off = neox ? head_dim / 2 : 1;  // row distance inside a pair
    const int base = (pair / off) * 2 * off + pair % off;
    const int row[2] = {min(base, rows - 2), min(base + off, rows - 1)};
    matvec_prefetch_rows<T, 2>(wq, wm, row, cols);
    pdl_entry();
    if (2 * pair >= rows) return;
    float acc[2][1];
    matvec_dots<T, 2, 1, 1>(wq, wm, xq, row, cols, 1, stride, acc);
    float x0 = warp_sum(acc[0][0]), x1 = warp_sum(acc[1][0]);
    if ((threadIdx.x & 31) != 0) return;
    if (bias) {
        x0 = x0 + bias[row[0]];
        x1 = x1 + bias[row[1]];
    }
    const int a = row[0] % head_dim, b = a + off;  // a, b: dims of the pair inside its head
    if (row[0] >= q_rows + kv_rows) {  // v: no rotation
        half* vr = vc + ((size_t)((row[0] - q_rows - kv_rows) / head_dim) * n_ctx + pos[0]) * head_dim;
        vr[a] = __float2half(x0);
        vr[b] = __float2half(x1);
        return;
    }
    float y0, y1;
    rope_rotate(x0, x1, neox ? a : a / 2, head_dim, (float)pos[0] * pos_scale, freq_factors, theta_base, y0, y1);
    if (row[0] < q_rows) {
        q_out[row[0]] = y0;
        q_out[row[1]] = y1;
    } else {
        half* kr = kc + ((size_t)((row[0] - q_rows) / head_dim) * n_ctx + pos[0]) * head_dim;
        kr[a] = __float2half(y0);
        kr[b] = __float2half(y1);
    }
}

// ---- entry points ----------------------------------------------------------------------------
// matvec_<type>_r<R>u<U>_c<C>(wq, wm, xq, y, rows, cols, n_tokens, stride): grid (ceil(rows / (4R)),
// ceil(n_tokens / C)), block 128; blockIdx.y takes columns C y .. C y + C - 1, so a few columns can
// spread over more blocks (verify on small models, where a warp's C dots in a row are the
// latency). U = 0 is the double-buffered loop (matvec_dots_db), one unit per step.
// matvec_<type>_fused_r<R>u<U>(wq, wm, x, y, rows, cols, n_tokens, stride): one column from f32 x,
// dynamic shared memory = stride bytes.
// Batched launches (C > 1) ask for one resident block per SM at least (launch bounds' second
// argument; 0 leaves ptxas its default): otherwise ptxas trades a few spilled registers for
// occupancy on the K-quants, whose two-term activations take 40 registers per column.
#define MV_MIN_BLOCKS(C) ((C) > 1 ? 1 : 0)
#define MATVEC_Q(TYPE, R, U, C)                                                                          \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32, MV_MIN_BLOCKS(C)) void                       \
    matvec_##TYPE##_r##R##u##U##_c##C(                                                                   \
        const uint8_t* wq, const uint8_t* wm, const int8_t* xq, float* y, int rows, int cols, int n_tokens, \
        int stride) {                                                                                    \
        matvec_prefetch_q<TYPE##_t, R>(wq, wm, rows, cols);                                              \
        pdl_entry();                                                                                     \
        const int c0 = blockIdx.y * C; /* this block's slice of the columns */                           \
        matvec_q<TYPE##_t, R, C, U, false>(wq, wm, xq + (size_t)c0 * stride, y + (size_t)c0 * rows, rows, \
                                           cols, n_tokens - c0, stride);                                 \
    }
#define MATVEC_QF(TYPE, R, U)                                                                             \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32) void matvec_##TYPE##_fused_r##R##u##U(         \
        const uint8_t* wq, const uint8_t* wm, const float* x, float* y, int rows, int cols, int n_tokens,  \
        int stride) {                                                                                     \
        matvec_prefetch_q<TYPE##_t, R>(wq, wm, rows, cols);                                               \
        pdl_entry();                                                                                      \
        matvec_q<TYPE##_t, R, 1, U, true>(wq, wm, x, y, rows, cols, n_tokens, stride);                    \
    }

#define MATVEC_QKV_ROPE(TYPE)                                                                                 \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32) void matvec_##TYPE##_qkv_rope(                          \
        const uint8_t* wq, const uint8_t* wm, const int8_t* xq, const float* bias, float* q_out, half* kc,        \
        half* vc, const int* pos, const float* freq_factors, int rows, int cols, int stride, int q_rows,           \
        int kv_rows, int head_dim, int n_ctx, float theta_base, float pos_scale, int neox) {                       \
        matvec_qkv_rope<TYPE##_t>(wq, wm, xq, bias, q_out, kc, vc, pos, freq_factors, rows, cols, stride, q_rows, \
                                  kv_rows, head_dim, n_ctx, theta_base, pos_scale, neox);                          \
    }

#define MATVEC_Q_ALL(TYPE)                                                                              \
    MATVEC_Q(TYPE, 1, 1, 1) MATVEC_Q(TYPE, 1, 2, 1) MATVEC_Q(TYPE, 1, 4, 1) MATVEC_Q(TYPE, 2, 1, 1)     \
    MATVEC_Q(TYPE, 2, 2, 1) MATVEC_Q(TYPE, 4, 1, 1)                                                     \
    MATVEC_Q(TYPE, 1, 0, 1) MATVEC_Q(TYPE, 2, 0, 1) MATVEC_Q(TYPE, 4, 0, 1)                             \
    MATVEC_Q(TYPE, 2, 1, 2) MATVEC_Q(TYPE, 2, 1, 4) MATVEC_Q(TYPE, 2, 1, 8) MATVEC_Q(TYPE, 2, 1, 16)    \
    MATVEC_Q(TYPE, 4, 1, 2) MATVEC_Q(TYPE, 4, 1, 4) MATVEC_Q(TYPE, 4, 1, 8) MATVEC_Q(TYPE, 4, 1, 16)    \
    MATVEC_QF(TYPE, 1, 1) MATVEC_QF(TYPE, 2, 1) MATVEC_QKV_ROPE(TYPE)

MATVEC_Q_ALL(q4_0)
MATVEC_Q_ALL(q4_1)
MATVEC_Q_ALL(q5_0)
MATVEC_Q_ALL(q5_1)
MATVEC_Q_ALL(q8_0)
MATVEC_Q_ALL(q4_K)
MATVEC_Q_ALL(q5_K)
MATVEC_Q_ALL(q6_K)
MATVEC_Q_ALL(q2_K)
MATVEC_Q_ALL(q3_K)
MATVEC_Q_ALL(iq4_xs)

// ---- Q4_K verify matvec on int8 tensor cores (2-16 columns) ---------------------------------------
// mma.m16n8k32 (s8 x s8 -> s32) gives a sub-block's integer dot for 16 rows x 8 columns exactly,
// whatever order the tensor core sums in, so the float steps after it can be the one-column
// kernel's, in its order: virtual lane L (of the decode warp's 32) sums units L, L+32, ... with
// fadd (kquant_combine_ds per unit), then warp_sum's butterfly over the 32 partials. Rows stay
// bit-identical to decode (tested); the dp4a work, two int8 terms per column, moves to the MMAs.
// Block: 8 warps, 16 rows, NT tiles of 8 columns. Warp w holds virtual lanes 4w..4w+3: its units
// at step i, 32i + 4w + l (l < 4), are the quarters of super-block 8i + w, so a row's scales load
// once a step. Thread (g = lane / 4, t = lane % 4) loads bytes 8t..8t+7 of a unit of rows g and
// g + 8. The k order inside an MMA is free (a dot product): those 8 values fill k slots 4t..4t+3
// and 16+4t..16+4t+3 of A, and values 8t..8t+7 of column g's activation the same slots of B.
// WIDE (the 8-column kernel): 16-byte loads of two units' bytes, then an 8-byte swap with thread
// t ^ 2 (swap_halves), so the thread's bytes are 8 pi(t) .. + 7, in A and B alike: half the warp
// loads, each touching the same 8 lines.
// grid ceil(rows / 16), block 256; y [n_tokens][rows]; n_tokens <= 8 NT.
#define MMA_WARPS 8

__device__ __forceinline__ uint2 ld8(const void* p) { return *reinterpret_cast<const uint2*>(p); }

// v: bytes 8t..8t+7 of a 32-byte span (quads 2t, 2t + 1; quads 0-3 the first unit's, 4-7 the
// second's). Returns (the first unit's quad pi(t), the second's), pi(t) = 2 (t % 2) + t / 2.
__device__ __forceinline__ int2 swap_quads(uint2 v, int t) {
    const bool first = t < 2;
    const int got = __shfl_xor_sync(0xffffffffu, (int)(first ? v.y : v.x), 2);
    return first ? make_int2((int)v.x, got) : make_int2(got, (int)v.y);
}

// v: bytes 16t..16t+15 of a 64-byte span (the first unit's 32 bytes, then the second's). Returns
// bytes 8 pi(t) .. + 7 of each unit (pi as swap_quads'), one 8-byte swap with thread t ^ 2.
__device__ __forceinline__ void swap_halves(int4 v, int t, uint2& first_unit, uint2& second_unit) {
    const bool first = t < 2;
    const int2 got = make_int2(__shfl_xor_sync(0xffffffffu, first ? v.z : v.x, 2),
                               __shfl_xor_sync(0xffffffffu, first ? v.w : v.y, 2));
    first_unit = first ? make_uint2(v.x, v.y) : make_uint2(got.x, got.y);
    second_unit = first ? make_uint2(got.x, got.y) : make_uint2(v.z, v.w);
}

// The block's per-virtual-lane partials (acc[l][nt][e]: virtual lane 4 warp + l, D element e of
// column tile nt) summed as decode's warp_sum sums its lanes, then y's 16 rows x 8 NT columns.
template <int NT>
__device__ __forceinline__ void mma_reduce_store(const float (&acc)[4][NT][4], float* __restrict__ y, int row0,
                                                 int rows, int n_tokens) {
    constexpr int C = 8 * NT;
    __shared__ float part[32][16][C];  // virtual lane, row, column
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int l = 0; l < 4; ++l)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[4 * warp + l][g + 8 * (e >> 1)][8 * nt + 2 * t + (e & 1)] = acc[l][nt][e];
    __syncthreads();
    // warp_sum's butterfly as lane 0 sees it: at distance o, partial L (< o) adds partial L + o
    for (int i = threadIdx.x; i < 16 * C; i += blockDim.x) {
        const int r = i / C, c = i % C;
        float p[32];
#pragma unroll
        for (int L = 0; L < 32; ++L) p[L] = part[L][r][c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int L = 0; L < o; ++L) p[L] = p[L] + p[L + o];
        if (row0 + r < rows && c < n_tokens) y[(size_t)c * rows + row0 + r] = p[0];
    }
}

// The setup both tensor-core kernels share: the first 2 KB of each of the block's 16 rows into L2
// before the PDL wait (weights never change in a step; sb_bytes a super-block), then the rows
// g, g + 8 clamped so loads stay in bounds, each column tile's activation row for B (xb: column
// 8 nt + g, plus x_off bytes), its q8_1 scales (xd: column 8 nt + lane % 8's) and zeroed partials.
template <int NT>
__device__ __forceinline__ void mma_setup(const uint8_t* __restrict__ wq, int sb_bytes, const int8_t* __restrict__ xq,
                                          int rows, int n_tokens, int stride, int nb, int x_off, int& ra, int& rb,
                                          const int8_t* (&xb)[NT], const float4* (&xd)[NT], float (&acc)[4][NT][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, row0 = blockIdx.x * 16;
    {
        const int r = min(row0 + (threadIdx.x >> 4), rows - 1), k = 128 * (threadIdx.x & 15);
        if (k < nb * sb_bytes) prefetch_l2(wq + (size_t)r * nb * sb_bytes + k);
    }
    pdl_entry();
    ra = min(row0 + g, rows - 1);
    rb = min(row0 + g + 8, rows - 1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        xb[nt] = xq + (size_t)min(8 * nt + g, n_tokens - 1) * stride + x_off;
        xd[nt] = q8_1_row_at(xq + (size_t)min(8 * nt + (lane & 7), n_tokens - 1) * stride, 256 * nb).ds;
    }
#pragma unroll
    for (int l = 0; l < 4; ++l)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[l][nt][e] = 0.0f;
}

template <int NT, bool WIDE>
__device__ __forceinline__ void matvec_q4_K_mma(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                                const int8_t* __restrict__ xq, float* __restrict__ y, int rows,
                                                int cols, int n_tokens, int stride) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nb = cols / 256, kq = nb * 256;
    int ra, rb;
    const int8_t* xb[NT];  // B: column 8 nt + g
    const float4* xd[NT];  // column 8 nt + lane % 8's (d1, sum, d2, 0), shared out by shuffles
    float acc[4][NT][4];
    mma_setup<NT>(wq, 128, xq, rows, n_tokens, stride, nb, 0, ra, rb, xb, xd, acc);

    for (int b = warp; b < nb; b += MMA_WARPS) {
        const size_t ba = (size_t)ra * nb + b, bb = (size_t)rb * nb + b;
        uint2 wa[4], wb[4];
        if (WIDE) {  // 16-byte loads, then bytes 8 pi(t) .. + 7 of each unit (swap_halves)
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                swap_halves(ld16(wq + ba * 128 + 64 * m + 16 * t), t, wa[2 * m], wa[2 * m + 1]);
                swap_halves(ld16(wq + bb * 128 + 64 * m + 16 * t), t, wb[2 * m], wb[2 * m + 1]);
            }
        } else {
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                wa[l] = ld8(wq + ba * 128 + 32 * l + 8 * t);
                wb[l] = ld8(wq + bb * 128 + 32 * l + 8 * t);
            }
        }
        const int4 ma = ld16(wm + ba * 16), mb = ld16(wm + bb * 16);
        // the super-block's 8 q8_1 scales of all 8 columns in two loads a warp (8 lines each), not
        // one load per unit and column (8 lines each): lane holds column lane % 8, block 4j + lane / 8
        float4 ds[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) ds[nt][j] = xd[nt][8 * b + 4 * j + (lane >> 3)];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            float dsc[2][2], dmn[2][2];  // [row g, g + 8][sub-block 2l, 2l + 1]
            kquant_scales_of(ma, l, dsc[0][0], dsc[0][1], dmn[0][0], dmn[0][1]);
            kquant_scales_of(mb, l, dsc[1][0], dsc[1][1], dmn[1][0], dmn[1][1]);
            int a[2][4];  // low nibbles: sub-block 2l; high: 2l + 1
            const int v[4] = {(int)wa[l].x, (int)wb[l].x, (int)wa[l].y, (int)wb[l].y};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[0][i] = v[i] & 0x0F0F0F0F;
                a[1][i] = (v[i] >> 4) & 0x0F0F0F0F;
            }
            const int blk = 8 * b + 2 * l;  // q8_1 block of sub-block 2l
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                uint2 x[2][2];  // [sub-block][term]: this thread's 8 values
                if (WIDE) {
                    swap_halves(ld16(xb[nt] + 32 * blk + 16 * t), t, x[0][0], x[1][0]);
                    swap_halves(ld16(xb[nt] + kq + 32 * blk + 16 * t), t, x[0][1], x[1][1]);
                } else {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        x[h][0] = ld8(xb[nt] + 32 * (blk + h) + 8 * t);
                        x[h][1] = ld8(xb[nt] + kq + 32 * (blk + h) + 8 * t);
                    }
                }
                int s[2][2][4];  // [sub-block][term][D element]
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    mma_s8_16x8x32(s[h][0], a[h], (int)x[h][0].x, (int)x[h][0].y);
                    mma_s8_16x8x32(s[h][1], a[h], (int)x[h][1].x, (int)x[h][1].y);
                }
                // xs[c][h]: column 2t + c's scales of sub-block 2l + h; block q of the super-block
                // is in lane (column) + 8 (q % 4), register q / 4
                float4 xs[2][2];
#pragma unroll
                for (int c = 0; c < 2; ++c)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int q = 2 * l + h, src = 2 * t + c + 8 * (q & 3);
                        const float4 d = ds[nt][q >> 2];
                        xs[c][h] = make_float4(__shfl_sync(0xffffffffu, d.x, src), __shfl_sync(0xffffffffu, d.y, src),
                                               __shfl_sync(0xffffffffu, d.z, src), 0.0f);
                    }
#pragma unroll
                for (int e = 0; e < 4; ++e) {  // D element e: row g + 8 (e >> 1), column 8 nt + 2t + (e & 1)
                    const int r = e >> 1, c = e & 1;
                    const float v = kquant_combine_ds(dsc[r][0], dmn[r][0], dsc[r][1], dmn[r][1], xs[c][0], xs[c][1],
                                                      make_int2(s[0][0][e], s[0][1][e]),
                                                      make_int2(s[1][0][e], s[1][1][e]));
                    acc[l][nt][e] = fadd(acc[l][nt][e], v);
                }
            }
        }
    }
    mma_reduce_store<NT>(acc, y, row0, rows, n_tokens);
}

// ---- Q6_K verify matvec on int8 tensor cores -------------------------------------------------------
// The Q4_K kernel's plan with Q6_K's unit: unit j of super-block b (h = j / 2, l0 = 16 (j % 2)) is
// values 128h + 32k + l0 .. + 15 for k = 0..3, each 16 with its own int8 scale, so the integer
// sums come from mma.m16n8k16 (one 16-value group, 16 rows x 8 columns) and the float steps are
// q6_K_t::dot's: sum over k of act_dot(d1, d2, sc s, .) in k order, times d.
// Loads are 8 bytes (a warp load touches 8 lines for 256 bytes, not 128: the Q4_K kernel was
// L1-bound): thread t loads bytes 8t..8t+7 of the 32 that units 2h and 2h+1 span in a ql, qh or
// activation row, then swaps a word with thread t ^ 2 (swap_quads), so each thread holds the same
// quad, 4 pi(t) .. + 3, of both units' 16 values: its k slots of the MMA, in A and B alike.
__device__ __forceinline__ void mma_s8_16x8x16(int (&d)[4], int a0, int a1, int b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// Q6_K's 6-bit values, minus 32, of group k from a row's ql word of k's parity and its qh word.
__device__ __forceinline__ int q6_K_quads(int ql, int qh, int k) {
    const int lo = (ql >> (4 * (k >> 1))) & 0x0F0F0F0F;
    const int hi = ((qh >> (2 * k)) & 0x03030303) << 4;
    return vsub4(lo | hi, 0x20202020);
}

template <int NT>
__device__ __forceinline__ void matvec_q6_K_mma(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                                const int8_t* __restrict__ xq, float* __restrict__ y, int rows,
                                                int cols, int n_tokens, int stride) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const int nb = cols / 256, kq = nb * 256;
    int ra, rb;
    const int8_t* xb[NT];  // B: column 8 nt + g, from this thread's 8 bytes
    const float4* xd[NT];
    float acc[4][NT][4];
    mma_setup<NT>(wq, 208, xq, rows, n_tokens, stride, nb, 8 * t, ra, rb, xb, xd, acc);

    for (int b = warp; b < nb; b += MMA_WARPS) {
        const uint8_t* p[2] = {wq + ((size_t)ra * nb + b) * 208, wq + ((size_t)rb * nb + b) * 208};
        uint2 raw[2][2][3];  // [row g, g + 8][h]: ql of even k, of odd k, qh; bytes 8t..8t+7
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                raw[r][h][0] = ld8(p[r] + 64 * h + 8 * t);
                raw[r][h][1] = ld8(p[r] + 64 * h + 32 + 8 * t);
                raw[r][h][2] = ld8(p[r] + 128 + 32 * h + 8 * t);
            }
        const int4 sc16[2] = {ld16(p[0] + 192), ld16(p[1] + 192)};  // the 16 int8 scales of each row
        const float d[2] = {ld_half(wm + 2 * ((size_t)ra * nb + b)), ld_half(wm + 2 * ((size_t)rb * nb + b))};
        float4 ds[NT][2];  // lane: column lane % 8, q8_1 block 4i + lane / 8 of the super-block
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 2; ++i) ds[nt][i] = xd[nt][8 * b + 4 * i + (lane >> 3)];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int a[2][4][2];  // [unit 2h + u][group k][row g, g + 8]
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int2 ql0 = swap_quads(raw[r][h][0], t), ql1 = swap_quads(raw[r][h][1], t);
                const int2 qh = swap_quads(raw[r][h][2], t);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    a[0][k][r] = q6_K_quads((k & 1) ? ql1.x : ql0.x, qh.x, k);
                    a[1][k][r] = q6_K_quads((k & 1) ? ql1.y : ql0.y, qh.y, k);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                int2 xw[4][2];  // [group k][term]: (unit 2h's quad, unit 2h + 1's)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int8_t* x = xb[nt] + 32 * (8 * b + 4 * h + k);
                    xw[k][0] = swap_quads(ld8(x), t);
                    xw[k][1] = swap_quads(ld8(x + kq), t);
                }
                float x1[4][2], x2[4][2];  // column 2t + c's (d1, d2) of block 4h + k: lane (column) + 8k
#pragma unroll
                for (int k = 0; k < 4; ++k)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int src = 2 * t + c + 8 * k;
                        x1[k][c] = __shfl_sync(0xffffffffu, ds[nt][h].x, src);
                        x2[k][c] = __shfl_sync(0xffffffffu, ds[nt][h].z, src);
                    }
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int j = 2 * h + u;
                    int s[4][2][4];  // [group][term][D element]
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        mma_s8_16x8x16(s[k][0], a[u][k][0], a[u][k][1], u ? xw[k][0].y : xw[k][0].x);
                        mma_s8_16x8x16(s[k][1], a[u][k][0], a[u][k][1], u ? xw[k][1].y : xw[k][1].x);
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) {  // D element e: row g + 8 (e >> 1), column 8 nt + 2t + (e & 1)
                        const int r = e >> 1, c = e & 1;
                        float sum = 0.0f;
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            const int byte = 8 * h + 2 * k + u;  // scales[8h + 2k + j % 2]
                            const int sc = (int)(int8_t)(lane_of(sc16[r], byte >> 2) >> (8 * (byte & 3)));
                            sum = act_dot(x1[k][c], x2[k][c], make_int2(sc * s[k][0][e], sc * s[k][1][e]), sum);
                        }
                        acc[j][nt][e] = fadd(acc[j][nt][e], fmul(d[r], sum));
                    }
                }
            }
        }
    }
    mma_reduce_store<NT>(acc, y, row0, rows, n_tokens);
}

// matvec_<type>_mma_c<C>(wq, wm, xq, y, rows, cols, n_tokens, stride): grid (ceil(rows / 16),
// ceil(n_tokens / C)), block 256; blockIdx.y takes columns C y .. C y + C - 1.
#define MATVEC_MMA(NAME, FN, NT, C)                                                                        \
    extern "C" __global__ __launch_bounds__(MMA_WARPS * 32) void NAME##_c##C(                               \
        const uint8_t* wq, const uint8_t* wm, const int8_t* xq, float* y, int rows, int cols, int n_tokens, \
        int stride) {                                                                                     \
        const int c0 = blockIdx.y * C;                                                                    \
        FN(wq, wm, xq + (size_t)c0 * stride, y + (size_t)c0 * rows, rows, cols, n_tokens - c0, stride);   \
    }
// 8 columns with 16-byte loads, 16 with 8-byte ones: H100, 8B verify of 8 rows 1.95x -> 1.85x a
// decode step with WIDE; 9 rows (the 16-column kernel) 2.80x -> 2.88x (session 41)
MATVEC_MMA(matvec_q4_K_mma, (matvec_q4_K_mma<1, true>), 1, 8)
MATVEC_MMA(matvec_q4_K_mma, (matvec_q4_K_mma<2, false>), 2, 16)
MATVEC_MMA(matvec_q6_K_mma, matvec_q6_K_mma<1>, 1, 8)
MATVEC_MMA(matvec_q6_K_mma, matvec_q6_K_mma<2>, 2, 16)

// ---- MoE: the routed experts' matvec ------------------------------------------------------------
// One launch for every (token, chosen expert) slot: grid (ceil(rows / MV_WARPS), n_slots), slot s
// = t * top_k + j runs expert ids[s] on its input row, as the one-token kernel (r1u1) would:
// the same units per lane and warp tree, so a slot's rows equal a plain matvec of that expert.
// table[e]: the base of expert e's repacked weight (q plane, its meta plane at meta_offset), in
// a VRAM slot or, under the expert cache, in host memory mapped for the device (a miss read in
// place: engine/gpu/expert_cache.py). x_per_slot: slot s reads xq row s (down: each slot has its
// own activation), else row s / top_k (gate|up: the token's). y: [n_slots][rows].
template <class T, int R, int U, int LW = 32>
__device__ __forceinline__ void moe_matvec(const unsigned long long* __restrict__ table, long long meta_offset,
                                           const int* __restrict__ ids, const int8_t* __restrict__ xq,
                                           float* __restrict__ y, int rows, int cols, int stride, int top_k,
                                           int x_per_slot) {
    pdl_entry();  // ids come from the router kernel just before
    const int s = blockIdx.y;
    const uint8_t* wq = reinterpret_cast<const uint8_t*>(table[ids[s]]);
    const int8_t* x = xq + (size_t)(x_per_slot ? s : s / top_k) * stride;
    matvec_q<T, R, 1, U, false, LW>(wq, wq + meta_offset, x, y + (size_t)s * rows, rows, cols, 1, stride);
}

// moe_matvec_<type>_r<R>u<U>: grid (ceil(rows / (4 R)), slots), block 128. Any R, U gives the same
// bits (a row's sums do not depend on the rows its warp holds).
#define MOE_MATVEC_RU(TYPE, R, U)                                                                            \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32) void moe_matvec_##TYPE##_r##R##u##U(                  \
        const unsigned long long* table, long long meta_offset, const int* ids, const int8_t* xq, float* y,     \
        int rows, int cols, int stride, int top_k, int x_per_slot) {                                          \
        moe_matvec<TYPE##_t, R, U>(table, meta_offset, ids, xq, y, rows, cols, stride, top_k, x_per_slot);      \
    }
// moe_matvec_<type>_r<R>h: rows of at most 16 units (the experts' down at FFN 768 in 64-value units:
// 12) in half-warps, two rows side by side, so 4 R rows a warp; the same bits (lanes_sum).
#define MOE_MATVEC_H(TYPE, R)                                                                                 \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32) void moe_matvec_##TYPE##_r##R##h(                      \
        const unsigned long long* table, long long meta_offset, const int* ids, const int8_t* xq, float* y,     \
        int rows, int cols, int stride, int top_k, int x_per_slot) {                                          \
        moe_matvec<TYPE##_t, R, 1, 16>(table, meta_offset, ids, xq, y, rows, cols, stride, top_k, x_per_slot);  \
    }
#define MOE_MATVEC(TYPE)       \
    MOE_MATVEC_RU(TYPE, 1, 1)  \
    MOE_MATVEC_RU(TYPE, 2, 1)  \
    MOE_MATVEC_RU(TYPE, 4, 1)  \
    MOE_MATVEC_H(TYPE, 2)      \
    MOE_MATVEC_H(TYPE, 4)

MOE_MATVEC(q4_0)
MOE_MATVEC(q4_1)
MOE_MATVEC(q5_0)
MOE_MATVEC(q5_1)
MOE_MATVEC(q8_0)
MOE_MATVEC(q4_K)
MOE_MATVEC(q5_K)
MOE_MATVEC(q6_K)
MOE_MATVEC(q2_K)
MOE_MATVEC(q3_K)
MOE_MATVEC(iq4_xs)

// matvec_<type>_c<C>(w, x, y, rows, cols, n_tokens): grid (ceil(rows / 4), ceil(n_tokens / C)), block 128.
#define MATVEC_F(TYPE, C)                                                                                  \
    extern "C" __global__ __launch_bounds__(MV_WARPS * 32) void matvec_##TYPE##_c##C(                      \
        const uint8_t* w, const float* x, float* y, int rows, int cols, int n_tokens) {                    \
        matvec_prefetch_f<TYPE##_t>(w, rows, cols);                                                        \
        pdl_entry();                                                                                       \
        const int c0 = blockIdx.y * C;                                                                     \
        matvec_f<TYPE##_t, C>(w, x + (size_t)c0 * cols, y + (size_t)c0 * rows, rows, cols, n_tokens - c0);  \
    }

#define MATVEC_F_ALL(TYPE) \
    MATVEC_F(TYPE, 1)      \
    MATVEC_F(TYPE, 2)      \
    MATVEC_F(TYPE, 4)      \
    MATVEC_F(TYPE, 8)      \
    MATVEC_F(TYPE, 16)

MATVEC_F_ALL(f16)
MATVEC_F_ALL(bf16)
MATVEC_F_ALL(f32)

// Registry signatures of the macro-made entry points (engine/gpu/build.py reads these lines).
// memra-kernel: matvec_q4_0_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_0_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_0_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_0_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q4_0_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q4_0_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q4_1_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_1_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_1_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_1_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q4_1_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q4_1_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q5_0_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_0_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_0_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_0_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q5_0_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q5_0_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q5_1_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_1_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_1_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_1_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q5_1_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q5_1_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q8_0_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q8_0_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q8_0_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q8_0_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q8_0_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q8_0_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q4_K_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_K_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q4_K_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q4_K_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q4_K_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q4_K_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q5_K_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_K_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q5_K_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q5_K_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q5_K_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q5_K_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q6_K_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q6_K_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q6_K_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q6_K_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q6_K_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q6_K_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q2_K_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q2_K_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q2_K_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q2_K_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q2_K_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q2_K_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q3_K_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_q3_K_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_q3_K_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_q3_K_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_q3_K_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_q3_K_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_iq4_xs_r1u1_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r1u2_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r1u4_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u1_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u2_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u1_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r1u0_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u0_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u0_c1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u1_c2(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u1_c4(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u1_c8(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r2u1_c16(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u1_c2(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u1_c4(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u1_c8(PPPPiiii)
// memra-kernel: matvec_iq4_xs_r4u1_c16(PPPPiiii)
// memra-kernel: matvec_iq4_xs_fused_r1u1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_fused_r2u1(PPPPiiii)
// memra-kernel: matvec_iq4_xs_qkv_rope(PPPPPPPPPiiiiiiiffi)
// memra-kernel: matvec_q4_K_mma_c8(PPPPiiii)
// memra-kernel: matvec_q4_K_mma_c16(PPPPiiii)
// memra-kernel: matvec_q6_K_mma_c8(PPPPiiii)
// memra-kernel: matvec_q6_K_mma_c16(PPPPiiii)
// memra-kernel: matvec_f16_c1(PPPiii)
// memra-kernel: matvec_f16_c2(PPPiii)
// memra-kernel: matvec_f16_c4(PPPiii)
// memra-kernel: matvec_f16_c8(PPPiii)
// memra-kernel: matvec_f16_c16(PPPiii)
// memra-kernel: matvec_bf16_c1(PPPiii)
// memra-kernel: matvec_bf16_c2(PPPiii)
// memra-kernel: matvec_bf16_c4(PPPiii)
// memra-kernel: matvec_bf16_c8(PPPiii)
// memra-kernel: matvec_bf16_c16(PPPiii)
// memra-kernel: matvec_f32_c1(PPPiii)
// memra-kernel: matvec_f32_c2(PPPiii)
// memra-kernel: matvec_f32_c4(PPPiii)
// memra-kernel: matvec_f32_c8(PPPiii)
// memra-kernel: matvec_f32_c16(PPPiii)
// memra-kernel: moe_matvec_q4_0_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_0_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_0_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_0_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_0_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_1_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_1_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_1_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_1_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_1_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_0_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_0_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_0_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_0_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_0_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_1_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_1_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_1_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_1_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_1_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q8_0_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q8_0_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q8_0_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q8_0_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q8_0_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_K_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_K_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_K_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_K_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q4_K_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_K_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_K_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_K_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_K_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q5_K_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q6_K_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q6_K_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q6_K_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q6_K_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q6_K_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q2_K_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q2_K_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q2_K_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q2_K_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q2_K_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_q3_K_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q3_K_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q3_K_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_q3_K_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_q3_K_r4h(PqPPPiiiii)
// memra-kernel: moe_matvec_iq4_xs_r1u1(PqPPPiiiii)
// memra-kernel: moe_matvec_iq4_xs_r2u1(PqPPPiiiii)
// memra-kernel: moe_matvec_iq4_xs_r4u1(PqPPPiiiii)
// memra-kernel: moe_matvec_iq4_xs_r2h(PqPPPiiiii)
// memra-kernel: moe_matvec_iq4_xs_r4h(PqPPPiiiii)
