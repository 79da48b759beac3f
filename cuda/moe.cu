// MoE routing: the router's top-k over its logits, and the weighted sum of the chosen experts'
// outputs. The expert matvecs themselves are in matvec.cu (moe_matvec_<type>).
#include "common.cuh"

#define MOE_MAX_EXPERTS 4096  // router logits of one token in shared memory: 16 KB
#define MOE_RANK_MAX 256      // up to this many experts, each logit's rank in one pass (below)

// l: n_expert logits -> ids[0..k), weights[0..k) (and log_ids, if not null). p = softmax(l); the k
// experts of highest p, best first (ties: the lower id), each with weight p (over the k weights'
// sum when renorm). Choosing on the logits picks the same experts as on p (exp is monotonic). A
// NaN logit counts as -inf, so k distinct ids always come back. Up to MOE_RANK_MAX experts each
// lane ranks its logits against all n at once: one pass, not k dependent arg-max rounds of warp
// shuffles (H100, 64 experts, top-8: 4.37 -> 3.76 us a launch, docs/gpu-log.md session 42).
__device__ __forceinline__ void moe_topk_row(const float* l, int* __restrict__ ids, float* __restrict__ weights,
                                             int* __restrict__ log_ids, int n_expert, int k, int renorm) {
    __shared__ float sl[MOE_MAX_EXPERTS];
    __shared__ float sp[16];
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += WARP) {
        const float v = l[e];
        sl[e] = isnan(v) ? -INFINITY : v;
        mx = fmaxf(mx, sl[e]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += WARP) sum += expf(sl[e] - mx);
    sum = warp_sum(sum);
    __syncwarp();
    if (n_expert <= MOE_RANK_MAX) {
        for (int e = lane; e < n_expert; e += WARP) {
            const float v = sl[e];
            int rank = 0;
            for (int f = 0; f < n_expert; ++f) rank += sl[f] > v || (sl[f] == v && f < e);
            if (rank < k) {
                ids[rank] = e;
                if (log_ids) log_ids[rank] = e;
                sp[rank] = expf(v - mx) / sum;
            }
        }
    } else {
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
    __syncwarp();
    if (lane == 0) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) total += sp[j];
        for (int j = 0; j < k; ++j) weights[j] = renorm ? sp[j] / total : sp[j];
    }
}

// moe_topk: router logits f32 [T][n_expert] -> ids int [T][k], weights f32 [T][k], one warp a
// token (moe_topk_row). log_ids (not null): the ids also go to log_ids[t * k + j], the routing log
// the host reads for the expert cache's counters.
extern "C" __global__ void moe_topk(const float* __restrict__ logits, int* __restrict__ ids,
                                    float* __restrict__ weights, int* __restrict__ log_ids, int n_expert, int k,
                                    int renorm) {
    pdl_entry();
    const int t = blockIdx.x;
    moe_topk_row(logits + (size_t)t * n_expert, ids + t * k, weights + t * k, log_ids ? log_ids + t * k : nullptr,
                 n_expert, k, renorm);
}

// moe_sort: the slots of T tokens x k experts grouped per expert, for the prefill GEMM.
// ids int [S] (S = T * k) -> offsets int [n_expert + 1] (expert e's slots are
// order[offsets[e] .. offsets[e + 1])), order int [S] (slot indices, ascending within an expert:
// a stable, deterministic grouping). One block of 1024 threads; warp w takes experts w, w + 32, ...
// and walks the slots 32 at a time with a ballot, so each slot's place is its rank among the
// slots of its expert before it. S <= MOE_SORT_MAX.
#define MOE_SORT_MAX 8192
extern "C" __global__ __launch_bounds__(1024) void moe_sort(const int* __restrict__ ids, int* __restrict__ offsets,
                                                            int* __restrict__ order, int n_slots, int n_expert) {
    __shared__ short sid[MOE_SORT_MAX];  // expert ids < MOE_MAX_EXPERTS fit: 16 KB, with count under the 48 KB of static shared memory
    __shared__ int count[MOE_MAX_EXPERTS + 1];
    pdl_entry();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
    for (int s = tid; s < n_slots; s += blockDim.x) sid[s] = ids[s];
    __syncthreads();
    for (int e = warp; e < n_expert; e += n_warps) {
        int c = 0;
        for (int s0 = 0; s0 < n_slots; s0 += WARP) c += __popc(__ballot_sync(0xffffffffu, s0 + lane < n_slots && sid[s0 + lane] == e));
        if (lane == 0) count[e] = c;
    }
    __syncthreads();
    if (tid == 0) {  // exclusive scan over at most a few thousand experts: cheap next to the GEMMs
        int acc = 0;
        for (int e = 0; e < n_expert; ++e) {
            const int c = count[e];
            count[e] = acc;
            offsets[e] = acc;
            acc += c;
        }
        offsets[n_expert] = acc;
    }
    __syncthreads();
    for (int e = warp; e < n_expert; e += n_warps) {
        int at = count[e];
        for (int s0 = 0; s0 < n_slots; s0 += WARP) {
            const bool mine = s0 + lane < n_slots && sid[s0 + lane] == e;
            const unsigned m = __ballot_sync(0xffffffffu, mine);
            if (mine) order[at + __popc(m & ((1u << lane) - 1))] = s0 + lane;
            at += __popc(m);
        }
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
