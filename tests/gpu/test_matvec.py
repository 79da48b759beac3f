"""Decode matvec and quantize_q8_1 on the GPU against numpy (cuda/matvec.cu, engine/gpu/quant_ops.py).

Random weights (random bytes for the quants, so every code appears; random d/m), random
activations, odd row counts, outputs poisoned with NaN before each launch. Bounds:
- quantize_q8_1: every byte of the rows identical to quant_ref.quantize_q8_1_ref (same divisions,
  roundf, fmaf residual, warp tree), both int8 terms and (d1, sum, d2, 0);
- int8 matvec vs the float64 emulation of the two-term q8_1 path: ||gpu-emul|| <= 1e-5 * S
  (float32 summation order only); vs the f32 dequantized reference: <= 2e-4 * S (the two-term
  rounding of x, ~2e-5 of the block's amax per value),
  where S = ||sqrt(x^2 @ W^2.T)||, the size of y without cancellation (a single row of 256 random
  products can cancel to near zero, making ||ref|| a poor yardstick);
- float matvec (F16/BF16/F32) vs the f32 reference: <= 1e-3 (measured ~1e-7);
- batched columns (verify) are bit-identical to one-column launches, and so are every one-column
  variant (rows per warp, units per step) and the fused quantize+matvec kernels.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import quant_ops
from memra_engine.gpu.quant_ref import (dequantize_weight, matvec_q8_1_ref, matvec_q8_k256_ref, q8_1_bytes, q8_k256_bytes,
                                        quantize_q8_1_ref, quantize_q8_k256_ref, random_weight_bytes,
                                        supported_types)
from memra_engine.model.gguf_file import TensorInfo
from gpu_util import rope_ref

pytestmark = pytest.mark.gpu
NAN_BITS = 0x7FC00000
QUANT_TYPES = list(quant_ops.QUANT_PLANES)
FLOAT_TYPES = list(quant_ops.FLOAT_TYPES)


def upload(rt, pool, ggml_type, rows, cols, rng):
    data = random_weight_bytes(ggml_type, rows, cols, rng)
    w = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), ggml_type, data))
    return w, data


def put(rt, pool, host: np.ndarray):
    buf = pool.alloc("scratch", max(host.nbytes, 16), "t")
    rt.upload(buf.ptr, host)
    return buf


def run_matvec(rt, pool, w, x: np.ndarray, variant=None, fused=False, slice_columns=None) -> np.ndarray:
    t, cols = x.shape
    xb = put(rt, pool, x)
    xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols, t), "xq")
    y = pool.alloc("scratch", t * w.rows * 4, "y")
    rt.memset_u32(y.ptr, NAN_BITS, t * w.rows)
    if not w.layout.is_float and not fused:
        quant_ops.quantize_q8_1(rt, xb.ptr, xq.ptr, cols, t)
    quant_ops.matvec(rt, w, xb.ptr, None if fused else xq.ptr, y.ptr, t, variant=variant, slice_columns=slice_columns)
    out = rt.download(y.ptr, (t, w.rows), np.float32)
    rt.check()
    return out


def rel(a, b, w=None, x=None) -> float:
    """||a-b|| over ||b||, or, given w and x, over the size the products can reach without
    cancellation, ||sqrt(x^2 @ w^2.T)|| (a single random dot product can sum to near zero)."""
    scale = np.linalg.norm(b) if w is None else np.linalg.norm(np.sqrt((x.astype(np.float64) ** 2) @ (w.astype(np.float64) ** 2).T))
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / scale)


@pytest.mark.parametrize("cols,tokens", [(576, 1), (2048, 3), (1000, 2)])
def test_quantize_q8_1_bytes_exact(gpu, cols, tokens):
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((tokens, cols)) * rng.uniform(0.1, 10, (tokens, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d1 = d2 = 0, q = 0
    x[-1, 32:64] = np.arange(-127, 129, 8).astype(np.float32) / 8  # multiples of d1 = 1/8: residual 0, d2 = 0
    xb = put(rt, pool, x)
    stride = quant_ops.q8_1_stride(cols)
    xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols, tokens), "xq")
    rt.memset_u32(xq.ptr, 0xDEADBEEF, quant_ops.q8_1_nbytes(cols, tokens) // 4)
    quant_ops.quantize_q8_1(rt, xb.ptr, xq.ptr, cols, tokens)
    got = rt.download(xq.ptr, (tokens, stride), np.uint8)
    qs, qs2, ds = quantize_q8_1_ref(x)
    assert 2 * qs.shape[1] + ds[0].nbytes == stride  # every byte of a row is written (poisoned before)
    assert np.array_equal(got, q8_1_bytes(qs, qs2, ds, stride))


@pytest.mark.parametrize("cols,tokens", [(256, 1), (600, 3), (4096, 2), (14336, 1)])
def test_quantize_q8_k256_bytes_exact(gpu, cols, tokens):
    """cuda/k256.cu's quantize_q8_k256: every byte of the rows equal to quantize_q8_k256_ref's image
    (quant_ref.q8_k256_bytes: both terms in order, bs, d2), the padding past K included."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(cols + 1)
    x = (rng.standard_normal((tokens, cols)) * rng.uniform(0.1, 10, (tokens, 1))).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero super-block: d2 = 0, q = 0, bs = 0
    if cols > 512:
        x[-1, 256:512] *= 1e3  # one super-block far larger than its neighbours
    xb = put(rt, pool, x)
    stride = quant_ops.q8_k256_stride(cols)
    xq = pool.alloc("scratch", tokens * stride, "xq")
    rt.memset_u32(xq.ptr, 0xDEADBEEF, tokens * stride // 4)
    quant_ops.quantize_q8_k256(rt, xb.ptr, xq.ptr, cols, tokens)
    got = rt.download(xq.ptr, (tokens, stride), np.uint8)
    rt.check()
    want = q8_k256_bytes(*quantize_q8_k256_ref(x), stride)
    used = quant_ops.Q8_K256_BYTES * (-(-cols // 256))  # the row's alignment pad is never written
    assert np.array_equal(got[:, :used], want[:, :used])


def run_k256(rt, pool, w, xk, tokens: int) -> np.ndarray:
    """matvec_k256 of `tokens` q8_k256 rows at xk into a 16-column y poisoned with NaN: y [16, rows]."""
    y = pool.alloc("scratch", 16 * w.rows * 4, "y")
    rt.memset_u32(y.ptr, NAN_BITS, 16 * w.rows)
    quant_ops.matvec_k256(rt, w, xk, y.ptr, tokens)
    out = rt.download(y.ptr, (16, w.rows), np.float32)
    rt.check()
    return out


# rows chosen for each width (k256_width: 6,144 rows -> 4 warps, 3,080 -> 8, fewer -> 16), row counts
# off the 16-row tile, super-block counts off the warp count (9 for 16 warps: 7 warps idle)
@pytest.mark.parametrize("rows,cols,width", [(6144, 512, 4), (3080, 768, 8), (40, 2304, 16), (1, 256, 16)])
def test_k256_matvec_decode_and_verify(gpu, rows, cols, width):
    """k256.cu's Q4_K matvecs: against the float64 value of the q8_k256 activation times the weight,
    ||gpu - ref|| <= 1e-5 * S (S as rel()'s: float32 steps only, the integers are exact); every column of
    a 3-, 8-, 9- and 16-column verify launch bit-identical to the one-column decode launch of that column
    alone, and nothing written past the launch's columns."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows + cols)
    w, data = upload(rt, pool, QT.Q4_K, rows, cols, rng)
    assert quant_ops.k256_width(w) == width
    x = (rng.standard_normal((16, cols)) * rng.uniform(0.2, 5, (16, 1))).astype(np.float32)
    stride = quant_ops.q8_k256_stride(cols)
    xk = pool.alloc("scratch", 16 * stride, "xk")
    quant_ops.quantize_q8_k256(rt, put(rt, pool, x).ptr, xk.ptr, cols, 16)
    decode = np.stack([run_k256(rt, pool, w, xk.ptr + t * stride, 1)[0] for t in range(16)])
    wf = dequantize_weight(QT.Q4_K, data, rows, cols)
    assert rel(decode, matvec_q8_k256_ref(QT.Q4_K, data, rows, cols, x), wf, x) <= 1e-5
    for tokens in (3, 8, 9, 16):
        y = run_k256(rt, pool, w, xk.ptr, tokens)
        assert np.array_equal(y[:tokens].view(np.uint32), decode[:tokens].view(np.uint32)), tokens
        assert np.all(y[tokens:].view(np.uint32) == NAN_BITS), tokens


@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols,tokens", [(301, 768, 1), (77, 1536, 5), (1, 256, 1), (2053, 512, 1)])
def test_quant_matvec(gpu, ggml_type, rows, cols, tokens):
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows * cols + int(ggml_type))
    w, data = upload(rt, pool, ggml_type, rows, cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    y = run_matvec(rt, pool, w, x)
    assert np.isfinite(y).all(), "unwritten (NaN-poisoned) outputs"
    emul = matvec_q8_1_ref(ggml_type, data, rows, cols, x)
    wf = dequantize_weight(ggml_type, data, rows, cols)
    ref = x.astype(np.float64) @ wf.T.astype(np.float64)
    assert rel(y, emul, wf, x) <= 1e-5
    assert rel(y, ref, wf, x) <= 2e-4


@pytest.mark.parametrize("ggml_type", [QT.Q4_1, QT.Q8_0], ids=lambda t: t.name)
def test_smollm2_shape_576(gpu, ggml_type):
    """K = 576 is 18 blocks of 32: fewer units than lanes."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(576)
    w, data = upload(rt, pool, ggml_type, 1536, 576, rng)
    x = rng.standard_normal((1, 576)).astype(np.float32)
    y = run_matvec(rt, pool, w, x)
    assert rel(y, matvec_q8_1_ref(ggml_type, data, 1536, 576, x)) <= 1e-5
    assert np.array_equal(run_matvec(rt, pool, w, x, fused=True), y)


@pytest.mark.parametrize("ggml_type", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols,tokens", [(301, 77, 1), (129, 576, 3), (33, 1000, 17), (64, 2048, 2)])
def test_float_matvec(gpu, ggml_type, rows, cols, tokens):
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows + cols + int(ggml_type))
    w, data = upload(rt, pool, ggml_type, rows, cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    y = run_matvec(rt, pool, w, x)
    assert np.isfinite(y).all()
    ref = x.astype(np.float64) @ dequantize_weight(ggml_type, data, rows, cols).T.astype(np.float64)
    assert rel(y, ref) <= 1e-3


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
def test_batched_columns_bit_identical_to_single(gpu, ggml_type):
    """Verify (2..16 columns, and >16 in chunks) must reproduce decode exactly, row by row."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(99 + int(ggml_type))
    rows, cols = 333, 512
    w, _ = upload(rt, pool, ggml_type, rows, cols, rng)
    x = rng.standard_normal((19, cols)).astype(np.float32)
    singles = np.stack([run_matvec(rt, pool, w, x[i:i + 1])[0] for i in range(x.shape[0])])
    for n in (2, 3, 4, 7, 8, 9, 10, 16, 19):  # 9: draft_max 8's full verify round
        assert np.array_equal(run_matvec(rt, pool, w, x[:n]), singles[:n]), f"{n} columns differ"
    for s in (1, 2, 4, 8):  # columns sliced over the grid's second dimension: same columns, same bits
        for n in (3, 9, 16):
            got = run_matvec(rt, pool, w, x[:n], slice_columns=s, variant=None if w.layout.is_float else (2, 1))
            assert np.array_equal(got, singles[:n]), f"{n} columns in slices of {s} differ"
    if not w.layout.is_float:
        for v in quant_ops.BATCHED_VARIANTS:  # rows per warp: each row's sums are the same
            for n in (2, 3, 8, 16):
                assert np.array_equal(run_matvec(rt, pool, w, x[:n], variant=v), singles[:n]), f"{v}, {n} columns"
        if w.layout.kernel_type in quant_ops.MMA_BATCHED_TYPES:  # and the tensor-core path
            for n in (2, 3, 8, 9, 16):
                assert np.array_equal(run_matvec(rt, pool, w, x[:n], variant="mma"), singles[:n]), f"mma, {n} columns"
            for n in (9, 16):  # 8-column slices on the tensor cores, the second partly empty at 9
                got = run_matvec(rt, pool, w, x[:n], variant="mma", slice_columns=8)
                assert np.array_equal(got, singles[:n]), f"mma in 8-column slices, {n} columns"
        for v in quant_ops.ONE_COLUMN_VARIANTS:
            assert np.array_equal(run_matvec(rt, pool, w, x[:1], variant=v), singles[:1]), f"variant {v} differs"
        for v in quant_ops.FUSED_VARIANTS:  # quantize inside the matvec: same bytes, same sums
            assert np.array_equal(run_matvec(rt, pool, w, x[:2], variant=v, fused=True), singles[:2]), f"fused {v} differs"



@pytest.mark.parametrize("ggml_type", [QT[t.upper()] for t in quant_ops.MMA_BATCHED_TYPES], ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols", [(1000, 4096), (77, 2560), (4099, 2048), (16, 14336)])
def test_tensor_core_verify_matvec_is_decode_bit_for_bit(gpu, ggml_type, rows, cols):
    """matvec_<type>_mma (int8 MMAs for the integer sums, decode's float steps in decode's order)
    against one-column launches, bit for bit, at shapes where each of the 8 warps has several
    super-blocks (2-7 steps), super-blocks not a multiple of 8 (2560: 10), rows not a multiple of
    16, and 1..16 columns; the default choice for 2-16 columns is this path. Plus the float64
    emulation bound of test_quant_matvec (1e-5 of S)."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows + cols)
    w, data = upload(rt, pool, ggml_type, rows, cols, rng)
    x = (rng.standard_normal((16, cols)) * rng.uniform(0.1, 10, (16, 1))).astype(np.float32)
    singles = np.stack([run_matvec(rt, pool, w, x[i:i + 1])[0] for i in range(16)])
    for n in (2, 5, 8, 9, 16):
        got = run_matvec(rt, pool, w, x[:n], variant="mma")
        assert np.array_equal(got, singles[:n]), f"{n} columns: {np.sum(got != singles[:n])} values differ"
    assert quant_ops.uses_mma(w)
    assert np.array_equal(run_matvec(rt, pool, w, x[:6]), singles[:6])
    wf = dequantize_weight(ggml_type, data, rows, cols)
    assert rel(singles, matvec_q8_1_ref(ggml_type, data, rows, cols, x), wf, x) <= 1e-5

@pytest.mark.parametrize("ggml_type", [QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("neox,bias,hd,n_q,n_kv", [(True, False, 64, 9, 3), (False, True, 128, 4, 2),
                                                   (True, True, 64, 14, 2)])
def test_qkv_rope_matvec_is_matvec_bias_and_rope_qk_kv(gpu, ggml_type, neox, bias, hd, n_q, n_kv):
    """matvec_qkv_rope (one-token decode) writes the same bits as the three launches verify and
    prefill use (matvec, add_bias_f32, rope_qk_kv_f16): q, and the whole K/V caches (the one row
    at pos changed, every other row untouched). And against float64 numpy: matvec of the
    dequantized weight, bias, rope: <= 5e-4 of the product scale S (test_quant_matvec's 2e-4 for the
    two-term activation, plus f32 rope), f16 cache rows <= 2e-3 relative."""
    rt, pool = gpu.rt, gpu.pool
    f32 = np.float32
    rng = np.random.default_rng(int(ggml_type) * 7 + hd + n_q + bias)
    cols, n_ctx, pos = 768, 96, 77
    q_rows, kv_rows = n_q * hd, n_kv * hd
    rows = q_rows + 2 * kv_rows
    w, data = upload(rt, pool, ggml_type, rows, cols, rng)
    x = rng.standard_normal((1, cols)).astype(f32)
    b = rng.standard_normal(rows).astype(f32)
    ff = (1 + rng.random(hd // 2)).astype(f32)
    cache0 = rng.standard_normal((2, n_kv, n_ctx, hd)).astype(np.float16)
    xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols), "xq").ptr
    quant_ops.quantize_q8_1(rt, gpu.put(x), xq, cols)
    ppos, pff, pb = gpu.put(np.array([pos], np.int32)), gpu.put(ff), gpu.put(b)

    q_out, kc, vc = gpu.empty(q_rows), gpu.put(cache0[0]), gpu.put(cache0[1])
    quant_ops.matvec_qkv_rope(rt, w, xq, pb if bias else 0, q_out, kc, vc, ppos, pff, q_rows, kv_rows, hd, n_ctx,
                              1e4, 1.0, neox)

    y, yb = gpu.empty(rows), gpu.empty(rows)
    quant_ops.matvec(rt, w, 0, xq, y)
    if bias:
        rt.launch("add_bias_f32", (-(-rows // 256), 1), 256, (yb, y, pb, rows))
    else:
        yb = y
    q_ref, kc2, vc2 = gpu.empty(q_rows), gpu.put(cache0[0]), gpu.put(cache0[1])
    rt.launch("rope_qk_kv_f16", (n_q + n_kv, 1), max(32, min(128, hd // 2)),
              (yb, q_ref, yb + q_rows * 4, yb + (q_rows + kv_rows) * 4, kc2, vc2, ppos, pff, n_q, n_kv, hd, rows, rows,
               rows, n_ctx, f32(1e4), f32(1.0), int(neox), 0, 0, f32(0), 1))
    got_q = gpu.get(q_out, (n_q, hd))
    got_k, got_v = (gpu.get(p, (n_kv, n_ctx, hd), np.float16) for p in (kc, vc))
    assert np.array_equal(got_q, gpu.get(q_ref, (n_q, hd)))
    assert np.array_equal(got_k, gpu.get(kc2, (n_kv, n_ctx, hd), np.float16))
    assert np.array_equal(got_v, gpu.get(vc2, (n_kv, n_ctx, hd), np.float16))
    others = np.arange(n_ctx) != pos
    assert np.array_equal(got_k[:, others], cache0[0][:, others]) and np.array_equal(got_v[:, others], cache0[1][:, others])

    wf = dequantize_weight(ggml_type, data, rows, cols)
    ref = x.astype(np.float64) @ wf.T.astype(np.float64) + (b if bias else 0)
    heads = ref[0].reshape(-1, hd)
    q_want = rope_ref(heads[None, :n_q], np.array([pos]), 1e4, neox, 1.0, ff)[0]
    k_want = rope_ref(heads[None, n_q:n_q + n_kv], np.array([pos]), 1e4, neox, 1.0, ff)[0]
    v_want = heads[n_q + n_kv:]
    s = np.linalg.norm(np.sqrt((x.astype(np.float64) ** 2) @ (wf[:q_rows].astype(np.float64) ** 2).T))
    assert np.linalg.norm(got_q - q_want) / s <= 5e-4
    for got, want in ((got_k[:, pos], k_want), (got_v[:, pos], v_want)):
        assert np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want) <= 2e-3


@pytest.mark.parametrize("ggml_type", [QT.Q4_1, QT.Q4_K], ids=lambda t: t.name)
def test_qkv_rope_matvec_of_verify_tokens_is_one_launch_a_token(gpu, ggml_type):
    """A verify pass's tokens in one matvec_qkv_rope launch (a token per grid row: its xq row, its
    position, its q row) write what one launch a token writes, bit for bit: q rows and both caches,
    including rows at positions no token wrote (left alone)."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(31 + int(ggml_type))
    hd, n_q, n_kv, cols, n_ctx, T = 64, 9, 3, 768, 64, 9  # cols: a multiple of Q4_K's 256
    q_rows, kv_rows = n_q * hd, n_kv * hd
    rows = q_rows + 2 * kv_rows
    w, _ = upload(rt, pool, ggml_type, rows, cols, rng)
    x = rng.standard_normal((T, cols)).astype(np.float32)
    b, ff = rng.standard_normal(rows).astype(np.float32), (1 + rng.random(hd // 2)).astype(np.float32)
    positions = np.arange(40, 40 + T, dtype=np.int32)
    cache0 = rng.standard_normal((2, n_kv, n_ctx, hd)).astype(np.float16)
    stride = quant_ops.q8_1_stride(cols)
    xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols, T), "xq").ptr
    quant_ops.quantize_q8_1(rt, gpu.put(x), xq, cols, T)
    ppos, pb, pff = gpu.put(positions), gpu.put(b), gpu.put(ff)

    q1, k1, v1 = gpu.empty(T * q_rows), gpu.put(cache0[0]), gpu.put(cache0[1])
    for t in range(T):
        quant_ops.matvec_qkv_rope(rt, w, xq + t * stride, pb, q1 + 4 * q_rows * t, k1, v1, ppos + 4 * t, pff,
                                  q_rows, kv_rows, hd, n_ctx, 1e4, 1.0, True)
    qT, kT, vT = gpu.empty(T * q_rows), gpu.put(cache0[0]), gpu.put(cache0[1])
    quant_ops.matvec_qkv_rope(rt, w, xq, pb, qT, kT, vT, ppos, pff, q_rows, kv_rows, hd, n_ctx, 1e4, 1.0, True,
                              n_tokens=T)
    got_q, want_q = gpu.get(qT, (T, q_rows)), gpu.get(q1, (T, q_rows))
    assert np.isfinite(want_q).all() and not np.array_equal(want_q[0], want_q[1])
    assert np.array_equal(got_q, want_q)
    for got, want, before in ((kT, k1, cache0[0]), (vT, v1, cache0[1])):
        g, wnt = gpu.get(got, (n_kv, n_ctx, hd), np.float16), gpu.get(want, (n_kv, n_ctx, hd), np.float16)
        assert np.array_equal(g, wnt)
        assert not np.array_equal(g[:, positions], before[:, positions])  # the tokens' rows were written
