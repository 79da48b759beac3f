// MoE routing: the router's top-k over its logits, and the weighted sum of the chosen experts'
// outputs. The expert matvecs themselves are in matvec.cu (moe_matvec_<type>).
#include "common.cuh"

#define MOE_MAX_PER_LANE 128  // experts per lane: up to 4096 experts per layer

// moe_topk: router logits f32 [T][n_expert] -> ids int [T][k], weights f32 [T][k]. One warp per
// token. p = softmax(logits); the k experts of highest p, best first (ties: the lower id), each
// with weight p (divided by the k weights' sum when renorm). Choosing on the logits picks the
// same experts as on p (exp is monotonic). log_ids (not null): the ids also go to
// log_ids[t * k + j], the routing log the host reads for the expert cache's counters.
extern "C" __global__ void moe_topk(const float* __restrict__ logits, int* __restrict__ ids,
                                    float* __restrict__ weights, int* __restrict__ log_ids, int n_expert, int k,
                                    int renorm) {
    pdl_entry();
    const int t = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (size_t)t * n_expert;
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += WARP) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < n_expert; e += WARP) sum += expf(l[e] - mx);
    sum = warp_sum(sum);
    unsigned taken[MOE_MAX_PER_LANE / 32] = {0};
    float picked[16];
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane, i = 0; e < n_expert; e += WARP, ++i)
            if (!(taken[i >> 5] >> (i & 31) & 1u) && (l[e] > best || (l[e] == best && e < bi))) best = l[e], bi = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if ((bi & 31) == lane) {
            const int i = bi >> 5;
            taken[i >> 5] |= 1u << (i & 31);
        }
        const float p = expf(best - mx) / sum;
        picked[j] = p;
        total += p;
        if (lane == 0) {
            ids[t * k + j] = bi;
            if (log_ids) log_ids[t * k + j] = bi;
        }
    }
    if (lane == 0)
        for (int j = 0; j < k; ++j) weights[t * k + j] = renorm ? picked[j] / total : picked[j];
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
