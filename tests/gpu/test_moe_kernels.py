"""The MoE kernels against numpy and against the dense matvec (cuda/moe.cu, moe_matvec_* in
cuda/matvec.cu, engine/gpu/moe.py), on random inputs with NaN-poisoned outputs.

- moe_topk: the same expert ids as a stable numpy argsort of the logits (ties cannot occur in
  random floats; a test of its own has ties, -inf and NaN), weights within 1e-6 relative of the
  float64 softmax (expf vs exp), on both of its paths (up to 256 experts ranked at once, beyond
  that k arg-max rounds);
- moe_matvec (every variant: rows a warp, half-warp rows where they fit): every slot's rows bit-identical to a one-token dense
  matvec (r1u1) of its expert on its activation row: the same kernel body, so the cache and the
  resident path agree exactly;
- moe_sort: the slots grouped per expert exactly as a stable numpy argsort of the ids;
- moe_gemm4 and moe_gemm7 (prefill, the pipelined 64-slot tile and the warp-specialized 128-slot
  tile, reading x's f16 copy): every slot's rows bit-identical to the dense prefill GEMM of the same
  tile (gemm4, gemm7) of its expert on its activation rows, and within the dense GEMM's bound (1e-3
  relative L2) of float64 numpy;
- moe_combine: within 1e-6 relative of the float64 weighted sum (fma order).
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.gpu import moe, quant_ops
from memra_engine.gpu.quant_ref import dequantize_weight, random_weight_bytes
from memra_engine.model.gguf_file import TensorInfo

pytestmark = pytest.mark.gpu
NAN_BITS = 0x7FC00000
QUANT_TYPES = list(quant_ops.QUANT_PLANES)


@pytest.mark.parametrize("n_expert,k,renorm", [(8, 2, True), (64, 8, True), (64, 8, False), (160, 16, False),
                                               (256, 8, True), (300, 8, True), (4096, 16, False)])
def test_topk_picks_the_largest_logits(gpu, n_expert, k, renorm):
    rng = np.random.default_rng(n_expert + k)
    T = 7
    logits = rng.standard_normal((T, n_expert)).astype(np.float32) * 2
    lp = gpu.put(logits)
    ids, w = gpu.empty(T * k), gpu.empty(T * k)
    log = gpu.empty(T * k)
    moe.topk(gpu.rt, lp, ids, w, log, T, n_expert, k, renorm)
    got_ids = gpu.get(ids, (T, k), np.int32)
    got_w = gpu.get(w, (T, k))
    want = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(got_ids, want)
    np.testing.assert_array_equal(gpu.get(log, (T, k), np.int32), want)
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    pw = np.take_along_axis(p, want, -1)
    if renorm:
        pw /= pw.sum(-1, keepdims=True)
    np.testing.assert_allclose(got_w, pw, rtol=1e-6)


@pytest.mark.parametrize("n_expert", [64, 300])
def test_topk_ties_go_to_the_lower_id_and_nan_counts_as_minus_inf(gpu, n_expert):
    """Equal logits rank by id; a NaN logit is -inf (never before a finite one), and the k ids are
    distinct even when -inf and NaN logits must be picked."""
    rng = np.random.default_rng(n_expert)
    T, k = 3, 8
    logits = rng.integers(-3, 3, (T, n_expert)).astype(np.float32)  # many ties
    logits[1, :] = -np.inf
    logits[1, 5:9] = [2.0, np.nan, 2.0, 1.0]  # 3 finite, then ties at -inf/NaN fill the top 8
    logits[2, ::3] = np.nan
    lp, ids, w = gpu.put(logits), gpu.empty(T * k), gpu.empty(T * k)
    moe.topk(gpu.rt, lp, ids, w, 0, T, n_expert, k, True)
    want = np.argsort(-np.where(np.isnan(logits), -np.inf, logits), axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(gpu.get(ids, (T, k), np.int32), want)
    got_w = gpu.get(w, (T, k))
    assert np.isfinite(got_w).all() and np.allclose(got_w.sum(-1), 1.0, rtol=1e-6)


class ScratchWeights:
    """The pool with weights put in the scratch region, which is emptied after every test: the
    session's 256 MiB weights region would fill up over this file's many stacks."""

    def __init__(self, pool):
        self.pool = pool

    def alloc(self, region: str, nbytes: int, name: str = ""):
        return self.pool.alloc("scratch", nbytes, name)


def expert_stack(gpu, ggml_type, n_expert, rows, cols, rng) -> tuple[moe.ExpertStack, list]:
    data = np.stack([random_weight_bytes(ggml_type, rows, cols, rng) for _ in range(n_expert)])
    stack = moe.ExpertStack.plan([TensorInfo("e", (n_expert, rows, cols), ggml_type, data)], "e")
    stack.table = np.zeros(n_expert, np.uint64)
    pool = ScratchWeights(gpu.pool)
    base = pool.alloc("weights", n_expert * stack.expert_bytes, "experts").ptr
    dense = []
    for e in range(n_expert):
        stack.table[e] = base + e * stack.expert_bytes
        gpu.rt.upload(int(stack.table[e]), stack.expert_host_bytes(e))
        dense.append(quant_ops.upload_weight(gpu.rt, pool, TensorInfo(f"e{e}", (rows, cols), ggml_type, data[e])))
    stack.table_ptr = gpu.put(stack.table)
    return stack, dense


@pytest.mark.parametrize("cols", [512, 768, 1024, 2048])
@pytest.mark.parametrize("x_per_slot", [False, True])
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
def test_expert_matvec_slots_equal_dense_matvecs(gpu, ggml_type, x_per_slot, cols):
    """Every variant, the half-warp ones (r2h, r4h) where a row has at most 16 units: 512 and 768
    (the FFN-768 expert's down: 12 K-quant units) take them, 1024 only for the K-quants, 2048 none.
    96 + 8 rows: the last warp's second half-warp (r4h: rows 96-103 of a 32-row block) has none."""
    rng = np.random.default_rng(int(ggml_type) + cols)
    n_expert, rows, T, k = 6, 104, 3, 2
    stack, dense = expert_stack(gpu, ggml_type, n_expert, rows, cols, rng)
    S = T * k
    ids = rng.integers(0, n_expert, S).astype(np.int32)
    ids[:2] = [5, 5]  # one expert twice for one token
    n_x = S if x_per_slot else T
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    xp = gpu.put(x)
    xq = gpu.empty(quant_ops.q8_1_nbytes(cols, n_x) // 4, poison=False)
    quant_ops.quantize_q8_1(gpu.rt, xp, xq, cols, n_x)
    stride = quant_ops.q8_1_stride(cols)
    want = []
    for s in range(S):
        out = gpu.empty(rows)
        row = s if x_per_slot else s // k
        quant_ops.matvec(gpu.rt, dense[ids[s]], 0, xq + row * stride, out, 1, variant=(1, 1))
        want.append(gpu.get(out, (rows,)))
    idp = gpu.put(ids)
    half_fits = moe.fits_half_warps(stack)
    variants = [v for v in moe.MATVEC_VARIANTS if half_fits or not v.endswith("h")]
    assert any(v.endswith("h") for v in variants) == half_fits
    for variant in variants:
        y = gpu.empty(S * rows)
        moe.expert_matvec(gpu.rt, stack, idp, xq, y, S, k, x_per_slot, variant=variant)
        got = gpu.get(y, (S, rows))
        for s in range(S):
            np.testing.assert_array_equal(got[s], want[s], err_msg=f"{variant} slot {s} expert {ids[s]}")
    gpu.rt.check()


@pytest.mark.parametrize("n_slots,n_expert", [(6, 6), (150 * 4, 6), (512 * 8, 64), (8192, 128), (777, 513),
                                              (5000, 4096)])
def test_sort_groups_the_slots_per_expert_stably(gpu, n_slots, n_expert):
    rng = np.random.default_rng(n_slots)
    ids = rng.integers(0, n_expert, n_slots).astype(np.int32)
    ids[: n_slots // 3] = n_expert - 1  # one expert far more popular, as real routing is
    offsets, order = gpu.empty(n_expert + 1), gpu.empty(n_slots)
    moe.sort_slots(gpu.rt, gpu.put(ids), offsets, order, n_slots, n_expert)
    counts = np.bincount(ids, minlength=n_expert)
    np.testing.assert_array_equal(gpu.get(offsets, (n_expert + 1,), np.int32), np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(gpu.get(order, (n_slots,), np.int32), np.argsort(ids, kind="stable"))


@pytest.mark.parametrize("tile", list(moe.GEMM_TILES))
@pytest.mark.parametrize("x_per_slot", [False, True])
@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
def test_expert_gemm_slots_equal_dense_gemms(gpu, ggml_type, x_per_slot, tile):
    rng = np.random.default_rng(100 + int(ggml_type))
    n_expert, rows, cols, T, k = 5, 160, 512, 150, 3
    stack, dense = expert_stack(gpu, ggml_type, n_expert, rows, cols, rng)
    S = T * k
    # k distinct experts per token, as moe_topk gives (moe_gemm's grid relies on it: no expert has
    # more than T slots); expert 4 in every token: 150 slots, two or three slot tiles
    ids = np.stack([np.concatenate([[4], rng.permutation(4)[:k - 1]]) for _ in range(T)]).astype(np.int32).reshape(-1)
    n_x = S if x_per_slot else T
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    xp = gpu.put(x)
    offsets, order = gpu.empty(n_expert + 1), gpu.empty(S)
    moe.sort_slots(gpu.rt, gpu.put(ids), offsets, order, S, n_expert)
    xh = gpu.empty(quant_ops.f16_nbytes(cols, n_x) // 4)
    quant_ops.to_f16(gpu.rt, xp, xh, cols, n_x)
    rows_of = np.arange(S) if x_per_slot else np.arange(S) // k
    y = gpu.empty(S * rows)
    moe.expert_gemm(gpu.rt, stack, offsets, order, xh, y, T, k, x_per_slot, tile=tile)
    got = gpu.get(y, (S, rows))
    assert np.isfinite(got).all(), "unwritten (NaN-poisoned) slot rows"
    for e in range(n_expert):
        slots = np.flatnonzero(ids == e)
        xe = np.ascontiguousarray(x[rows_of[slots]])
        xe_p = gpu.put(xe)
        xe_h = gpu.empty(quant_ops.f16_nbytes(cols, len(slots)) // 4)
        quant_ops.to_f16(gpu.rt, xe_p, xe_h, cols, len(slots))
        out = gpu.empty(len(slots) * rows)
        quant_ops.gemm(gpu.rt, dense[e], xe_p, out, len(slots), xe_h, variant=tile)
        np.testing.assert_array_equal(got[slots], gpu.get(out, (len(slots), rows)), err_msg=f"expert {e}")
        ref = xe.astype(np.float64) @ dequantize_weight(ggml_type, stack.parts[0].data[e], rows, cols).T.astype(np.float64)
        err = np.linalg.norm(got[slots] - ref) / np.linalg.norm(ref)
        assert err <= 1e-3, f"expert {e}: rel err {err:.2e}"
    gpu.rt.check()


def test_combine_is_the_weighted_sum(gpu):
    rng = np.random.default_rng(3)
    T, k, d = 4, 8, 300
    y = rng.standard_normal((T * k, d)).astype(np.float32)
    w = rng.uniform(0, 1, T * k).astype(np.float32)
    out = gpu.empty(T * d)
    moe.combine(gpu.rt, gpu.put(y), gpu.put(w), out, T, d, k)
    want = (w.reshape(T, k, 1).astype(np.float64) * y.reshape(T, k, d)).sum(1)
    np.testing.assert_allclose(gpu.get(out, (T, d)), want, rtol=1e-6, atol=1e-6)
