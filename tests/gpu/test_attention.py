"""Split-K flash attention over the KV cache vs a float64 numpy reference.

The reference attends over the values the kernel reads (f16-rounded K/V, or q8_0 dequantized:
the cache format is part of the op), so the bound is float32 arithmetic: <= 1e-4 relative
(measured ~1e-6). Covers head dims 64/128/256, GQA groups of 1, 3, 4, 9 (> 8 heads per kv head:
several head groups) and 7, sliding window, softcap, decode and causal prefill rows, rows long
enough that a split walks several chunks, that a row's result does not depend on the grid's split
count (graph buckets) or its batch bit for bit. Every test runs on both paths: splits merged by
attn_merge, and (sm_90+) splits merged inside clusters (16 blocks for hd64 f16, else 8), with rows
of one split, of one partly filled cluster, of one full cluster whose splits walk several trips,
and of several clusters (attn_cl_merge).
"""
from __future__ import annotations

import numpy as np
import pytest
from gpu_util import rel_err

from memra_engine.gpu.ops import (ATTN_MAX_SPLITS, ATTN_MAX_SPLITS_CL, attention_launch, attn_plan,
                                  attn_row_splits, attn_slots, attn_splits, kv_bucket)

pytestmark = pytest.mark.gpu
f32 = np.float32


@pytest.fixture(params=["split", "cluster"])
def cluster(gpu, request) -> bool:
    if request.param == "cluster" and not gpu.rt.built_sm90:
        pytest.skip("thread-block clusters need kernels built for sm_90+")
    return request.param == "cluster"


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


def launch_attention(gpu, q, kc, vc, ppos, pos, T, H, n_kv, hd, n_ctx, window=0, softcap=0.0, n_splits=None,
                     xq=0, xq_stride=0, kd=0, vd=0, kv_type="f16", cluster=False, group_tile=None,
                     max_splits=ATTN_MAX_SPLITS_CL):
    """Attention and its merge launch; returns out [T, H*hd]."""
    S = n_splits or attn_splits(kv_bucket(int(pos.max()) + 1), hd, cluster, kv_type, max_splits)
    slots = attn_slots(S, cluster, hd, kv_type)
    opart, ml = gpu.empty(T * slots * H * hd), gpu.empty(T * slots * H * 2)
    out = gpu.empty(T * H * hd)
    attention_launch(gpu.rt, gpu.put(q), H * hd, kc, vc, kd, vd, opart, ml, ppos, T, H, n_kv, hd, n_ctx,
                     window, 1 / np.sqrt(hd), softcap, out, xq, xq_stride, S, kv_type, cluster,
                     group_tile=group_tile, max_splits=max_splits)
    return gpu.get(out, (T, H * hd))


def run_attention(gpu, q, k_new, v_new, kc0, vc0, pos, window=0, softcap=0.0, n_splits=None, xq=0, xq_stride=0,
                  cluster=False, max_splits=ATTN_MAX_SPLITS_CL):
    """Write k_new/v_new at pos through kv_write_f16, then attend (xq: q8_1 output too)."""
    T, H, hd = q.shape
    n_kv, n_ctx, _ = kc0.shape
    kc, vc = gpu.put(kc0), gpu.put(vc0)
    ppos = gpu.put(pos.astype(np.int32))
    gpu.rt.launch("kv_write_f16", (T, n_kv), min(128, hd),
                  (gpu.put(k_new), gpu.put(v_new), kc, vc, ppos, n_kv * hd, n_kv * hd, hd, n_ctx))
    out = launch_attention(gpu, q, kc, vc, ppos, pos, T, H, n_kv, hd, n_ctx, window, softcap, n_splits, xq, xq_stride,
                           cluster=cluster, max_splits=max_splits)
    return out, gpu.get(kc, kc0.shape, np.float16), gpu.get(vc, vc0.shape, np.float16)


def random_case(rng, T, H, n_kv, hd, n_ctx):
    q = rng.standard_normal((T, H, hd)).astype(f32)
    kc = (rng.standard_normal((n_kv, n_ctx, hd))).astype(np.float16)
    vc = (rng.standard_normal((n_kv, n_ctx, hd))).astype(np.float16)
    k_new = (rng.standard_normal((T, n_kv * hd))).astype(f32)
    v_new = (rng.standard_normal((T, n_kv * hd))).astype(f32)
    return q, kc, vc, k_new, v_new


@pytest.mark.parametrize("hd,H,n_kv", [(64, 9, 3), (128, 32, 8), (128, 32, 4), (256, 4, 1), (64, 9, 1), (128, 8, 8),
                                      (64, 14, 2)])
@pytest.mark.parametrize("p", [0, 37, 200, 1000, 3000, 4300])
def test_decode_row(gpu, cluster, hd, H, n_kv, p):
    """4300: a row past 4,096 keys (the tg128-at-4096 rows), several clusters on the cluster path."""
    rng = np.random.default_rng(hd * 1000 + H + p)
    n_ctx = 4400
    q, kc, vc, k_new, v_new = random_case(rng, 1, H, n_kv, hd, n_ctx)
    pos = np.array([p])
    out, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, cluster=cluster)
    assert np.array_equal(kc_dev[:, p], k_new.reshape(n_kv, hd).astype(np.float16))
    ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(out, ref) < 1e-4


@pytest.mark.parametrize("max_splits", [8, 24, 32, 40])
@pytest.mark.parametrize("hd,H,n_kv", [(128, 32, 8), (64, 9, 3), (256, 4, 1)])
def test_a_model_split_cap_keeps_rows_exact_and_grid_independent(gpu, cluster, hd, H, n_kv, max_splits):
    """attn_max_splits caps a long row's splits on the cluster path (the split path ignores it): rows
    past one cluster match the reference, give the same bits in a larger grid, and a row alone
    equals the same row in a batch (verify) under the same cap."""
    rng = np.random.default_rng(max_splits * 10 + hd)
    q, kc, vc, k_new, v_new = random_case(rng, 3, H, n_kv, hd, 8600)
    pos = np.array([1000, 4300, 8500])
    if cluster:
        assert attn_row_splits(8501, hd, True, "f16", max_splits) <= max(max_splits, attn_plan(hd).cluster)
    base, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, cluster=cluster, max_splits=max_splits)
    ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(base, ref) < 1e-4
    S = attn_splits(kv_bucket(8501), hd, cluster, "f16", max_splits)
    limit = ATTN_MAX_SPLITS_CL if cluster else ATTN_MAX_SPLITS
    wider = min(S + (attn_plan(hd).cluster if cluster else 1), limit)
    other, _, _ = run_attention(gpu, q, k_new, v_new, kc_dev, vc_dev, pos, n_splits=wider, cluster=cluster,
                                max_splits=max_splits)
    assert np.array_equal(base, other)
    alone, _, _ = run_attention(gpu, q[1:2], k_new[1:2], v_new[1:2], kc_dev, vc_dev, pos[1:2], cluster=cluster,
                                max_splits=max_splits)
    assert np.array_equal(alone[0], base[1])


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_prefill_rows_are_causal_with_window_and_softcap(gpu, cluster, hd):
    rng = np.random.default_rng(hd)
    T, H, n_kv, n_ctx = 37, 4, 1, 700
    q, kc, vc, k_new, v_new = random_case(rng, T, H, n_kv, hd, n_ctx)
    pos = np.arange(600, 600 + T)
    for window, softcap in ((0, 0.0), (300, 0.0), (16, 50.0)):
        out, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, window, softcap, cluster=cluster)
        ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), window, softcap)
        assert rel_err(out, ref) < 1e-4, (window, softcap)


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_result_is_independent_of_the_split_grid(gpu, cluster, hd):
    rng = np.random.default_rng(7 + hd)
    q, kc, vc, k_new, v_new = random_case(rng, 6, 9, 3, hd, 8600)
    # one split, several in one cluster (splits walking 1 to 6 chunks each), several clusters
    pos = np.array([20, 300, 1500, 2900, 6000, 8500])
    need = max(attn_row_splits(p + 1, hd, cluster) for p in pos)
    if cluster:
        cs = attn_plan(hd).cluster
        need = -(-need // cs) * cs
        others = (need + cs, ATTN_MAX_SPLITS_CL)
    else:
        others = (need + 3, ATTN_MAX_SPLITS)
    base, kc_dev, vc_dev = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=need, cluster=cluster)
    for S in others:
        if S <= (ATTN_MAX_SPLITS_CL if cluster else ATTN_MAX_SPLITS):
            other, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, n_splits=S, cluster=cluster)
            assert np.array_equal(base, other), S
    ref = attention_ref(q, kc_dev, vc_dev, pos, 1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(base, ref) < 1e-4
    # and a row alone (smaller grid) equals the same row in a batch (a small grid may take another
    # group tile: test_result_is_independent_of_the_group_tile)
    for t in (1, 2, 4):
        alone, _, _ = run_attention(gpu, q[t:t + 1], k_new[t:t + 1], v_new[t:t + 1], kc_dev, vc_dev, pos[t:t + 1],
                                    cluster=cluster)
        assert np.array_equal(alone[0], base[t])


def test_q8_0_cache_reads_dequantized_values(gpu, cluster):
    """The q8_0 cache: int8 values plus a half scale per 32 (engine/gpu/kv_cache.py's layout)."""
    rng = np.random.default_rng(11)
    T, H, n_kv, hd, n_ctx = 3, 8, 2, 128, 900
    q = rng.standard_normal((T, H, hd)).astype(f32)
    planes = []
    for _ in range(2):
        qs = rng.integers(-127, 128, (n_kv, n_ctx, hd), dtype=np.int8)
        d = (rng.uniform(0.001, 0.02, (n_kv, n_ctx, hd // 32))).astype(np.float16)
        planes.append((qs, d, qs.astype(np.float32) * np.repeat(d.astype(np.float32), 32, axis=2)))
    (kq, kd, kf), (vq, vd, vf) = planes
    pos = np.array([5, 300, 899])
    out = launch_attention(gpu, q, gpu.put(kq), gpu.put(vq), gpu.put(pos.astype(np.int32)), pos,
                           T, H, n_kv, hd, n_ctx, kd=gpu.put(kd), vd=gpu.put(vd), kv_type="q8_0", cluster=cluster)
    ref = attention_ref(q, kf, vf, pos, 1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(out, ref) < 1e-4


@pytest.mark.parametrize("hd,H,n_kv", [(64, 9, 3), (128, 32, 8), (256, 4, 1)])
def test_q8_1_output_equals_quantize_q8_1_of_the_output(gpu, cluster, hd, H, n_kv):
    """Attention writes the o matvec's q8_1 input itself, from one split (direct) and from the
    merge of several: the same bytes as quantize_q8_1 of its f32 output."""
    from memra_engine.gpu.quant_ops import q8_1_nbytes, q8_1_stride, quantize_q8_1

    rng = np.random.default_rng(hd + H)
    T, n = 3, H * hd
    q, kc, vc, k_new, v_new = random_case(rng, T, H, n_kv, hd, 3000)
    stride, nbytes = q8_1_stride(n), q8_1_nbytes(n, T)
    for pos in (np.array([3, 20, 31]), np.array([100, 300, 599]), np.array([700, 1900, 2999])):
        xq = gpu.empty(nbytes // 4 + 1)
        out, _, _ = run_attention(gpu, q, k_new, v_new, kc, vc, pos, xq=xq, xq_stride=stride, cluster=cluster)
        assert np.all(np.isfinite(out))
        ref_xq = gpu.empty(nbytes // 4 + 1)
        quantize_q8_1(gpu.rt, gpu.put(out), ref_xq, n, T)
        got, ref = gpu.get(xq, nbytes, np.uint8), gpu.get(ref_xq, nbytes, np.uint8)
        for t in range(T):  # the whole row: qs[n], the residual's qs2[n], ds[n/32] (every byte written)
            row = slice(t * stride, (t + 1) * stride)
            assert np.array_equal(got[row], ref[row]), (pos, t)


# ---- prefill chunks on tensor cores (cuda/attn_prefill.cu) -------------------------------------

@pytest.mark.parametrize("hd,H,n_kv", [(64, 9, 3), (128, 8, 2), (128, 6, 6), (64, 4, 1)])
@pytest.mark.parametrize("T,p0,window,softcap", [(17, 0, 0, 0.0), (100, 37, 0, 0.0), (150, 300, 0, 30.0),
                                                 (130, 0, 50, 0.0), (64, 500, 200, 0.0)])
def test_prefill_attention_matches_numpy(gpu, hd, H, n_kv, T, p0, window, softcap):
    """attn_prefill: a chunk of T tokens at positions p0 .. p0 + T - 1 over a cache holding p0
    earlier rows; the cache past the chunk's last position is NaN (never read: rows past the
    block's keys are zero-filled). float64 reference over the f16 cache; q and p go through the
    MMAs as f16 hi + lo pairs, so the bound is float32's (<= 1e-4 relative, as the split kernel)."""
    from memra_engine.gpu.ops import prefill_attention_launch

    rng = np.random.default_rng(hd + H * 7 + T + p0 + window)
    n_ctx = p0 + T + 40
    q = rng.standard_normal((T, H, hd)).astype(f32)
    kc = rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16)
    vc = rng.standard_normal((n_kv, n_ctx, hd)).astype(np.float16)
    kc[:, p0 + T:] = np.nan
    vc[:, p0 + T:] = np.nan
    pos = np.arange(p0, p0 + T)
    out, out_h = gpu.empty(T * H * hd), gpu.empty(T * H * hd // 2)
    prefill_attention_launch(gpu.rt, gpu.put(q), H * hd, gpu.put(kc), gpu.put(vc), gpu.put(pos.astype(np.int32)), T,
                             H, n_kv, hd, n_ctx, window, 1 / np.sqrt(hd), softcap, out, out_h)
    got = gpu.get(out, (T, H * hd))
    gpu.rt.check()
    ref = attention_ref(q, kc, vc, pos, 1 / np.sqrt(hd), window, softcap)
    assert rel_err(got, ref) < 1e-4
    # the f16 copy the o GEMM reads: f16(out) exactly
    assert np.array_equal(gpu.get(out_h, (T, H * hd), np.float16).view(np.uint16), got.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_result_is_independent_of_the_group_tile(gpu, cluster, hd):
    """A GQA group of 8 gives the same bits in blocks of 1, 2, 4 or 8 heads: ops.attn_group_tile
    picks 4 for small grids and 8 for large ones, so a decode row (small grid) and the same row in
    a verify pass (a larger one) may take different instances (docs/design.md §5 rule 3)."""
    rng = np.random.default_rng(11 + hd)
    T, H, n_kv, n_ctx = 3, 16, 2, 2200
    q, kc, vc, k_new, v_new = random_case(rng, T, H, n_kv, hd, n_ctx)
    pos = np.array([100, 1000, 2100])
    kc_dev, vc_dev = gpu.put(kc), gpu.put(vc)
    ppos = gpu.put(pos.astype(np.int32))
    gpu.rt.launch("kv_write_f16", (T, n_kv), min(128, hd),
                  (gpu.put(k_new), gpu.put(v_new), kc_dev, vc_dev, ppos, n_kv * hd, n_kv * hd, hd, n_ctx))
    outs = {g: launch_attention(gpu, q, kc_dev, vc_dev, ppos, pos, T, H, n_kv, hd, n_ctx, cluster=cluster, group_tile=g)
            for g in (1, 2, 4, 8)}
    for g in (1, 2, 4):
        assert np.array_equal(outs[g], outs[8]), g
    ref = attention_ref(q, gpu.get(kc_dev, kc.shape, np.float16), gpu.get(vc_dev, vc.shape, np.float16), pos,
                        1 / np.sqrt(hd), 0, 0.0)
    assert rel_err(outs[8], ref) < 1e-4
