// ggml weight blocks, the q8_1 activation, and one int8 dot product per weight type.
//
// Written once, ggml-cuda vecdotq.cuh style: matvec.cu and gemm.cu are templates over the traits
// structs below, so adding a quant type means adding one struct here.
//
// 1. The ggml block layouts, bit-exact (checked against gguf.quants and ggml-common.h). These are
//    what a GGUF file stores; static_asserts pin the sizes.
// 2. The repacked layout the kernels read. ggml blocks of 18/20/22/24/34/84/110/136/210 bytes leave rows and
//    blocks off 16-byte alignment, so upload (engine/gpu/quant_ops.py) splits every block into two
//    planes, a pure byte split with no bit shuffling:
//       q plane:    rows * nb * QB bytes, block (r, b) at (r*nb + b)*QB  (QB a multiple of 16)
//       meta plane: rows * nb * MB bytes, block (r, b) at (r*nb + b)*MB  (d, m, scales, qh)
//    Per type, as byte ranges of the ggml block:
//       Q4_0 (18):  q = qs[2:18]   (16)   meta = d[0:2]                        (2)
//       Q4_1 (20):  q = qs[4:20]   (16)   meta = d,m[0:4]                      (4)
//       Q5_0 (22):  q = qs[6:22]   (16)   meta = d[0:2], 2 zero bytes, qh[2:6] (8)
//       Q5_1 (24):  q = qs[8:24]   (16)   meta = d,m,qh[0:8]                   (8)
//       Q8_0 (34):  q = qs[2:34]   (32)   meta = d[0:2]                        (2)
//       Q4_K (144): q = qs[16:144] (128)  meta = d,dmin,scales[0:16]           (16)
//       Q5_K (176): q = qh,qs[16:176] (160) meta = d,dmin,scales[0:16]         (16)
//       Q6_K (210): q = ql,qh,scales[0:208] (208) meta = d[208:210]            (2)
//       Q2_K (84):  q = scales,qs[0:80] (80)  meta = d,dmin[80:84]              (4)
//       Q3_K (110): q = hmask,qs[0:96] (96)   meta = scales,d[96:110], 2 zero bytes (16)
//       IQ4_XS (136): q = qs[8:136] (128)     meta = d,scales_h,scales_l[0:8]  (8)
//    Every 16-byte load of quants is then aligned and a warp's loads are contiguous.
// 3. The q8_1 activation (our own: two int8 terms, structure-of-arrays). Per token, a row of
//    q8_1_stride(K) bytes (quant_ops.py; Kq = K rounded up to 32, the stride a multiple of 16):
//       int8 qs[Kq] | int8 qs2[Kq] | float4 ds[Kq/32] = (d1, sum, d2, 0)
//    Per 32-value block: d1 = amax|x| / 127, qs = roundf(x / d1); the residual r = x - d1*qs (one
//    rounding: fmaf), d2 = d1 / 254 (|r| <= d1/2), qs2 = roundf(r / d2) (0 where amax is 0); sum = the
//    float sum of x (ggml's quantize_q8_1 convention). x ~ d1*qs + d2*qs2 to amax/64516 where one
//    int8 term alone gives amax/254: that rounding flipped greedy tokens of real models (~96% top-1
//    agreement with f32 on SmolLM2). A unit's dot is d_w * (d1 * sum(w qs) + d2 * sum(w qs2)) plus
//    the type's offset term (Q4_0's -8 d_w, Q4_1's m, ...) times the exact sum, counted once. Two
//    dp4a per weight int instead of one: decode matvecs are bound by latency, not by dp4a.
//
// A "unit" is the piece of a block one thread handles in one step: a whole block for the 32-wide
// types, a quarter super-block (64 values) for the K-quants, a 32-value sub-block for IQ4_XS.
// Each traits struct gives
//   QK, UNITS (units per block), QB, MB (plane bytes per block), UE (values per unit)
//   W: the unit's weight registers; load_w(W&, q_block, meta_block, unit)
//   A: the unit's activation registers; load_a(A&, q8_1_row, block, unit)
//   dot(W, A) -> float: the two-term int8 dot product (dp4a) with all scales applied
//   dequant(q_block, meta_block, unit, half* dst): UE values and their offsets in the
//     block (for the tensor-core GEMM's dequantized tiles).
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

// ---- 1. ggml block layouts (ggml-common.h) -------------------------------------------------
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

struct block_q4_0 { half d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { half d; half m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { half d; half m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { half d; int8_t qs[QK8_0]; };
struct block_q4_K { half d; half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { half d; half dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; half d; };
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; half d; half dmin; };  // scales: 4-bit scale | 4-bit min << 4
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[K_SCALE_SIZE]; half d; };
struct block_iq4_xs { half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };

static_assert(sizeof(block_q4_0) == 18, "wrong q4_0 block size");
static_assert(sizeof(block_q4_1) == 20, "wrong q4_1 block size");
static_assert(sizeof(block_q5_0) == 22, "wrong q5_0 block size");
static_assert(sizeof(block_q5_1) == 24, "wrong q5_1 block size");
static_assert(sizeof(block_q8_0) == 34, "wrong q8_0 block size");
static_assert(sizeof(block_q4_K) == 144, "wrong q4_K block size");
static_assert(sizeof(block_q5_K) == 176, "wrong q5_K block size");
static_assert(sizeof(block_q6_K) == 210, "wrong q6_K block size");
static_assert(sizeof(block_q2_K) == 84, "wrong q2_K block size");
static_assert(sizeof(block_q3_K) == 110, "wrong q3_K block size");
static_assert(sizeof(block_iq4_xs) == 136, "wrong iq4_xs block size");

// ---- small helpers ---------------------------------------------------------------------------
// Host and device: tests/test_quant_host.py compiles this header into a CPU program and checks
// every dot product and dequant against gguf's numpy code without a GPU.
#define QDEV __host__ __device__ __forceinline__

QDEV int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

// Float steps of the dot products, each rounded on its own (never contracted into an FMA the
// compiler picks): every matvec instantiation (rows per warp, columns) must give the same bits,
// so that speculative verify reproduces decode exactly.
QDEV float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
QDEV float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
QDEV float ffma(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}

// Per-byte a - b (no saturation needed: callers stay in int8 range).
QDEV int vsub4(int a, int b) {
#ifdef __CUDA_ARCH__
    return (int)__vsub4((unsigned)a, (unsigned)b);
#else
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((unsigned)(((a >> (8 * i)) & 0xFF) - ((b >> (8 * i)) & 0xFF)) & 0xFFu) << (8 * i);
    return (int)r;
#endif
}

// __byte_perm: result byte i is byte (s >> 4i) & 7 of the 8 bytes {y:x} (selectors 0..7 only).
QDEV unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const unsigned long long yx = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((yx >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
#endif
}

QDEV int lane_of(const int4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

QDEV int byte_of(const int4& v, int i) { return (lane_of(v, i >> 2) >> (8 * (i & 3))) & 0xFF; }
QDEV int nibble(const int4& v, int i, int high) { return (byte_of(v, i) >> (4 * high)) & 0xF; }

// Eight f16 values in one 16-byte shared-memory store (the GEMM's dequantized tiles).
QDEV void store8(half* dst, const float* v) {
    half2 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    int4 out;
    memcpy(&out, h, sizeof out);  // not a pointer cast: that breaks strict aliasing on the host
    *reinterpret_cast<int4*>(dst) = out;
}

QDEV int4 ld16(const void* p) { return *reinterpret_cast<const int4*>(p); }

QDEV float ld_half(const void* p) { return __half2float(*reinterpret_cast<const half*>(p)); }

// Bits 0..3 of b to bit 4 of bytes 0..3 (the fifth bit of four 5-bit quants).
QDEV int spread_bit4(unsigned b) {
    return ((b << 4) & 0x10) | ((b << 11) & 0x1000) | ((b << 18) & 0x100000) | ((b << 25) & 0x10000000);
}

// ggml get_scale_min_k4: 6-bit scale and min of sub-block j from the 12 packed bytes.
QDEV void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// ---- 3. the q8_1 activation ----------------------------------------------------------------
// Where the three arrays of one token's row start (kq: the row's values, a multiple of 32).
struct q8_1_row { const int8_t* qs; const int8_t* qs2; const float4* ds; };

QDEV q8_1_row q8_1_row_at(const int8_t* row, int kq) {
    return {row, row + kq, reinterpret_cast<const float4*>(row + 2 * kq)};
}

#ifdef __CUDACC__
__device__ __forceinline__ float warp_absmax(float v) {
    float m = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// The one q8_1 producer: value i (column) of a token's row, one value per lane of a full warp
// holding one 32-value block (i = 32 * block + lane). row: the start of the token's row of
// q8_1_stride bytes (16-byte aligned); kq: the row's values. Every kernel that emits q8_1
// (quantize_q8_1, the fused matvec, a norm, an activation, attention) calls this, so all of them
// write the same bytes. Lane 0 writes the block's ds.
__device__ __forceinline__ void quantize_q8_1_at(float xi, int8_t* row, int kq, int i) {
    float sum = xi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float amax = warp_absmax(xi);
    const float d1 = amax / 127.0f;
    const float q1 = amax == 0.0f ? 0.0f : roundf(xi / d1);
    const float r = __fmaf_rn(-d1, q1, xi);  // x - d1*q1 rounded once (the product is exact in the fma)
    // |r| <= d1/2, so a fixed d2 = d1/254 keeps r/d2 within +-127 (the clamp only guards the
    // rounding of x/d1): no second amax reduction, and as fine as an adaptive d2 would be at worst
    const float d2 = d1 / 254.0f;
    row[i] = (int8_t)q1;
    row[kq + i] = amax == 0.0f ? 0 : (int8_t)fminf(fmaxf(roundf(r / d2), -127.0f), 127.0f);
    if ((threadIdx.x & 31) == 0) reinterpret_cast<float4*>(row + 2 * kq)[i >> 5] = make_float4(d1, sum, d2, 0.0f);
}
#endif

#ifdef __CUDACC__
// ---- the per-256 activation, q8_k256 (issue 14; k256.cu's Q4_K matvecs read it) ---------------
// q8_1's two int8 terms with one scale per 256 values (d1 = amax/127 of the 256, d2 = d1/254),
// so a K-quant super-block's sub-block scales and mins multiply exact integers and a (row,
// column) converts to float once a super-block: the same float steps for 1 or 8 columns. Per
// token, a row of q8_k256_stride(K) bytes (quant_ops.py), nb = K / 256 rounded up, zero-padded:
//   int8 q[nb][2][256]     term u of super-block b: value 64 i + 32 h + 8 t + e (pair i of sub-blocks
//                          2i, 2i + 1; h which of them; t a quarter; e < 8) at 64 i + 16 t + 8 h + e,
//                          so one 16-byte load gives an MMA lane t its B words of both sub-blocks of a
//                          pair, and a dp4a lane's 64 bytes are still one pair whole
//   int32 bs[nb][8]        254 sum(q1) + sum(q2) over each 32-value sub-block (exact integers)
//   float d2[nb]
// The values are d2 (254 q1 + q2). One value per thread; the caller's warp holds one whole
// sub-block (j = 32 * sub-block + lane) and passes the super-block's amax.
__device__ __forceinline__ void q8_k256_store(float xj, float amax, uint8_t* row, int nb, int j) {
    const float d1 = amax / 127.0f;
    const float q1 = amax == 0.0f ? 0.0f : roundf(xj / d1);
    const float r = __fmaf_rn(-d1, q1, xj);  // as quantize_q8_1_at
    const float d2 = d1 / 254.0f;
    const int q2 = amax == 0.0f ? 0 : (int)fminf(fmaxf(roundf(r / d2), -127.0f), 127.0f);
    const int b = j >> 8, k = j & 255, lane = k & 31;
    const int off = b * 512 + (k & 192) + ((k >> 3) & 3) * 16 + ((k >> 5) & 1) * 8 + (k & 7);
    row[off] = (uint8_t)(int8_t)q1;
    row[off + 256] = (uint8_t)(int8_t)q2;
    int v = 254 * (int)q1 + q2;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) reinterpret_cast<int*>(row + nb * 512)[j >> 5] = v;
    if (k == 0) reinterpret_cast<float*>(row + nb * 544)[b] = d2;
}

// Q4_K's header as bytes, for the q8_k256 matvecs (k256.cu) and scripts/proto/mma_q4k.cu.
// A row's 8 scales and 8 mins as bytes (sc[0] sub-blocks 0-3, sc[1] 4-7; mn the same) from its
// header's scale words, four at a time.
__device__ __forceinline__ void q4k_scale_bytes(const int4& h, uint32_t (&sc)[2], uint32_t (&mn)[2]) {
    const uint32_t w0 = h.y, w1 = h.z, w2 = h.w;
    sc[0] = w0 & 0x3F3F3F3Fu;
    mn[0] = w1 & 0x3F3F3F3Fu;
    sc[1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    mn[1] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
}

// Byte s of the pair (s may differ by lane: a select and one PRMT, no local-memory index).
__device__ __forceinline__ int scale_byte(const uint32_t (&v)[2], int s) {
    return (int)__byte_perm(s < 4 ? v[0] : v[1], 0, 0x4440 | (s & 3));
}

// Bytes of a token's q8_k256 row of n values (quant_ops.q8_k256_stride).
__device__ __forceinline__ int q8_k256_row_bytes(int n) { return ((((n + 255) >> 8) * 548) + 15) & ~15; }

// The producers' q8_k256 copy where a block of 256 threads holds one super-block (thread j of
// block b: value 256 b + j, 0 past the row): quantize_q8_k256, the split norm, the gated
// activations. Every thread of the block calls it.
__device__ __forceinline__ void q8_k256_block(float xj, uint8_t* row, int nb, int j) {
    __shared__ float wmax[8];
    const float m = warp_absmax(xj);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = wmax[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) amax = fmaxf(amax, wmax[w]);
    q8_k256_store(xj, amax, row, nb, j);
}

// The same for a row a block has written to global memory (yr, n values) with blockDim a multiple
// of 256: 256-thread groups take a super-block each, re-reading the row (L1) after a barrier.
__device__ __forceinline__ void q8_k256_row(const float* yr, uint8_t* row, int n) {
    __shared__ float wmax[32];
    const int nb = (n + 255) >> 8, warp = threadIdx.x >> 5;
    __syncthreads();  // the row's values were written by other threads of the block
    for (int base = 0; base < nb * 256; base += blockDim.x) {  // block-uniform bounds
        const int j = base + threadIdx.x;
        const float v = j < n ? yr[j] : 0.0f;
        const float m = warp_absmax(v);
        if ((threadIdx.x & 31) == 0) wmax[warp] = m;
        __syncthreads();
        float amax = wmax[warp & ~7];
#pragma unroll
        for (int w = 1; w < 8; ++w) amax = fmaxf(amax, wmax[(warp & ~7) + w]);
        if (j < nb * 256) q8_k256_store(v, amax, row, nb, j);  // warp-uniform: whole 256-thread groups
        __syncthreads();
    }
}
#endif

// d1 * s.x + d2 * s.y + c: a two-term activation's dot with int sums s (first term, residual
// term), plus c. The first fma takes the cancellation against an offset term c exactly.
QDEV float act_dot(float d1, float d2, int2 s, float c) {
    return ffma(d2, (float)s.y, ffma(d1, (float)s.x, c));
}

// One 32-value q8_1 activation block: 8 ints of int8 per term and (d1, sum, d2, 0).
struct act32 { int4 lo, hi, lo2, hi2; float4 ds; };

QDEV void load_act32(act32& a, const q8_1_row& x, int blk) {
    a.lo = ld16(x.qs + 32 * blk);
    a.hi = ld16(x.qs + 32 * blk + 16);
    a.lo2 = ld16(x.qs2 + 32 * blk);
    a.hi2 = ld16(x.qs2 + 32 * blk + 16);
    a.ds = x.ds[blk];
}

// Sums over the 32 values of (4-bit or 5-bit weight ints) x (each activation int8 term): q ints
// hold values 0..15 / 16..31 of the block in their low / high nibbles (ggml's 32-wide layout).
QDEV int2 dot_nibbles(const int4& q, const int4& hbits_lo, const int4& hbits_hi, const act32& a) {
    int s = 0, s2 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int v = lane_of(q, i);
        const int lo = ((v >> 0) & 0x0F0F0F0F) | lane_of(hbits_lo, i);
        const int hi = ((v >> 4) & 0x0F0F0F0F) | lane_of(hbits_hi, i);
        s = dp4a(lo, lane_of(a.lo, i), s);
        s = dp4a(hi, lane_of(a.hi, i), s);
        s2 = dp4a(lo, lane_of(a.lo2, i), s2);
        s2 = dp4a(hi, lane_of(a.hi2, i), s2);
    }
    return make_int2(s, s2);
}


// ---- 2. per-type traits ----------------------------------------------------------------------

struct q4_0_t {  // w = d * (q - 8)
    static constexpr int QK = 32, UNITS = 1, QB = 16, MB = 2, UE = 32;
    struct W { int4 q; float d; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int) {
        w.q = ld16(q);
        w.d = ld_half(m);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int) { load_act32(a, x, b); }
    static QDEV float dot(const W& w, const A& a) {
        const int4 z = make_int4(0, 0, 0, 0);
        return fmul(w.d, act_dot(a.ds.x, a.ds.z, dot_nibbles(w.q, z, z, a), -8.0f * a.ds.y));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = w.d * (float)(nibble(w.q, (8 * g + e) & 15, g >> 1) - 8);
            store8(dst + 8 * g, v);
        }
    }
};

struct q4_1_t {  // w = d * q + m
    static constexpr int QK = 32, UNITS = 1, QB = 16, MB = 4, UE = 32;
    struct W { int4 q; float d, m; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int) {
        w.q = ld16(q);
        const half2 dm = *reinterpret_cast<const half2*>(m);
        w.d = __low2float(dm);
        w.m = __high2float(dm);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int) { load_act32(a, x, b); }
    static QDEV float dot(const W& w, const A& a) {
        const int4 z = make_int4(0, 0, 0, 0);
        return ffma(w.m, a.ds.y, fmul(w.d, act_dot(a.ds.x, a.ds.z, dot_nibbles(w.q, z, z, a), 0.0f)));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = w.d * (float)nibble(w.q, (8 * g + e) & 15, g >> 1) + w.m;
            store8(dst + 8 * g, v);
        }
    }
};

// The fifth bits of Q5_x: qh bit i belongs to value i; as ints aligned with dot_nibbles' lanes.
QDEV void q5_high_bits(unsigned qh, int4& lo, int4& hi) {
    lo = make_int4(spread_bit4(qh >> 0), spread_bit4(qh >> 4), spread_bit4(qh >> 8), spread_bit4(qh >> 12));
    hi = make_int4(spread_bit4(qh >> 16), spread_bit4(qh >> 20), spread_bit4(qh >> 24), spread_bit4(qh >> 28));
}

struct q5_0_t {  // w = d * (q5 - 16)
    static constexpr int QK = 32, UNITS = 1, QB = 16, MB = 8, UE = 32;
    struct W { int4 q; unsigned qh; float d; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int) {
        w.q = ld16(q);
        const uint2 meta = *reinterpret_cast<const uint2*>(m);
        w.d = __half2float(__ushort_as_half((unsigned short)(meta.x & 0xFFFF)));
        w.qh = meta.y;
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int) { load_act32(a, x, b); }
    static QDEV float dot(const W& w, const A& a) {
        int4 hl, hh;
        q5_high_bits(w.qh, hl, hh);
        return fmul(w.d, act_dot(a.ds.x, a.ds.z, dot_nibbles(w.q, hl, hh, a), -16.0f * a.ds.y));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int i = 8 * g + e;
                v[e] = w.d * (float)((nibble(w.q, i & 15, g >> 1) | (int)(((w.qh >> i) & 1) << 4)) - 16);
            }
            store8(dst + 8 * g, v);
        }
    }
};

struct q5_1_t {  // w = d * q5 + m
    static constexpr int QK = 32, UNITS = 1, QB = 16, MB = 8, UE = 32;
    struct W { int4 q; unsigned qh; float d, m; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int) {
        w.q = ld16(q);
        const uint2 meta = *reinterpret_cast<const uint2*>(m);
        w.d = __half2float(__ushort_as_half((unsigned short)(meta.x & 0xFFFF)));
        w.m = __half2float(__ushort_as_half((unsigned short)(meta.x >> 16)));
        w.qh = meta.y;
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int) { load_act32(a, x, b); }
    static QDEV float dot(const W& w, const A& a) {
        int4 hl, hh;
        q5_high_bits(w.qh, hl, hh);
        return ffma(w.m, a.ds.y, fmul(w.d, act_dot(a.ds.x, a.ds.z, dot_nibbles(w.q, hl, hh, a), 0.0f)));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int i = 8 * g + e;
                v[e] = w.d * (float)(nibble(w.q, i & 15, g >> 1) | (int)(((w.qh >> i) & 1) << 4)) + w.m;
            }
            store8(dst + 8 * g, v);
        }
    }
};

struct q8_0_t {  // w = d * q
    static constexpr int QK = 32, UNITS = 1, QB = 32, MB = 2, UE = 32;
    struct W { int4 lo, hi; float d; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int) {
        w.lo = ld16(q);
        w.hi = ld16(q + 16);
        w.d = ld_half(m);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int) { load_act32(a, x, b); }
    static QDEV float dot(const W& w, const A& a) {
        int s = 0, s2 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s = dp4a(lane_of(w.lo, i), lane_of(a.lo, i), s);
            s = dp4a(lane_of(w.hi, i), lane_of(a.hi, i), s);
            s2 = dp4a(lane_of(w.lo, i), lane_of(a.lo2, i), s2);
            s2 = dp4a(lane_of(w.hi, i), lane_of(a.hi2, i), s2);
        }
        return fmul(w.d, act_dot(a.ds.x, a.ds.z, make_int2(s, s2), 0.0f));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = w.d * (float)(int8_t)byte_of(g < 2 ? w.lo : w.hi, (8 * g + e) & 15);
            store8(dst + 8 * g, v);
        }
    }
};

// K-quants: a unit is a quarter super-block, 64 values. For Q4_K/Q5_K unit j covers sub-blocks
// 2j and 2j+1 (values 64j..64j+63): qs bytes 32j..32j+31, low nibbles -> sub-block 2j.
struct act64 { int4 x[4], x2[4]; float4 ds0, ds1; };  // two consecutive q8_1 blocks, both terms

QDEV void load_act64(act64& a, const q8_1_row& x, int blk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a.x[i] = ld16(x.qs + 32 * blk + 16 * i);
#pragma unroll
    for (int i = 0; i < 4; ++i) a.x2[i] = ld16(x.qs2 + 32 * blk + 16 * i);
    a.ds0 = x.ds[blk];
    a.ds1 = x.ds[blk + 1];
}

// Scales of sub-blocks 2j, 2j+1, folded with d / dmin.
// One 16-byte load of the K-quant meta (d, dmin, 12 scale bytes), then ggml's get_scale_min_k4
// for both sub-blocks at once on 16-bit pairs (as llama.cpp's vec_dot_q4_K_q8_1), with selects,
// not branches: j differs across a warp's lanes, and per-byte branches there diverged (both sides
// ran, for each of R rows). Scale bytes 0..3, 4..7, 8..11 are mv.y, mv.z, mv.w; the pair of unit j
// sits in half j & 1 of each. The integers are scale_min_k4's (tests/test_quant_host.py checks).
QDEV void kquant_scales_of(const int4 mv, int j, float& dsc0, float& dsc1, float& dmn0, float& dmn1) {
    const float d = __half2float(__ushort_as_half((unsigned short)(mv.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)((unsigned)mv.x >> 16)));
    const int sh = 16 * (j & 1);
    const unsigned y = ((unsigned)mv.y >> sh) & 0xFFFF, z = ((unsigned)mv.z >> sh) & 0xFFFF;
    const unsigned w = ((unsigned)mv.w >> sh) & 0xFFFF;
    const bool high = j >= 2;  // sub-blocks 4..7: low 4 bits in bytes 8..11, top 2 bits in bytes 0..7
    const unsigned sc = high ? (w & 0x0F0F) | ((y & 0xC0C0) >> 2) : y & 0x3F3F;
    const unsigned mn = high ? ((w >> 4) & 0x0F0F) | ((z & 0xC0C0) >> 2) : z & 0x3F3F;
    dsc0 = fmul(d, (float)(int)(sc & 0xFF));
    dmn0 = fmul(dmin, (float)(int)(mn & 0xFF));
    dsc1 = fmul(d, (float)(int)(sc >> 8));
    dmn1 = fmul(dmin, (float)(int)(mn >> 8));
}

QDEV void kquant_scales(const uint8_t* meta, int j, float& dsc0, float& dsc1, float& dmn0, float& dmn1) {
    kquant_scales_of(ld16(meta), j, dsc0, dsc1, dmn0, dmn1);
}

// d*sc*(d1*sumi + d2*sumi2) - dmin*m*s for the unit's two sub-blocks (ds0, ds1: their q8_1
// (d1, sum, d2, 0)). The tensor-core verify matvec calls this too, on the MMA's integer sums.
QDEV float kquant_combine_ds(float dsc0, float dmn0, float dsc1, float dmn1, float4 ds0, float4 ds1, int2 s0, int2 s1) {
    const float t0 = ffma(-dmn0, ds0.y, fmul(dsc0, act_dot(ds0.x, ds0.z, s0, 0.0f)));
    const float t1 = ffma(-dmn1, ds1.y, fmul(dsc1, act_dot(ds1.x, ds1.z, s1, 0.0f)));
    return fadd(t0, t1);
}

QDEV float kquant_combine(float dsc0, float dmn0, float dsc1, float dmn1, const act64& a, int2 s0, int2 s1) {
    return kquant_combine_ds(dsc0, dmn0, dsc1, dmn1, a.ds0, a.ds1, s0, s1);
}

struct q4_K_t {  // w = d*sc[s]*q - dmin*m[s]
    static constexpr int QK = 256, UNITS = 4, QB = 128, MB = 16, UE = 64;
    struct W { int4 q0, q1; float dsc0, dsc1, dmn0, dmn1; };
    typedef act64 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        w.q0 = ld16(q + 32 * j);
        w.q1 = ld16(q + 32 * j + 16);
        kquant_scales(m, j, w.dsc0, w.dsc1, w.dmn0, w.dmn1);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act64(a, x, 8 * b + 2 * j); }
    static QDEV float dot(const W& w, const A& a) {
        int2 s0 = make_int2(0, 0), s1 = make_int2(0, 0);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int v = i < 4 ? lane_of(w.q0, i) : lane_of(w.q1, i - 4);
            const int v0 = v & 0x0F0F0F0F, v1 = (v >> 4) & 0x0F0F0F0F;
            s0.x = dp4a(v0, lane_of(a.x[i >> 2], i & 3), s0.x);
            s0.y = dp4a(v0, lane_of(a.x2[i >> 2], i & 3), s0.y);
            s1.x = dp4a(v1, lane_of(a.x[2 + (i >> 2)], i & 3), s1.x);
            s1.y = dp4a(v1, lane_of(a.x2[2 + (i >> 2)], i & 3), s1.y);
        }
        return kquant_combine(w.dsc0, w.dmn0, w.dsc1, w.dmn1, a, s0, s1);
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
        dst += 64 * j;
#pragma unroll
        for (int g = 0; g < 8; ++g) {  // g < 4: low nibbles (sub-block 2j), else high (2j+1)
            const int hi = g >> 2;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int l = 8 * (g & 3) + e;
                const int n = nibble(l < 16 ? w.q0 : w.q1, l & 15, hi);
                v[e] = hi ? w.dsc1 * (float)n - w.dmn1 : w.dsc0 * (float)n - w.dmn0;
            }
            store8(dst + 8 * g, v);
        }
    }
};

struct q5_K_t {  // as Q4_K with a fifth bit: qh[l] bit s is value l of sub-block s
    static constexpr int QK = 256, UNITS = 4, QB = 160, MB = 16, UE = 64;
    struct W { int4 q0, q1, h0, h1; int j; float dsc0, dsc1, dmn0, dmn1; };
    typedef act64 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        w.h0 = ld16(q);
        w.h1 = ld16(q + 16);
        w.q0 = ld16(q + 32 + 32 * j);
        w.q1 = ld16(q + 32 + 32 * j + 16);
        w.j = j;
        kquant_scales(m, j, w.dsc0, w.dsc1, w.dmn0, w.dmn1);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act64(a, x, 8 * b + 2 * j); }
    static QDEV float dot(const W& w, const A& a) {
        int2 s0 = make_int2(0, 0), s1 = make_int2(0, 0);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int v = i < 4 ? lane_of(w.q0, i) : lane_of(w.q1, i - 4);
            const int h = i < 4 ? lane_of(w.h0, i) : lane_of(w.h1, i - 4);
            const int v0 = (v & 0x0F0F0F0F) | (((h >> (2 * w.j)) & 0x01010101) << 4);
            const int v1 = ((v >> 4) & 0x0F0F0F0F) | (((h >> (2 * w.j + 1)) & 0x01010101) << 4);
            s0.x = dp4a(v0, lane_of(a.x[i >> 2], i & 3), s0.x);
            s0.y = dp4a(v0, lane_of(a.x2[i >> 2], i & 3), s0.y);
            s1.x = dp4a(v1, lane_of(a.x[2 + (i >> 2)], i & 3), s1.x);
            s1.y = dp4a(v1, lane_of(a.x2[2 + (i >> 2)], i & 3), s1.y);
        }
        return kquant_combine(w.dsc0, w.dmn0, w.dsc1, w.dmn1, a, s0, s1);
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
        dst += 64 * j;
#pragma unroll
        for (int g = 0; g < 8; ++g) {
            const int hi = g >> 2;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int l = 8 * (g & 3) + e;
                const int h5 = (byte_of(l < 16 ? w.h0 : w.h1, l & 15) >> (2 * j + hi)) & 1;
                const int n = nibble(l < 16 ? w.q0 : w.q1, l & 15, hi) | (h5 << 4);
                v[e] = hi ? w.dsc1 * (float)n - w.dmn1 : w.dsc0 * (float)n - w.dmn0;
            }
            store8(dst + 8 * g, v);
        }
    }
};

// Q6_K, Q3_K and Q2_K order a super-block as two halves of four 32-value rows: value
// 128h + 32k + l (h 0..1, k 0..3, l 0..31), row k stored in bit field k of the same bytes.
// Their unit j = (h = j>>1, l0 = 16(j&1)) takes values l0..l0+15 of all four rows, so one 16-byte
// load of each bit plane serves the whole unit, and the two units of a half cover its 128 values
// (the GEMM's K step). Each row piece is one 16-value sub-block: scale index 8h + 2k + (j&1).
// The activation of such a unit: 16 int8 of each term from each of q8_1 blocks 8b + 4h + k, and
// their d1, d2 (these types have no offset term that needs the block sums, Q2_K's mins aside).
struct act16x4 { int4 x[4], x2[4]; float d[4], d2[4]; };

QDEV void load_act16x4(act16x4& a, const q8_1_row& x, int b, int j) {
    const int h = j >> 1, l0 = 16 * (j & 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int blk = 8 * b + 4 * h + k;
        a.x[k] = ld16(x.qs + 32 * blk + l0);
        a.x2[k] = ld16(x.qs2 + 32 * blk + l0);
        const float4 ds = x.ds[blk];
        a.d[k] = ds.x;
        a.d2[k] = ds.z;
    }
}

// Q6_K: value 128h + 32k + l (h 0..1, k 0..3, l 0..31) is
//   (ql[64h + l + 32(k&1)] >> 4(k>>1)) & 15 | ((qh[32h + l] >> 2k) & 3) << 4, minus 32,
// times d * scales[8h + 2k + l/16]. Unit j = (h = j>>1, l0 = 16(j&1)) covers l0..l0+15 for all k:
// three 16-byte loads (two of ql, one of qh), four q8_1 half-blocks.
struct q6_K_t {
    static constexpr int QK = 256, UNITS = 4, QB = 208, MB = 2, UE = 64;
    struct W { int4 a, b, h; int sc[4]; float d; };
    typedef act16x4 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        const int h = j >> 1, l0 = 16 * (j & 1);
        w.a = ld16(q + 64 * h + l0);
        w.b = ld16(q + 64 * h + 32 + l0);
        w.h = ld16(q + 128 + 32 * h + l0);
        scales_of(w, *reinterpret_cast<const uint2*>(q + 192 + 8 * h), j);  // scales[8h .. 8h+7]
        w.d = ld_half(m);
    }
    static QDEV void scales_of(W& w, const uint2 s8, int j) {
        const int sel = j & 1;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned word = k < 2 ? s8.x : s8.y;
            w.sc[k] = (int)(int8_t)(word >> (8 * ((2 * k + sel) & 3)));
        }
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act16x4(a, x, b, j); }
    static QDEV float dot(const W& w, const A& a) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0, s2 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int src = (k & 1) ? lane_of(w.b, i) : lane_of(w.a, i);
                const int lo = (src >> (4 * (k >> 1))) & 0x0F0F0F0F;
                const int hi = ((lane_of(w.h, i) >> (2 * k)) & 0x03030303) << 4;
                const int q = vsub4(lo | hi, 0x20202020);
                s = dp4a(q, lane_of(a.x[k], i), s);
                s2 = dp4a(q, lane_of(a.x2[k], i), s2);
            }
            // sc * s fits a float exactly: |sc| <= 128, |s| <= 16 * 32 * 127 (< 2^24 together)
            sum = act_dot(a.d[k], a.d2[k], make_int2(w.sc[k] * s, w.sc[k] * s2), sum);
        }
        return fmul(w.d, sum);
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
        dst += 128 * (j >> 1) + 16 * (j & 1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float dk = w.d * (float)w.sc[k];
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const int l = 8 * g + e;
                    const int lo = nibble((k & 1) ? w.b : w.a, l, k >> 1);
                    const int hb = (byte_of(w.h, l) >> (2 * k)) & 3;
                    v[e] = dk * (float)((lo | (hb << 4)) - 32);
                }
                store8(dst + 32 * k + 8 * g, v);
            }
        }
    }
};

// Q2_K: 2-bit q = (qs[32h + l] >> 2k) & 3, w = d*(sc & 15)*q - dmin*(sc >> 4) with sc = scales[s]
// per 16-value sub-block s. The min term multiplies the sum of the rounded two-term activation,
// d1*sum(qs) + d2*sum(qs2) over the 16 values (dp4a against ones, as ggml does with one term):
// q8_1's exact sums cover 32 values, two sub-blocks. With the residual term that sum is within
// 16 * amax/64516 of the exact one, so the min term needs no sums of its own.
struct q2_K_t {
    static constexpr int QK = 256, UNITS = 4, QB = 80, MB = 4, UE = 64;
    struct W { int4 q; unsigned sc; float d, dmin; };  // sc: the scale bytes of rows k = 0..3
    typedef act16x4 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        const int h = j >> 1, l0 = 16 * (j & 1);
        w.q = ld16(q + 16 + 32 * h + l0);
        const uint2 s8 = *reinterpret_cast<const uint2*>(q + 8 * h);  // scales[8h .. 8h+7]
        w.sc = byte_perm(s8.x, s8.y, (j & 1) ? 0x7531 : 0x6420);      // bytes 2k + (j&1)
        const half2 dm = *reinterpret_cast<const half2*>(m);
        w.d = __low2float(dm);
        w.dmin = __high2float(dm);
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act16x4(a, x, b, j); }
    static QDEV float dot(const W& w, const A& a) {
        float sum_q = 0.0f, sum_m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0, s2 = 0, sx = 0, sx2 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int q = (lane_of(w.q, i) >> (2 * k)) & 0x03030303;
                const int x = lane_of(a.x[k], i), x2 = lane_of(a.x2[k], i);
                s = dp4a(q, x, s);
                s2 = dp4a(q, x2, s2);
                sx = dp4a(0x01010101, x, sx);
                sx2 = dp4a(0x01010101, x2, sx2);
            }
            const int sc = (w.sc >> (8 * k)) & 0xFF, scale = sc & 0xF, min = sc >> 4;
            sum_q = act_dot(a.d[k], a.d2[k], make_int2(scale * s, scale * s2), sum_q);
            sum_m = act_dot(a.d[k], a.d2[k], make_int2(min * sx, min * sx2), sum_m);
        }
        return ffma(-w.dmin, sum_m, fmul(w.d, sum_q));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
        dst += 128 * (j >> 1) + 16 * (j & 1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int sc = (w.sc >> (8 * k)) & 0xFF;
            const float dl = w.d * (float)(sc & 0xF), ml = w.dmin * (float)(sc >> 4);
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) v[e] = dl * (float)((byte_of(w.q, 8 * g + e) >> (2 * k)) & 3) - ml;
                store8(dst + 32 * k + 8 * g, v);
            }
        }
    }
};

// Q3_K: q = ((qs[32h + l] >> 2k) & 3) - 4 * !(hmask[l] bit 4h + k), in -4..3, w = d * (sc - 32) * q
// with sc the 6-bit scale of 16-value sub-block s: low 4 bits in scales[s % 8] (nibble s / 8),
// high 2 bits in scales[8 + s % 4] (bits 2(s / 4)).
QDEV int q3_K_scale(const int4& mv, int s) {  // mv: the 16 meta bytes, s: sub-block 0..15
    const int lo = (byte_of(mv, s & 7) >> (4 * (s >> 3))) & 0xF;
    const int hi = (byte_of(mv, 8 + (s & 3)) >> (2 * (s >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

struct q3_K_t {
    static constexpr int QK = 256, UNITS = 4, QB = 96, MB = 16, UE = 64;
    struct W { int4 ql, hm; int sc[4]; int hbit; float d; };  // hbit: hmask bit of row k = 0
    typedef act16x4 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        const int h = j >> 1, l0 = 16 * (j & 1);
        w.hm = ld16(q + l0);
        w.ql = ld16(q + 32 + 32 * h + l0);
        w.hbit = 4 * h;
        const int4 mv = ld16(m);  // scales[0:12], d, 2 zero bytes
#pragma unroll
        for (int k = 0; k < 4; ++k) w.sc[k] = q3_K_scale(mv, 8 * h + 2 * k + (j & 1));
        w.d = __half2float(__ushort_as_half((unsigned short)(mv.w & 0xFFFF)));
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act16x4(a, x, b, j); }
    static QDEV int quants4(const W& w, int k, int i) {  // four signed 3-bit quants of row k
        const int lo = (lane_of(w.ql, i) >> (2 * k)) & 0x03030303;
        const int hi = ((lane_of(w.hm, i) >> (w.hbit + k)) & 0x01010101) << 2;
        return vsub4(lo | hi, 0x04040404);
    }
    static QDEV float dot(const W& w, const A& a) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0, s2 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int q = quants4(w, k, i);
                s = dp4a(q, lane_of(a.x[k], i), s);
                s2 = dp4a(q, lane_of(a.x2[k], i), s2);
            }
            sum = act_dot(a.d[k], a.d2[k], make_int2(w.sc[k] * s, w.sc[k] * s2), sum);
        }
        return fmul(w.d, sum);
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        const int h = j >> 1, l0 = 16 * (j & 1);
        const int4 hm = ld16(q + l0), ql = ld16(q + 32 + 32 * h + l0), mv = ld16(m);
        const float d = __half2float(__ushort_as_half((unsigned short)(mv.w & 0xFFFF)));
        dst += 128 * h + l0;
#pragma unroll 1  // rolled: unrolled, the 128-row GEMM tile's dequant spills registers
        for (int k = 0; k < 4; ++k) {
            const float dl = d * (float)q3_K_scale(mv, 8 * h + 2 * k + (j & 1));
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const int l = 8 * g + e;
                    const int low = (byte_of(ql, l) >> (2 * k)) & 3;
                    const int high = (byte_of(hm, l) >> (4 * h + k)) & 1;
                    v[e] = dl * (float)(low - (high ? 0 : 4));
                }
                store8(dst + 32 * k + 8 * g, v);
            }
        }
    }
};

// IQ4_XS: 4-bit indices into the non-linear table kvalues_iq4nl, laid out per 32-value sub-block
// as Q4_0 (qs[16 ib + l] low nibble: value l, high nibble: value l + 16), w = d * (ls - 32) *
// kvalues[q] with ls the 6-bit scale: low 4 bits nibble ib of scales_l, high 2 bits of scales_h.
// kvalues_iq4nl = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as
// four little-endian words of int8 bytes (two byte_perms then pick per byte on index bit 3).
QDEV int iq4nl_values4(unsigned idx) {  // idx: four indices 0..15, one per byte
    const unsigned sel = (idx & 0x7) | ((idx >> 4) & 0x70) | ((idx >> 8) & 0x700) | ((idx >> 12) & 0x7000);
    const unsigned lo = byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel);  // entries 0..7
    const unsigned hi = byte_perm(0x26190D01u, 0x71594535u, sel);  // entries 8..15
    const unsigned upper = ((idx >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~upper) | (hi & upper));
}

struct iq4_xs_t {
    static constexpr int QK = 256, UNITS = 8, QB = 128, MB = 8, UE = 32;
    struct W { int4 q; float dl; };
    typedef act32 A;
    static QDEV void load_w(W& w, const uint8_t* q, const uint8_t* m, int j) {
        w.q = ld16(q + 16 * j);
        const uint2 meta = *reinterpret_cast<const uint2*>(m);  // d | scales_h << 16, scales_l
        const int ls = ((meta.y >> (4 * j)) & 0xF) | (((meta.x >> (16 + 2 * j)) & 3) << 4);
        w.dl = fmul(__half2float(__ushort_as_half((unsigned short)(meta.x & 0xFFFF))), (float)(ls - 32));
    }
    static QDEV void load_a(A& a, const q8_1_row& x, int b, int j) { load_act32(a, x, 8 * b + j); }
    static QDEV float dot(const W& w, const A& a) {
        int s = 0, s2 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned v = (unsigned)lane_of(w.q, i);
            const int lo = iq4nl_values4(v & 0x0F0F0F0Fu), hi = iq4nl_values4((v >> 4) & 0x0F0F0F0Fu);
            s = dp4a(lo, lane_of(a.lo, i), s);
            s = dp4a(hi, lane_of(a.hi, i), s);
            s2 = dp4a(lo, lane_of(a.lo2, i), s2);
            s2 = dp4a(hi, lane_of(a.hi2, i), s2);
        }
        return fmul(w.dl, act_dot(a.ds.x, a.ds.z, make_int2(s, s2), 0.0f));
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t* m, int j, half* dst) {
        W w;
        load_w(w, q, m, j);
        dst += 32 * j;
#pragma unroll
        for (int g = 0; g < 4; ++g) {  // g < 2: low nibbles (values 0..15), else high (16..31)
            const int hi = g >> 1;
            float v[8];
#pragma unroll
            for (int half_ = 0; half_ < 2; ++half_) {
                const unsigned raw = (unsigned)lane_of(w.q, 2 * (g & 1) + half_);
                const int k4 = iq4nl_values4((raw >> (4 * hi)) & 0x0F0F0F0Fu);
#pragma unroll
                for (int e = 0; e < 4; ++e) v[4 * half_ + e] = w.dl * (float)(int8_t)(k4 >> (8 * e));
            }
            store8(dst + 8 * g, v);
        }
    }
};

// ---- float weights ---------------------------------------------------------------------------
// F16/BF16/F32 rows are padded at upload to a multiple of 8 values (zeros), so a unit of 8 values
// is one (f16, bf16) or two (f32) aligned 16-byte loads. No meta plane. These take the float
// matvec path (f32 activations, no q8_1) and the same GEMM template.
QDEV float bits_to_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct f16_t {
    static constexpr int QK = 8, UNITS = 1, QB = 16, MB = 0, UE = 8;
    static QDEV void load8(const uint8_t* q, float* v) {
        const int4 raw = ld16(q);
        half2 h[4];
        memcpy(h, &raw, sizeof h);
#pragma unroll
        for (int i = 0; i < 4; ++i) { const float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t*, int, half* dst) {
        *reinterpret_cast<int4*>(dst) = ld16(q);
    }
};

struct bf16_t {
    static constexpr int QK = 8, UNITS = 1, QB = 16, MB = 0, UE = 8;
    static QDEV void load8(const uint8_t* q, float* v) {
        const int4 raw = ld16(q);
        unsigned u[4];
        memcpy(u, &raw, sizeof u);
#pragma unroll
        for (int i = 0; i < 4; ++i) { v[2 * i] = bits_to_float(u[i] << 16); v[2 * i + 1] = bits_to_float(u[i] & 0xFFFF0000u); }
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t*, int, half* dst) {
        float v[8];
        load8(q, v);
        store8(dst, v);
    }
};

struct f32_t {
    static constexpr int QK = 8, UNITS = 1, QB = 32, MB = 0, UE = 8;
    static QDEV void load8(const uint8_t* q, float* v) {
        const float4 a = *reinterpret_cast<const float4*>(q), b = *reinterpret_cast<const float4*>(q + 16);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    static QDEV void dequant(const uint8_t* q, const uint8_t*, int, half* dst) {
        float v[8];
        load8(q, v);
        store8(dst, v);
    }
};
