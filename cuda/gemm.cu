// Prefill GEMM on tensor cores: y[t][r] = sum_k W[r][k] x[t][k] for many tokens at once.
//
// gemm3_<type> / gemm4_<type> (gemm_pipe below): per 128-wide K step a block dequantizes its
// weight tile (128 rows x 128 values) to f16 in shared memory with the per-type dequant of
// quants.cuh and runs 16x16x16 WMMA products with f32 accumulators, while cp.async brings the next
// step's f16 activation tile and raw weight bytes in. One weight tile is dequantized once per 64 or
// 128 tokens, so the dequant cost is spread over them. f32 weights (only the MoE router in practice,
// which prefill runs as sgemm_f32) keep the unpipelined gemm_/gemm2_ tiles over f32 x.
//
// 128 is a multiple of every unit (32, 64 values; 8 for float types), and the two Q6_K (Q3_K,
// Q2_K) units of a half super-block cover it exactly, so every unit lands inside one K step. K tails (float
// types: any K; quant types: K a multiple of 32 but not of 128) are zero-filled.
// f16 operands: activations beyond +-65504 would overflow (not seen after RMSNorm).
#include <mma.h>
#include "common.cuh"
#include "quants.cuh"
#include "tensor_core.cuh"

using namespace nvcuda;

#define GEMM_BK 128                 // K values per step
#define GEMM_LDS (GEMM_BK + 8)      // padded f16 row: 272 bytes, rows land on different banks

// BM tokens x BN rows per block, warps arranged WM x WN, each warp (BM/WM) x (BN/WN) of y.
// Shared memory (dynamic): x tile BM x LDS f16, then w tile BN x LDS f16; the f32 y tile is
// staged through the same space at the end.
template <int BM, int BN, int WM, int WN>
struct GemmTile {
    static constexpr int THREADS = 32 * WM * WN;
    static constexpr int FM = BM / WM / 16, FN = BN / WN / 16;  // 16x16 fragments per warp
    static constexpr int LDC = BN + 4;
    static constexpr int SMEM_AB = (BM + BN) * GEMM_LDS * 2;
    static constexpr int SMEM = SMEM_AB > BM * LDC * 4 ? SMEM_AB : BM * LDC * 4;
};

template <class T, class G, int BM, int BN, int WN>
__device__ __forceinline__ void gemm_tile(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                          const float* __restrict__ x, float* __restrict__ y,
                                          int rows, int cols, int n_tokens) {
    extern __shared__ int4 gemm_smem[];
    half* xs = reinterpret_cast<half*>(gemm_smem);
    half* ws = xs + BM * GEMM_LDS;
    constexpr int UPT = GEMM_BK / T::UE;  // weight units per row per K step
    const int tid = threadIdx.x, warp = tid >> 5;
    const int t0 = blockIdx.y * BM, r0 = blockIdx.x * BN;
    const int nb = (cols + T::QK - 1) / T::QK;  // float types: rows padded to multiples of 8
    const bool xvec = (cols & 3) == 0;
    const int wt = (warp / WN) * (BM / (G::THREADS / 32 / WN)), wr = (warp % WN) * (BN / WN);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[G::FM][G::FN];
#pragma unroll
    for (int i = 0; i < G::FM; ++i)
#pragma unroll
        for (int j = 0; j < G::FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < cols; k0 += GEMM_BK) {
        // activation tile, f32 -> f16, 4 values per thread per step
        for (int i = tid; i < BM * GEMM_BK / 4; i += G::THREADS) {
            const int tt = i / (GEMM_BK / 4), kk = (i % (GEMM_BK / 4)) * 4;
            const int t = t0 + tt, k = k0 + kk;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (t < n_tokens) {
                const float* src = x + (size_t)t * cols + k;
                if (xvec && k + 3 < cols) {
                    v = *reinterpret_cast<const float4*>(src);
                } else {
                    if (k + 0 < cols) v.x = src[0];
                    if (k + 1 < cols) v.y = src[1];
                    if (k + 2 < cols) v.z = src[2];
                    if (k + 3 < cols) v.w = src[3];
                }
            }
            half2* dst = reinterpret_cast<half2*>(xs + tt * GEMM_LDS + kk);
            dst[0] = __floats2half2_rn(v.x, v.y);
            dst[1] = __floats2half2_rn(v.z, v.w);
        }
        // weight tile, dequantized unit by unit
        for (int i = tid; i < BN * UPT; i += G::THREADS) {
            const int rr = i / UPT, uu = i % UPT;
            const int r = r0 + rr;
            const int gu = k0 / T::UE + uu;
            const int b = gu / T::UNITS, j = gu % T::UNITS;
            half* row = ws + rr * GEMM_LDS;
            if (r < rows && b < nb) {
                const size_t blk = (size_t)r * nb + b;
                T::dequant(wq + blk * T::QB, wm + blk * T::MB, j, row + b * T::QK - k0);
            } else {
                // this unit's values all lie in [uu*UE, (uu+1)*UE) or, for Q6_K/Q3_K/Q2_K, the pair of
                // units of one half super-block covers the same 128 values: both are out together
                for (int e = 0; e < T::UE; e += 8) *reinterpret_cast<int4*>(row + uu * T::UE + e) = make_int4(0, 0, 0, 0);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[G::FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[G::FN];
#pragma unroll
            for (int i = 0; i < G::FM; ++i) wmma::load_matrix_sync(a[i], xs + (wt + 16 * i) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < G::FN; ++j) wmma::load_matrix_sync(b[j], ws + (wr + 16 * j) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int i = 0; i < G::FM; ++i)
#pragma unroll
                for (int j = 0; j < G::FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    // stage the f32 tile through shared memory for guarded, coalesced stores
    float* cs = reinterpret_cast<float*>(gemm_smem);
#pragma unroll
    for (int i = 0; i < G::FM; ++i)
#pragma unroll
        for (int j = 0; j < G::FN; ++j)
            wmma::store_matrix_sync(cs + (wt + 16 * i) * G::LDC + wr + 16 * j, acc[i][j], G::LDC, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < BM * BN; i += G::THREADS) {
        const int tt = i / BN, rr = i % BN;
        const int t = t0 + tt, r = r0 + rr;
        if (t < n_tokens && r < rows) y[(size_t)t * rows + r] = cs[tt * G::LDC + rr];
    }
}

// ---- the pipelined tile (gemm3_<type>) ------------------------------------------------------
// The same WMMA products, fed by a two-stage cp.async pipeline: while a block dequantizes and
// multiplies K step s, the raw bytes of step s + 1 (the f16 activation tile and the weight blocks'
// q and meta bytes, as they lie in the repacked planes) are already on their way to shared memory.
// The weight tile is then dequantized from shared memory with the same T::dequant (it reads
// through generic pointers), so every type gets the pipeline from its one traits struct.
// x arrives as f16 rows (f32_to_f16_rows below, row stride ldx, zero past cols): half the bytes
// of f32, and copyable without passing through registers.

// Shared memory of one block: two stages of (x tile, raw weight bytes), one dequantized w tile.
// Raw bytes per row and K step: the blocks the step touches (K-quants: their whole 256-value
// super-block, of which the step dequantizes one half); the meta bytes from the 4-byte-aligned
// address at or below the first block's (Q6_K's 2-byte d), read in 4-byte copies.
template <class T, int BM, int BN, int WM, int WN>
struct PipeTile {
    static constexpr int THREADS = 32 * WM * WN;
    static constexpr int FM = BM / WM / 16, FN = BN / WN / 16;
    static constexpr int LDC = BN + 4;
    static constexpr int NB_STEP = T::QK >= GEMM_BK ? 1 : GEMM_BK / T::QK;  // blocks a row a step
    static constexpr int QROW = NB_STEP * T::QB;                              // multiple of 16
    static constexpr int MCH = T::MB ? (NB_STEP * T::MB + 3 + 3) / 4 : 0;    // 4-byte meta copies a row
    static constexpr int MROW = (MCH * 4 + 15) / 16 * 16;
    static constexpr int XS = BM * GEMM_LDS * 2, WS = BN * GEMM_LDS * 2, RAW = BN * (QROW + MROW);
    static constexpr int STAGE = XS + RAW;
    static constexpr int SMEM_PIPE = 2 * STAGE + WS;
    static constexpr int SMEM = SMEM_PIPE > BM * LDC * 4 ? SMEM_PIPE : BM * LDC * 4;
};

// K step ks's f16 x tile (BM tokens x GEMM_BK values) into xs, by threads tid of nthreads: zero
// past n_tokens and cols. ROUTED: tile row tt is x row slot_of[tt] / x_div (the MoE slots).
template <int BM, bool ROUTED>
__device__ __forceinline__ void copy_x_step(half* xs, const half* __restrict__ xh, int ldx, int t0, int n_tokens,
                                            int cols, int ks, const int* slot_of, int x_div, int tid, int nthreads) {
    const int k0 = ks * GEMM_BK;
    for (int i = tid; i < BM * (GEMM_BK / 8); i += nthreads) {
        const int tt = i / (GEMM_BK / 8), k = k0 + (i % (GEMM_BK / 8)) * 8, t = t0 + tt;
        const bool ok = t < n_tokens && k < cols;
        const half* src = ok ? xh + (size_t)(ROUTED ? slot_of[tt] / x_div : t) * ldx + k : xh;
        cp_async16(xs + tt * GEMM_LDS + (k - k0), src, ok ? 16 : 0);
    }
}

// K step ks's raw weight bytes for BN rows into rq (q bytes, G::QROW a row) and rq + BN * QROW (meta,
// G::MROW a row): the blocks the step touches, as they lie in the repacked planes.
template <class T, class G, int BN>
__device__ __forceinline__ void copy_w_step(uint8_t* rq, const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                            int r0, int rows, int nb, int ks, int tid, int nthreads) {
    const int b0 = ks * GEMM_BK / T::QK;
    for (int i = tid; i < BN * (G::QROW / 16); i += nthreads) {
        const int rr = i / (G::QROW / 16), c = i % (G::QROW / 16), r = r0 + rr;
        const bool ok = r < rows && b0 + (16 * c) / T::QB < nb;
        const uint8_t* src = ok ? wq + ((size_t)r * nb + b0) * T::QB + 16 * c : wq;
        cp_async16(rq + rr * G::QROW + 16 * c, src, ok ? 16 : 0);
    }
    if constexpr (G::MCH > 0) {
        uint8_t* rm = rq + BN * G::QROW;
        const size_t meta_bytes = (size_t)rows * nb * T::MB;
        for (int i = tid; i < BN * G::MCH; i += nthreads) {
            const int rr = i / G::MCH, c = i % G::MCH, r = r0 + rr;
            if (r >= rows) continue;
            const size_t off = (((size_t)r * nb + b0) * T::MB & ~(size_t)3) + 4 * c;
            // a word that starts inside the plane (its last, for Q6_K's odd block counts, may
            // end up to 3 bytes past it: still inside the pool's 256-aligned allocation)
            if (off < meta_bytes) cp_async4(rm + rr * G::MROW + 4 * c, wm + off);
        }
    }
}

// K step ks's weight tile, dequantized from the raw bytes in rq to f16 rows of ws (zero past rows
// and the last block), unit by unit with the type's own dequant.
template <class T, class G, int BN>
__device__ __forceinline__ void dequant_step(half* ws, const uint8_t* rq, int r0, int rows, int nb, int ks, int tid,
                                             int nthreads) {
    constexpr int UPT = GEMM_BK / T::UE;
    const int k0 = ks * GEMM_BK, b0 = k0 / T::QK;
    const uint8_t* rm = rq + BN * G::QROW;
    for (int i = tid; i < BN * UPT; i += nthreads) {
        const int rr = i / UPT, uu = i % UPT, r = r0 + rr;
        const int gu = k0 / T::UE + uu;
        const int b = gu / T::UNITS, j = gu % T::UNITS;
        half* row = ws + rr * GEMM_LDS;
        if (r < rows && b < nb) {
            const int moff = (int)((((size_t)r * nb + b0) * T::MB) & 3);
            T::dequant(rq + rr * G::QROW + (b - b0) * T::QB, rm + rr * G::MROW + moff + (b - b0) * T::MB, j,
                       row + b * T::QK - k0);
        } else {
            for (int e = 0; e < T::UE; e += 8) *reinterpret_cast<int4*>(row + uu * T::UE + e) = make_int4(0, 0, 0, 0);
        }
    }
}

template <class T, class G, int BM, int BN, int WN, bool ROUTED = false>
__device__ __forceinline__ void gemm_pipe(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                          const half* __restrict__ xh, int ldx, float* __restrict__ y,
                                          int rows, int cols, int n_tokens,
                                          const int* __restrict__ slots = nullptr, int x_div = 1) {
    extern __shared__ int4 gemm_smem[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(gemm_smem);
    half* ws = reinterpret_cast<half*>(smem + 2 * G::STAGE);
    __shared__ int slot_of[ROUTED ? BM : 1];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int t0 = blockIdx.y * BM, r0 = blockIdx.x * BN;
    const int nb = (cols + T::QK - 1) / T::QK;
    const int wt = (warp / WN) * (BM / (G::THREADS / 32 / WN)), wr = (warp % WN) * (BN / WN);
    const int nsteps = (cols + GEMM_BK - 1) / GEMM_BK;

    if (ROUTED) {
        for (int i = tid; i < BM; i += G::THREADS) slot_of[i] = t0 + i < n_tokens ? slots[t0 + i] : 0;
        __syncthreads();
    }
    auto issue = [&](int ks, int s) {
        uint8_t* stage = smem + s * G::STAGE;
        copy_x_step<BM, ROUTED>(reinterpret_cast<half*>(stage), xh, ldx, t0, n_tokens, cols, ks, slot_of, x_div, tid,
                                G::THREADS);
        copy_w_step<T, G, BN>(stage + G::XS, wq, wm, r0, rows, nb, ks, tid, G::THREADS);
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[G::FM][G::FN];
#pragma unroll
    for (int i = 0; i < G::FM; ++i)
#pragma unroll
        for (int j = 0; j < G::FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    issue(0, 0);
    cp_async_commit();
    for (int ks = 0; ks < nsteps; ++ks) {
        const int s = ks & 1;
        cp_async_wait_all();
        __syncthreads();  // step ks is in shared memory for all; step ks - 1's products are done
        if (ks + 1 < nsteps) issue(ks + 1, s ^ 1);
        cp_async_commit();
        dequant_step<T, G, BN>(ws, smem + s * G::STAGE + G::XS, r0, rows, nb, ks, tid, G::THREADS);
        __syncthreads();
        const half* xs = reinterpret_cast<const half*>(smem + s * G::STAGE);
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> a[G::FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> b[G::FN];
#pragma unroll
            for (int i = 0; i < G::FM; ++i) wmma::load_matrix_sync(a[i], xs + (wt + 16 * i) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < G::FN; ++j) wmma::load_matrix_sync(b[j], ws + (wr + 16 * j) * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int i = 0; i < G::FM; ++i)
#pragma unroll
                for (int j = 0; j < G::FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
    }
    cp_async_wait_all();
    __syncthreads();
    float* cs = reinterpret_cast<float*>(gemm_smem);
#pragma unroll
    for (int i = 0; i < G::FM; ++i)
#pragma unroll
        for (int j = 0; j < G::FN; ++j)
            wmma::store_matrix_sync(cs + (wt + 16 * i) * G::LDC + wr + 16 * j, acc[i][j], G::LDC, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < BM * BN; i += G::THREADS) {
        const int tt = i / BN, rr = i % BN;
        const int t = t0 + tt, r = r0 + rr;
        if (t < n_tokens && r < rows) y[(size_t)(ROUTED ? slot_of[tt] : t) * rows + r] = cs[tt * G::LDC + rr];
    }
}

// ---- the warp-specialized tile (gemm5_<type>, sm_90) --------------------------------------------
// gemm3's operands and per-type dequant, with the two kinds of work on different warps so that
// they overlap instead of taking turns between barriers: 4 producer warps copy each K step's raw
// weight bytes in (cp.async, two steps ahead) and dequantize them into one of two f16 w buffers,
// while 4 consumer warps, 64 tokens x 64 rows each, multiply the step before on mma.sync m16n8k16
// fed by ldmatrix, and copy their own x tiles two steps ahead. Named barriers pass the w buffers
// back and forth: FULL + b (dequantized, consumers wait), EMPTY + b (multiplied, producers wait).
// 128 tokens x 128 rows a block, blockIdx.x the token tile, so a weight tile's token tiles run side
// by side and its bytes come from DRAM once. y is stored from the accumulators. Shared memory
// (2 x tiles, 2 raw steps, 2 w tiles: 176 KB for Q4_K, 200 KB for f16) needs sm_90.
#define WS_BM 128
#define WS_BN 128
#define WS_CONS 128  // consumer threads: the last 4 warps, 2 along tokens x 2 along rows
enum { WS_BAR_PROD = 1, WS_BAR_CONS = 2, WS_BAR_FULL = 3, WS_BAR_EMPTY = 5 };

template <class T>
struct WsTile {
    typedef PipeTile<T, WS_BM, WS_BN, 2, 2> P;  // its per-row raw layout (QROW, MCH, MROW)
    static constexpr int QROW = P::QROW, MCH = P::MCH, MROW = P::MROW;
    static constexpr int XS = P::XS, RAW = P::RAW, WS = P::WS;
    static constexpr int SMEM = 2 * (XS + RAW + WS);
};

// PW producer warps come first (gemm5: 4; gemm7: 8, where sm_90a's setmaxnreg moves registers from
// the producers, which need few, to the consumers' 128 accumulators).
// ROUTED (moe_gemm7): tile row tt is x row slots[t0 + tt] / x_div and y row slots[t0 + tt] (the MoE
// slots of one expert, as moe_gemm4 takes them); n_tokens is then that expert's slot count.
template <class T, int PW, bool ROUTED = false>
__device__ __forceinline__ void gemm_ws(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                                        const half* __restrict__ xh, int ldx, float* __restrict__ y,
                                        int rows, int cols, int n_tokens,
                                        const int* __restrict__ slots = nullptr, int x_div = 1) {
    typedef WsTile<T> G;
    constexpr int WS_PROD = 32 * PW, ALL = WS_PROD + WS_CONS;
    __shared__ int x_of[ROUTED ? WS_BM : 1], y_of[ROUTED ? WS_BM : 1];
    extern __shared__ int4 gemm_smem[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(gemm_smem);
    half* xbuf = reinterpret_cast<half*>(smem);                       // 2 x tiles
    uint8_t* rbuf = smem + 2 * G::XS;                                 // 2 raw steps
    half* wbuf = reinterpret_cast<half*>(smem + 2 * (G::XS + G::RAW));  // 2 w tiles
    const int tid = threadIdx.x, lane = tid & 31;
    const int t0 = blockIdx.x * WS_BM, r0 = blockIdx.y * WS_BN;
    const int nb = (cols + T::QK - 1) / T::QK;
    const int nsteps = (cols + GEMM_BK - 1) / GEMM_BK;
    if constexpr (ROUTED) {  // before the roles part: the consumers' x copies and stores read them
        for (int i = tid; i < WS_BM; i += ALL) {
            const int s = t0 + i < n_tokens ? slots[t0 + i] : 0;
            x_of[i] = s / x_div;
            y_of[i] = s;
        }
        __syncthreads();
    }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (PW == 8) {  // 256 x 96 + 128 x 232 <= 64 K registers
        if (tid < WS_PROD) asm volatile("setmaxnreg.dec.sync.aligned.u32 96;");
        else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    }
#endif
    if (tid < WS_PROD) {
        copy_w_step<T, G, WS_BN>(rbuf, wq, wm, r0, rows, nb, 0, tid, WS_PROD);
        cp_async_commit();
        if (nsteps > 1) copy_w_step<T, G, WS_BN>(rbuf + G::RAW, wq, wm, r0, rows, nb, 1, tid, WS_PROD);
        cp_async_commit();
        for (int ks = 0; ks < nsteps; ++ks) {
            const int b = ks & 1;
            cp_async_wait<1>();
            bar_sync(WS_BAR_PROD, WS_PROD);                          // step ks's raw bytes are in
            if (ks >= 2) bar_sync(WS_BAR_EMPTY + b, ALL);            // step ks - 2 multiplied
            dequant_step<T, G, WS_BN>(wbuf + b * (G::WS / 2), rbuf + b * G::RAW, r0, rows, nb, ks, tid, WS_PROD);
            bar_arrive(WS_BAR_FULL + b, ALL);
            bar_sync(WS_BAR_PROD, WS_PROD);                          // every producer is done with rbuf[b]
            if (ks + 2 < nsteps) copy_w_step<T, G, WS_BN>(rbuf + b * G::RAW, wq, wm, r0, rows, nb, ks + 2, tid, WS_PROD);
            cp_async_commit();
        }
        return;
    }

    const int ct = tid - WS_PROD, cw = ct >> 5;
    const int wt = (cw >> 1) * 64, wr = (cw & 1) * 64;  // this warp's 64 tokens x 64 rows
    // x copies: thread ct moves 16-byte chunk ct % 16 of tile rows ct / 16 + 8 c, c = 0..15 (the
    // addresses fixed but for the step, so the copies are a few instructions each)
    const int xrow = ct >> 4, xcol = 8 * (ct & 15);
    const half* xsrc = xh + (size_t)(t0 + xrow) * ldx + xcol;
    auto copy_x = [&](half* xs, int ks) {
        const bool kin = ks * GEMM_BK + xcol < cols;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
            const bool ok = kin && t0 + xrow + 8 * c < n_tokens;
            const half* src = ROUTED ? xh + (size_t)x_of[xrow + 8 * c] * ldx + xcol : xsrc + (size_t)(8 * c) * ldx;
            cp_async16(xs + (xrow + 8 * c) * GEMM_LDS + xcol, ok ? src + ks * GEMM_BK : xh, ok ? 16 : 0);
        }
    };
    copy_x(xbuf, 0);
    cp_async_commit();
    if (nsteps > 1) copy_x(xbuf + G::XS / 2, 1);
    cp_async_commit();

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    // ldmatrix rows: A (tokens x k) matrices 0-3 = rows 0-7 | 8-15 at k 0, then at k 8;
    // B (rows x k) = rows 0-7 at k 0 | k 8, then rows 8-15 at k 0 | k 8 (two n8 tiles' b0, b1)
    const int a_off = (wt + (lane & 15)) * GEMM_LDS + (lane >> 4) * 8;
    const int b_off = (wr + (lane & 7) + ((lane >> 4) << 3)) * GEMM_LDS + ((lane >> 3) & 1) * 8;
    for (int ks = 0; ks < nsteps; ++ks) {
        const int b = ks & 1;
        cp_async_wait<1>();
        bar_sync(WS_BAR_FULL + b, ALL);  // w tile dequantized; every consumer's x copies are in
        const half* xs = xbuf + b * (G::XS / 2);
        const half* ws = wbuf + b * (G::WS / 2);
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            uint32_t af[4][4], bf[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) ldsm_x4(af[i], xs + a_off + 16 * i * GEMM_LDS + kk);
#pragma unroll
            for (int j = 0; j < 4; ++j) ldsm_x4(bf[j], ws + b_off + 16 * j * GEMM_LDS + kk);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    mma_16816(acc[i][2 * j], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][0], bf[j][1]);
                    mma_16816(acc[i][2 * j + 1], af[i][0], af[i][1], af[i][2], af[i][3], bf[j][2], bf[j][3]);
                }
        }
        if (ks + 2 < nsteps) bar_arrive(WS_BAR_EMPTY + b, ALL);
        bar_sync(WS_BAR_CONS, WS_CONS);  // every consumer is done with xbuf[b]
        if (ks + 2 < nsteps) copy_x(xbuf + b * (G::XS / 2), ks + 2);
        cp_async_commit();
    }
    // accumulator (i, j): rows t = 16 i + lane / 4 (+ 8 for e >= 2), columns r = 8 j + 2 (lane % 4) (+ 1)
    const bool pairs = (rows & 1) == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int t = t0 + wt + 16 * i + (lane >> 2) + 8 * h;
            if (t >= n_tokens) continue;
            float* yt = y + (size_t)(ROUTED ? y_of[t - t0] : t) * rows;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int r = r0 + wr + 8 * j + 2 * (lane & 3);
                const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (pairs && r + 1 < rows) {
                    *reinterpret_cast<float2*>(yt + r) = make_float2(v0, v1);
                } else {
                    if (r < rows) yt[r] = v0;
                    if (r + 1 < rows) yt[r + 1] = v1;
                }
            }
        }
}

// f32_to_f16_rows(x, y, cols, ldy, n): y[t][c] = f16(x[t][c]) for c < cols, 0 for cols <= c < ldy
// (the pipelined GEMM's input; ldy a multiple of 8). Eight values a thread: one 16-byte store.
// grid (ceil(ldy / 2048), n), block 256.
extern "C" __global__ void f32_to_f16_rows(const float* __restrict__ x, half* __restrict__ y, int cols, int ldy, int n) {
    pdl_entry();
    const int c = 8 * (blockIdx.x * blockDim.x + threadIdx.x), t = blockIdx.y;
    if (c >= ldy) return;
    const float* xr = x + (size_t)t * cols + c;
    float v[8];
    if (c + 8 <= cols && (cols & 3) == 0) {
        const float4 a = *reinterpret_cast<const float4*>(xr), b = *reinterpret_cast<const float4*>(xr + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = c + e < cols ? xr[e] : 0.0f;
    }
    store8(y + (size_t)t * ldy + c, v);
}

// sgemm_f32(w, w_ld, x, y, rows, cols, n_tokens): y[t][r] = sum_k w[r][k] x[t][k] in float32 FMAs,
// the same bits run to run. For f32 weights in prefill: the MoE router, whose close calls between
// experts would flip with f16 operands. The router's output is small (64 experts x 512 tokens), so
// a block's 32 rows x 16 tokens split k over its 8 warps (k in order within a warp, the 8 partial
// sums added in warp order at the end). A warp takes its k range 16 at a time: its lanes load the
// 32 w rows and 16 x rows (a lane a row, float4 along k; the next chunk's loads in flight while
// this one is summed), store them k-major in the warp's own shared memory, and each lane sums a
// 4-row x 4-token tile from two float4 shared loads a k. H100, 512 tokens of a 64-expert router:
// 27.5 us a launch, against 31.3 for the 16 x 16 tile it replaced (an output a thread, two shared
// loads an FMA); still ~5x what its FMAs and L2 bytes predict, for a reason not found (rotating the
// warps' k slices per token tile, against L2 hot spots, changed nothing). grid (ceil(rows/32),
// ceil(n_tokens/16)), block 256.
#define SG_R 32
#define SG_T 16
#define SG_KC 16   // k a chunk
#define SG_XLD 20  // xs row stride: the two half-warps' k quads land 16 banks apart
#define SG_WARPS 8
__device__ __forceinline__ float4 sg_quad(const float* p, int k, int cols, bool vec) {
    if (vec && k + 3 < cols) return *reinterpret_cast<const float4*>(p + k);
    return make_float4(k < cols ? p[k] : 0.0f, k + 1 < cols ? p[k + 1] : 0.0f, k + 2 < cols ? p[k + 2] : 0.0f,
                       k + 3 < cols ? p[k + 3] : 0.0f);
}
extern "C" __global__ __launch_bounds__(256) void sgemm_f32(const float* __restrict__ w, int w_ld,
                                                            const float* __restrict__ x, float* __restrict__ y,
                                                            int rows, int cols, int n_tokens) {
    __shared__ __align__(16) float sm[SG_WARPS][SG_KC * SG_R + SG_KC * SG_XLD];  // per warp: ws[k][r], xs[k][t]
    pdl_entry();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * SG_R, t0 = blockIdx.y * SG_T;
    float* ws = sm[warp];
    float* xs = ws + SG_KC * SG_R;
    const bool vec = (cols & 3) == 0 && (w_ld & 3) == 0;
    // loads: lane l holds w row r0 + l (4 quads a chunk) and x row t0 + l % 16 (quads 2q + l / 16)
    const float* wrow = w + (size_t)min(r0 + lane, rows - 1) * w_ld;  // rows, tokens past the end: never stored
    const float* xrow = x + (size_t)min(t0 + (lane & 15), n_tokens - 1) * cols;
    const int n_chunks = (cols + SG_KC - 1) / SG_KC, per = (n_chunks + SG_WARPS - 1) / SG_WARPS;
    const int c0 = min(n_chunks, warp * per), c1 = min(n_chunks, c0 + per);
    float4 wn[4], xn[2];
    auto load = [&](int c) {
        const int k = c * SG_KC;
#pragma unroll
        for (int q = 0; q < 4; ++q) wn[q] = sg_quad(wrow, k + 4 * q, cols, vec);
#pragma unroll
        for (int q = 0; q < 2; ++q) xn[q] = sg_quad(xrow, k + 4 * (2 * q + (lane >> 4)), cols, vec);
    };
    const int rl = (lane & 7) * 4, tl = (lane >> 3) * 4;  // this lane's sums: rows r0 + rl.., tokens t0 + tl..
    float acc[4][4] = {};
    if (c0 < c1) load(c0);
    for (int c = c0; c < c1; ++c) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            ws[(4 * q + 0) * SG_R + lane] = wn[q].x;
            ws[(4 * q + 1) * SG_R + lane] = wn[q].y;
            ws[(4 * q + 2) * SG_R + lane] = wn[q].z;
            ws[(4 * q + 3) * SG_R + lane] = wn[q].w;
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int kq = 4 * (2 * q + (lane >> 4)), t = lane & 15;
            xs[(kq + 0) * SG_XLD + t] = xn[q].x;
            xs[(kq + 1) * SG_XLD + t] = xn[q].y;
            xs[(kq + 2) * SG_XLD + t] = xn[q].z;
            xs[(kq + 3) * SG_XLD + t] = xn[q].w;
        }
        __syncwarp();
        if (c + 1 < c1) load(c + 1);
#pragma unroll
        for (int k = 0; k < SG_KC; ++k) {
            const float4 a = *reinterpret_cast<const float4*>(ws + k * SG_R + rl);
            const float4 b = *reinterpret_cast<const float4*>(xs + k * SG_XLD + tl);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncwarp();  // every lane's reads done before the next chunk's stores
    }
    __syncthreads();  // the chunks' shared memory becomes the partial sums
    float* part = &sm[0][0];  // [warp][token][row]: 8 x 16 x 33 floats, within sm's 8 x 832
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[(warp * SG_T + tl + j) * (SG_R + 1) + rl + i] = acc[i][j];
    __syncthreads();
    const int r = threadIdx.x % SG_R, t = threadIdx.x / SG_R;  // 256 threads: 32 rows x 8 tokens, twice
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int tt = t + 8 * h;
        float sum = part[tt * (SG_R + 1) + r];
#pragma unroll
        for (int p = 1; p < SG_WARPS; ++p) sum += part[(p * SG_T + tt) * (SG_R + 1) + r];
        if (r0 + r < rows && t0 + tt < n_tokens) y[(size_t)(t0 + tt) * rows + r0 + r] = sum;
    }
}


// The tile shapes; bench_kernels.py times them (docs/gpu-log.md has the numbers):
//   gemm_f32:  64 tokens x  64 rows, 4 warps of 32x32 (34.8 KB shared)
//   gemm2_f32: 128 tokens x 128 rows, 8 warps of 64x32 (69.6 KB shared, needs the opt-in)
typedef GemmTile<64, 64, 2, 2> Tile1;
typedef GemmTile<128, 128, 2, 4> Tile2;
//   gemm3_<type>: pipelined, 128 tokens x 128 rows, 8 warps of 64x32, one block an SM
//   gemm4_<type>: pipelined,  64 tokens x 128 rows, 4 warps of 32x64, two blocks an SM
template <class T> using Pipe3 = PipeTile<T, 128, 128, 2, 4>;
template <class T> using Pipe4 = PipeTile<T, 64, 128, 2, 2>;
//   gemm6_<type>: pipelined,  64 tokens x  64 rows, 4 warps of 32x32: 61-83 KB of shared memory, for
//                 GPUs whose blocks get at most 99 KB (sm_86, sm_89), where gemm3/gemm4 do not fit
template <class T> using Pipe6 = PipeTile<T, 64, 64, 2, 2>;

// gemm_f32(wq, wm, x, y, rows, cols, n_tokens): grid (ceil(rows/64), ceil(n_tokens/64)),
// block 128, dynamic shared Tile1::SMEM; gemm2_<type>: grid (ceil(rows/128), ceil(n_tokens/128)),
// block 256, dynamic shared Tile2::SMEM. wm = wq (no meta plane). The session-30 tiles of every type,
// beaten on every shape by gemm3/gemm4 (docs/gpu-log.md session 31), were dropped: build time.
#define GEMM_ENTRY(TYPE)                                                                                    \
    extern "C" __global__ __launch_bounds__(128) void gemm_##TYPE(                                          \
        const uint8_t* wq, const uint8_t* wm, const float* x, float* y, int rows, int cols, int n_tokens) { pdl_entry();  \
        gemm_tile<TYPE##_t, Tile1, 64, 64, 2>(wq, wm, x, y, rows, cols, n_tokens);                          \
    }                                                                                                       \
    extern "C" __global__ __launch_bounds__(256, 2) void gemm2_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const float* x, float* y, int rows, int cols, int n_tokens) { pdl_entry();  \
        gemm_tile<TYPE##_t, Tile2, 128, 128, 4>(wq, wm, x, y, rows, cols, n_tokens);                        \
    }

// gemm3_<type>, gemm4_<type>, gemm6_<type>(wq, wm, xh, y, rows, cols, n_tokens, ldx): the pipelined tiles; xh
// f16 rows of stride ldx. grid (ceil(rows/128), ceil(n_tokens/BM)), block THREADS, dynamic shared
// PipeTile::SMEM (quant_ops.gemm_shared). Not for f32 weights: their raw step (64 KB) does not fit.
#define GEMM_PIPE_ENTRY(TYPE)                                                                               \
    extern "C" __global__ __launch_bounds__(256, 1) void gemm3_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const half* xh, float* y, int rows, int cols, int n_tokens,   \
        int ldx) { pdl_entry();                                                                             \
        gemm_pipe<TYPE##_t, Pipe3<TYPE##_t>, 128, 128, 4>(wq, wm, xh, ldx, y, rows, cols, n_tokens);        \
    }                                                                                                       \
    extern "C" __global__ __launch_bounds__(128, 2) void gemm4_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const half* xh, float* y, int rows, int cols, int n_tokens,   \
        int ldx) { pdl_entry();                                                                             \
        gemm_pipe<TYPE##_t, Pipe4<TYPE##_t>, 64, 128, 2>(wq, wm, xh, ldx, y, rows, cols, n_tokens);         \
    }                                                                                                       \
    extern "C" __global__ __launch_bounds__(128, 2) void gemm6_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const half* xh, float* y, int rows, int cols, int n_tokens,   \
        int ldx) { pdl_entry();                                                                             \
        gemm_pipe<TYPE##_t, Pipe6<TYPE##_t>, 64, 64, 2>(wq, wm, xh, ldx, y, rows, cols, n_tokens);          \
    }

// gemm5_<type>(wq, wm, xh, y, rows, cols, n_tokens, ldx): the warp-specialized tile; grid
// (ceil(n_tokens/128), ceil(rows/128)) (token tiles first), block 256, dynamic shared WsTile::SMEM.
#define GEMM_WS_ENTRY(TYPE)                                                                                 \
    extern "C" __global__ __launch_bounds__(256, 1) void gemm5_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const half* xh, float* y, int rows, int cols, int n_tokens,   \
        int ldx) { pdl_entry();                                                                             \
        gemm_ws<TYPE##_t, 4>(wq, wm, xh, ldx, y, rows, cols, n_tokens);                                     \
    }                                                                                                       \
    extern "C" __global__ __launch_bounds__(384, 1) void gemm7_##TYPE(                                      \
        const uint8_t* wq, const uint8_t* wm, const half* xh, float* y, int rows, int cols, int n_tokens,   \
        int ldx) { pdl_entry();                                                                             \
        gemm_ws<TYPE##_t, 8>(wq, wm, xh, ldx, y, rows, cols, n_tokens);                                     \
    }

GEMM_ENTRY(f32)

// moe_gemm4_<type>(table, meta_offset, offsets, order, xh, y, rows, cols, top_k, x_per_slot, ldx): the
// MoE prefill GEMM over the slots moe_sort grouped per expert (cuda/moe.cu), on the 64-slot
// pipelined tile. Block z = expert e takes its slots order[offsets[e] ..] 64 at a time, weights at
// table[e] (q plane; the meta plane meta_offset bytes on). y[slot] = expert @ x(slot), x(slot) =
// xh[slot / top_k] or xh[slot], f16 rows of stride ldx. grid (ceil(rows/128), ceil(T/64),
// n_expert), block 128, dynamic shared Pipe4::SMEM: each token's experts are distinct (moe_topk's
// are), so no expert has more than T slots; blocks past their expert's slots return at once.
#define MOE_GEMM_PIPE_ENTRY(TYPE)                                                                           \
    extern "C" __global__ __launch_bounds__(128, 2) void moe_gemm4_##TYPE(                                  \
        const unsigned long long* table, long long meta_offset, const int* offsets, const int* order,       \
        const half* xh, float* y, int rows, int cols, int top_k, int x_per_slot, int ldx) {                 \
        pdl_entry();                                                                                        \
        const int e = blockIdx.z, a = offsets[e], n = offsets[e + 1] - a;                                   \
        if ((int)blockIdx.y * 64 >= n) return;                                                              \
        const uint8_t* wq = reinterpret_cast<const uint8_t*>(table[e]);                                     \
        gemm_pipe<TYPE##_t, Pipe4<TYPE##_t>, 64, 128, 2, true>(wq, wq + meta_offset, xh, ldx, y, rows, cols,  \
                                                              n, order + a, x_per_slot ? 1 : top_k);       \
    }

// moe_gemm7_<type>(same arguments as moe_gemm4): the MoE prefill GEMM on the warp-specialized tile
// (gemm7: 8 producer warps dequantizing, 4 consumer warps on mma.sync), 128 slots of one expert a
// block. grid (ceil(T/128), ceil(rows/128), n_expert) (slot tiles first, as gemm7's token tiles), block
// 384, dynamic shared WsTile::SMEM (sm_90); blocks past their expert's slots return at once. At ~64
// slots an expert (512 tokens, top-8 of 64) the tile is half empty, but the time goes to the dequant,
// which is per weight tile, not per slot.
#define MOE_GEMM_WS_ENTRY(TYPE)                                                                             \
    extern "C" __global__ __launch_bounds__(384, 1) void moe_gemm7_##TYPE(                                  \
        const unsigned long long* table, long long meta_offset, const int* offsets, const int* order,       \
        const half* xh, float* y, int rows, int cols, int top_k, int x_per_slot, int ldx) {                 \
        pdl_entry();                                                                                        \
        const int e = blockIdx.z, a = offsets[e], n = offsets[e + 1] - a;                                   \
        if ((int)blockIdx.x * WS_BM >= n) return;                                                           \
        const uint8_t* wq = reinterpret_cast<const uint8_t*>(table[e]);                                     \
        gemm_ws<TYPE##_t, 8, true>(wq, wq + meta_offset, xh, ldx, y, rows, cols, n, order + a,               \
                                   x_per_slot ? 1 : top_k);                                                 \
    }

GEMM_PIPE_ENTRY(q4_0)
GEMM_PIPE_ENTRY(q4_1)
GEMM_PIPE_ENTRY(q5_0)
GEMM_PIPE_ENTRY(q5_1)
GEMM_PIPE_ENTRY(q8_0)
GEMM_PIPE_ENTRY(q4_K)
GEMM_PIPE_ENTRY(q5_K)
GEMM_PIPE_ENTRY(q6_K)
GEMM_PIPE_ENTRY(q2_K)
GEMM_PIPE_ENTRY(q3_K)
GEMM_PIPE_ENTRY(iq4_xs)
GEMM_PIPE_ENTRY(f16)
GEMM_PIPE_ENTRY(bf16)

GEMM_WS_ENTRY(q4_0)
GEMM_WS_ENTRY(q4_1)
GEMM_WS_ENTRY(q5_0)
GEMM_WS_ENTRY(q5_1)
GEMM_WS_ENTRY(q8_0)
GEMM_WS_ENTRY(q4_K)
GEMM_WS_ENTRY(q5_K)
GEMM_WS_ENTRY(q6_K)
GEMM_WS_ENTRY(q2_K)
GEMM_WS_ENTRY(q3_K)
GEMM_WS_ENTRY(iq4_xs)
GEMM_WS_ENTRY(f16)
GEMM_WS_ENTRY(bf16)

MOE_GEMM_PIPE_ENTRY(q4_0)
MOE_GEMM_PIPE_ENTRY(q4_1)
MOE_GEMM_PIPE_ENTRY(q5_0)
MOE_GEMM_PIPE_ENTRY(q5_1)
MOE_GEMM_PIPE_ENTRY(q8_0)
MOE_GEMM_PIPE_ENTRY(q4_K)
MOE_GEMM_PIPE_ENTRY(q5_K)
MOE_GEMM_PIPE_ENTRY(q6_K)
MOE_GEMM_PIPE_ENTRY(q2_K)
MOE_GEMM_PIPE_ENTRY(q3_K)
MOE_GEMM_PIPE_ENTRY(iq4_xs)

MOE_GEMM_WS_ENTRY(q4_0)
MOE_GEMM_WS_ENTRY(q4_1)
MOE_GEMM_WS_ENTRY(q5_0)
MOE_GEMM_WS_ENTRY(q5_1)
MOE_GEMM_WS_ENTRY(q8_0)
MOE_GEMM_WS_ENTRY(q4_K)
MOE_GEMM_WS_ENTRY(q5_K)
MOE_GEMM_WS_ENTRY(q6_K)
MOE_GEMM_WS_ENTRY(q2_K)
MOE_GEMM_WS_ENTRY(q3_K)
MOE_GEMM_WS_ENTRY(iq4_xs)


// memra-kernel: gemm_f32(PPPPiii)
// memra-kernel: gemm2_f32(PPPPiii)
// memra-kernel: gemm3_q4_0(PPPPiiii)
// memra-kernel: gemm4_q4_0(PPPPiiii)
// memra-kernel: gemm6_q4_0(PPPPiiii)
// memra-kernel: gemm3_q4_1(PPPPiiii)
// memra-kernel: gemm4_q4_1(PPPPiiii)
// memra-kernel: gemm6_q4_1(PPPPiiii)
// memra-kernel: gemm3_q5_0(PPPPiiii)
// memra-kernel: gemm4_q5_0(PPPPiiii)
// memra-kernel: gemm6_q5_0(PPPPiiii)
// memra-kernel: gemm3_q5_1(PPPPiiii)
// memra-kernel: gemm4_q5_1(PPPPiiii)
// memra-kernel: gemm6_q5_1(PPPPiiii)
// memra-kernel: gemm3_q8_0(PPPPiiii)
// memra-kernel: gemm4_q8_0(PPPPiiii)
// memra-kernel: gemm6_q8_0(PPPPiiii)
// memra-kernel: gemm3_q4_K(PPPPiiii)
// memra-kernel: gemm4_q4_K(PPPPiiii)
// memra-kernel: gemm6_q4_K(PPPPiiii)
// memra-kernel: gemm3_q5_K(PPPPiiii)
// memra-kernel: gemm4_q5_K(PPPPiiii)
// memra-kernel: gemm6_q5_K(PPPPiiii)
// memra-kernel: gemm3_q6_K(PPPPiiii)
// memra-kernel: gemm4_q6_K(PPPPiiii)
// memra-kernel: gemm6_q6_K(PPPPiiii)
// memra-kernel: gemm3_q2_K(PPPPiiii)
// memra-kernel: gemm4_q2_K(PPPPiiii)
// memra-kernel: gemm6_q2_K(PPPPiiii)
// memra-kernel: gemm3_q3_K(PPPPiiii)
// memra-kernel: gemm4_q3_K(PPPPiiii)
// memra-kernel: gemm6_q3_K(PPPPiiii)
// memra-kernel: gemm3_iq4_xs(PPPPiiii)
// memra-kernel: gemm4_iq4_xs(PPPPiiii)
// memra-kernel: gemm6_iq4_xs(PPPPiiii)
// memra-kernel: gemm3_f16(PPPPiiii)
// memra-kernel: gemm4_f16(PPPPiiii)
// memra-kernel: gemm6_f16(PPPPiiii)
// memra-kernel: gemm3_bf16(PPPPiiii)
// memra-kernel: gemm4_bf16(PPPPiiii)
// memra-kernel: gemm6_bf16(PPPPiiii)
// memra-kernel: gemm5_q4_0(PPPPiiii)
// memra-kernel: gemm7_q4_0(PPPPiiii)
// memra-kernel: gemm5_q4_1(PPPPiiii)
// memra-kernel: gemm7_q4_1(PPPPiiii)
// memra-kernel: gemm5_q5_0(PPPPiiii)
// memra-kernel: gemm7_q5_0(PPPPiiii)
// memra-kernel: gemm5_q5_1(PPPPiiii)
// memra-kernel: gemm7_q5_1(PPPPiiii)
// memra-kernel: gemm5_q8_0(PPPPiiii)
// memra-kernel: gemm7_q8_0(PPPPiiii)
// memra-kernel: gemm5_q4_K(PPPPiiii)
// memra-kernel: gemm7_q4_K(PPPPiiii)
// memra-kernel: gemm5_q5_K(PPPPiiii)
// memra-kernel: gemm7_q5_K(PPPPiiii)
// memra-kernel: gemm5_q6_K(PPPPiiii)
// memra-kernel: gemm7_q6_K(PPPPiiii)
// memra-kernel: gemm5_q2_K(PPPPiiii)
// memra-kernel: gemm7_q2_K(PPPPiiii)
// memra-kernel: gemm5_q3_K(PPPPiiii)
// memra-kernel: gemm7_q3_K(PPPPiiii)
// memra-kernel: gemm5_iq4_xs(PPPPiiii)
// memra-kernel: gemm7_iq4_xs(PPPPiiii)
// memra-kernel: gemm5_f16(PPPPiiii)
// memra-kernel: gemm7_f16(PPPPiiii)
// memra-kernel: gemm5_bf16(PPPPiiii)
// memra-kernel: gemm7_bf16(PPPPiiii)
// memra-kernel: moe_gemm4_q4_0(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q4_1(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q5_0(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q5_1(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q8_0(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q4_K(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q5_K(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q6_K(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q2_K(PqPPPPiiiii)
// memra-kernel: moe_gemm4_q3_K(PqPPPPiiiii)
// memra-kernel: moe_gemm4_iq4_xs(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q4_0(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q4_1(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q5_0(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q5_1(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q8_0(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q4_K(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q5_K(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q6_K(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q2_K(PqPPPPiiiii)
// memra-kernel: moe_gemm7_q3_K(PqPPPPiiiii)
// memra-kernel: moe_gemm7_iq4_xs(PqPPPPiiiii)
