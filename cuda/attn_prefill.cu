// Prefill attention on tensor cores (FlashAttention-2 style), for an f16 KV cache, head dims 64
// and 128. The split kernel of attention.cu serves decode and verify, where a row must equal its
// one-token self bit for bit; a prefill chunk's rows never have to (ops.begin), and there the
// split kernel re-read every key once per query row on CUDA cores (8B shape, 512 tokens: 355 µs a
// layer, 17% of the prefill). Here a block takes 64 query tokens of one head, 16 per warp, and
// walks the keys they see 64 at a time: K and V tiles come from the cache by cp.async into shared
// memory (the next tile's copies in flight while this one is used), S = Q K^T and O += P V run on
// mma.sync m16n8k16 (f16 in, f32 accumulate), with the online softmax in registers.
//
// Accuracy: q and p are split into f16 hi + lo halves (x = hi + lo to ~2^-22 relative) and each
// product takes two MMAs, so scores and outputs keep float32 accuracy; K and V are f16 values
// already (the cache format). Rows see keys max(0, pos + 1 - window) .. pos (window 0: all).
#include "common.cuh"
#include "tensor_core.cuh"

#define PF_BQ 64  // query tokens a block: 4 warps of 16
#define PF_BK 64  // keys a step
#define PF_THREADS 128

// grid (ceil(T / 64), n_head), block 128, dynamic shared 2 * 2 * 64 * (HD + 8) * 2 bytes.
// q [T][q_ld] f32 (heads of HD inside), kc / vc one layer's cache [n_kv][n_ctx][HD] f16, pos [T],
// out [T][n_head * HD] f32; out_h, if not null, the same as f16 (the o GEMM's input).
template <int HD>
__device__ __forceinline__ void attn_prefill(const float* __restrict__ q, int q_ld, const half* __restrict__ kc,
                                             const half* __restrict__ vc, const int* __restrict__ pos, int T,
                                             int n_head, int n_kv, int n_ctx, int window, float scale, float softcap,
                                             float* __restrict__ out, half* __restrict__ out_h) {
    constexpr int LD = HD + 8;  // padded row: 8 rows of a fragment load land on distinct banks
    constexpr int KS = HD / 16, NS = PF_BK / 8, ND = HD / 8;
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ int4 pf_smem[];
    half* ks = reinterpret_cast<half*>(pf_smem);  // [2][PF_BK][LD]
    half* vs = ks + 2 * PF_BK * LD;               // [2][PF_BK][LD]
    __shared__ int lo_s, hi_s;

    const int h = blockIdx.y, kvh = h / (n_head / n_kv);
    const int t0 = (gridDim.x - 1 - blockIdx.x) * PF_BQ;  // the tiles with the most keys first
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    if (tid == 0) { lo_s = 0x7fffffff; hi_s = 0; }
    __syncthreads();
    // this thread's two rows (MMA rows g and g + 8 of the warp's 16)
    const int ta = t0 + 16 * warp + g, tb = ta + 8;
    const int pa = ta < T ? pos[ta] : -1, pb = tb < T ? pos[tb] : -1;
    const int la = window > 0 ? max(0, pa + 1 - window) : 0, lb = window > 0 ? max(0, pb + 1 - window) : 0;
    int wlo = 0x7fffffff, whi = 0;  // the warp's keys [wlo, whi)
    if (pa >= 0) { wlo = la; whi = pa + 1; }
    if (pb >= 0) { wlo = min(wlo, lb); whi = max(whi, pb + 1); }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    }
    if (lane == 0 && whi > 0) { atomicMin(&lo_s, wlo); atomicMax(&hi_s, whi); }

    // q, scaled, as A fragments: k-step kk holds (row g | g + 8) x (dims 16 kk + 2 tig (+1) | + 8)
    uint32_t qh[KS][4], ql[KS][4];
    {
        const float* qa = q + (size_t)min(ta, T - 1) * q_ld + h * HD;  // rows past T: any row, not written
        const float* qb = q + (size_t)min(tb, T - 1) * q_ld + h * HD;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            const int d = 16 * kk + 2 * tig;
            const float2 a0 = *reinterpret_cast<const float2*>(qa + d), a1 = *reinterpret_cast<const float2*>(qb + d);
            const float2 a2 = *reinterpret_cast<const float2*>(qa + d + 8), a3 = *reinterpret_cast<const float2*>(qb + d + 8);
            split_f16x2(a0.x * scale, a0.y * scale, qh[kk][0], ql[kk][0]);
            split_f16x2(a1.x * scale, a1.y * scale, qh[kk][1], ql[kk][1]);
            split_f16x2(a2.x * scale, a2.y * scale, qh[kk][2], ql[kk][2]);
            split_f16x2(a3.x * scale, a3.y * scale, qh[kk][3], ql[kk][3]);
        }
    }
    __syncthreads();
    const int jlo = lo_s, jhi = hi_s;  // the block's keys
    const size_t row0 = (size_t)kvh * n_ctx;
    // a step's K and V rows; rows at or past jhi are zero-filled (V rows there are never written:
    // 0 * garbage could be NaN)
    auto load = [&](int j0, int buf) {
        half* kd = ks + buf * PF_BK * LD;
        half* vd = vs + buf * PF_BK * LD;
        for (int i = tid; i < PF_BK * (HD / 8); i += PF_THREADS) {
            const int r = i / (HD / 8), c = (i % (HD / 8)) * 8, j = j0 + r;
            const bool ok = j < jhi;
            const size_t src = (row0 + (ok ? j : jlo)) * HD + c;
            cp_async16(kd + r * LD + c, kc + src, ok ? 16 : 0);
            cp_async16(vd + r * LD + c, vc + src, ok ? 16 : 0);
        }
    };

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = -INFINITY, mb = -INFINITY, sa = 0.0f, sb = 0.0f;  // row max, this thread's part of the row sum

    const int nsteps = jhi > jlo ? (jhi - jlo + PF_BK - 1) / PF_BK : 0;
    if (nsteps) load(jlo, 0);
    cp_async_commit();
    for (int st = 0; st < nsteps; ++st) {
        const int j0 = jlo + st * PF_BK, buf = st & 1;
        cp_async_wait_all();
        __syncthreads();  // this step's rows are in; the previous step's reads are done
        if (st + 1 < nsteps) load(j0 + PF_BK, buf ^ 1);
        cp_async_commit();
        if (j0 >= whi || j0 + PF_BK <= wlo) continue;  // none of this warp's rows sees these keys
        const half* K = ks + buf * PF_BK * LD;
        const half* V = vs + buf * PF_BK * LD;

        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const half* kr = K + (8 * n + g) * LD + 2 * tig;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 16 * kk + 8);
                mma_16816(s[n], qh[kk][0], qh[kk][1], qh[kk][2], qh[kk][3], b0, b1);
                mma_16816(s[n], ql[kk][0], ql[kk][1], ql[kk][2], ql[kk][3], b0, b1);
            }
        }
        float mxa = -INFINITY, mxb = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = j0 + 8 * n + 2 * tig + (e & 1);
                float v = s[n][e];
                if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                const bool ok = e < 2 ? (j >= la && j <= pa) : (j >= lb && j <= pb);
                s[n][e] = ok ? v : -INFINITY;
                if (e < 2) mxa = fmaxf(mxa, s[n][e]); else mxb = fmaxf(mxb, s[n][e]);
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, o2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o2));
        }
        const float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
        const float ua = na == -INFINITY ? 0.0f : na, ub = nb == -INFINITY ? 0.0f : nb;  // rows with no key yet
        const float ca = exp2f((ma - ua) * LOG2E), cb = exp2f((mb - ub) * LOG2E);
        ma = na, mb = nb;
        float pa_sum = 0.0f, pb_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            s[n][0] = exp2f((s[n][0] - ua) * LOG2E), s[n][1] = exp2f((s[n][1] - ua) * LOG2E);
            s[n][2] = exp2f((s[n][2] - ub) * LOG2E), s[n][3] = exp2f((s[n][3] - ub) * LOG2E);
            pa_sum += s[n][0] + s[n][1], pb_sum += s[n][2] + s[n][3];
        }
        sa = sa * ca + pa_sum, sb = sb * cb + pb_sum;
#pragma unroll
        for (int n = 0; n < ND; ++n) o[n][0] *= ca, o[n][1] *= ca, o[n][2] *= cb, o[n][3] *= cb;
        // O += P V: P's accumulator layout is the A fragment of keys 16 kk .. 16 kk + 15
#pragma unroll
        for (int kk = 0; kk < PF_BK / 16; ++kk) {
            uint32_t ph[4], pl[4];
            split_f16x2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
            split_f16x2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
            split_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
            split_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
            const half* vr = V + (16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
#pragma unroll
            for (int nd = 0; nd < HD / 16; ++nd) {
                uint32_t b[4];
                ldsm_x4_trans(b, vr + 16 * nd);
                mma_16816(o[2 * nd], ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
                mma_16816(o[2 * nd], pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
                mma_16816(o[2 * nd + 1], ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
                mma_16816(o[2 * nd + 1], pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
            }
        }
    }
    cp_async_wait_all();
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        sa += __shfl_xor_sync(0xffffffffu, sa, o2);
        sb += __shfl_xor_sync(0xffffffffu, sb, o2);
    }
    const size_t ld = (size_t)n_head * HD;
#pragma unroll
    for (int n = 0; n < ND; ++n) {
        const int d = h * HD + 8 * n + 2 * tig;
        const float2 ya = make_float2(o[n][0] / sa, o[n][1] / sa), yb = make_float2(o[n][2] / sb, o[n][3] / sb);
        if (ta < T) *reinterpret_cast<float2*>(out + ta * ld + d) = ya;
        if (tb < T) *reinterpret_cast<float2*>(out + tb * ld + d) = yb;
        if (out_h && ta < T) *reinterpret_cast<half2*>(out_h + ta * ld + d) = __float22half2_rn(ya);
        if (out_h && tb < T) *reinterpret_cast<half2*>(out_h + tb * ld + d) = __float22half2_rn(yb);
    }
}

#define ATTN_PREFILL_ENTRY(HD)                                                                             \
    extern "C" __global__ __launch_bounds__(PF_THREADS) void attn_prefill_hd##HD(                          \
        const float* q, int q_ld, const half* kc, const half* vc, const int* pos, int T, int n_head,       \
        int n_kv, int n_ctx, int window, float scale, float softcap, float* out, half* out_h) {            \
        pdl_entry();                                                                                       \
        attn_prefill<HD>(q, q_ld, kc, vc, pos, T, n_head, n_kv, n_ctx, window, scale, softcap, out, out_h); \
    }

ATTN_PREFILL_ENTRY(64)
ATTN_PREFILL_ENTRY(128)
// memra-kernel: attn_prefill_hd64(PiPPPiiiiiffPP)
// memra-kernel: attn_prefill_hd128(PiPPPiiiiiffPP)
