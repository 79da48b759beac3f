// CPU driver for cuda/quants.cuh (used by tests/test_quant_host.py; no GPU needed).
// Runs every traits struct's load_w/load_a/dot and dequant on the host over the exact buffers
// quant_ops.repack and quantize_q8_1 produce, so a layout or bit error shows up in CI.
//
//   quant_host_check TYPE ROWS COLS TOKENS IN OUT
// IN:  the repacked weight buffer, then TOKENS q8_1 rows (stride from quant_ops.q8_1_stride)
// OUT: y float32 [TOKENS][ROWS] (quant types; float types write zeros), then f16 [ROWS][COLS]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "quants.cuh"

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

template <class T>
static void run_quant(const uint8_t* buf, int rows, int cols, int tokens, int stride, const int8_t* xq,
                      std::vector<float>& y, std::vector<half>& deq) {
    const int nb = cols / T::QK;
    const uint8_t* meta = buf + align_up((size_t)rows * nb * T::QB, 256);
    for (int t = 0; t < tokens; ++t) {
        const q8_1_row xrow = q8_1_row_at(xq + (size_t)t * stride, cols);
        for (int r = 0; r < rows; ++r) {
            float acc = 0.0f;
            for (int u = 0; u < nb * T::UNITS; ++u) {
                const int b = u / T::UNITS, j = u % T::UNITS;
                const size_t blk = (size_t)r * nb + b;
                typename T::W w;
                typename T::A a;
                T::load_w(w, buf + blk * T::QB, meta + blk * T::MB, j);
                T::load_a(a, xrow, b, j);
                acc += T::dot(w, a);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
    for (int r = 0; r < rows; ++r)
        for (int u = 0; u < nb * T::UNITS; ++u) {
            const int b = u / T::UNITS, j = u % T::UNITS;
            const size_t blk = (size_t)r * nb + b;
            T::dequant(buf + blk * T::QB, meta + blk * T::MB, j, deq.data() + (size_t)r * cols + b * T::QK);
        }
}

template <class F>
static void run_float(const uint8_t* buf, int rows, int cols, std::vector<half>& deq) {
    const int nu = (cols + 7) / 8;
    std::vector<half> row(nu * 8);
    for (int r = 0; r < rows; ++r) {
        for (int u = 0; u < nu; ++u) F::dequant(buf + ((size_t)r * nu + u) * F::QB, nullptr, 0, row.data() + 8 * u);
        memcpy(deq.data() + (size_t)r * cols, row.data(), cols * sizeof(half));
    }
}

// `quant_host_check kscales`: kquant_scales_of against scale_min_k4 (ggml's get_scale_min_k4) on
// every unit of 200,000 pseudo-random metas, bit for bit; prints the mismatches, rc 1 if any.
static int check_kquant_scales() {
    unsigned long long state = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int n = 0; n < 200000; ++n) {
        uint8_t meta[16];
        for (int i = 0; i < 16; ++i) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            meta[i] = (uint8_t)(state >> 56);
        }
        meta[1] &= 0x3B, meta[3] &= 0x3B;  // finite f16 d and dmin
        int4 mv;
        memcpy(&mv, meta, 16);
        const float d = __half2float(*reinterpret_cast<const half*>(meta));
        const float dmin = __half2float(*reinterpret_cast<const half*>(meta + 2));
        for (int j = 0; j < 4; ++j) {
            float got[4];
            kquant_scales_of(mv, j, got[0], got[1], got[2], got[3]);
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * j, meta + 4, sc0, m0);
            scale_min_k4(2 * j + 1, meta + 4, sc1, m1);
            const float want[4] = {d * (float)sc0, d * (float)sc1, dmin * (float)m0, dmin * (float)m1};
            if (memcmp(got, want, sizeof got) != 0 && bad++ < 10)
                fprintf(stderr, "meta %d unit %d: got %g %g %g %g, want %g %g %g %g\n", n, j, got[0], got[1], got[2],
                        got[3], want[0], want[1], want[2], want[3]);
        }
    }
    printf("kscales: %d mismatches\n", bad);
    return bad ? 1 : 0;
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "kscales") return check_kquant_scales();
    if (argc != 7) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS TOKENS IN OUT\n", argv[0]);
        return 2;
    }
    const std::string type = argv[1];
    const int rows = atoi(argv[2]), cols = atoi(argv[3]), tokens = atoi(argv[4]);
    FILE* f = fopen(argv[5], "rb");
    if (!f) return 3;
    std::vector<uint8_t> in;
    uint8_t chunk[1 << 16];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) in.insert(in.end(), chunk, chunk + n);
    fclose(f);
    const size_t kq = align_up(cols, 32);
    const int stride = (int)align_up(2 * kq + kq / 32 * 16, 16);  // qs | qs2 | float4 ds (quant_ops.q8_1_stride)
    const size_t xq_bytes = (size_t)tokens * stride;
    const uint8_t* buf;
    // 16-byte aligned copies, as on the device (the kernels use aligned vector loads)
    std::vector<int4> wbuf((in.size() - xq_bytes + 15) / 16), xbuf((xq_bytes + 15) / 16);
    memcpy(wbuf.data(), in.data(), in.size() - xq_bytes);
    memcpy(xbuf.data(), in.data() + in.size() - xq_bytes, xq_bytes);
    buf = reinterpret_cast<const uint8_t*>(wbuf.data());
    const int8_t* xq = reinterpret_cast<const int8_t*>(xbuf.data());
    std::vector<float> y((size_t)tokens * rows, 0.0f);
    std::vector<half> deq((size_t)rows * cols);
#define QUANT(NAME) else if (type == #NAME) run_quant<NAME##_t>(buf, rows, cols, tokens, stride, xq, y, deq);
#define FLOAT(NAME) else if (type == #NAME) run_float<NAME##_t>(buf, rows, cols, deq);
    if (false) {}
    QUANT(q4_0) QUANT(q4_1) QUANT(q5_0) QUANT(q5_1) QUANT(q8_0) QUANT(q4_K) QUANT(q5_K) QUANT(q6_K)
    QUANT(q2_K) QUANT(q3_K) QUANT(iq4_xs)
    FLOAT(f16) FLOAT(bf16) FLOAT(f32)
    else {
        fprintf(stderr, "unknown type %s\n", type.c_str());
        return 4;
    }
    FILE* o = fopen(argv[6], "wb");
    if (!o) return 5;
    fwrite(y.data(), sizeof(float), y.size(), o);
    fwrite(deq.data(), sizeof(half), deq.size(), o);
    fclose(o);
    return 0;
}
