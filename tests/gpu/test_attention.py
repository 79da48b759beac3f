"""Split-K flash attention over the f16 KV cache vs a float64 numpy reference.

The reference attends over the f16-rounded K/V the kernel reads (the cache format is part of
the op), so the bound is float32 arithmetic: <= 1e-4 relative (measured ~1e-6). Covers head dims
64/128/256, GQA groups of 1, 3, 4 and 9 (> 8 heads per kv head: several head groups), sliding
window, softcap, decode and causal prefill rows, and that a row's result does not depend on the
grid's split count (graph buckets) bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
from gpu_util import rel_err

pytestmark = pytest.mark.gpu
f32 = np.float32
SPLIT_LEN = 128


def attention_ref(q, kc, vc, pos, scale, window, softcap):
    """q [T, H, hd]; kc/vc [n_kv, n_ctx, hd] (f16 values). Row t sees keys in its window up to pos[t]."""
    T, H, hd = q.shape
    n_kv = kc.shape[0]
    out = np.zeros((T, H, hd))
    for t in range(T):
        lo = max(0, pos[t] + 1 - window) if window > 0 else 0
        for h in range(H):
            kvh = h // (H // n_kv)
            k = kc[kvh, lo:pos[t] + 1].astype(np.float64)
            v = vc[kvh, lo:pos[t] + 1].astype(np.float64)
            s = k @ q[t, h].astype(np.float64) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[t, h] = p @ v / p.sum()
    return out.reshape(T, H * hd)


def run_attention(gpu, q, k_new, v_new, kc0, vc0, pos, window=0, softcap=0.0, n_splits=None, direct=False,
                  xq=0, xq_stride=0):
    """Write k_new/v_new at pos through kv_write_f16, then attn_split + attn_combine (xq: q8_1 output too)."""
    T, H, hd = q.shape
    n_kv, n_ctx, _ = kc0.shape
    kc, vc = gpu.put(kc0), gpu.put(vc0)
    ppos = gpu.put(pos.astype(np.int32))
    gpu.rt.launch("kv_write_f16", (T, n_kv), min(128, hd),
                  (gpu.put(k_new), gpu.put(v_new), kc, vc, ppos, n_kv * hd, n_kv * hd, hd, n_ctx))
    need = -(-int(pos.max() + 1) // SPLIT_LEN)
    S = n_splits or need
    opart, ml = gpu.empty(T * S * H * hd), gpu.empty(T * S * H * 2)
    out = gpu.empty(T * H * hd)
    n_hgroups = -(-(H // n_kv) // 8)
    gpu.rt.launch(f"attn_split_hd{hd}", (n_kv * n_hgroups, S, T), 128,
                  (gpu.put(q), H * hd, kc, vc, opart, ml, ppos, H, n_kv, n_ctx, window, f32(1 / np.sqrt(hd)),
                   f32(softcap), SPLIT_LEN, out if direct else 0, xq, xq_stride))
    if not direct:
        gpu.rt.launch("attn_combine", (H, T), hd, (opart, ml, out, H, hd, S, xq, xq_stride))
    return gpu.get(out, (T, H * hd)), gpu.get(kc, kc0.shape, np.float16), gpu.get(vc, vc0.shape, np.float16)


def random_case(rng, T, H, n_kv, hd, n_ctx):
    q = rng.standard_normal((T, H, hd)).astype(f32)
    kc = (rng.standard_normal((n_kv, n_ctx, hd))).astype(np.float16)
    vc = (rng.standard_normal((n_kv, n_ctx, hd))).astype(np.float16)
    k_new = (rng.standard_normal((T, n_kv * hd))).astype(f32)
    v_new = (rng.standard_normal((T, n_kv * hd))).astype(f32)
    return q, kc, vc, k_new, v_new


@pytest.mark.parametrize("hd,H,n_kv", [(64, 9, 3), (128, 32, 8), (256, 4, 1), (64, 9, 1), (128, 8, 8)])
@pytest.mark.parametrize("p", [0, 37, 1000])
def test_decode_row(gpu, hd, H, n_kv, p):
    rng = np.random.default_rng(hd * 1000 + H + p)
    n_ctx = 1100
    q, kc, vc, k_new, v_new = random_case(rng, 1, H, n_kv, hd, n_ctx)
    pos = np.array([p])
    out, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos)
    assert np.array_equal(kc_dev[:, p], k_new.reshape(n_kv, hd).astype(np.float16))
    ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(out, ref) < 1e-4


@pytest.mark.parametrize("hd", [64, 256])
def test_prefill_rows_are_causal_with_window_and_softcap(gpu, hd):
    rng = np.random.default_rng(hd)
    T, H, n_kv, n_ctx = 37, 4, 1, 700
    q, kc, vc, k_new, v_new = random_case(rng, T, H, n_kv, hd, n_ctx)
    pos = np.arange(600, 600 + T)
    for window, softcap in ((0, 0.0), (300, 0.0), (16, 50.0)):
        out, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, window, softcap)
        ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), window, softcap)
        assert rel_err(out, ref) < 1e-4, (window, softcap)


def test_result_is_independent_of_the_split_grid(gpu):
    rng = np.random.default_rng(7)
    q, kc, vc, k_new, v_new = random_case(rng, 3, 9, 3, 64, 2048)
    pos = np.array([100, 700, 1500])
    base, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=12)
    for S in (16, 24):
        other, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=S)
        assert np.array_equal(base, other), S
    # and a row alone equals the same row in a batch
    alone, _, _ = run_attention(gpu, q[1:2], k_new[1:2], v_new[1:2], kc_dev, vc_dev, pos[1:2], n_splits=16)
    assert np.array_equal(alone[0], base[1])


def test_one_split_writes_the_output_directly_bit_identical(gpu):
    rng = np.random.default_rng(8)
    q, kc, vc, k_new, v_new = random_case(rng, 4, 8, 2, 128, 200)
    pos = np.array([5, 60, 100, 127])
    combined, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=1)
    direct, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=1, direct=True)
    assert np.array_equal(combined, direct)


@pytest.mark.parametrize("hd,H,n_kv", [(64, 9, 3), (256, 4, 1)])
def test_q8_1_output_equals_quantize_q8_1_of_the_output(gpu, hd, H, n_kv):
    """Attention (one split, direct) and the combine (several splits) write the o matvec's q8_1
    input themselves: the same bytes as quantize_q8_1 of their f32 output."""
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride, quantize_q8_1

    rng = np.random.default_rng(hd + H)
    T, n = 3, H * hd
    q, kc, vc, k_new, v_new = random_case(rng, T, H, n_kv, hd, 600)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    for pos, direct in ((np.array([3, 50, 127]), True), (np.array([100, 300, 599]), False)):
        xq = gpu.empty(nbytes // 4 + 1)
        out, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, direct=direct, xq=xq, xq_stride=stride,
                                  n_splits=1 if direct else None)
        assert np.all(np.isfinite(out))
        ref_xq = gpu.empty(nbytes // 4 + 1)
        quantize_q8_1(gpu.rt, gpu.put(out), ref_xq, n, T)
        got, ref = gpu.get(xq, nbytes, np.uint8), gpu.get(ref_xq, nbytes, np.uint8)
        for t in range(T):  # the defined bytes of each row: qs[n] and ds[n/32]
            row = slice(t * stride, t * stride + n + n // 32 * 8)
            assert np.array_equal(got[row], ref[row]), (direct, t)
