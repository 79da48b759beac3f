// The per-256 activation, q8_k256 (layout and producer: quants.cuh), and the Q4_K matvecs that
// read it (issue 14; prototyped in scripts/proto/mma_q4k.cu, docs/gpu-log.md sessions 56-57). One
// activation scale per 256 values keeps a Q4_K super-block's sums exact integers, so a (row, column)
// takes the same float steps whether 1 column runs (decode, on dp4a) or 8 (verify, on int8 tensor
// cores): verify rows have decode's bits by construction.
#include "common.cuh"
#include "quants.cuh"
#include "tensor_core.cuh"

// x f32 [T][K] -> q8_k256 rows, `stride` bytes apart. Grid (nb, T), 256 threads: thread j of block
// b quantizes value 256 b + j (0 past K) against the super-block's amax.
extern "C" __global__ void __launch_bounds__(256) quantize_q8_k256(const float* __restrict__ x, uint8_t* __restrict__ xq,
                                                                   int cols, int stride) {
    pdl_entry();
    const int t = blockIdx.y, j = blockIdx.x * 256 + threadIdx.x;
    q8_k256_block(j < cols ? x[(size_t)t * cols + j] : 0.0f, xq + (size_t)t * stride, gridDim.x, j);
}

// ---- Q4_K x q8_k256 ----------------------------------------------------------------------------
// A block of NW warps takes a 16-row tile; lane (g, t) holds rows g and g + 8. Warp w takes the
// super-blocks w, w + NW, ... and per super-block and (row, column) forms three exact integers
//   a1 = sum_s sc_s c_s,  a2 = sum_s sc_s e_s,  am = sum_s m_s bs_s
// (c_s, e_s: the sub-block's dots of the 4-bit values with the two int8 terms; sc_s, m_s its 6-bit
// scale and min), then y += d2 (d (254 a1 + a2) - dmin am) in float; the warps' totals are added in
// warp order. Only NW (per weight shape, quant_ops.k256_width) sets the float order, never the
// columns. Bounds: |a1|, |a2| <= 8 * 63 * 32 * 15 * 127 < 2^25, |am| <= 8 * 63 * 32 * 32385 < 2^30.
// The weight is the plane layout every Q4_K kernel reads (quants.cuh, q4_K_t).

// Rows g and g + 8 of a super-block: scale and min bytes, (d, dmin).
struct Q4kHead {
    uint32_t sc[2][2], mn[2][2];
    float2 dm[2];
    __device__ __forceinline__ Q4kHead(const int4& h0, const int4& h1) {
        q4k_scale_bytes(h0, sc[0], mn[0]);
        q4k_scale_bytes(h1, sc[1], mn[1]);
        dm[0] = __half22float2(*reinterpret_cast<const __half2*>(&h0.x));
        dm[1] = __half22float2(*reinterpret_cast<const __half2*>(&h1.x));
    }
};

// tot + d2 (d (254 a1 + a2) - dmin am), each step rounded on its own.
__device__ __forceinline__ float k256_total(float d2, float2 dm, int a1, int a2, int am, float tot) {
    return ffma(d2, ffma(dm.x, ffma(254.0f, (float)a1, (float)a2), -fmul(dm.y, (float)am)), tot);
}

// What a lane loads of rows g and g + 8 for one super-block. Mma: bytes 8t .. 8t + 7 of each 32-byte
// pair (the MMA's k 4t.. and 16 + 4t.. are those bytes, in A and B alike), as 8-byte loads (16-byte
// loads and a swap with lane t ^ 2 measured 7-27% slower, H100, docs/gpu-log.md session 58).
// Dp4a: pair t whole.
struct Q4kMmaLoad {
    uint2 q[2][4];  // row r's 8 bytes of pair i
    int4 h[2];
    __device__ __forceinline__ void load(const uint8_t* const (&p)[2], const uint8_t* const (&m)[2], int b, int t) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < 4; ++i) q[r][i] = __ldg(reinterpret_cast<const uint2*>(p[r] + (size_t)b * 128 + 32 * i + 8 * t));
            h[r] = __ldg(reinterpret_cast<const int4*>(m[r] + (size_t)b * 16));
        }
    }
};

struct Q4kDp4aLoad {
    int4 q[2][2];
    int4 h[2];
    __device__ __forceinline__ void load(const uint8_t* const (&p)[2], const uint8_t* const (&m)[2], int b, int t) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < 2; ++i) q[r][i] = __ldg(reinterpret_cast<const int4*>(p[r] + (size_t)b * 128 + 32 * t) + i);
            h[r] = __ldg(reinterpret_cast<const int4*>(m[r] + (size_t)b * 16));
        }
    }
};

// The warp's super-blocks in order with the next one's weights in flight; the first load goes out
// before the PDL wait (weights never depend on the previous kernel). Asking L2 for the tile's first
// 4 KB a row there too, as matvec.cu's kernels do, made these 5-12% slower (H100, session 58).
template <class L, int NW, typename F>
__device__ __forceinline__ void q4k_tile_loop(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm, int rows,
                                              int nb, F&& body) {
    const int lane = threadIdx.x & 31, t = lane & 3, b0 = threadIdx.x >> 5;
    const int row0 = blockIdx.x * 16 + (lane >> 2);
    const uint8_t* p[2];
    const uint8_t* m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const size_t row = (size_t)min(row0 + 8 * r, rows - 1);  // clamped: the tile's rows past the end load row rows - 1
        p[r] = wq + row * nb * 128;
        m[r] = wm + row * nb * 16;
    }
    L ring[2];
    if (b0 < nb) ring[0].load(p, m, b0, t);
    pdl_entry();
    for (int b = b0; b < nb; b += 2 * NW) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int bk = b + k * NW;
            if (bk >= nb) break;
            if (bk + NW < nb) ring[k ^ 1].load(p, m, bk + NW, t);
            body(ring[k], bk);
        }
    }
}

// The warps' totals of (row g, column 8c + 2t), (g, 8c + 2t + 1), (g + 8, 8c + 2t), (g + 8, 8c + 2t + 1)
// (tot[c][0..3], c < NG column groups), added in warp order, into y[n][row] for the tile's rows and
// the first nc columns.
template <int NW, int NG>
__device__ __forceinline__ void q4k_tile_store(const float (&tot)[NG][4], float* __restrict__ y, int rows, int nc) {
    __shared__ float part[NW][16][8 * NG];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int c = 0; c < NG; ++c)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[warp][g + 8 * (j >> 1)][8 * c + 2 * t + (j & 1)] = tot[c][j];
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * nc; i += 32 * NW) {
        const int r = i & 15, n = i >> 4, row = blockIdx.x * 16 + r;
        float v = part[0][r][n];
#pragma unroll
        for (int k = 1; k < NW; ++k) v = fadd(v, part[k][r][n]);
        if (row < rows) y[(size_t)n * rows + row] = v;
    }
}

// Decode: one column on dp4a. Lane t sums pair t (sub-blocks 2t, 2t + 1) of its two rows, and the
// quad adds its integers (exact: any order gives the MMA kernel's integers).
template <int NW>
__device__ void q4k_k256_c1(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                            const uint8_t* __restrict__ x, float* __restrict__ y, int rows, int nb) {
    const int t = threadIdx.x & 3;
    float tot[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};  // (row g, column 0), -, (row g + 8, column 0), -
    q4k_tile_loop<Q4kDp4aLoad, NW>(wq, wm, rows, nb, [&](const Q4kDp4aLoad& w, int b) {
        const Q4kHead hd(w.h[0], w.h[1]);
        // pair t of both terms: u[q] holds values 8q .. 8q + 7 of sub-block 2t (words 0, 1), then of 2t + 1
        const int4* xu = reinterpret_cast<const int4*>(x + (size_t)b * 512 + 64 * t);
        const int4 u[4] = {__ldg(xu), __ldg(xu + 1), __ldg(xu + 2), __ldg(xu + 3)};
        const int4 v[4] = {__ldg(xu + 16), __ldg(xu + 17), __ldg(xu + 18), __ldg(xu + 19)};
        const int2 bs = __ldg(reinterpret_cast<const int2*>(x + (size_t)nb * 512) + 4 * b + t);
        int a1[2], a2[2], am[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            int clo = 0, chi = 0, elo = 0, ehi = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int q = lane_of(w.q[r][j >> 2], j & 3), lo = q & 0x0F0F0F0F, hi = (q >> 4) & 0x0F0F0F0F;
                clo = dp4a(lo, lane_of(u[j >> 1], j & 1), clo);  // values 4j .. 4j + 3 of sub-block 2t
                chi = dp4a(hi, lane_of(u[j >> 1], 2 + (j & 1)), chi);  // and of 2t + 1
                elo = dp4a(lo, lane_of(v[j >> 1], j & 1), elo);
                ehi = dp4a(hi, lane_of(v[j >> 1], 2 + (j & 1)), ehi);
            }
            const int slo = scale_byte(hd.sc[r], 2 * t), shi = scale_byte(hd.sc[r], 2 * t + 1);
            a1[r] = slo * clo + shi * chi;
            a2[r] = slo * elo + shi * ehi;
            am[r] = scale_byte(hd.mn[r], 2 * t) * bs.x + scale_byte(hd.mn[r], 2 * t + 1) * bs.y;
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                a1[r] += __shfl_xor_sync(0xffffffffu, a1[r], o);
                a2[r] += __shfl_xor_sync(0xffffffffu, a2[r], o);
                am[r] += __shfl_xor_sync(0xffffffffu, am[r], o);
            }
        const float d2 = __ldg(reinterpret_cast<const float*>(x + (size_t)nb * 544) + b);
        tot[0][0] = k256_total(d2, hd.dm[0], a1[0], a2[0], am[0], tot[0][0]);
        tot[0][2] = k256_total(d2, hd.dm[1], a1[1], a2[1], am[1], tot[0][2]);
    });
    q4k_tile_store<NW, 1>(tot, y, rows, 1);
}

// Verify: up to 8 NG columns (rows of x, `stride` bytes apart) on m16n8k32, one MMA per sub-block,
// term and group of 8 columns, the weight fragment shared by the groups. Lane (g, t) feeds column
// 8c + g's B words and gets columns 8c + 2t, 8c + 2t + 1 of rows g, g + 8.
template <int NW, int NG>
__device__ void q4k_k256_mma(const uint8_t* __restrict__ wq, const uint8_t* __restrict__ wm,
                             const uint8_t* __restrict__ x, float* __restrict__ y, int rows, int nb, int nc,
                             int stride) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float tot[NG][4] = {};
    const uint8_t* xg[NG];     // B: column 8c + g (clamped; columns past nc are not stored)
    const uint8_t* xc[NG][2];  // bs and d2 of columns 8c + 2t, 8c + 2t + 1
#pragma unroll
    for (int c = 0; c < NG; ++c) {
        xg[c] = x + (size_t)min(8 * c + g, nc - 1) * stride + 16 * t;
#pragma unroll
        for (int k = 0; k < 2; ++k) xc[c][k] = x + (size_t)min(8 * c + 2 * t + k, nc - 1) * stride + (size_t)nb * 512;
    }
    q4k_tile_loop<Q4kMmaLoad, NW>(wq, wm, rows, nb, [&](const Q4kMmaLoad& w, int b) {
        const Q4kHead hd(w.h[0], w.h[1]);
#pragma unroll
        for (int c = 0; c < NG; ++c) {
            int4 bs[2][2];
            float d2[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                bs[k][0] = __ldg(reinterpret_cast<const int4*>(xc[c][k]) + 2 * b);
                bs[k][1] = __ldg(reinterpret_cast<const int4*>(xc[c][k]) + 2 * b + 1);
                d2[k] = __ldg(reinterpret_cast<const float*>(xc[c][k] + (size_t)nb * 32) + b);
            }
            int a1[4] = {0, 0, 0, 0}, a2[4] = {0, 0, 0, 0}, am[4] = {0, 0, 0, 0};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // column 8c + g's B words of sub-blocks 2i (words 0, 1) and 2i + 1 (2, 3), both terms
                const int4 x1 = __ldg(reinterpret_cast<const int4*>(xg[c] + (size_t)b * 512 + 64 * i));
                const int4 x2 = __ldg(reinterpret_cast<const int4*>(xg[c] + (size_t)b * 512 + 256 + 64 * i));
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int s = 2 * i + hh, sh = 4 * hh;
                    const int a[4] = {(int)(w.q[0][i].x >> sh) & 0x0F0F0F0F, (int)(w.q[1][i].x >> sh) & 0x0F0F0F0F,
                                      (int)(w.q[0][i].y >> sh) & 0x0F0F0F0F, (int)(w.q[1][i].y >> sh) & 0x0F0F0F0F};
                    int cc[4], e[4];
                    mma_s8_16x8x32(cc, a, lane_of(x1, 2 * hh), lane_of(x1, 2 * hh + 1));
                    mma_s8_16x8x32(e, a, lane_of(x2, 2 * hh), lane_of(x2, 2 * hh + 1));
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const int r = j >> 1;
                        const int sc = (int)((hd.sc[r][s >> 2] >> (8 * (s & 3))) & 0xFF);
                        const int mn = (int)((hd.mn[r][s >> 2] >> (8 * (s & 3))) & 0xFF);
                        a1[j] += sc * cc[j];
                        a2[j] += sc * e[j];
                        am[j] += mn * lane_of(bs[j & 1][s >> 2], s & 3);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
                tot[c][j] = k256_total(d2[j & 1], hd.dm[j >> 1], a1[j], a2[j], am[j], tot[c][j]);
        }
    });
    q4k_tile_store<NW, NG>(tot, y, rows, nc);
}

// matvec_q4_K_k256_c1_w<NW>(wq, wm, xq, y, rows, cols, n_tokens, stride): grid ceil(rows / 16),
// 32 NW threads; one column (n_tokens is 1). matvec_q4_K_k256_c<8 NG>_w<NW>: grid (ceil(rows / 16),
// ceil(n_tokens / 8 NG)), block y takes columns 8 NG y .. 8 NG y + 8 NG - 1.
#define Q4K_K256_MMA(NW, NG, NC)                                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * NW) matvec_q4_K_k256_c##NC##_w##NW(                              \
        const uint8_t* wq, const uint8_t* wm, const uint8_t* xq, float* y, int rows, int cols, int n_tokens, int stride) { \
        const int c0 = 8 * NG * blockIdx.y;                                                                           \
        q4k_k256_mma<NW, NG>(wq, wm, xq + (size_t)c0 * stride, y + (size_t)c0 * rows, rows, cols / 256,              \
                             min(8 * NG, n_tokens - c0), stride);                                                     \
    }
#define Q4K_K256(NW)                                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * NW) matvec_q4_K_k256_c1_w##NW(                                   \
        const uint8_t* wq, const uint8_t* wm, const uint8_t* xq, float* y, int rows, int cols, int n_tokens, int stride) { \
        q4k_k256_c1<NW>(wq, wm, xq, y, rows, cols / 256);                                                             \
    }                                                                                                                 \
    Q4K_K256_MMA(NW, 1, 8)                                                                                            \
    Q4K_K256_MMA(NW, 2, 16)
Q4K_K256(4)
Q4K_K256(8)
Q4K_K256(16)
// memra-kernel: matvec_q4_K_k256_c1_w4(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c8_w4(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c16_w4(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c1_w8(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c8_w8(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c16_w8(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c1_w16(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c8_w16(PPPPiiii)
// memra-kernel: matvec_q4_K_k256_c16_w16(PPPPiiii)
