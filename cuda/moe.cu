// MoE routing: the router's top-k over its logits, and the weighted sum of the chosen experts'
// outputs. The expert matvecs themselves are in matvec.cu (moe_matvec_<type>).
#include "common.cuh"

#define MOE_MAX_EXPERTS 4096  // router logits of one token in shared memory: 16 KB
#define MOE_RANK_MAX 256      // up to this many experts, every logit ranked at once (below)
#define MOE_TOPK_THREADS 256

// moe_topk: router logits f32 [T][n_expert] -> ids int [T][k], weights f32 [T][k]; a block of
// MOE_TOPK_THREADS a token. p = softmax(logits); the k experts of highest p, best first (ties: the
// lower id), each with weight p (over the k weights' sum when renorm). Choosing on the logits
// picks the same experts as on p (exp is monotonic). A NaN logit counts as -inf, so k distinct ids
// always come back. log_ids (not null): the ids also go to log_ids[t * k + j], the routing log the
// host reads for the expert cache's counters.
// Up to MOE_RANK_MAX experts every logit's rank (the logits before it in that order) is counted
// at once, q = 256 / n threads a logit each taking every q-th comparison: no chain of k dependent
// arg-max rounds (H100, 64 experts, top-8: one warp's k rounds 4.37 us a launch, one warp ranking
// 3.76, the block ranking 2.36; docs/gpu-log.md session 42). Beyond that warp 0 runs the k rounds.
extern "C" __global__ __launch_bounds__(MOE_TOPK_THREADS) void moe_topk(
    const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ weights, int* __restrict__ log_ids,
    int n_expert, int k, int renorm) {
    __shared__ float sl[MOE_MAX_EXPERTS];
    __shared__ float sp[16];
    pdl_entry();
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
    const float* l = logits + (size_t)t * n_expert;
    ids += t * k;
    weights += t * k;
    if (log_ids) log_ids += t * k;
    for (int e = tid; e < n_expert; e += MOE_TOPK_THREADS) {
        const float v = l[e];
        sl[e] = isnan(v) ? -INFINITY : v;
    }
    __syncthreads();
    // every warp the same max and sum, in the same order (lane-strided partials, then the warp tree)
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += WARP) mx = fmaxf(mx, sl[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += WARP) sum += expf(sl[e] - mx);
    sum = warp_sum(sum);
    if (n_expert <= MOE_RANK_MAX) {
        int q = 1;  // threads a logit: a power of two <= 32 with q * n_expert <= the block
        while (q < WARP && 2 * q * n_expert <= MOE_TOPK_THREADS) q *= 2;
        const int e = tid / q, part = tid % q;
        int rank = 0;
        if (e < n_expert) {
            const float v = sl[e];
            for (int f = part; f < n_expert; f += q) rank += sl[f] > v || (sl[f] == v && f < e);
        }
        for (int o = q / 2; o > 0; o >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
        if (e < n_expert && part == 0 && rank < k) {
            ids[rank] = e;
            if (log_ids) log_ids[rank] = e;
            sp[rank] = expf(sl[e] - mx) / sum;
        }
    } else if (tid < WARP) {
        for (int j = 0; j < k; ++j) {
            float best = -INFINITY;
            int bi = 0x7fffffff;
            for (int e = lane; e < n_expert; e += WARP)
                if (sl[e] > best || (sl[e] == best && e < bi)) best = sl[e], bi = e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ob = __shfl_xor_sync(0xffffffffu, best, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
            }
            __syncwarp();
            if ((bi & 31) == lane) sl[bi] = NAN;  // taken: compares false, so no later round picks it
            __syncwarp();
            if (lane == 0) {
                ids[j] = bi;
                if (log_ids) log_ids[j] = bi;
                sp[j] = expf(best - mx) / sum;
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) total += sp[j];
        for (int j = 0; j < k; ++j) weights[j] = renorm ? sp[j] / total : sp[j];
    }
}

// moe_sort: the slots of T tokens x k experts grouped per expert, for the prefill GEMM.
// ids int [S] (S = T * k) -> offsets int [n_expert + 1] (expert e's slots are
// order[offsets[e] .. offsets[e + 1])), order int [S] (slot indices, ascending within an expert:
// a stable, deterministic grouping). One block of 1024 threads, S <= MOE_SORT_MAX.
// G counting warps each own a contiguous run of slots and a histogram row of their own, so a
// slot's rank among its expert's slots in the run is exact with no atomics: 32 slots at a time,
// __match_any_sync finds the lanes of one expert and their leader bumps the row. Then each
// expert's counts are scanned over the runs (a warp an expert, a lane a run), the experts' totals
// over the block, and each slot lands at offset[e] + run base + rank. The earlier kernel had each
// warp walk all S slots for each of its experts, twice: 34 us for 4,096 slots of 64 experts (H200).
#define MOE_SORT_MAX 8192
#define MOE_SORT_HIST 12288  // G x n_expert run counts (shorts: a count is at most S): 24 KB
extern "C" __global__ __launch_bounds__(1024) void moe_sort(const int* __restrict__ ids, int* __restrict__ offsets,
                                                            int* __restrict__ order, int n_slots, int n_expert) {
    __shared__ short hist[MOE_SORT_HIST];  // [run][expert]: counts, then each run's base within its expert
    __shared__ short rank[MOE_SORT_MAX];   // a slot's rank among its expert's slots in its run
    __shared__ int warp_sum[32];
    pdl_entry();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    const int G = min(n_warps, MOE_SORT_HIST / n_expert);  // >= 3 for n_expert <= MOE_MAX_EXPERTS
    const int run = (n_slots + G * WARP - 1) / (G * WARP) * WARP;  // slots a run, whole warps' worth
    for (int i = tid; i < G * n_expert; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    if (warp < G) {
        short* h = hist + warp * n_expert;
        const int end = min(n_slots, (warp + 1) * run);
        for (int s0 = warp * run; s0 < end; s0 += WARP) {
            const int s = s0 + lane;
            const int e = s < end ? ids[s] : -1;  // the tail's lanes match only each other, and are dropped
            const unsigned same = __match_any_sync(0xffffffffu, e);
            const int leader = __ffs(same) - 1;
            int before = 0;
            if (lane == leader && e >= 0) {
                before = h[e];
                h[e] = (short)(before + __popc(same));
            }
            before = __shfl_sync(0xffffffffu, before, leader);
            if (e >= 0) rank[s] = (short)(before + __popc(same & ((1u << lane) - 1)));
            __syncwarp();
        }
    }
    __syncthreads();
    // each run's base within its expert (exclusive over runs), the expert's total to offsets[e]
    for (int e = warp; e < n_expert; e += n_warps) {
        const int c = lane < G ? hist[lane * n_expert + e] : 0;
        int incl = c;
#pragma unroll
        for (int o = 1; o < WARP; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane < G) hist[lane * n_expert + e] = (short)(incl - c);
        if (lane == WARP - 1) offsets[e] = incl;
    }
    __syncthreads();
    // exclusive scan of the totals over the experts: a thread per span of experts, then the block
    const int per = (n_expert + blockDim.x - 1) / blockDim.x, e0 = min(n_expert, tid * per), e1 = min(n_expert, e0 + per);
    int mine = 0;
    for (int e = e0; e < e1; ++e) mine += offsets[e];
    int incl = mine;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == WARP - 1) warp_sum[warp] = incl;
    __syncthreads();
    int acc = incl - mine;
    for (int w = 0; w < warp; ++w) acc += warp_sum[w];
    for (int e = e0; e < e1; ++e) {
        const int c = offsets[e];
        offsets[e] = acc;
        acc += c;
    }
    if (tid == blockDim.x - 1) offsets[n_expert] = acc;
    __syncthreads();
    for (int s = tid; s < n_slots; s += blockDim.x) {
        const int e = ids[s];
        order[offsets[e] + hist[(s / run) * n_expert + e] + rank[s]] = s;
    }
}

// moe_combine: out[t][i] = sum_j weights[t*k + j] * y[(t*k + j)][i], j in order (best expert first).
// grid (ceil(d / 256), T), block 256.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ weights,
                                       float* __restrict__ out, int d, int k) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= d) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = fmaf(weights[t * k + j], y[(size_t)(t * k + j) * d + i], acc);
    out[(size_t)t * d + i] = acc;
}
