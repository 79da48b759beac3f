// Sampling on the device, inside the decode graph: penalties over the device token history,
// the grammar bitmask, then greedy argmax, plain temperature sampling (Gumbel-max over the whole
// vocabulary), or the filtered chain top_k -> top_p -> min_p -> temperature with an inverse-CDF
// draw over the sorted candidates. Same chain and semantics as engine/sampling.py.
//
// Every knob comes from a device parameter block, so changing one needs no recapture. Random
// numbers are Philox4x32 of (seed, step counter): the counter lives on the device and advances
// once per sampled token, so the same seed gives the same tokens.
//
// Rows: a verify pass samples all its rows in one launch of each kernel, row r = blockIdx.y with
// its own logits row, mask row, pos entry, scratch and result, and Philox counter + r: what r
// launches of one row each would use, as sample_finish moves the counter by one a row; the
// counter then moves past all rows in sample_advance. One row (gridDim.y = 1) is the decode step.
//
// Candidates: stage 1 keeps each block's best `local_k` logits, sorted; stage 2 merges those
// runs (all of them with top_k off, the best top_k with it on) and finds each cut with
// block-wide scans and counts, no serial loop. The GPU is therefore exact while no block holds
// more than local_k (128 up to a 256k vocabulary) of the kept tokens; a wider nucleus is cut to
// the candidates. See docs/gpu-engine.md, "The sampler".
#include "common.cuh"

struct SampleParams {      // mirrored by engine/gpu/sampler.py PARAMS_DTYPE
    float temperature;     // 0: greedy
    int top_k;             // 0: off
    float top_p;           // 1: off
    float min_p;           // 0: off
    float repeat_penalty;  // 1: off
    float presence_penalty;
    float frequency_penalty;
    int repeat_last_n;     // -1: whole context, 0: off
    uint32_t seed_lo, seed_hi;
    uint32_t counter;      // Philox step counter; +1 per sampled token
    int use_mask;          // apply the token bitmask
    int top_logprobs;      // > 0: sample_candidates reports this many candidates (read there only)
    int skip;              // sample_stage1 does nothing: a candidates pass this draw does not need
    int cand_reuse;        // sample_candidates: raw logits == penalised ones (no penalties, no mask)
                           // and sample_finish's sorted list is long enough: it is the model's list too
};

struct SampleOut {         // written by sample_finish; the 4-byte token id is what the host reads
    int token;
    float logprob;
};

// Candidates (the sampling workbench, SamplingParams.top_logprobs): with them on, sample_finish
// writes the cuts it made (SampleCuts) and sample_candidates the best CAND_MAX tokens of the raw
// and of the penalised logits, from stage-1 passes that keep each block's best CAND_RUN. The host
// (engine/gpu/sampler.py candidates_from_record) turns them into engine/candidates.py's records.
#define CAND_RUN 32
#define CAND_MAX 20
#define CAND_MAX_RUNS 128  // stage-1 blocks, padded to a power of two: vocabularies up to 512k

struct SampleCuts {        // mirrored by engine/gpu/sampler.py CAND_DTYPE
    int mode;              // 0 greedy, 1 plain temperature, 2 filtered, 3 nothing allowed
    float c0, log_z;       // the draw's distribution: p(v) = exp((v - c0) / temp - log_z)
    int kept;              // filtered: tokens left after every cut
    float cut_v[3];        // the last survivor (value, index) of top_k, top_p, min_p, in the
    int cut_i[3];          // order of before(); a stage that is off: (-inf, INT_MAX), all pass
};

struct SampleCandidates {  // mirrored by engine/gpu/sampler.py CAND_DTYPE
    SampleCuts cuts;
    int n, rank;           // rank: the drawn token's place under the raw logits, 0 = best
    float model_max, model_z;  // softmax of the raw logits: exp(l - model_max) / model_z
    int model_id[CAND_MAX];
    float model_logit[CAND_MAX];    // raw
    float model_final[CAND_MAX];    // the same tokens' penalised logits (-inf: masked)
    int final_id[CAND_MAX];
    float final_logit[CAND_MAX];    // the best penalised logits
    float final_raw[CAND_MAX];      // the same tokens' raw logits
};

__device__ __forceinline__ void set_cut(SampleCuts* cuts, int stage, bool on, const float* cv, const int* ci, int kept) {
    cuts->cut_v[stage] = on ? cv[kept - 1] : -INFINITY;
    cuts->cut_i[stage] = on ? ci[kept - 1] : 0x7fffffff;
}

// Stage 1 blocks hold 4 logits per thread, one RUN per warp: chunk = 4 * blockDim.x, from 1024
// to S1_CHUNK_MAX (sampler.py stage1_chunk: the smallest that leaves <= 64 blocks, so a 49k
// vocabulary spreads over 48 SMs, not 12).
#define S1_THREADS_MAX 1024
#define S1_CHUNK_MAX 4096
#define S2_THREADS 1024
#define S2_MAX_CAND 8192

__device__ __forceinline__ bool filters_on(const SampleParams& p, int vocab) {
    return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// Penalties (llama.cpp): for each distinct token in the window, divide positive logits by the
// repeat penalty (multiply negative ones), then subtract count * frequency + presence.
// Window: history[n - last_n, n) with n = *pos + 1 tokens in context. One block a row.
extern "C" __global__ void sample_penalize(float* logits, const SampleParams* params, const int* history,
                                           const int* pos, int vocab) {
    pdl_entry();
    logits += (size_t)blockIdx.y * vocab;  // row blockIdx.y of a verify pass (see "Rows" above)
    pos += blockIdx.y;
    const SampleParams p = *params;
    if (p.repeat_last_n == 0 || (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f))
        return;
    const int n = *pos + 1;
    const int first = p.repeat_last_n < 0 ? 0 : max(0, n - p.repeat_last_n);
    for (int i = first + threadIdx.x; i < n; i += blockDim.x) {
        const int tok = history[i];
        if (tok < 0 || tok >= vocab) continue;
        bool earlier = false;
        int count = 1;
        for (int j = first; j < n; ++j) {
            if (j == i || history[j] != tok) continue;
            if (j < i) { earlier = true; break; }
            ++count;
        }
        if (earlier) continue;  // the first occurrence in the window applies the penalty once
        float l = logits[tok];
        l = l > 0.0f ? l / p.repeat_penalty : l * p.repeat_penalty;
        logits[tok] = l - (count * p.frequency_penalty + p.presence_penalty);
    }
}

__device__ __forceinline__ float gumbel(const SampleParams& p, int idx) {
    const philox_out r = philox4x32(p.counter, (uint32_t)idx, 1u, 0u, p.seed_lo, p.seed_hi);
    return -logf(-logf(u32_to_unit(r.x[0])));
}

// Larger value first; equal values: lower index first (matches argmax's first-max rule).
__device__ __forceinline__ bool before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Warp tree over the argmax (value, index) and the best Gumbel score (score, index): every lane
// ends with the warp's winners. Both orders are total (ties: the lower index), so the winners do
// not depend on the tree.
__device__ __forceinline__ void warp_winners(float& v, int& i, float& g, int& gi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (before(ov, oi, v, i)) { v = ov; i = oi; }
        const float og = __shfl_xor_sync(0xffffffffu, g, o);
        const int ogi = __shfl_xor_sync(0xffffffffu, gi, o);
        if (before(og, ogi, g, gi)) { g = og; gi = ogi; }
    }
}

// Sorting, in two pieces that need few block barriers:
//  - warp_sort128: a warp sorts 128 (value, index) pairs it holds in registers, 4 per lane
//    (position lane * 4 + r in register r): a bitonic network whose partners are either in the
//    same lane (distance j < 4: a register swap, 13 of the 28 steps) or in lane ^ (j / 4) (a
//    shuffle). No shared memory.
//  - merge_round: the block merges pairs of sorted runs in shared memory by rank. An element's
//    place in the merged run is its place in its own run plus the count of the partner run's
//    elements that go before it (a binary search); ties go to the even run first, so a pair's
//    positions are a permutation. Keeping only the best `cap` of each merged run makes it a
//    top-cap selection. One barrier between all reads and all writes, one after.
//  - warp_merge<T> / merge_tree<T> (T = 64, 128): when only the best T are wanted (top_k <= 64,
//    the default knobs, or <= 128), a warp merges two sorted runs of T in registers: a ++
//    reversed(b) is bitonic, so the last bitonic stage sorts it and the first T are the best. A
//    tree of these warp merges needs one barrier per level and no binary searches.
// Sorted runs of stage 1 go to stage 2 as they are; stage 2 only merges.
#define RUN 128

// One stage k of the bitonic network over the warp's 32 * P pairs, P a lane (position lane * P + r
// in register r; k = 2 .. 32 * P).
template <int P>
__device__ __forceinline__ void warp_bitonic_stage(float (&v)[P], int (&ix)[P], int k) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll
        for (int r = 0; r < P; ++r) {
            const int i = lane * P + r;
            const bool up = (i & k) == 0;  // this k-sequence runs best first
            if (j < P) {                   // partner: register r ^ j of this lane
                const int ro = r ^ j;
                if (ro > r) {
                    const bool swap = up ? before(v[ro], ix[ro], v[r], ix[r]) : before(v[r], ix[r], v[ro], ix[ro]);
                    if (swap) {
                        const float tv = v[r]; v[r] = v[ro]; v[ro] = tv;
                        const int ti = ix[r]; ix[r] = ix[ro]; ix[ro] = ti;
                    }
                }
            } else {                       // partner: register r of lane ^ (j / P)
                const float ov = __shfl_xor_sync(0xffffffffu, v[r], j / P);
                const int oi = __shfl_xor_sync(0xffffffffu, ix[r], j / P);
                const bool wants_better = ((i & j) == 0) == up;  // the pair's first place when up
                const bool take = wants_better ? before(ov, oi, v[r], ix[r]) : before(v[r], ix[r], ov, oi);
                if (take) { v[r] = ov; ix[r] = oi; }
            }
        }
    }
}

__device__ void warp_sort128(float (&v)[4], int (&ix)[4]) {
#pragma unroll
    for (int k = 2; k <= RUN; k <<= 1) warp_bitonic_stage<4>(v, ix, k);
}

// The best T of two runs of T sorted best first (a, b: 16-byte aligned), sorted, into o: one
// warp, no barrier, P = T / 16 pairs a lane. a then b reversed is a bitonic sequence, so the
// network's last stage (k = 2T) sorts it. a_real / b_real false: that run is empty (padding).
// A top-T under before() is a top-cap for any cap <= T, so trees of these give the same list as
// merge_round's.
#define TOP 64       // stage 1's tree (top_k <= 64) and sample_finish's first
#define TOP_MAX 128  // sample_finish's widest tree
template <int T>
__device__ void warp_merge(const float* av, const int* ai, bool a_real, const float* bv, const int* bi,
                           bool b_real, float* ov, int* oi) {
    constexpr int P = T / 16;
    const int lane = threadIdx.x & 31;
    float v[P];
    int ix[P];
    const bool mine_a = lane < 16, real = mine_a ? a_real : b_real;
    // lane l < 16: a[P l, P l + P); lane l >= 16: b[2T - P - P l, 2T - P l), reversed
    const int at = mine_a ? P * lane : 2 * T - P - P * lane;
#pragma unroll
    for (int c = 0; c < P; c += 4) {
        float4 fv = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        int4 iv = make_int4(0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff);
        if (real) {
            fv = *reinterpret_cast<const float4*>((mine_a ? av : bv) + at + c);
            iv = *reinterpret_cast<const int4*>((mine_a ? ai : bi) + at + c);
        }
        const float f[4] = {fv.x, fv.y, fv.z, fv.w};
        const int g[4] = {iv.x, iv.y, iv.z, iv.w};
        if (mine_a) {
#pragma unroll
            for (int e = 0; e < 4; ++e) { v[c + e] = f[e]; ix[c + e] = g[e]; }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) { v[P - 1 - c - e] = f[e]; ix[P - 1 - c - e] = g[e]; }
        }
    }
    warp_bitonic_stage<P>(v, ix, 2 * T);
    if (mine_a) {
#pragma unroll
        for (int c = 0; c < P; c += 4) {
            *reinterpret_cast<float4*>(ov + P * lane + c) = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);
            *reinterpret_cast<int4*>(oi + P * lane + c) = make_int4(ix[c], ix[c + 1], ix[c + 2], ix[c + 3]);
        }
    }
}

// n_runs (a power of two, <= 64) runs of T at v/ix + r * stride (r >= n_real: empty) -> their
// best T sorted, by a tree of warp_merge<T>: each level halves the runs, ping-ponging between
// the two halves [0, 32T) and [32T, 64T) of buf_v/buf_i (shared). Returns the offset of the half
// that holds the result. Block-uniform; ends with __syncthreads.
template <int T>
__device__ int merge_tree(const float* v, const int* ix, int stride, int n_runs, int n_real, float* buf_v,
                          int* buf_i) {
    constexpr int HALF = 32 * T;
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int out = 0;
    if (n_runs == 1) {  // nothing to merge: the run itself
        for (int i = threadIdx.x; i < T; i += blockDim.x) {
            buf_v[i] = n_real ? v[i] : -INFINITY;
            buf_i[i] = n_real ? ix[i] : 0x7fffffff;
        }
        __syncthreads();
        return 0;
    }
    for (int runs = n_runs; runs > 1; runs >>= 1) {
        for (int q = warp; q < runs / 2; q += nw)
            warp_merge<T>(v + 2 * q * stride, ix + 2 * q * stride, 2 * q < n_real,
                          v + (2 * q + 1) * stride, ix + (2 * q + 1) * stride, 2 * q + 1 < n_real,
                          buf_v + out + q * T, buf_i + out + q * T);
        __syncthreads();
        v = buf_v + out; ix = buf_i + out; stride = T; n_real = runs / 2;
        out ^= HALF;
    }
    return out ^ HALF;
}

// Runs r = 0 .. n_runs-1 (n_runs even) of length L at v/ix + r * L, each sorted best first;
// run pair (2q, 2q+1) becomes run q of length Lo = min(2L, cap) at q * Lo: the best Lo of the
// pair, sorted. MAXE >= n_runs * L / blockDim.x. Ends with __syncthreads.
template <int MAXE>
__device__ void merge_round(float* v, int* ix, int n_runs, int L, int cap) {
    const int Lo = min(2 * L, cap);
    const int n = n_runs * L;
    float xv[MAXE];
    int xi[MAXE], cnt[MAXE], other[MAXE];
#pragma unroll
    for (int m = 0; m < MAXE; ++m) {
        const int e = threadIdx.x + m * blockDim.x;
        cnt[m] = 0;
        other[m] = -1;
        xv[m] = -INFINITY;
        xi[m] = 0;
        if (e < n && e % L < Lo) {  // from place i >= Lo in its own run it cannot make the cut
            xv[m] = v[e];
            xi[m] = ix[e];
            other[m] = ((e / L) ^ 1) * L;  // the partner run's start
        }
    }
    // cnt = how many of the partner run go first: a prefix of it (it is sorted), found by binary
    // lifting; the MAXE searches of a thread advance together so their loads overlap.
    for (int step = 1 << (31 - __clz(L)); step > 0; step >>= 1) {
#pragma unroll
        for (int m = 0; m < MAXE; ++m) {
            if (other[m] >= 0 && cnt[m] + step <= L) {
                const int b = other[m] + cnt[m] + step - 1;
                const float vb = v[b];
                bool first = vb > xv[m];  // b goes before x; equal values: by index (a second load)
                if (vb == xv[m]) {
                    const bool odd = other[m] < (int)(threadIdx.x + m * blockDim.x);  // x in the odd run
                    first = odd ? ix[b] <= xi[m]   // the even run's element goes first on a full tie
                                : ix[b] < xi[m];
                }
                if (first) cnt[m] += step;
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MAXE; ++m) {
        const int e = threadIdx.x + m * blockDim.x;
        if (other[m] >= 0) {
            const int r = e / L;
            const int pos = e - r * L + cnt[m];
            if (pos < Lo) { v[(r >> 1) * Lo + pos] = xv[m]; ix[(r >> 1) * Lo + pos] = xi[m]; }
        }
    }
    __syncthreads();
}

// merge_round with the fewest places per thread that hold the round's elements (block-uniform):
// top_k 40 over 64 runs is 2,560 live pairs, not the buffer's 8,192.
__device__ void merge_round_fit(float* v, int* ix, int n_runs, int L, int cap) {
    const int per = (n_runs * L + blockDim.x - 1) / blockDim.x;
    if (per <= 1) merge_round<1>(v, ix, n_runs, L, cap);
    else if (per <= 2) merge_round<2>(v, ix, n_runs, L, cap);
    else if (per <= 4) merge_round<4>(v, ix, n_runs, L, cap);
    else merge_round<S2_MAX_CAND / S2_THREADS>(v, ix, n_runs, L, cap);
}

// Exclusive prefix sum over the block's threads (thread order); every thread also gets the
// total. Fixed order: the same inputs give the same bits. scratch: >= 33 entries.
template <typename T>
__device__ T block_excl_scan(T x, T* scratch, T* total) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    T incl = x;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    T excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = T(0);
    __syncthreads();
    if (lane == 31) scratch[wid] = incl;
    __syncthreads();
    if (wid == 0) {
        const T t = lane < nw ? scratch[lane] : T(0);
        T ti = t;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const T y = __shfl_up_sync(0xffffffffu, ti, o);
            if (lane >= o) ti += y;
        }
        T te = __shfl_up_sync(0xffffffffu, ti, 1);
        if (lane == 0) te = T(0);
        scratch[lane] = te;
        if (lane == 31) scratch[32] = ti;
    }
    __syncthreads();
    const T r = scratch[wid] + excl;
    *total = scratch[32];
    __syncthreads();
    return r;
}

__device__ int block_min_int(int x, int* scratch) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
    __syncthreads();
    if (lane == 0) scratch[wid] = x;
    __syncthreads();
    x = lane < nw ? scratch[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Stage 1: grid (ceil(vocab / chunk), rows), block chunk / 4 threads (chunk <= S1_CHUNK_MAX). Masks
// disallowed tokens to -inf in place, then per block: max logit, argmax, sum e^(l - max) at T = 1
// and at T, the best Gumbel score, and (filters on) its local_k best logits sorted best first.
// part: per block 8 floats: max, argmax, sum1, sumT, gumbel value, gumbel index, -, -.
extern "C" __global__ void __launch_bounds__(S1_THREADS_MAX, 1) sample_stage1(
    float* logits, const uint32_t* mask, const SampleParams* params, float* part, float* cand_v, int* cand_i,
    int vocab, int local_k) {
    pdl_entry();
    __shared__ __align__(16) float sv[S1_CHUNK_MAX];
    __shared__ __align__(16) int si[S1_CHUNK_MAX];
    __shared__ float2 red2[32];
    __shared__ float bmax_s;
    constexpr int PER = 4;  // a warp holds one run of RUN = 128
    const int nt = blockDim.x, nw = nt >> 5;
    const int row = blockIdx.y;  // a verify pass's row (see "Rows" above)
    logits += (size_t)row * vocab;
    mask += (size_t)row * ((vocab + 31) >> 5);
    part += (size_t)row * gridDim.x * 8;
    cand_v += (size_t)row * gridDim.x * local_k;
    cand_i += (size_t)row * gridDim.x * local_k;
    SampleParams p = *params;
    p.counter += row;
    if (p.skip) return;
    const float temp = p.temperature > 0.0f ? p.temperature : 1.0f;
    const int base = blockIdx.x * PER * nt;

    float vmax = -INFINITY;
    int imax = 0x7fffffff;
    float gbest = -INFINITY;
    int gidx = 0x7fffffff;
    float lv[PER];
    int li[PER];
    const bool want_gumbel = p.temperature > 0.0f && !filters_on(p, vocab);  // Philox only when drawn from
#pragma unroll
    for (int r = 0; r < PER; ++r) {
        const int idx = base + threadIdx.x + r * nt;
        float l = -INFINITY;
        if (idx < vocab) {
            l = logits[idx];
            if (p.use_mask && !((mask[idx >> 5] >> (idx & 31)) & 1u)) { l = -INFINITY; logits[idx] = l; }
        }
        lv[r] = l;
        li[r] = idx < vocab ? idx : 0x7fffffff;
        if (before(l, idx, vmax, imax) && l > -INFINITY) { vmax = l; imax = idx; }
        if (want_gumbel && l > -INFINITY) {
            const float gs = l / temp + gumbel(p, idx);
            if (gs > gbest || (gs == gbest && idx < gidx)) { gbest = gs; gidx = idx; }
        }
    }
    // block argmax (value, then lowest index) and best gumbel, through warp shuffles + shared
    __shared__ float wv[32], wg[32];
    __shared__ int wi[32], wgi[32];
    warp_winners(vmax, imax, gbest, gidx);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { wv[warp] = vmax; wi[warp] = imax; wg[warp] = gbest; wgi[warp] = gidx; }
    __syncthreads();
    if (warp == 0) {  // the warps' winners, one per lane, through the same tree
        const bool has = lane < nw;
        vmax = has ? wv[lane] : -INFINITY; imax = has ? wi[lane] : 0x7fffffff;
        gbest = has ? wg[lane] : -INFINITY; gidx = has ? wgi[lane] : 0x7fffffff;
        warp_winners(vmax, imax, gbest, gidx);
        if (lane == 0) bmax_s = vmax;
    }
    __syncthreads();
    const float bmax = bmax_s;
    float s1 = 0.0f, sT = 0.0f;
    if (bmax > -INFINITY) {
#pragma unroll
        for (int r = 0; r < PER; ++r) {
            const float l = lv[r];
            if (l > -INFINITY) { s1 += expf(l - bmax); sT += expf((l - bmax) / temp); }
        }
    }
    // both normalizers in one block reduction, in block_sum's order (warp trees, then warp 0's)
    s1 = warp_sum(s1);
    sT = warp_sum(sT);
    if (lane == 0) red2[warp] = make_float2(s1, sT);
    __syncthreads();
    if (warp == 0) {
        const float2 w = lane < nw ? red2[lane] : make_float2(0.0f, 0.0f);
        s1 = warp_sum(w.x);
        sT = warp_sum(w.y);
        if (lane == 0) {  // lane 0 of warp 0 holds the block's winners from the tree above
            float* o = part + blockIdx.x * 8;
            o[0] = bmax; o[1] = __int_as_float(imax); o[2] = s1; o[3] = sT;
            o[4] = gbest; o[5] = __int_as_float(gidx); o[6] = 0.0f; o[7] = 0.0f;
        }
    }
    if (p.temperature > 0.0f && filters_on(p, vocab)) {
        // the warp's 128 pairs (position lane * 4 + r) sorted in registers, then the warps' runs
        // merged down to the block's best local_k (<= RUN, sampler.py LOCAL_K_MAX) in sv/si.
        // top_k on: only the block's best k can be among the best k overall; the rest of its
        // local_k places are written empty (-inf), which stage 2 sorts last
        warp_sort128(lv, li);
        const int cap = (p.top_k > 0 && p.top_k < local_k) ? p.top_k : local_k;
        int at = 0;
        if (cap <= TOP) {  // each warp's best 64, then a tree of warp merges (1 barrier a level)
            if (lane < 16) {
                *reinterpret_cast<float4*>(sv + 2048 + warp * TOP + 4 * lane) = make_float4(lv[0], lv[1], lv[2], lv[3]);
                *reinterpret_cast<int4*>(si + 2048 + warp * TOP + 4 * lane) = make_int4(li[0], li[1], li[2], li[3]);
            }
            __syncthreads();
            at = merge_tree<TOP>(sv + 2048, si + 2048, TOP, nw, nw, sv, si);
        } else {
#pragma unroll
            for (int r = 0; r < PER; ++r) {
                sv[warp * RUN + lane * 4 + r] = lv[r];
                si[warp * RUN + lane * 4 + r] = li[r];
            }
            __syncthreads();
            int L = RUN;
            for (int runs = nw; runs > 1; runs >>= 1) {
                merge_round<PER>(sv, si, runs, L, cap);
                L = min(2 * L, cap);
            }
        }
        for (int i = threadIdx.x; i < local_k; i += nt) {
            cand_v[blockIdx.x * local_k + i] = i < cap ? sv[at + i] : -INFINITY;
            cand_i[blockIdx.x * local_k + i] = i < cap ? si[at + i] : 0x7fffffff;
        }
    }
}

// The filtered draw over cv/ci[0, n), sorted best first (the top candidates): top_k (the first
// k) -> top_p -> min_p -> temperature, then an inverse-CDF draw. Every cut is a prefix of the
// sorted list, found by block-wide scans and counts; thread t owns the contiguous positions
// [t * per, (t + 1) * per). Z1: sum e^(l - M) over the whole vocabulary (top_p with top_k off).
// Block-uniform control flow; writes *pick_s / *logprob_s from thread 0.
__device__ void filtered_draw(const float* cv, const int* ci, int n, const SampleParams& p, bool k_on, float Z1,
                              float M, float temp, double* scratch, int* pick_s, float* logprob_s,
                              SampleCuts* cuts) {
    constexpr int E = S2_MAX_CAND / S2_THREADS;
    int* iscratch = reinterpret_cast<int*>(scratch);
    const int per = (n + S2_THREADS - 1) / S2_THREADS;  // <= E
    const int first = threadIdx.x * per;
    int kept = 0;  // sorted: the finite ones come first
    for (int b = 0; b < n; b += S2_THREADS)
        kept += __syncthreads_count(b + (int)threadIdx.x < n && cv[b + threadIdx.x] > -INFINITY);
    if (k_on) kept = min(kept, p.top_k);
    const float c0 = cv[0];
    if (kept == 0) {  // every token masked: nothing to draw from
        if (threadIdx.x == 0) {
            *pick_s = ci[0]; *logprob_s = -INFINITY;
            if (cuts) cuts->mode = 3;
        }
        __syncthreads();
        return;
    }
    if (cuts && threadIdx.x == 0) set_cut(cuts, 0, k_on, cv, ci, kept);
    // Running sums in double: a float sum over thousands of terms drifts by ~1e-5 of the total,
    // enough to move the top_p cut by a token against the CPU's float64 cumsum.
    float w[E];
    double total, cum;
    if (p.top_p < 1.0f && kept > 1) {
        // top_k on: nucleus of the renormalised top k; off: of the whole vocabulary
        double s = 0.0;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int i = first + e;
            w[e] = (e < per && i < kept) ? expf(cv[i] - c0) : 0.0f;
            s += w[e];
        }
        cum = block_excl_scan(s, scratch, &total);
        const double target = (double)p.top_p * (k_on ? total : (double)Z1 * exp((double)M - (double)c0));
        int cross = 0x7fffffff;  // the first place where the running sum reaches top_p: kept
#pragma unroll
        for (int e = 0; e < E; ++e) {
            cum += w[e];
            if (e < per && first + e < kept && cum >= target && cross == 0x7fffffff) cross = first + e;
        }
        cross = block_min_int(cross, iscratch);
        if (cross != 0x7fffffff) kept = cross + 1;  // else never reached (a nucleus wider than the candidates): all
    }
    if (cuts && threadIdx.x == 0) set_cut(cuts, 1, p.top_p < 1.0f, cv, ci, kept);
    if (p.min_p > 0.0f) {  // p >= min_p * p_max at T = 1, as engine/sampling.py
        const float floor_l = c0 + logf(p.min_p);
        int k2 = 0;
        for (int b = 0; b < kept; b += S2_THREADS)
            k2 += __syncthreads_count(b + (int)threadIdx.x < kept && cv[b + threadIdx.x] >= floor_l);
        kept = max(k2, 1);
    }
    if (cuts && threadIdx.x == 0) set_cut(cuts, 2, p.min_p > 0.0f, cv, ci, kept);
    double s = 0.0;
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = first + e;
        w[e] = (e < per && i < kept) ? expf((cv[i] - c0) / temp) : 0.0f;
        s += w[e];
    }
    cum = block_excl_scan(s, scratch, &total);
    const philox_out r = philox4x32(p.counter, 0u, 0u, 0u, p.seed_lo, p.seed_hi);
    const double u = (double)u32_to_unit(r.x[0]) * total;
    int pick = 0x7fffffff;  // the first place whose running sum passes u
#pragma unroll
    for (int e = 0; e < E; ++e) {
        cum += w[e];
        if (e < per && first + e < kept && cum > u && pick == 0x7fffffff) pick = first + e;
    }
    pick = min(block_min_int(pick, iscratch), kept - 1);  // u rounded up to the total: the last
    if (threadIdx.x == 0) {
        *pick_s = ci[pick];
        *logprob_s = (cv[pick] - c0) / temp - (float)log(total);
        if (cuts) { cuts->mode = 2; cuts->c0 = c0; cuts->log_z = (float)log(total); cuts->kept = kept; }
    }
    __syncthreads();
}

// filtered_draw for n <= 64 candidates, on warp 0 alone (the other warps return at once): the
// same cuts in the same order, with warp scans and ballots instead of block barriers. Lane l owns
// places 2l and 2l + 1. Warp-uniform control flow.
__device__ void filtered_draw_warp(const float* cv, const int* ci, int n, const SampleParams& p, bool k_on,
                                   float Z1, float M, float temp, int* pick_s, float* logprob_s, SampleCuts* cuts) {
    if (threadIdx.x >= 32) return;
    constexpr unsigned ALL = 0xffffffffu;
    const int lane = threadIdx.x, i0 = 2 * lane, i1 = i0 + 1;
    const float v0 = i0 < n ? cv[i0] : -INFINITY, v1 = i1 < n ? cv[i1] : -INFINITY;
    int kept = __popc(__ballot_sync(ALL, v0 > -INFINITY)) + __popc(__ballot_sync(ALL, v1 > -INFINITY));
    if (k_on) kept = min(kept, p.top_k);
    const float c0 = __shfl_sync(ALL, v0, 0);
    if (kept == 0) {
        if (lane == 0) {
            *pick_s = ci[0]; *logprob_s = -INFINITY;
            if (cuts) cuts->mode = 3;
        }
        return;
    }
    if (cuts && lane == 0) set_cut(cuts, 0, k_on, cv, ci, kept);
    // inclusive warp scan of the lane sums (double, as filtered_draw) and the first place whose
    // running sum passes `target` (strictly when `strict`), among the first `kept`
    auto first_crossing = [&](float w0, float w1, double target, bool from_total, bool strict, double* total) {
        const double s = (double)w0 + (double)w1;
        double incl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double y = __shfl_up_sync(ALL, incl, o);
            if (lane >= o) incl += y;
        }
        double cum = __shfl_up_sync(ALL, incl, 1);
        if (lane == 0) cum = 0.0;
        *total = __shfl_sync(ALL, incl, 31);
        if (from_total) target *= *total;
        int at = 0x7fffffff;
        cum += w0;
        if (i0 < kept && (strict ? cum > target : cum >= target)) at = i0;
        cum += w1;
        if (at == 0x7fffffff && i1 < kept && (strict ? cum > target : cum >= target)) at = i1;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) at = min(at, __shfl_xor_sync(ALL, at, o));
        return at;
    };
    double total;
    if (p.top_p < 1.0f && kept > 1) {
        const float w0 = i0 < kept ? expf(v0 - c0) : 0.0f, w1 = i1 < kept ? expf(v1 - c0) : 0.0f;
        const double target = k_on ? (double)p.top_p : (double)p.top_p * ((double)Z1 * exp((double)M - (double)c0));
        const int cross = first_crossing(w0, w1, target, k_on, false, &total);
        if (cross != 0x7fffffff) kept = cross + 1;
    }
    if (cuts && lane == 0) set_cut(cuts, 1, p.top_p < 1.0f, cv, ci, kept);
    if (p.min_p > 0.0f) {
        const float floor_l = c0 + logf(p.min_p);
        const int k2 = __popc(__ballot_sync(ALL, i0 < kept && v0 >= floor_l)) +
                       __popc(__ballot_sync(ALL, i1 < kept && v1 >= floor_l));
        kept = max(k2, 1);
    }
    if (cuts && lane == 0) set_cut(cuts, 2, p.min_p > 0.0f, cv, ci, kept);
    const float w0 = i0 < kept ? expf((v0 - c0) / temp) : 0.0f, w1 = i1 < kept ? expf((v1 - c0) / temp) : 0.0f;
    const philox_out r = philox4x32(p.counter, 0u, 0u, 0u, p.seed_lo, p.seed_hi);
    const int pick = min(first_crossing(w0, w1, (double)u32_to_unit(r.x[0]), true, true, &total), kept - 1);
    if (lane == 0) {
        *pick_s = ci[pick];
        *logprob_s = (cv[pick] - c0) / temp - (float)log(total);
        if (cuts) { cuts->mode = 2; cuts->c0 = c0; cuts->log_z = (float)log(total); cuts->kept = kept; }
    }
}

// Stage 2: one block a row. Merges the stage-1 partials, picks the token, writes the outputs and
// advances the device state: token (the next step's input), position, Philox counter.
// Filters on: the stage-1 runs (padded with empty runs to a power of two, <= S2_MAX_CAND pairs,
// sampler.py local_k_for) are merged: fully sorted with top_k off, only the best top_k kept
// with it on; then filtered_draw.
extern "C" __global__ void __launch_bounds__(S2_THREADS) sample_finish(
    const float* logits, SampleParams* params, const float* part, const float* cand_v, const int* cand_i,
    int n_blocks, int local_k, int vocab, int* token_io, int* pos_io, SampleOut* out, SampleCandidates* cand) {
    pdl_entry();
    extern __shared__ __align__(16) float dyn[];
    float* cv = dyn;                                  // [S2_MAX_CAND]
    int* ci = reinterpret_cast<int*>(dyn + S2_MAX_CAND);  // [S2_MAX_CAND]
    __shared__ float red[2];
    __shared__ double dred[33];
    __shared__ int pick_s, over_max_s, over_sum_s;
    __shared__ float logprob_s;
    const int row = blockIdx.y;  // a verify pass's row (see "Rows" above)
    logits += (size_t)row * vocab;
    part += (size_t)row * n_blocks * 8;
    cand_v += (size_t)row * n_blocks * local_k;
    cand_i += (size_t)row * n_blocks * local_k;
    out += row;
    SampleParams p = *params;
    p.counter += row;
    const float temp = p.temperature > 0.0f ? p.temperature : 1.0f;
    SampleCuts* cuts = cand ? &cand->cuts : nullptr;

    // global max / argmax / normalizers over the n_blocks partials: warp 0, lanes strided, then a
    // shuffle tree (a serial loop over 64 partials costs ~15 us of dependent loads).
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float M = -INFINITY, gb = -INFINITY;
        int arg = 0x7fffffff, gi = 0x7fffffff;
        for (int b = lane; b < n_blocks; b += 32) {
            const float* o = part + b * 8;
            const int ib = __float_as_int(o[1]);
            if (o[0] > -INFINITY && before(o[0], ib, M, arg)) { M = o[0]; arg = ib; }
            const int gib = __float_as_int(o[5]);
            if (o[4] > gb || (o[4] == gb && gib < gi)) { gb = o[4]; gi = gib; }
        }
        warp_winners(M, arg, gb, gi);
        float Z1 = 0.0f, ZT = 0.0f;
        for (int b = lane; b < n_blocks; b += 32) {
            const float* o = part + b * 8;
            if (o[0] > -INFINITY) { Z1 += o[2] * expf(o[0] - M); ZT += o[3] * expf((o[0] - M) / temp); }
        }
        Z1 = warp_sum(Z1);
        ZT = warp_sum(ZT);
      if (lane == 0) {
        if (p.temperature <= 0.0f) {          // greedy; logprob under the penalised softmax at T = 1
            (void)ZT;
            pick_s = arg;
            logprob_s = -logf(Z1);
            if (cand) { cuts->mode = 0; cand->final_id[0] = arg; cand->final_logit[0] = logits[arg]; }
        } else if (!filters_on(p, vocab)) {   // plain temperature sampling: Gumbel-max, exact
            pick_s = gi;
            logprob_s = (logits[gi] - M) / temp - logf(ZT);
            if (cuts) { cuts->mode = 1; cuts->c0 = M; cuts->log_z = logf(ZT); }
        } else {
            pick_s = -1;
            red[0] = Z1;
            red[1] = M;
        }
      }
    }
    __syncthreads();
    if (pick_s < 0) {
        const float Z1 = red[0], M = red[1];
        int n_runs = 1;
        while (n_runs < n_blocks) n_runs <<= 1;
        const bool k_on = p.top_k > 0 && p.top_k < vocab;
        // Lc: the places of each run that can be kept; live: a bound on the kept tokens. top_k on:
        // a run's places from top_k on are stage 1's padding. min_p keeps p >= min_p * p_max, a
        // prefix of the sorted list, so places under its floor can go before the merge: each run
        // is cut to its longest prefix over the floor. Not with top_k and top_p both on (top_p's
        // mass is then the top k's, past the floor too), nor with a cuts record to write (the
        // inspector must see the real top_p cut, which may lie past the floor).
        int Lc = k_on ? min(local_k, p.top_k) : local_k;
        int live = k_on ? p.top_k : S2_MAX_CAND;
        if (p.min_p > 0.0f && !(k_on && p.top_p < 1.0f) && !cand && M > -INFINITY && live > TOP) {
            const float floor_l = M + logf(p.min_p);  // M is cv[0]: filtered_draw's floor, bit for bit
            if (threadIdx.x == 0) { over_max_s = 0; over_sum_s = 0; }
            __syncthreads();
            const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
            for (int r = warp; r < n_blocks; r += S2_THREADS / 32) {
                int c = 0;
                for (int j0 = 0; j0 < Lc; j0 += 32)
                    c += __popc(__ballot_sync(0xffffffffu, j0 + lane < Lc && cand_v[r * local_k + j0 + lane] >= floor_l));
                if (lane == 0) { atomicMax(&over_max_s, c); atomicAdd(&over_sum_s, c); }
            }
            __syncthreads();
            Lc = max(over_max_s, 1);
            live = min(live, over_sum_s);
        }
        int n, at = 0;
        const bool tree64 = live <= TOP && local_k >= TOP, tree128 = live <= TOP_MAX && local_k >= TOP_MAX;
        if ((tree64 || tree128) && n_runs <= 64) {
            // the default knobs' path (and top_k up to 128): a tree of warp merges straight from
            // the stage-1 runs
            at = tree64 ? merge_tree<TOP>(cand_v, cand_i, local_k, n_runs, n_blocks, cv, ci)
                        : merge_tree<TOP_MAX>(cand_v, cand_i, local_k, n_runs, n_blocks, cv, ci);
            n = live;
        } else {
            // the runs copied cut to Lc. The merge is a top-cap selection under before(), a total
            // order up to equal padding, so the run layout does not change the result, only the work.
            const int n_all = n_runs * Lc;  // <= S2_MAX_CAND
            for (int i = threadIdx.x; i < n_all; i += S2_THREADS) {
                const int r = i / Lc, src = r * local_k + (i - r * Lc);
                cv[i] = r < n_blocks ? cand_v[src] : -INFINITY;
                ci[i] = r < n_blocks ? cand_i[src] : 0x7fffffff;
            }
            __syncthreads();
            const int cap = k_on ? min(p.top_k, n_all) : n_all;
            int L = Lc;
            for (int runs = n_runs; runs > 1; runs >>= 1) {
                merge_round_fit(cv, ci, runs, L, cap);
                L = min(2 * L, cap);
            }
            n = min(L, cap);
        }
        if (n <= TOP) {
            filtered_draw_warp(cv + at, ci + at, n, p, k_on, Z1, M, temp, &pick_s, &logprob_s, cuts);
            __syncthreads();
        } else {
            filtered_draw(cv + at, ci + at, n, p, k_on, Z1, M, temp, dred, &pick_s, &logprob_s, cuts);
        }
        // the final distribution's best are the sorted list's first (sample_candidates needs no
        // pass of its own over the penalised logits here)
        if (cand && threadIdx.x < min(min(p.top_logprobs, CAND_MAX), n)) {
            cand->final_id[threadIdx.x] = ci[at + threadIdx.x];
            cand->final_logit[threadIdx.x] = cv[at + threadIdx.x];
        }
    }
    if (threadIdx.x == 0) {
        out->token = pick_s;
        out->logprob = logprob_s;
        if (token_io) *token_io = pick_s;
        if (pos_io) *pos_io += 1;  // null outside the decode graph
        if (gridDim.y == 1) params->counter = p.counter + 1;  // rows: sample_advance, after every row read it
    }
}

// After a verify pass's rows: the counter moves past the rows' draws (each row read it, so no row
// may move it). One thread.
extern "C" __global__ void sample_advance(SampleParams* params, int rows) {
    pdl_entry();
    if (threadIdx.x == 0) params->counter += rows;
}

// The candidates of the token sample_finish drew. One block of 1024. raw: the logits before
// penalties and mask (a copy); logits: after them (-inf: masked). model_* / final_*: stage-1
// passes (T = 1, top_k = CAND_RUN, no mask) over raw and (plain temperature draws only: the
// other draws' best come from sample_finish) over logits, each block's best CAND_RUN sorted;
// merged here into the best n. rank: the drawn token's place among the raw logits in
// before()'s order, from the list when it is there, else by counting the whole vocabulary.
extern "C" __global__ void __launch_bounds__(1024) sample_candidates(
    const float* raw, const float* logits, const SampleParams* params, const float* model_part,
    const float* model_cv, const int* model_ci, const float* final_cv, const int* final_ci,
    const float* draw_part, int n_blocks, int vocab, const SampleOut* out, SampleCandidates* cand) {
    pdl_entry();
    constexpr int MAXP = CAND_MAX_RUNS * CAND_RUN;
    __shared__ float v[MAXP];
    __shared__ int ix[MAXP];
    __shared__ int rank_s;
    const int n = min(params->top_logprobs, CAND_MAX);
    const int token = out->token;
    const bool reuse = params->cand_reuse;  // the model's list is sample_finish's (no raw pass ran)
    if (reuse) model_part = draw_part;
    int n_runs = 1;
    while (n_runs < n_blocks) n_runs <<= 1;
    if (threadIdx.x == 0) rank_s = -1;
    __syncthreads();
    // the penalised list: sample_finish wrote it for greedy and filtered draws; plain
    // temperature sampling sorts nothing there, so the stage-1 pass over logits did (final_*)
    const int lists = cand->cuts.mode == 1 ? 2 : 1;
    if (reuse && threadIdx.x < n) {
        const int t = threadIdx.x, id = cand->final_id[t];
        cand->model_id[t] = id;
        cand->model_logit[t] = cand->model_final[t] = cand->final_logit[t];
        if (id == token) rank_s = t;
    }
    for (int list = reuse ? 1 : 0; list < lists; ++list) {
        const float* cv = list ? final_cv : model_cv;
        const int* ci = list ? final_ci : model_ci;
        for (int i = threadIdx.x; i < n_runs * CAND_RUN; i += blockDim.x) {
            const bool real = i < n_blocks * CAND_RUN;
            v[i] = real ? cv[i] : -INFINITY;
            ix[i] = real ? ci[i] : 0x7fffffff;
        }
        __syncthreads();
        for (int runs = n_runs; runs > 1; runs >>= 1) merge_round_fit(v, ix, runs, CAND_RUN, CAND_RUN);
        const int t = threadIdx.x;
        if (t < n) {
            const int id = ix[t];
            if (list == 0) {
                cand->model_id[t] = id;
                cand->model_logit[t] = v[t];
                cand->model_final[t] = id < vocab ? logits[id] : -INFINITY;
                if (id == token) rank_s = t;
            } else {
                cand->final_id[t] = id;
                cand->final_logit[t] = v[t];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < n) {
        const int id = cand->final_id[threadIdx.x];
        cand->final_raw[threadIdx.x] = id >= 0 && id < vocab ? raw[id] : -INFINITY;
    }
    __syncthreads();  // rank_s is set (the reuse branch alone may have written it)
    if (rank_s < 0) {  // block-uniform: not among the n best. Count per thread, one sum at the end
        // (a block count per 1024 tokens was 256 barriers at a 262k vocabulary: ~55 us)
        const float lt = raw[token];
        int c = 0;
#pragma unroll 4
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) c += before(raw[i], i, lt, token);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
        __syncthreads();  // every thread has read rank_s
        if (threadIdx.x == 0) rank_s = 0;
        __syncthreads();
        if ((threadIdx.x & 31) == 0) atomicAdd(&rank_s, c);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // the raw softmax's normalizer from the model pass's block partials
        const int lane = threadIdx.x;
        float M = -INFINITY;
        for (int b = lane; b < n_blocks; b += 32) M = fmaxf(M, model_part[b * 8]);
        M = warp_max(M);
        float Z = 0.0f;
        for (int b = lane; b < n_blocks; b += 32)
            if (model_part[b * 8] > -INFINITY) Z += model_part[b * 8 + 2] * expf(model_part[b * 8] - M);
        Z = warp_sum(Z);
        if (lane == 0) {
            cand->n = n;
            cand->rank = rank_s;
            cand->model_max = M;
            cand->model_z = Z;
        }
    }
}
