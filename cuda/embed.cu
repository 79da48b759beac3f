// Embedding lookup straight from the quantized table (the same upload as the LM head when the
// embeddings are tied), token ids read from device memory so a captured graph embeds whatever
// token the sampler wrote last step. Dequantization is quants.cuh's, written once per type.
#include "common.cuh"
#include "quants.cuh"

// y[t, :cols] = table[tokens[t], :] * scale, and history[pos[t]] = tokens[t] (the device token
// history the sampler's penalties read; history may be null). grid T, dynamic shared nb*QK halves.
// q/meta are the two upload planes (quants.cuh, "repacked layout"); nb blocks per row.
__device__ __forceinline__ void record_token(const int* tokens, const int* pos, int* history) {
    if (history && threadIdx.x == 0) history[pos[blockIdx.x]] = tokens[blockIdx.x];
}

template <typename B>
__device__ void embed_rows(const uint8_t* q, const uint8_t* meta, const int* tokens, float* y, int cols, int nb,
                           float scale) {
    extern __shared__ half row[];
    const size_t r = (size_t)tokens[blockIdx.x];
    for (int u = threadIdx.x; u < nb * B::UNITS; u += blockDim.x) {
        const int b = u / B::UNITS, j = u % B::UNITS;
        const size_t blk = r * nb + b;
        B::dequant(q + blk * B::QB, meta + blk * B::MB, j, row + (size_t)b * B::QK);
    }
    __syncthreads();
    float* yr = y + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = __half2float(row[i]) * scale;
}

#define EMBED_KERNEL(NAME, TYPE)                                                                        \
    extern "C" __global__ void NAME(const uint8_t* q, const uint8_t* meta, const int* tokens, float* y,  \
                                    int cols, int nb, float scale, const int* pos, int* history) { pdl_entry();       \
        record_token(tokens, pos, history);                                                              \
        embed_rows<TYPE>(q, meta, tokens, y, cols, nb, scale);                                           \
    }

// memra-kernel: embed_q4_0(PPPPiifPP)
EMBED_KERNEL(embed_q4_0, q4_0_t)
// memra-kernel: embed_q4_1(PPPPiifPP)
EMBED_KERNEL(embed_q4_1, q4_1_t)
// memra-kernel: embed_q5_0(PPPPiifPP)
EMBED_KERNEL(embed_q5_0, q5_0_t)
// memra-kernel: embed_q5_1(PPPPiifPP)
EMBED_KERNEL(embed_q5_1, q5_1_t)
// memra-kernel: embed_q8_0(PPPPiifPP)
EMBED_KERNEL(embed_q8_0, q8_0_t)
// memra-kernel: embed_q4_K(PPPPiifPP)
EMBED_KERNEL(embed_q4_K, q4_K_t)
// memra-kernel: embed_q5_K(PPPPiifPP)
EMBED_KERNEL(embed_q5_K, q5_K_t)
// memra-kernel: embed_q6_K(PPPPiifPP)
EMBED_KERNEL(embed_q6_K, q6_K_t)
// memra-kernel: embed_q2_K(PPPPiifPP)
EMBED_KERNEL(embed_q2_K, q2_K_t)
// memra-kernel: embed_q3_K(PPPPiifPP)
EMBED_KERNEL(embed_q3_K, q3_K_t)
// memra-kernel: embed_iq4_xs(PPPPiifPP)
EMBED_KERNEL(embed_iq4_xs, iq4_xs_t)
// memra-kernel: embed_f16(PPPPiifPP)
EMBED_KERNEL(embed_f16, f16_t)
// memra-kernel: embed_bf16(PPPPiifPP)
EMBED_KERNEL(embed_bf16, bf16_t)

// f32 tables are exact: no trip through half.
extern "C" __global__ void embed_f32(const uint8_t* q, const uint8_t* meta, const int* tokens, float* y, int cols,
                                     int nb, float scale, const int* pos, int* history) {
    pdl_entry();
    record_token(tokens, pos, history);
    const float* row = reinterpret_cast<const float*>(q) + (size_t)tokens[blockIdx.x] * nb * 8;
    float* yr = y + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = row[i] * scale;
}
