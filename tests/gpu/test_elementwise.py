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
from gpu_util import rel_err

pytestmark = pytest.mark.gpu
f32 = np.float32


def rms_norm_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("T,n", [(1, 576), (7, 640), (3, 1001)])
def test_rms_norm_rows(gpu, T, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((T, n)).astype(f32) * 3
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    y = gpu.empty(T * n)
    gpu.rt.launch("rms_norm_f32", T, 128, (gpu.put(x), gpu.put(w), y, n, 1, n, n, f32(1e-6)))
    assert rel_err(gpu.get(y, (T, n)), rms_norm_ref(x, w, 1e-6)) < 1e-5


def test_rms_norm_per_head_of_a_strided_view(gpu):
    rng = np.random.default_rng(1)
    T, heads, hd, ld = 5, 3, 64, 3 * 64 + 2 * 32  # q heads inside a fused qkv row
    x = rng.standard_normal((T, ld)).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(hd)).astype(f32)
    y = gpu.empty(T * heads * hd)
    gpu.rt.launch("rms_norm_f32", T * heads, 32, (gpu.put(x), gpu.put(w), y, hd, heads, ld, heads * hd, f32(1e-6)))
    ref = rms_norm_ref(x[:, : heads * hd].reshape(T, heads, hd), w, 1e-6)
    assert rel_err(gpu.get(y, (T, heads, hd)), ref) < 1e-5


def test_add_rms_norm_updates_the_residual(gpu):
    rng = np.random.default_rng(2)
    T, n = 4, 577
    h, d = rng.standard_normal((2, T, n)).astype(f32)
    w = (1 + 0.1 * rng.standard_normal(n)).astype(f32)
    hp, y = gpu.put(h), gpu.empty(T * n)
    gpu.rt.launch("add_rms_norm_f32", T, 128, (hp, gpu.put(d), gpu.put(w), y, n, f32(1e-5)))
    assert np.array_equal(gpu.get(hp, (T, n)), h + d)
    assert rel_err(gpu.get(y, (T, n)), rms_norm_ref(h + d, w, 1e-5)) < 1e-5


def rope_ref(x, pos, base, neox, scale=1.0, ff=None):
    T, n, hd = x.shape
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if ff is not None:
        inv = inv / ff
    ang = (pos.astype(np.float64) * scale)[:, None] * inv[None]
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x = x.astype(np.float64)
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return np.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape)


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


@pytest.mark.parametrize("kernel", ["silu_mul_f32", "gelu_tanh_mul_f32"])
def test_gated_activations_read_a_fused_row(gpu, kernel):
    rng = np.random.default_rng(3)
    T, n = 3, 1537
    gu = (rng.standard_normal((T, 2 * n)) * 3).astype(f32)
    y = gpu.empty(T * n)
    p = gpu.put(gu)
    gpu.rt.launch(kernel, (-(-n // 256), T), 256, (p, p + n * 4, y, n, 2 * n))
    g, u = gu[:, :n].astype(np.float64), gu[:, n:].astype(np.float64)
    if kernel == "silu_mul_f32":
        ref = g / (1 + np.exp(-g)) * u
    else:
        ref = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * u
    assert rel_err(gpu.get(y, (T, n)), ref) < 1e-5


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


EMBED_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.F16, QT.BF16, QT.F32]


@pytest.mark.parametrize("qtype", EMBED_TYPES, ids=lambda t: t.name)
def test_embed_from_quantized_table_records_history(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    rows, cols = 301, 512 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 576
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
