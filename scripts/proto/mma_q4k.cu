// Prototype for issue 14 (not an engine kernel; scripts/proto/mma_q4k.py builds and times it).
//
// A Q4_K matvec on int8 tensor cores whose arithmetic does not depend on the column count: each
// MMA (16 rows x one 32-value sub-block x 8 columns) gives every (row, column) its exact integer
// sums, and the float steps per (row, column) are the same whether 1 or 8 columns are live. So a
// decode (1 column) and a verify (8) would share bits by construction, with no replay of the dp4a
// kernel's per-lane order (session 42: 631 instructions a warp trip, 3x decode's work a weight).
// The question it answers: is such a kernel as fast as the dp4a decode at 1 column, and how much
// does it cost at 8?
//
// Weights, repacked per 16-row tile and 256-value super-block (2,304 bytes, Q4_K's own size):
//   bytes [0, 2048): four 512-byte slices; slice i holds, for lane L = 4g + t, 16 bytes at 16 L:
//     the words (row g, k 4t), (row g + 8, k 4t), (row g, k 16 + 4t), (row g + 8, k 16 + 4t) of the
//     rows' Q4_K quant bytes 32 i + k .. + 3. A word's low nibbles are sub-block 2i's A fragment,
//     its high nibbles sub-block 2i + 1's: the repack only moves whole words.
//   bytes [2048, 2304): the 16 rows' Q4_K headers (d, dmin, 12 bytes of 6-bit scales and mins).
// Activations (a q8_1 row per column, both int8 terms), repacked per super-block for the B fragments:
//   xq[b][u][i][L] 16 bytes = sub-blocks 2i, 2i + 1 of term u for column g: (k 4t, k 16 + 4t) each;
//   xs[b][s][n] float2 = (d2, sum) of column n's q8_1 block: d1 = 254 d2 in quants.cuh's scheme, so
//   d1 c + d2 e = d2 (254 c + e) with 254 c + e an exact int (|c| <= 32 * 15 * 127).
// y[n][row] = sum over super-blocks of d * sum_s sc_s d2_s (254 c_s + e_s) - dmin * sum_s m_s sum_s,
// each warp a quarter of the super-blocks (b = warp, warp + 4, ...), the quarters added in warp order.
#include <cuda_fp16.h>
#include <stdint.h>

#include "../../cuda/quants.cuh"  // Q4_K header bytes (q4k_scale_bytes, scale_byte), lane_of

__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float byte_f(const uint32_t (&v)[2], int s) { return (float)scale_byte(v, s); }

// NW: warps a block (4 unless a kernel's name says _w8 / _w16); warp w takes super-blocks b = w, w + NW, ...
// of the block's tile, and the warps' sums are added in warp order (so NW chains a (row, column)).

// A warp's share of its tile for super-block b: the lane's A-fragment words and rows g and g + 8's headers.
struct Tile { int4 q[4], h0, h1; };

__device__ __forceinline__ void tile_load(Tile& d, const uint8_t* wt, int b, int lane) {
    const uint8_t* p = wt + (size_t)b * 2304;
#pragma unroll
    for (int i = 0; i < 4; ++i) d.q[i] = __ldg(reinterpret_cast<const int4*>(p + 512 * i) + lane);
    d.h0 = __ldg(reinterpret_cast<const int4*>(p + 2048) + (lane >> 2));
    d.h1 = __ldg(reinterpret_cast<const int4*>(p + 2048) + (lane >> 2) + 8);
}

// Rows g and g + 8: scale and min bytes of the 8 sub-blocks, and (d, dmin).
struct Scales { uint32_t sc0[2], mn0[2], sc1[2], mn1[2]; float2 dm0, dm1; };

__device__ __forceinline__ Scales tile_scales(const Tile& tl) {
    Scales s;
    q4k_scale_bytes(tl.h0, s.sc0, s.mn0);
    q4k_scale_bytes(tl.h1, s.sc1, s.mn1);
    s.dm0 = __half22float2(*reinterpret_cast<const __half2*>(&tl.h0.x));
    s.dm1 = __half22float2(*reinterpret_cast<const __half2*>(&tl.h1.x));
    return s;
}

// The sub-block's A fragment: low nibbles of the pair's words for hh = 0, high for hh = 1.
__device__ __forceinline__ void a_frag(int (&a)[4], const int4& q, int hh) {
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = (lane_of(q, j) >> (4 * hh)) & 0x0F0F0F0F;
}

// The warp's super-blocks in order, the next DEPTH ones' loads in flight (before the PDL wait for the
// first: weights do not depend on the previous kernel).
template <int DEPTH = 1, int NW = 4, typename F>
__device__ __forceinline__ void tile_loop(const uint8_t* wt, int nb, F&& body) {
    const int lane = threadIdx.x & 31;
    Tile ring[DEPTH + 1];
    const int b0 = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < DEPTH; ++k)
        if (b0 + k * NW < nb) tile_load(ring[k], wt, b0 + k * NW, lane);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int b = b0; b < nb; b += NW * (DEPTH + 1)) {  // unrolled over the ring so its indices stay static
#pragma unroll
        for (int k = 0; k <= DEPTH; ++k) {
            const int bk = b + k * NW;
            if (bk >= nb) break;
            if (bk + DEPTH * NW < nb) tile_load(ring[(k + DEPTH) % (DEPTH + 1)], wt, bk + DEPTH * NW, lane);
            body(ring[k], bk);
        }
    }
}

// The lane's (row g, columns 2t, 2t + 1) and (row g + 8, the same) sums, the warps' added in warp order.
template <int NC, int NW = 4>
__device__ __forceinline__ void tile_out(const float (&tot)[4], float* __restrict__ y, int rows) {
    __shared__ float part[NW][16][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    part[warp][g][2 * t] = tot[0];
    part[warp][g][2 * t + 1] = tot[1];
    part[warp][g + 8][2 * t] = tot[2];
    part[warp][g + 8][2 * t + 1] = tot[3];
    __syncthreads();
    if (threadIdx.x < 16 * NC) {
        const int r = threadIdx.x & 15, n = threadIdx.x >> 4;
        float v = part[0][r][n];
#pragma unroll
        for (int k = 1; k < NW; ++k) v += part[k][r][n];
        y[(size_t)n * rows + blockIdx.x * 16 + r] = v;
    }
}

template <int NC>
__device__ void mvq4k(const uint8_t* __restrict__ w, const int4* __restrict__ xq, const float4* __restrict__ xs,
                      float* __restrict__ y, int rows, int nb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_loop(w + (size_t)blockIdx.x * nb * 2304, nb, [&](const Tile& tl, int b) {
        const Scales sc = tile_scales(tl);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, accm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int4* xb = xq + (size_t)b * 2 * 4 * 32;
        const float4* sb = xs + (size_t)b * 8 * 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int4 x1 = make_int4(0, 0, 0, 0), x2 = make_int4(0, 0, 0, 0);
            if (g < NC) {
                x1 = __ldg(xb + i * 32 + lane);
                x2 = __ldg(xb + (4 + i) * 32 + lane);
            }
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int s = 2 * i + hh;
                int a[4];
                a_frag(a, tl.q[i], hh);
                int c[4] = {0, 0, 0, 0};
                mma_s8(c, a, lane_of(x1, 2 * hh), lane_of(x1, 2 * hh + 1));
#pragma unroll
                for (int j = 0; j < 4; ++j) c[j] *= 254;
                mma_s8(c, a, lane_of(x2, 2 * hh), lane_of(x2, 2 * hh + 1));
                const float4 ds = __ldg(sb + s * 4 + t);  // (d2, sum) of columns 2t, 2t + 1
                const float s0 = byte_f(sc.sc0, s), s1 = byte_f(sc.sc1, s), m0 = byte_f(sc.mn0, s), m1 = byte_f(sc.mn1, s);
                acc[0] = fmaf(s0, ds.x * (float)c[0], acc[0]);
                acc[2] = fmaf(s1, ds.x * (float)c[2], acc[2]);
                accm[0] = fmaf(m0, ds.y, accm[0]);
                accm[2] = fmaf(m1, ds.y, accm[2]);
                if (NC > 1) {  // columns 2t + 1 live
                    acc[1] = fmaf(s0, ds.z * (float)c[1], acc[1]);
                    acc[3] = fmaf(s1, ds.z * (float)c[3], acc[3]);
                    accm[1] = fmaf(m0, ds.w, accm[1]);
                    accm[3] = fmaf(m1, ds.w, accm[3]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 dm = j < 2 ? sc.dm0 : sc.dm1;
            tot[j] += fmaf(dm.x, acc[j], -dm.y * accm[j]);
        }
    });
    tile_out<NC>(tot, y, rows);
}

// The same MMAs with one activation scale a super-block (two int8 terms, d1 = 254 d2 per 256 values,
// integer block sums bs = 254 sum(q1) + sum(q2) per sub-block): every sub-block's scale and min then
// multiply integers, and a (row, column) converts to float once a super-block.
//   xd[b][n] float d2 of column n; xb[b][s][n] int bs.
// y[n][row] = sum over b of d2 (d (254 sum_s sc_s c_s + sum_s sc_s e_s) - dmin sum_s m_s bs_s).
// Bounds: |sum_s sc_s c_s| <= 8 * 63 * 32 * 15 * 127 < 2^25, |sum_s m_s bs_s| <= 8 * 63 * 255 * 32 * 127 < 2^30.
__device__ __forceinline__ float int_total(float d2, float2 dm, int a1, int a2, int am, float tot) {
    return fmaf(d2, fmaf(dm.x, fmaf(254.0f, (float)a1, (float)a2), -dm.y * (float)am), tot);
}

template <int NC, int DEPTH = 1, int NW = 4>
__device__ void mvq4k_int(const uint8_t* __restrict__ w, const int4* __restrict__ xq, const float* __restrict__ xd,
                          const int4* __restrict__ xb, float* __restrict__ y, int rows, int nb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    tile_loop<DEPTH, NW>(w + (size_t)blockIdx.x * nb * 2304, nb, [&](const Tile& tl, int b) {
        const Scales sc = tile_scales(tl);
        int a1[4] = {0, 0, 0, 0}, a2[4] = {0, 0, 0, 0}, am[4] = {0, 0, 0, 0};
        const int4* xs = xq + (size_t)b * 2 * 4 * 32;
        const int4* bb = xb + (size_t)b * 16;  // 8 sub-blocks x 8 columns
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int4 x1 = make_int4(0, 0, 0, 0), x2 = make_int4(0, 0, 0, 0);
            if (g < NC) {
                x1 = __ldg(xs + i * 32 + lane);
                x2 = __ldg(xs + (4 + i) * 32 + lane);
            }
            const int4 bs = __ldg(bb + (2 * i) * 2 + t / 2);  // bs of columns 4(t/2) .. +3, sub-block 2i
            const int4 bs1 = __ldg(bb + (2 * i + 1) * 2 + t / 2);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int s = 2 * i + hh;
                int a[4];
                a_frag(a, tl.q[i], hh);
                int c[4] = {0, 0, 0, 0}, e[4] = {0, 0, 0, 0};
                mma_s8(c, a, lane_of(x1, 2 * hh), lane_of(x1, 2 * hh + 1));
                mma_s8(e, a, lane_of(x2, 2 * hh), lane_of(x2, 2 * hh + 1));
                const int s0 = scale_byte(sc.sc0, s), s1 = scale_byte(sc.sc1, s), m0 = scale_byte(sc.mn0, s), m1 = scale_byte(sc.mn1, s);
                const int4 bv = hh ? bs1 : bs;
                const int b0 = lane_of(bv, 2 * (t & 1)), b1 = lane_of(bv, 2 * (t & 1) + 1);  // columns 2t, 2t + 1
                a1[0] += s0 * c[0]; a2[0] += s0 * e[0]; am[0] += m0 * b0;
                a1[2] += s1 * c[2]; a2[2] += s1 * e[2]; am[2] += m1 * b0;
                if (NC > 1) {
                    a1[1] += s0 * c[1]; a2[1] += s0 * e[1]; am[1] += m0 * b1;
                    a1[3] += s1 * c[3]; a2[3] += s1 * e[3]; am[3] += m1 * b1;
                }
            }
        }
        const float2 d2 = __ldg(reinterpret_cast<const float2*>(xd + (size_t)b * 8 + 2 * t));
#pragma unroll
        for (int j = 0; j < 4; ++j) tot[j] = int_total((j & 1) ? d2.y : d2.x, j < 2 ? sc.dm0 : sc.dm1, a1[j], a2[j], am[j], tot[j]);
    });
    tile_out<NC, NW>(tot, y, rows);
}

// One column on dp4a with mvq4k_int's arithmetic: the integers inside a super-block are exact in any
// order, so this gives mvq4k_int_1's bits while each lane sums only its own k (4t.., 16 + 4t.. of every
// sub-block) for rows g and g + 8, and the quad's lanes add their integers once a super-block.
template <int NW>
__device__ void mvq4k_dp4a(const uint8_t* __restrict__ w, const int4* __restrict__ xq, const float* __restrict__ xd,
                           const int4* __restrict__ xb, float* __restrict__ y, int rows, int nb) {
    const int t = threadIdx.x & 3;
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (row g, column 0), -, (row g + 8, column 0), -
    tile_loop<1, NW>(w + (size_t)blockIdx.x * nb * 2304, nb, [&](const Tile& tl, int b) {
        const Scales sc = tile_scales(tl);
        int a1[2] = {0, 0}, a2[2] = {0, 0}, am[2] = {0, 0};
        const int4* xs = xq + (size_t)b * 2 * 4 * 32;
        const int* bb = reinterpret_cast<const int*>(xb + (size_t)b * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int4 x1 = __ldg(xs + i * 32 + t), x2 = __ldg(xs + (4 + i) * 32 + t);  // column 0's B words
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int s = 2 * i + hh;
                int a[4];
                a_frag(a, tl.q[i], hh);
                const int u0 = lane_of(x1, 2 * hh), u1 = lane_of(x1, 2 * hh + 1), v0 = lane_of(x2, 2 * hh), v1 = lane_of(x2, 2 * hh + 1);
                const int s0 = scale_byte(sc.sc0, s), s1 = scale_byte(sc.sc1, s);
                a1[0] += s0 * __dp4a(a[2], u1, __dp4a(a[0], u0, 0));
                a2[0] += s0 * __dp4a(a[2], v1, __dp4a(a[0], v0, 0));
                a1[1] += s1 * __dp4a(a[3], u1, __dp4a(a[1], u0, 0));
                a2[1] += s1 * __dp4a(a[3], v1, __dp4a(a[1], v0, 0));
            }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {  // the mins: lane t takes sub-blocks 2t and 2t + 1
            const int s = 2 * t + hh, bv = __ldg(bb + 8 * s);
            am[0] += scale_byte(sc.mn0, s) * bv;
            am[1] += scale_byte(sc.mn1, s) * bv;
        }
#pragma unroll
        for (int o = 1; o < 4; o <<= 1)  // the quad's integers: exact, so any order
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                a1[j] += __shfl_xor_sync(0xffffffffu, a1[j], o);
                a2[j] += __shfl_xor_sync(0xffffffffu, a2[j], o);
                am[j] += __shfl_xor_sync(0xffffffffu, am[j], o);
            }
        const float d2 = __ldg(xd + (size_t)b * 8);
        tot[0] = int_total(d2, sc.dm0, a1[0], a2[0], am[0], tot[0]);
        tot[2] = int_total(d2, sc.dm1, a1[1], a2[1], am[1], tot[2]);
    });
    tile_out<1, NW>(tot, y, rows);  // column 0 comes from lanes t = 0
}

#define MVQ4K(NC)                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) mvq4k_mma_##NC(const uint8_t* w, const int4* xq,       \
                                                                      const float4* xs, float* y, int rows, \
                                                                      int nb) {                               \
        mvq4k<NC>(w, xq, xs, y, rows, nb);                                                                    \
    }
MVQ4K(1)
MVQ4K(2)
MVQ4K(4)
MVQ4K(8)

#define MVQ4K_INT(NC)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mvq4k_int_##NC(const uint8_t* w, const int4* xq,          \
                                                                      const float* xd, const int4* xb, float* y, \
                                                                      int rows, int nb) {                        \
        mvq4k_int<NC>(w, xq, xd, xb, y, rows, nb);                                                             \
    }
MVQ4K_INT(1)
MVQ4K_INT(2)
MVQ4K_INT(4)
MVQ4K_INT(8)

// The same with two super-blocks' loads in flight a warp (does the one-deep ring leave DRAM idle?).
#define MVQ4K_INT2(NC)                                                                                         \
    extern "C" __global__ void __launch_bounds__(128) mvq4k_int2_##NC(const uint8_t* w, const int4* xq,         \
                                                                       const float* xd, const int4* xb, float* y, \
                                                                       int rows, int nb) {                        \
        mvq4k_int<NC, 2>(w, xq, xd, xb, y, rows, nb);                                                          \
    }
MVQ4K_INT2(1)
MVQ4K_INT2(8)

// Wider blocks for shapes with few 16-row tiles (2,048 rows: 128 tiles for 132 SMs) or long rows.
#define MVQ4K_W(NW)                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * NW) mvq4k_int_8_w##NW(const uint8_t* w, const int4* xq,   \
                                                                         const float* xd, const int4* xb,       \
                                                                         float* y, int rows, int nb) {          \
        mvq4k_int<8, 1, NW>(w, xq, xd, xb, y, rows, nb);                                                       \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * NW) mvq4k_dp4a_1_w##NW(const uint8_t* w, const int4* xq,  \
                                                                          const float* xd, const int4* xb,      \
                                                                          float* y, int rows, int nb) {         \
        mvq4k_dp4a<NW>(w, xq, xd, xb, y, rows, nb);                                                            \
    }
MVQ4K_W(4)
MVQ4K_W(8)
MVQ4K_W(16)

extern "C" __global__ void __launch_bounds__(128) mvq4k_dp4a_1(const uint8_t* w, const int4* xq, const float* xd,
                                                               const int4* xb, float* y, int rows, int nb) {
    mvq4k_dp4a<4>(w, xq, xd, xb, y, rows, nb);
}
