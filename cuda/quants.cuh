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
// 3. The q8_1 activation (our own, structure-of-arrays): for T tokens of K columns (K a multiple
//    of 32), int8 qs[T][K] then, at align16(T*K), float2 ds[T][K/32] with ds = (d, sum of the
//    float inputs of the block) — ggml's quantize_q8_1 convention — and q = roundf(x / d),
//    d = amax / 127. float, not half, scales: the same bytes, less rounding.
//
// A "unit" is the piece of a block one thread handles in one step: a whole block for the 32-wide
// types, a quarter super-block (64 values) for the K-quants, a 32-value sub-block for IQ4_XS.
// Each traits struct gives
//   QK, UNITS (units per block), QB, MB (plane bytes per block), UE (values per unit)
//   W: the unit's weight registers; load_w(W&, q_block, meta_block, unit)
//   A: the unit's activation registers; load_a(A&, xq_row, ds_row, block, unit)
//   dot(W, A) -> float: the int8 dot product (dp4a) with all scales applied
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

#ifdef __CUDACC__
// q8_1 quantization of one 32-value block, one value per lane of a full warp: q = roundf(x / d),
// d = amax / 127, ds = (d, sum of x) (ggml's quantize_q8_1). Every kernel that emits q8_1
// (quantize_q8_1, the fused matvec, a norm or activation that writes q8_1 directly) must use
// this function, so that all of them produce the same bytes. Lane 0 writes ds.
__device__ __forceinline__ void quantize_block_q8_1(float xi, int8_t* qs, float2* ds) {
    float amax = fabsf(xi), sum = xi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    const float d = amax / 127.0f;
    *qs = amax == 0.0f ? 0 : (int8_t)roundf(xi / d);
    if ((threadIdx.x & 31) == 0) *ds = make_float2(d, sum);
}
#endif

// One 32-value q8_1 activation block: 8 ints of int8 and (d, sum).
struct act32 { int4 lo, hi; float2 ds; };

QDEV void load_act32(act32& a, const int8_t* xq, const float2* ds, int blk) {
    a.lo = ld16(xq + 32 * blk);
    a.hi = ld16(xq + 32 * blk + 16);
    a.ds = ds[blk];
}

// Sum over the 32 values of (4-bit or 5-bit weight ints) x (activation int8): q ints hold
// values 0..15 / 16..31 of the block in their low / high nibbles (ggml's 32-wide layout).
QDEV int dot_nibbles(const int4& q, const int4& hbits_lo, const int4& hbits_hi, const act32& a) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int v = lane_of(q, i);
        s = dp4a(((v >> 0) & 0x0F0F0F0F) | lane_of(hbits_lo, i), lane_of(a.lo, i), s);
        s = dp4a(((v >> 4) & 0x0F0F0F0F) | lane_of(hbits_hi, i), lane_of(a.hi, i), s);
    }
    return s;
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int) { load_act32(a, xq, ds, b); }
    static QDEV float dot(const W& w, const A& a) {
        const int4 z = make_int4(0, 0, 0, 0);
        return fmul(w.d, ffma(a.ds.x, (float)dot_nibbles(w.q, z, z, a), -8.0f * a.ds.y));
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int) { load_act32(a, xq, ds, b); }
    static QDEV float dot(const W& w, const A& a) {
        const int4 z = make_int4(0, 0, 0, 0);
        return ffma(w.m, a.ds.y, fmul(fmul(w.d, a.ds.x), (float)dot_nibbles(w.q, z, z, a)));
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int) { load_act32(a, xq, ds, b); }
    static QDEV float dot(const W& w, const A& a) {
        int4 hl, hh;
        q5_high_bits(w.qh, hl, hh);
        return fmul(w.d, ffma(a.ds.x, (float)dot_nibbles(w.q, hl, hh, a), -16.0f * a.ds.y));
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int) { load_act32(a, xq, ds, b); }
    static QDEV float dot(const W& w, const A& a) {
        int4 hl, hh;
        q5_high_bits(w.qh, hl, hh);
        return ffma(w.m, a.ds.y, fmul(fmul(w.d, a.ds.x), (float)dot_nibbles(w.q, hl, hh, a)));
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int) { load_act32(a, xq, ds, b); }
    static QDEV float dot(const W& w, const A& a) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s = dp4a(lane_of(w.lo, i), lane_of(a.lo, i), s);
            s = dp4a(lane_of(w.hi, i), lane_of(a.hi, i), s);
        }
        return fmul(fmul(w.d, a.ds.x), (float)s);
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
struct act64 { int4 x[4]; float2 ds0, ds1; };  // two consecutive q8_1 blocks

QDEV void load_act64(act64& a, const int8_t* xq, const float2* ds, int blk) {
    const int8_t* p = xq + 32 * blk;
#pragma unroll
    for (int i = 0; i < 4; ++i) a.x[i] = ld16(p + 16 * i);
    a.ds0 = ds[blk];
    a.ds1 = ds[blk + 1];
}

// Scales of sub-blocks 2j, 2j+1, folded with d / dmin.
// One 16-byte load of the K-quant meta (d, dmin, 12 scale bytes), then get_scale_min_k4 on
// registers: byte loads of the scales one by one cost more instructions than the dot itself.
QDEV void kquant_scales(const uint8_t* meta, int j, float& dsc0, float& dsc1, float& dmn0, float& dmn1) {
    const int4 mv = ld16(meta);
    const float d = __half2float(__ushort_as_half((unsigned short)(mv.x & 0xFFFF)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)((unsigned)mv.x >> 16)));
    int sc[2], mn[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int s = 2 * j + h;  // sub-block; scale byte k of the 12 is meta byte 4 + k
        if (s < 4) {
            sc[h] = byte_of(mv, 4 + s) & 63;
            mn[h] = byte_of(mv, 8 + s) & 63;
        } else {
            sc[h] = (byte_of(mv, 8 + s) & 0xF) | ((byte_of(mv, s) >> 6) << 4);
            mn[h] = (byte_of(mv, 8 + s) >> 4) | ((byte_of(mv, 4 + s) >> 6) << 4);
        }
    }
    dsc0 = fmul(d, (float)sc[0]);
    dmn0 = fmul(dmin, (float)mn[0]);
    dsc1 = fmul(d, (float)sc[1]);
    dmn1 = fmul(dmin, (float)mn[1]);
}

// d*sc*dx*sumi - dmin*m*s for the unit's two sub-blocks.
QDEV float kquant_combine(float dsc0, float dmn0, float dsc1, float dmn1, const act64& a, int s0, int s1) {
    const float t0 = ffma(-dmn0, a.ds0.y, fmul(fmul(dsc0, a.ds0.x), (float)s0));
    const float t1 = ffma(-dmn1, a.ds1.y, fmul(fmul(dsc1, a.ds1.x), (float)s1));
    return fadd(t0, t1);
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act64(a, xq, ds, 8 * b + 2 * j); }
    static QDEV float dot(const W& w, const A& a) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int v = i < 4 ? lane_of(w.q0, i) : lane_of(w.q1, i - 4);
            s0 = dp4a(v & 0x0F0F0F0F, lane_of(a.x[i >> 2], i & 3), s0);
            s1 = dp4a((v >> 4) & 0x0F0F0F0F, lane_of(a.x[2 + (i >> 2)], i & 3), s1);
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act64(a, xq, ds, 8 * b + 2 * j); }
    static QDEV float dot(const W& w, const A& a) {
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int v = i < 4 ? lane_of(w.q0, i) : lane_of(w.q1, i - 4);
            const int h = i < 4 ? lane_of(w.h0, i) : lane_of(w.h1, i - 4);
            const int v0 = (v & 0x0F0F0F0F) | (((h >> (2 * w.j)) & 0x01010101) << 4);
            const int v1 = ((v >> 4) & 0x0F0F0F0F) | (((h >> (2 * w.j + 1)) & 0x01010101) << 4);
            s0 = dp4a(v0, lane_of(a.x[i >> 2], i & 3), s0);
            s1 = dp4a(v1, lane_of(a.x[2 + (i >> 2)], i & 3), s1);
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
// The activation of such a unit: 16 int8 from each of q8_1 blocks 8b + 4h + k, and their d.
struct act16x4 { int4 x[4]; float d[4]; };

QDEV void load_act16x4(act16x4& a, const int8_t* xq, const float2* ds, int b, int j) {
    const int h = j >> 1, l0 = 16 * (j & 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int blk = 8 * b + 4 * h + k;
        a.x[k] = ld16(xq + 32 * blk + l0);
        a.d[k] = ds[blk].x;
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
        const uint2 s8 = *reinterpret_cast<const uint2*>(q + 192 + 8 * h);  // scales[8h .. 8h+7]
        const int sel = j & 1;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const unsigned word = k < 2 ? s8.x : s8.y;
            w.sc[k] = (int)(int8_t)(word >> (8 * ((2 * k + sel) & 3)));
        }
        w.d = ld_half(m);
    }
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act16x4(a, xq, ds, b, j); }
    static QDEV float dot(const W& w, const A& a) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int src = (k & 1) ? lane_of(w.b, i) : lane_of(w.a, i);
                const int lo = (src >> (4 * (k >> 1))) & 0x0F0F0F0F;
                const int hi = ((lane_of(w.h, i) >> (2 * k)) & 0x03030303) << 4;
                s = dp4a(vsub4(lo | hi, 0x20202020), lane_of(a.x[k], i), s);
            }
            sum = ffma(fmul((float)w.sc[k], a.d[k]), (float)s, sum);
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
// per 16-value sub-block s. The min term multiplies the sum of the rounded activation (one dp4a
// against ones per 16 values, as ggml does): q8_1's exact sums cover 32 values, two sub-blocks.
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act16x4(a, xq, ds, b, j); }
    static QDEV float dot(const W& w, const A& a) {
        float sum_q = 0.0f, sum_m = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0, sx = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int x = lane_of(a.x[k], i);
                s = dp4a((lane_of(w.q, i) >> (2 * k)) & 0x03030303, x, s);
                sx = dp4a(0x01010101, x, sx);
            }
            const int sc = (w.sc >> (8 * k)) & 0xFF;
            sum_q = ffma(a.d[k], (float)((sc & 0xF) * s), sum_q);
            sum_m = ffma(a.d[k], (float)((sc >> 4) * sx), sum_m);
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act16x4(a, xq, ds, b, j); }
    static QDEV int quants4(const W& w, int k, int i) {  // four signed 3-bit quants of row k
        const int lo = (lane_of(w.ql, i) >> (2 * k)) & 0x03030303;
        const int hi = ((lane_of(w.hm, i) >> (w.hbit + k)) & 0x01010101) << 2;
        return vsub4(lo | hi, 0x04040404);
    }
    static QDEV float dot(const W& w, const A& a) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int s = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) s = dp4a(quants4(w, k, i), lane_of(a.x[k], i), s);
            sum = ffma(fmul((float)w.sc[k], a.d[k]), (float)s, sum);
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
    static QDEV void load_a(A& a, const int8_t* xq, const float2* ds, int b, int j) { load_act32(a, xq, ds, 8 * b + j); }
    static QDEV float dot(const W& w, const A& a) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned v = (unsigned)lane_of(w.q, i);
            s = dp4a(iq4nl_values4(v & 0x0F0F0F0Fu), lane_of(a.lo, i), s);
            s = dp4a(iq4nl_values4((v >> 4) & 0x0F0F0F0Fu), lane_of(a.hi, i), s);
        }
        return fmul(fmul(w.dl, a.ds.x), (float)s);
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
