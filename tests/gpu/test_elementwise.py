"""RMSNorm, RoPE, gated activations, adds, softcap and embedding lookup vs numpy (float64 refs).

Random inputs (never zeros), NaN-poisoned outputs, odd widths, strided views. Tolerances:
f32 elementwise and norms <= 1e-5 relative (measured ~1e-7); rope <= 1e-4 (float angles up to
~4000 rad); embedding from quantized tables <= 1e-3 (dequantized through half, as matvec's GEMM).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import quant_ops
from memra_engine.gpu.quant_ref import dequantize_weight, random_weight_bytes
from memra_engine.model.gguf_file import TensorInfo
from gpu_util import rel_err, rope_ref

pytestmark = pytest.mark.gpu
f32 = np.float32


def rms_norm_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("T,n", [(1, 576), (7, 640), (3, 1001)])
@pytest.mark.parametrize("block", ["128", "one per value"])  # a loop per thread; the engine's register path
def test_rms_norm_rows(gpu, T, n, block):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((T, n)).astype(f32) * 3
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    y = gpu.empty(T * n)
    threads = 128 if block == "128" else -(-n // 32) * 32
    gpu.rt.launch("rms_norm_f32", T, threads, (gpu.put(x), gpu.put(w), y, n, 1, n, n, f32(1e-6), 0, 0, 0))
    assert rel_err(gpu.get(y, (T, n)), rms_norm_ref(x, w, 1e-6)) < 1e-5


def test_rms_norm_per_head_of_a_strided_view(gpu):
    rng = np.random.default_rng(1)
    T, heads, hd, ld = 5, 3, 64, 3 * 64 + 2 * 32  # q heads inside a fused qkv row
    x = rng.standard_normal((T, ld)).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(hd)).astype(f32)
    y = gpu.empty(T * heads * hd)
    gpu.rt.launch("rms_norm_f32", T * heads, 32, (gpu.put(x), gpu.put(w), y, hd, heads, ld, heads * hd, f32(1e-6), 0, 0, 0))
    ref = rms_norm_ref(x[:, : heads * hd].reshape(T, heads, hd), w, 1e-6)
    assert rel_err(gpu.get(y, (T, heads, hd)), ref) < 1e-5


def test_add_rms_norm_updates_the_residual(gpu):
    rng = np.random.default_rng(2)
    T, n = 4, 577
    h, d = rng.standard_normal((2, T, n)).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    total, y = gpu.empty(T * n), gpu.empty(T * n)
    gpu.rt.launch("add_rms_norm_f32", T, 128, (total, gpu.put(h), gpu.put(d), gpu.put(w), y, n, f32(1e-5), 0, 0, 0))
    assert np.array_equal(gpu.get(total, (T, n)), h + d)
    assert rel_err(gpu.get(y, (T, n)), rms_norm_ref(h + d, w, 1e-5)) < 1e-5


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_rope_from_device_positions(gpu, neox, hd):
    rng = np.random.default_rng(hd + neox)
    T, n, ld = 6, 3, 3 * hd + 40
    x = rng.standard_normal((T, ld)).astype(f32)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    ff = (1 + rng.random(hd // 2)).astype(f32)
    for freq in (None, ff):
        y = gpu.empty(T * n * hd)
        gpu.rt.launch("rope_f32", (n, T), 64, (gpu.put(x), y, gpu.put(pos), gpu.put(freq) if freq is not None else 0,
                                              hd, ld, n * hd, f32(10000.0), f32(0.5), int(neox)))
        ref = rope_ref(x[:, : n * hd].reshape(T, n, hd), pos, 10000.0, neox, 0.5, freq)
        assert rel_err(gpu.get(y, (T, n, hd)), ref) < 1e-4


@pytest.mark.parametrize("hpb", [1, 5, 12])  # heads a block: decode's 1, uneven groups, prefill's all 12
@pytest.mark.parametrize("neox", [False, True])
def test_fused_rope_qk_and_kv_write_match_rope_and_kv_write(gpu, neox, hpb):
    rng = np.random.default_rng(11 + neox)
    T, n_q, n_kv, hd, n_ctx = 5, 9, 3, 64, 300
    width = (n_q + 2 * n_kv) * hd
    qkv = rng.standard_normal((T, width)).astype(f32)
    pos = np.array([3, 100, 101, 250, 299], np.int32)
    ff = (1 + rng.random(hd // 2)).astype(f32)
    p, ppos = gpu.put(qkv), gpu.put(pos)
    kc, vc = gpu.put(np.zeros((n_kv, n_ctx, hd), np.float16)), gpu.put(np.zeros((n_kv, n_ctx, hd), np.float16))
    q_out = gpu.empty(T * n_q * hd)
    gpu.rt.launch("rope_qk_kv_f16", (-(-(n_q + n_kv) // hpb), T), 32,
                  (p, q_out, p + n_q * hd * 4, p + (n_q + n_kv) * hd * 4, kc, vc, ppos, gpu.put(ff), n_q, n_kv, hd,
                   width, width, width, n_ctx, f32(1e4), f32(1.0), int(neox), 0, 0, f32(0), hpb))
    # the same through the separate kernels
    q_ref, k_ref = gpu.empty(T * n_q * hd), gpu.empty(T * n_kv * hd)
    for x, y, n in ((p, q_ref, n_q), (p + n_q * hd * 4, k_ref, n_kv)):
        gpu.rt.launch("rope_f32", (n, T), 32, (x, y, ppos, gpu.put(ff), hd, width, n * hd, f32(1e4), f32(1.0), int(neox)))
    kc2, vc2 = gpu.put(np.zeros((n_kv, n_ctx, hd), np.float16)), gpu.put(np.zeros((n_kv, n_ctx, hd), np.float16))
    gpu.rt.launch("kv_write_f16", (T, n_kv), 64, (k_ref, p + (n_q + n_kv) * hd * 4, kc2, vc2, ppos, n_kv * hd, width,
                                                  hd, n_ctx))
    assert np.array_equal(gpu.get(q_out, (T, n_q * hd)), gpu.get(q_ref, (T, n_q * hd)))
    assert np.array_equal(gpu.get(kc, (n_kv, n_ctx, hd), np.float16), gpu.get(kc2, (n_kv, n_ctx, hd), np.float16))
    assert np.array_equal(gpu.get(vc, (n_kv, n_ctx, hd), np.float16), gpu.get(vc2, (n_kv, n_ctx, hd), np.float16))
    ref = rope_ref(qkv[:, : n_q * hd].reshape(T, n_q, hd), pos, 1e4, neox, 1.0, ff)
    assert rel_err(gpu.get(q_out, (T, n_q, hd)), ref) < 1e-4


@pytest.mark.parametrize("all_heads", [False, True])  # a head a block (decode), a token's heads a block (prefill)
@pytest.mark.parametrize("hd,n_q,n_kv", [(64, 9, 3), (256, 4, 1)])
def test_rope_qk_kv_with_fused_head_norms_matches_rms_norm_then_rope(gpu, hd, n_q, n_kv, all_heads):
    """qwen3/gemma3: the per-head q/k RMSNorm inside rope_qk_kv_f16 (block of head_dim threads)
    gives rms_norm_f32's values; compared with the separate launches, and with numpy."""
    rng = np.random.default_rng(hd + n_q)
    T, n_ctx, eps = 3, 64, 1e-6
    width = (n_q + 2 * n_kv) * hd
    qkv = (rng.standard_normal((T, width)) * 3).astype(f32)
    wq, wk = (1 + 0.2 * rng.standard_normal((2, hd))).astype(f32)
    pos = np.array([0, 17, 63], np.int32)
    p, ppos, pwq, pwk = gpu.put(qkv), gpu.put(pos), gpu.put(wq), gpu.put(wk)
    zeros = np.zeros((n_kv, n_ctx, hd), np.float16)
    kc, vc, kc2, vc2 = gpu.put(zeros), gpu.put(zeros), gpu.put(zeros), gpu.put(zeros)
    q_out, q_ref = gpu.empty(T * n_q * hd), gpu.empty(T * n_q * hd)
    koff, voff = p + n_q * hd * 4, p + (n_q + n_kv) * hd * 4
    hpb = n_q + n_kv if all_heads else 1
    gpu.rt.launch("rope_qk_kv_f16", (-(-(n_q + n_kv) // hpb), T), hd,
                  (p, q_out, koff, voff, kc, vc, ppos, 0, n_q, n_kv, hd, width, width, width, n_ctx, f32(1e4), f32(1.0),
                   1, pwq, pwk, f32(eps), hpb))
    # separately: rms_norm_f32 per head (block hd), then the plain fused rope
    qn, kn = gpu.empty(T * n_q * hd), gpu.empty(T * n_kv * hd)
    for x, w, y, n in ((p, pwq, qn, n_q), (koff, pwk, kn, n_kv)):
        gpu.rt.launch("rms_norm_f32", T * n, hd, (x, w, y, hd, n, width, n * hd, f32(eps), 0, 0, 0))
    gpu.rt.launch("rope_qk_kv_f16", (n_q + n_kv, T), max(32, min(128, hd // 2)),
                  (qn, q_ref, kn, voff, kc2, vc2, ppos, 0, n_q, n_kv, hd, n_q * hd, n_kv * hd, width, n_ctx, f32(1e4),
                   f32(1.0), 1, 0, 0, f32(0), 1))
    got, ref = gpu.get(q_out, (T, n_q * hd)), gpu.get(q_ref, (T, n_q * hd))
    assert rel_err(got, ref) < 1e-6
    k_got = gpu.get(kc, (n_kv, n_ctx, hd), np.float16).astype(np.float32)
    k_ref = gpu.get(kc2, (n_kv, n_ctx, hd), np.float16).astype(np.float32)
    assert rel_err(k_got, k_ref) < 1e-3  # f16 cache: an ulp flip at most
    assert np.array_equal(gpu.get(vc, (n_kv, n_ctx, hd), np.float16), gpu.get(vc2, (n_kv, n_ctx, hd), np.float16))
    xq = qkv[:, : n_q * hd].reshape(T, n_q, hd).astype(np.float64)
    normed = xq / np.sqrt((xq ** 2).mean(-1, keepdims=True) + eps) * wq
    assert rel_err(got.reshape(T, n_q, hd), rope_ref(normed, pos, 1e4, True, 1.0, None)) < 1e-4


@pytest.mark.parametrize("n", [640, 1000])
def test_norm_add_rms_norm_matches_rms_norm_then_add_rms_norm(gpu, n):
    """gemma3's sandwich: yb = norm(b) * wb, h = a + yb, y = norm(h) * w in one launch equals the
    two launches (rms_norm_f32, add_rms_norm_f32), q8_1 output included."""
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride

    rng = np.random.default_rng(n + 5)
    T, eps = 3, 1e-6
    a, b = (rng.standard_normal((2, T, n)) * 2).astype(f32)
    wb, w = (1 + 0.2 * rng.standard_normal((2, n))).astype(f32)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    block = -(-n // 32) * 32
    pa, pb, pwb, pw = gpu.put(a), gpu.put(b), gpu.put(wb), gpu.put(w)
    h, yb, y, xq = gpu.empty(T * n), gpu.empty(T * n), gpu.empty(T * n), gpu.empty(nbytes // 4 + 1)
    gpu.rt.launch("norm_add_rms_norm_f32", T, block, (h, pa, pb, pwb, yb, f32(eps), pw, y, n, f32(eps), xq, stride, 0))
    h2, yb2, y2, xq2 = gpu.empty(T * n), gpu.empty(T * n), gpu.empty(T * n), gpu.empty(nbytes // 4 + 1)
    gpu.rt.launch("rms_norm_f32", T, block, (pb, pwb, yb2, n, 1, n, n, f32(eps), 0, 0, 0))
    gpu.rt.launch("add_rms_norm_f32", T, block, (h2, pa, yb2, pw, y2, n, f32(eps), xq2, stride, 0))
    for got, ref in ((yb, yb2), (h, h2), (y, y2)):
        assert rel_err(gpu.get(got, (T, n)), gpu.get(ref, (T, n)).astype(np.float64)) < 1e-6
    bb = b.astype(np.float64)
    yb_ref = bb / np.sqrt((bb ** 2).mean(-1, keepdims=True) + eps) * wb
    hh = a + yb_ref
    y_ref = hh / np.sqrt((hh ** 2).mean(-1, keepdims=True) + eps) * w
    assert rel_err(gpu.get(y, (T, n)), y_ref) < 1e-5
    # the q8_1 rows: a last-bit difference in y may move qs by one step and then the residual's qs2
    # anywhere, so check what each row encodes: its own y, within d2/2 <= amax/(2*127*254) per block
    kq = -(-n // 32) * 32
    for xq_p, y_p in ((xq, y), (xq2, y2)):
        yy = np.zeros((T, kq))
        yy[:, :n] = gpu.get(y_p, (T, n))
        blocks = yy.reshape(T, -1, 32)
        err = np.abs(q8_1_values(gpu.get(xq_p, nbytes, np.uint8), T, n).reshape(T, -1, 32) - blocks)
        assert np.all(err <= 2e-5 * np.abs(blocks).max(-1, keepdims=True))


@pytest.mark.parametrize("kernel", ["silu_mul_f32", "gelu_tanh_mul_f32"])
def test_gated_activations_read_a_fused_row(gpu, kernel):
    rng = np.random.default_rng(3)
    T, n = 3, 1537
    gu = (rng.standard_normal((T, 2 * n)) * 3).astype(f32)
    y = gpu.empty(T * n)
    ld = -(-n // 8) * 8
    yh = gpu.empty(T * ld // 2)  # NaN-poisoned: the pad must be written (zeros) too
    p = gpu.put(gu)
    gpu.rt.launch(kernel, (-(-n // 256), T), 256, (p, p + n * 4, y, n, 2 * n, 0, 0, 0, 0, 0))
    g, u = gu[:, :n].astype(np.float64), gu[:, n:].astype(np.float64)
    if kernel == "silu_mul_f32":
        ref = g / (1 + np.exp(-g)) * u
    else:
        ref = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * u
    got = gpu.get(y, (T, n))
    assert rel_err(got, ref) < 1e-5
    # with the f16 copy for the prefill GEMM: the same y, and f16(y) rows of ld, zero past n
    gpu.rt.launch(kernel, (-(-n // 256), T), 256, (p, p + n * 4, y, n, 2 * n, 0, 0, yh, ld, 0))
    assert np.array_equal(gpu.get(y, (T, n)), got)
    half = gpu.get(yh, (T, ld), np.float16)
    assert np.array_equal(half[:, :n].view(np.uint16), got.astype(np.float16).view(np.uint16))
    assert not half[:, n:].any()


def test_add_bias_scale_softcap_copy(gpu):
    rng = np.random.default_rng(4)
    T, n = 3, 999
    a, b = (rng.standard_normal((2, T, n)) * 20).astype(f32)
    bias = rng.standard_normal(n).astype(f32)
    pa, pb = gpu.put(a), gpu.put(b)
    blocks = -(-T * n // 256)
    y = gpu.empty(T * n)
    gpu.rt.launch("add_f32", blocks, 256, (y, pa, pb, T * n))
    assert np.array_equal(gpu.get(y, (T, n)), a + b)
    y = gpu.empty(T * n)
    gpu.rt.launch("add_bias_f32", (-(-n // 256), T), 256, (y, pa, gpu.put(bias), n))
    assert np.array_equal(gpu.get(y, (T, n)), a + bias)
    y = gpu.empty(T * n)
    gpu.rt.launch("scale_f32", blocks, 256, (y, pa, f32(0.25), T * n))
    assert np.array_equal(gpu.get(y, (T, n)), a * f32(0.25))
    y = gpu.empty(T * n)
    gpu.rt.launch("softcap_f32", blocks, 256, (y, pa, f32(30.0), T * n))
    assert rel_err(gpu.get(y, (T, n)), 30 * np.tanh(a.astype(np.float64) / 30)) < 1e-5
    y = gpu.empty(T * 100)
    gpu.rt.launch("copy_rows_f32", (1, T), 256, (y, pa + 7 * 4, 100, 100, n))
    assert np.array_equal(gpu.get(y, (T, 100)), a[:, 7:107])


def q8_1_values(rows: np.ndarray, T: int, n: int) -> np.ndarray:
    """d1*qs + d2*qs2 of T device q8_1 rows (quant_ops layout: qs[Kq] | qs2[Kq] | float4 ds[Kq/32])."""
    from memra_engine.gpu.quant_ref import dequantize_q8_1_ref

    kq = -(-n // 32) * 32
    rows = rows.reshape(T, -1)
    ds = rows[:, 2 * kq:2 * kq + kq // 2].copy().view(np.float32).reshape(T, kq // 32, 4)
    return dequantize_q8_1_ref(rows[:, :kq].view(np.int8), rows[:, kq:2 * kq].view(np.int8), ds)


def quantize_q8_1_bytes(gpu, y_ptr, T, n):
    from memra_engine.gpu.quant_ops import q8_1_nbytes, quantize_q8_1

    xq = gpu.empty(q8_1_nbytes(n, T) // 4 + 1)
    quantize_q8_1(gpu.rt, y_ptr, xq, n, T)
    return gpu.get(xq, q8_1_nbytes(n, T), np.uint8)


@pytest.mark.parametrize("n", [576, 640, 1000])
def test_norm_and_activation_emit_the_same_q8_1_bytes_as_quantize_q8_1(gpu, n):
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride

    rng = np.random.default_rng(n)
    T = 3
    x, d = (rng.standard_normal((2, T, n)) * 2).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    # norms with 128 threads (a loop per thread, then quantize_row) and with one thread per value
    # (the engine's launch: each thread quantizes the value it holds)
    cases = [(k, b) for k in ("rms_norm_f32", "add_rms_norm_f32", "norm_add_rms_norm_f32")
             for b in (128, -(-n // 32) * 32)] + [("silu_mul_f32", 256)]
    for kernel, block in cases:
        y = gpu.empty(T * n)
        xq = gpu.empty(nbytes // 4 + 1)
        gpu.rt.memset_u32(xq, 0x5A5A5A5A, nbytes // 4)  # poisoned: every byte of a row must be written
        if kernel == "rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (gpu.put(x), gpu.put(w), y, n, 1, n, n, f32(1e-6), xq, stride, 0))
        elif kernel == "add_rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (gpu.empty(T * n), gpu.put(x), gpu.put(d), gpu.put(w), y, n, f32(1e-6),
                                             xq, stride, 0))
        elif kernel == "norm_add_rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (gpu.empty(T * n), gpu.put(x), gpu.put(d), gpu.put(w), gpu.empty(T * n),
                                             f32(1e-6), gpu.put(w[::-1].copy()), y, n, f32(1e-6), xq, stride, 0))
        else:
            gu = gpu.put(np.concatenate([x, d], axis=1))
            gpu.rt.launch(kernel, (-(-n // 256), T), 256, (gu, gu + n * 4, y, n, 2 * n, xq, stride, 0, 0, 0))
        ref = quantize_q8_1_bytes(gpu, y, T, n)
        got = gpu.get(xq, nbytes, np.uint8)
        assert np.array_equal(got, ref), (kernel, block)  # every byte: qs | qs2 | ds rows fill the stride


@pytest.mark.parametrize("n", [4096, 3001, 1500])
def test_norm_rows_held_in_registers(gpu, n):
    """Rows of up to 4 values per thread (decode's d = 4096 at the engine's 1024 threads) keep them in
    registers, 64 threads take the loop over global memory: both give the norm, the residual and the
    q8_1 bytes of their own y. (Across block sizes the sums' order differs, so no bit equality.)"""
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride

    rng = np.random.default_rng(n)
    T = 2
    x, d = (rng.standard_normal((2, T, n)) * 2).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    for kernel in ("rms_norm_f32", "add_rms_norm_f32"):
        for block in (64, 1024, -(-n // 4 // 32) * 32):  # loop; registers (1-4 values); registers (4 values)
            y, h = gpu.empty(T * n), gpu.empty(T * n)
            xq = gpu.empty(nbytes // 4 + 1)
            gpu.rt.memset_u32(xq, 0x5A5A5A5A, nbytes // 4)  # poisoned: every byte of a row must be written
            if kernel == "rms_norm_f32":
                gpu.rt.launch(kernel, T, block, (gpu.put(x), gpu.put(w), y, n, 1, n, n, f32(1e-6), xq, stride, 0))
                src = x
            else:
                gpu.rt.launch(kernel, T, block, (h, gpu.put(x), gpu.put(d), gpu.put(w), y, n, f32(1e-6), xq, stride, 0))
                src = x + d
                assert np.array_equal(gpu.get(h, (T, n)), src), (kernel, block)
            assert rel_err(gpu.get(y, (T, n)), rms_norm_ref(src, w, 1e-6)) < 1e-5, (kernel, block)
            assert np.array_equal(gpu.get(xq, nbytes, np.uint8), quantize_q8_1_bytes(gpu, y, T, n)), (kernel, block)


@pytest.mark.parametrize("n", [4096, 3001, 2048, 1500, 1056])
def test_add_rms_norm_split_matches_one_block(gpu, n):
    """Decode's add + norm over n / 256 blocks a row gives the bits of the one-block kernel at the
    engine's 1024 threads: h, y and every q8_1 byte (verify rows and decode rows may take either)."""
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride

    rng = np.random.default_rng(n + 7)
    T = 3
    x, d = (rng.standard_normal((2, T, n)) * 3).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    a, b, wd = gpu.put(x), gpu.put(d), gpu.put(w)
    out = {}
    for kernel, grid, block in (("add_rms_norm_f32", T, 1024), ("add_rms_norm_split_f32", (-(-n // 256), T), 256)):
        y, h = gpu.empty(T * n), gpu.empty(T * n)
        xq = gpu.empty(nbytes // 4 + 1)
        gpu.rt.memset_u32(xq, 0x5A5A5A5A, nbytes // 4)  # poisoned: every byte of a row must be written
        gpu.rt.launch(kernel, grid, block, (h, a, b, wd, y, n, f32(1e-6), xq, stride, 0))
        out[kernel] = (gpu.get(h, (T, n)), gpu.get(y, (T, n)), gpu.get(xq, nbytes, np.uint8))
    (h1, y1, q1), (h2, y2, q2) = out.values()
    assert np.array_equal(h2, x + d)
    assert rel_err(y2, rms_norm_ref(x + d, w, 1e-6)) < 1e-5
    assert np.array_equal(y1, y2) and np.array_equal(q1, q2)


@pytest.mark.parametrize("n", [4096, 2048, 256, 768])
def test_norms_and_activations_emit_quantize_q8_k256_bytes(gpu, n):
    """The producers' q8_k256 copies (xk, for the Q4_K matvecs of k256.cu): every byte equal to what
    quantize_q8_k256 writes from the same y, for each norm at the engine's block size (one value a
    thread up to 1024, four beyond), the split add + norm, and the gated activation."""
    from memra_engine.gpu.quant_ops import q8_k256_stride, quantize_q8_k256

    rng = np.random.default_rng(n + 3)
    T = 3
    x, d = (rng.standard_normal((2, T, n)) * 2).astype(f32)
    x[1, :256] *= 40.0  # one super-block far larger than the rest
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    stride = q8_k256_stride(n)
    used = -(-n // 256) * 548  # the row's alignment pad is never written
    block = min(1024, n)
    a, b, wd = gpu.put(x), gpu.put(d), gpu.put(w)
    cases = ["rms_norm_f32", "add_rms_norm_f32", "norm_add_rms_norm_f32", "silu_mul_f32"]
    if 1024 < n <= 4096:
        cases.append("add_rms_norm_split_f32")
    for kernel in cases:
        y = gpu.empty(T * n)
        xk = gpu.empty(T * stride // 4)
        gpu.rt.memset_u32(xk, 0x5A5A5A5A, T * stride // 4)
        if kernel == "rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (a, wd, y, n, 1, n, n, f32(1e-6), 0, 0, xk))
        elif kernel == "add_rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (gpu.empty(T * n), a, b, wd, y, n, f32(1e-6), 0, 0, xk))
        elif kernel == "add_rms_norm_split_f32":
            gpu.rt.launch(kernel, (n // 256, T), 256, (gpu.empty(T * n), a, b, wd, y, n, f32(1e-6), 0, 0, xk))
        elif kernel == "norm_add_rms_norm_f32":
            gpu.rt.launch(kernel, T, block, (gpu.empty(T * n), a, b, wd, gpu.empty(T * n), f32(1e-6),
                                             gpu.put(w[::-1].copy()), y, n, f32(1e-6), 0, 0, xk))
        else:
            gu = gpu.put(np.concatenate([x, d], axis=1))
            gpu.rt.launch(kernel, (n // 256, T), 256, (gu, gu + n * 4, y, n, 2 * n, 0, 0, 0, 0, xk))
        want = gpu.empty(T * stride // 4)
        quantize_q8_k256(gpu.rt, y, want, n, T)
        got, ref = gpu.get(xk, (T, stride), np.uint8), gpu.get(want, (T, stride), np.uint8)
        assert np.isfinite(gpu.get(y, (T, n))).all(), kernel
        assert np.array_equal(got[:, :used], ref[:, :used]), kernel


EMBED_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS,
               QT.F16, QT.BF16, QT.F32]


@pytest.mark.parametrize("qtype", EMBED_TYPES, ids=lambda t: t.name)
def test_embed_from_quantized_table_records_history(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    rows, cols = 301, 512 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS) else 576
    if qtype in quant_ops.FLOAT_TYPES:
        cols = 577  # float rows are padded to 8 at upload
    data = random_weight_bytes(qtype, rows, cols, rng)
    w = quant_ops.upload_weight(gpu.rt, gpu.pool, TensorInfo("embd", (rows, cols), qtype, data))
    table = dequantize_weight(qtype, data, rows, cols)
    T = 9
    tokens = rng.integers(0, rows, T).astype(np.int32)
    tokens[3] = tokens[5]
    pos = np.arange(40, 40 + T, dtype=np.int32)
    hist = gpu.put(np.full(64, -1, np.int32))
    y = gpu.empty(T * cols)
    lay = w.layout
    nb = lay.padded_cols // lay.block_values
    shared = 0 if lay.kernel_type == "f32" else nb * lay.block_values * 2
    gpu.rt.launch(f"embed_{lay.kernel_type}", T, 128,
                  (w.q_ptr, w.meta_ptr, gpu.put(tokens), y, cols, nb, f32(2.0), gpu.put(pos), hist), shared=shared)
    tol = 1e-6 if qtype == QT.F32 else 1e-3
    assert rel_err(gpu.get(y, (T, cols)), 2.0 * table[tokens].astype(np.float64)) < tol
    h = gpu.get(hist, 64, np.int32)
    assert np.array_equal(h[40:40 + T], tokens) and np.all(h[:40] == -1)
