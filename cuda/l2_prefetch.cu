// Weights into L2 ahead of the kernel that reads them. A decode step's attention, norms and
// activations are latency-bound and leave DRAM nearly idle; the matvecs after them are bound by how
// many bytes they keep in flight. While a layer's attention runs, l2_prefetch asks L2 for the next
// weights of the layer (the o projection, the start of gate|up): fire-and-forget bulk requests
// (cp.async.bulk.prefetch.L2, sm_90), so the matvecs find part of their bytes in L2. No data
// changes, so a step's output is the same bits with or without it.
#include "common.cuh"

#define L2_CHUNK 16384  // bytes a request

__device__ __forceinline__ void l2_bulk_prefetch(const uint8_t* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// l2_prefetch(a, na, b, nb, c, nc, d, nd): up to four byte ranges (16-byte aligned starts; a size of
// 0 skips one), cut in L2_CHUNK requests dealt round-robin over all the grid's threads, the ranges'
// chunks numbered one after another so every thread gets about as many. A size's tail below 16
// bytes is left out (bulk requests come in multiples of 16). PDL: dependents may launch at once
// (nothing here is read by them), and the requests go out before the wait, since weights never
// change in a step; the wait then keeps this grid from completing before its predecessor, so the
// next kernel's own wait still covers everything before it. grid any, block any.
extern "C" __global__ void l2_prefetch(const uint8_t* a, long long na, const uint8_t* b, long long nb,
                                       const uint8_t* c, long long nc, const uint8_t* d, long long nd) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const uint8_t* p[4] = {a, b, c, d};
    const long long n[4] = {na & ~15LL, nb & ~15LL, nc & ~15LL, nd & ~15LL};
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nth = (long long)gridDim.x * blockDim.x;
    long long first = 0;  // the global number of this range's first chunk
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const long long chunks = (n[r] + L2_CHUNK - 1) / L2_CHUNK;
        for (long long i = ((tid - first) % nth + nth) % nth; i < chunks; i += nth) {
            const long long off = i * L2_CHUNK;
            l2_bulk_prefetch(p[r] + off, (unsigned)min((long long)L2_CHUNK, n[r] - off));
        }
        first += chunks;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
