// Sampling on the device, inside the decode graph: penalties over the device token history,
// the grammar bitmask, then greedy argmax, plain temperature sampling (Gumbel-max over the whole
// vocabulary), or the filtered chain top_k -> top_p -> min_p -> temperature with an inverse-CDF
// draw over the sorted candidates. Same chain and semantics as engine/sampling.py.
//
// Every knob comes from a device parameter block, so changing one needs no recapture. Random
// numbers are Philox4x32 of (seed, step counter): the counter lives on the device and advances
// once per sampled token, so the same seed gives the same tokens.
//
// Candidates: stage 1 keeps each block's best `local_k` logits; stage 2 merges them. The GPU
// therefore applies top_k <= local_k (128 up to a 256k vocabulary) and, with top_k off, top_p /
// min_p within the best local_k * n_blocks tokens; see docs/gpu-notes.md.
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
};

struct SampleOut {         // written by sample_finish; the 4-byte token id is what the host reads
    int token;
    float logprob;
};

#define S1_THREADS 1024
#define S1_CHUNK 4096
#define S2_THREADS 1024
#define S2_MAX_CAND 8192

__device__ __forceinline__ bool filters_on(const SampleParams& p, int vocab) {
    return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// Penalties (llama.cpp): for each distinct token in the window, divide positive logits by the
// repeat penalty (multiply negative ones), then subtract count * frequency + presence.
// Window: history[n - last_n, n) with n = *pos + 1 tokens in context. One block.
extern "C" __global__ void sample_penalize(float* logits, const SampleParams* params, const int* history,
                                           const int* pos, int vocab) {
    pdl_entry();
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

// In-place bitonic sort of n (a power of two) pairs in shared memory, best first.
__device__ void bitonic_sort(float* v, int* ix, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int o = i ^ j;
                if (o > i) {
                    const bool up = (i & k) == 0;
                    const bool swap = up ? before(v[o], ix[o], v[i], ix[i]) : before(v[i], ix[i], v[o], ix[o]);
                    if (swap) {
                        const float tv = v[i]; v[i] = v[o]; v[o] = tv;
                        const int ti = ix[i]; ix[i] = ix[o]; ix[o] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// Runs of RUN pairs sorted best first, merged without a block-wide sort: each warp sorts its own
// run with __syncwarp only, then a tree of merge-prune steps keeps the best RUN of two runs
// (bitonic: pair a_i with b_(RUN-1-i), keep the better, then a half-cleaner pass sorts the
// result). The order is total (value, then index), so the best RUN come out exactly as a full
// sort would give them. About a third of the work of a 4096-wide bitonic sort, and no block
// barrier inside a run's sort.
#define RUN 128

__device__ __forceinline__ void cswap(float* v, int* ix, int i, int o, bool best_first) {
    const bool swap = best_first ? before(v[o], ix[o], v[i], ix[i]) : before(v[i], ix[i], v[o], ix[o]);
    if (swap) {
        const float tv = v[i]; v[i] = v[o]; v[o] = tv;
        const int ti = ix[i]; ix[i] = ix[o]; ix[o] = ti;
    }
}

// One warp sorts v/ix[0, RUN) best first.
__device__ void warp_sort_run(float* v, int* ix) {
    const int lane = threadIdx.x & 31;
    for (int k = 2; k <= RUN; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = lane; i < RUN; i += 32) {
                const int o = i ^ j;
                if (o > i) cswap(v, ix, i, o, (i & k) == 0);
            }
            __syncwarp();
        }
    }
}

// One warp: a := the best RUN of a and b (both sorted best first), sorted best first.
__device__ void warp_merge_runs(float* av, int* ai, const float* bv, const int* bi) {
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < RUN; i += 32) {
        const int o = RUN - 1 - i;
        if (before(bv[o], bi[o], av[i], ai[i])) { av[i] = bv[o]; ai[i] = bi[o]; }
    }
    __syncwarp();
    for (int j = RUN >> 1; j > 0; j >>= 1) {  // a is bitonic now: half-cleaners sort it
        for (int i = lane; i < RUN; i += 32) {
            if ((i & j) == 0) cswap(av, ai, i, i + j, true);
        }
        __syncwarp();
    }
}

// The block's warps: runs r = 0 .. n_runs-1 at v/ix + r*RUN (each sorted unless `sorted`), merged
// into run 0. Ends with __syncthreads.
__device__ void best_run(float* v, int* ix, int n_runs, bool sorted) {
    const int warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (!sorted)
        for (int r = warp; r < n_runs; r += n_warps) warp_sort_run(v + r * RUN, ix + r * RUN);
    __syncthreads();
    for (int step = 1; step < n_runs; step <<= 1) {
        for (int r = warp * 2 * step; r + step < n_runs; r += n_warps * 2 * step)
            warp_merge_runs(v + r * RUN, ix + r * RUN, v + (r + step) * RUN, ix + (r + step) * RUN);
        __syncthreads();
    }
}

// Stage 1: grid ceil(vocab / S1_CHUNK), block S1_THREADS. Masks disallowed tokens to -inf in
// place, then per block: max logit, argmax, sum e^(l - max) at T = 1 and at T, the best Gumbel
// score, and (filters on) its local_k best logits sorted.
// part: per block 8 floats: max, argmax, sum1, sumT, gumbel value, gumbel index, -, -.
extern "C" __global__ void __launch_bounds__(S1_THREADS) sample_stage1(
    float* logits, const uint32_t* mask, const SampleParams* params, float* part, float* cand_v, int* cand_i,
    int vocab, int local_k) {
    pdl_entry();
    __shared__ float sv[S1_CHUNK];
    __shared__ int si[S1_CHUNK];
    __shared__ float red[32];
    __shared__ float bmax_s;
    const SampleParams p = *params;
    const float temp = p.temperature > 0.0f ? p.temperature : 1.0f;
    const int base = blockIdx.x * S1_CHUNK;

    float vmax = -INFINITY;
    int imax = 0x7fffffff;
    float gbest = -INFINITY;
    int gidx = 0x7fffffff;
    const bool want_gumbel = p.temperature > 0.0f && !filters_on(p, vocab);  // Philox only when drawn from
    for (int i = threadIdx.x; i < S1_CHUNK; i += S1_THREADS) {
        const int idx = base + i;
        float l = -INFINITY;
        if (idx < vocab) {
            l = logits[idx];
            if (p.use_mask && !((mask[idx >> 5] >> (idx & 31)) & 1u)) { l = -INFINITY; logits[idx] = l; }
        }
        sv[i] = l;
        si[i] = idx < vocab ? idx : 0x7fffffff;
        if (before(l, idx, vmax, imax) && l > -INFINITY) { vmax = l; imax = idx; }
        if (want_gumbel && l > -INFINITY) {
            const float gs = l / temp + gumbel(p, idx);
            if (gs > gbest || (gs == gbest && idx < gidx)) { gbest = gs; gidx = idx; }
        }
    }
    // block argmax (value, then lowest index) and best gumbel, through warp shuffles + shared
    __shared__ float wv[32], wg[32];
    __shared__ int wi[32], wgi[32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, vmax, o);
        const int oi = __shfl_xor_sync(0xffffffffu, imax, o);
        if (before(ov, oi, vmax, imax)) { vmax = ov; imax = oi; }
        const float og = __shfl_xor_sync(0xffffffffu, gbest, o);
        const int ogi = __shfl_xor_sync(0xffffffffu, gidx, o);
        if (og > gbest || (og == gbest && ogi < gidx)) { gbest = og; gidx = ogi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { wv[warp] = vmax; wi[warp] = imax; wg[warp] = gbest; wgi[warp] = gidx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < S1_THREADS / 32; ++w) {
            if (before(wv[w], wi[w], vmax, imax)) { vmax = wv[w]; imax = wi[w]; }
            if (wg[w] > gbest || (wg[w] == gbest && wgi[w] < gidx)) { gbest = wg[w]; gidx = wgi[w]; }
        }
        bmax_s = vmax;
    }
    __syncthreads();
    const float bmax = bmax_s;
    float s1 = 0.0f, sT = 0.0f;
    if (bmax > -INFINITY) {
        for (int i = threadIdx.x; i < S1_CHUNK; i += S1_THREADS) {
            const float l = sv[i];
            if (l > -INFINITY) { s1 += expf(l - bmax); sT += expf((l - bmax) / temp); }
        }
    }
    s1 = block_sum(s1, red);
    __syncthreads();
    sT = block_sum(sT, red);
    if (threadIdx.x == 0) {
        float* o = part + blockIdx.x * 8;
        o[0] = bmax; o[1] = __int_as_float(imax); o[2] = s1; o[3] = sT;
        o[4] = gbest; o[5] = __int_as_float(gidx); o[6] = 0.0f; o[7] = 0.0f;
    }
    if (p.temperature > 0.0f && filters_on(p, vocab)) {
        __syncthreads();
        best_run(sv, si, S1_CHUNK / RUN, false);  // local_k <= RUN (sampler.py LOCAL_K_MAX)
        for (int i = threadIdx.x; i < local_k; i += S1_THREADS) {
            cand_v[blockIdx.x * local_k + i] = sv[i];
            cand_i[blockIdx.x * local_k + i] = si[i];
        }
    }
}

// Stage 2: one block. Merges the stage-1 partials, picks the token, writes the outputs and
// advances the device state: token (the next step's input), position, Philox counter.
extern "C" __global__ void __launch_bounds__(S2_THREADS) sample_finish(
    const float* logits, SampleParams* params, const float* part, const float* cand_v, const int* cand_i,
    int n_blocks, int local_k, int vocab, int* token_io, int* pos_io, SampleOut* out) {
    pdl_entry();
    extern __shared__ float dyn[];
    float* cv = dyn;                                  // [S2_MAX_CAND]
    int* ci = reinterpret_cast<int*>(dyn + S2_MAX_CAND);  // [S2_MAX_CAND]
    __shared__ float red[32];
    __shared__ int pick_s;
    __shared__ float logprob_s;
    const SampleParams p = *params;
    const float temp = p.temperature > 0.0f ? p.temperature : 1.0f;

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
        for (int off = 16; off > 0; off >>= 1) {
            const float oM = __shfl_xor_sync(0xffffffffu, M, off);
            const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
            if (before(oM, oa, M, arg)) { M = oM; arg = oa; }
            const float og = __shfl_xor_sync(0xffffffffu, gb, off);
            const int ogi = __shfl_xor_sync(0xffffffffu, gi, off);
            if (og > gb || (og == gb && ogi < gi)) { gb = og; gi = ogi; }
        }
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
        } else if (!filters_on(p, vocab)) {   // plain temperature sampling: Gumbel-max, exact
            pick_s = gi;
            logprob_s = (logits[gi] - M) / temp - logf(ZT);
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
        __syncthreads();
        int n = n_blocks * local_k;
        // top_k <= RUN: only the best RUN matter, and stage 1's runs are sorted: merge them
        const bool merge = local_k == RUN && p.top_k > 0 && p.top_k <= RUN;
        int npow = 1;
        while (npow < n) npow <<= 1;
        for (int i = threadIdx.x; i < npow; i += S2_THREADS) {
            cv[i] = i < n ? cand_v[i] : -INFINITY;
            ci[i] = i < n ? cand_i[i] : 0x7fffffff;
        }
        __syncthreads();
        if (merge) {
            best_run(cv, ci, n_blocks, true);
            n = RUN;
        } else {
            bitonic_sort(cv, ci, npow);
        }
        int kept = 0;  // sorted: the finite ones come first
        for (int b = 0; b < n; b += S2_THREADS)
            kept += __syncthreads_count(b + (int)threadIdx.x < n && cv[b + threadIdx.x] > -INFINITY);
        if (threadIdx.x == 0) {
            if (p.top_k > 0 && p.top_k < kept) kept = p.top_k;
            const float c0 = cv[0];
            if (p.top_p < 1.0f && kept > 1) {
                // top_k on: nucleus of the renormalised top k; off: of the whole vocabulary
                float Zp = 0.0f;
                if (p.top_k > 0 && p.top_k < vocab) {
                    for (int i = 0; i < kept; ++i) Zp += expf(cv[i] - c0);
                } else {
                    Zp = Z1 * expf(M - c0);
                }
                float cum = 0.0f;
                int last = kept - 1;
                for (int i = 0; i < kept; ++i) {
                    cum += expf(cv[i] - c0) / Zp;
                    if (cum >= p.top_p) { last = i; break; }
                }
                kept = last + 1;
            }
            if (p.min_p > 0.0f) {
                const float floor_l = c0 + logf(p.min_p);
                int k2 = 0;
                while (k2 < kept && cv[k2] >= floor_l) ++k2;
                kept = max(k2, 1);
            }
            float total = 0.0f;
            for (int i = 0; i < kept; ++i) total += expf((cv[i] - c0) / temp);
            const philox_out r = philox4x32(p.counter, 0u, 0u, 0u, p.seed_lo, p.seed_hi);
            const float u = u32_to_unit(r.x[0]) * total;
            float cum = 0.0f;
            int pick = kept - 1;
            for (int i = 0; i < kept; ++i) {
                cum += expf((cv[i] - c0) / temp);
                if (cum > u) { pick = i; break; }
            }
            pick_s = ci[pick];
            logprob_s = (cv[pick] - c0) / temp - logf(total);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out->token = pick_s;
        out->logprob = logprob_s;
        if (token_io) *token_io = pick_s;
        if (pos_io) *pos_io += 1;  // null outside the decode graph
        params->counter = p.counter + 1;
    }
}
