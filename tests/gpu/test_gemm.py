"""Prefill GEMM on tensor cores against numpy (cuda/gemm.cu, quant_ops.gemm).

Every tile shape (the pipelined gemm3_, gemm4_ that read x's f16 copy; gemm_, gemm2_ for f32 weights), every weight type, odd row counts, token counts that are not multiples of the 64-token tile,
K not a multiple of the 128-wide K step (32-wide types) and any K (float types); outputs
poisoned with NaN first. Bound: ||gpu-ref||/||ref|| <= 1e-3 against x @ W.T in float64 with W as
gguf dequantizes it (both operands are rounded to f16, ~4e-4 expected, f32 accumulation).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType

from memra_engine.gpu import quant_ops
from memra_engine.gpu.quant_ref import dequantize_weight, random_weight_bytes, supported_types
from memra_engine.model.gguf_file import TensorInfo

pytestmark = pytest.mark.gpu
NAN_BITS = 0x7FC00000


def cols_for(ggml_type, kind: str) -> int:
    if ggml_type in quant_ops.FLOAT_TYPES:
        return {"even": 512, "odd": 77}[kind]
    qk = quant_ops.weight_layout(ggml_type, 1, 256).block_values
    return {"even": 1024, "odd": 576 if qk == 32 else 768}[kind]  # 576 = 4.5 K steps, 768 = 6


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
@pytest.mark.parametrize("rows,kind,tokens", [(301, "odd", 100), (128, "even", 17), (67, "even", 512)])
def test_gemm_matches_numpy(gpu, ggml_type, rows, kind, tokens):
    rt, pool = gpu.rt, gpu.pool
    cols = cols_for(ggml_type, kind)
    rng = np.random.default_rng(rows * 7 + tokens + int(ggml_type))
    data = random_weight_bytes(ggml_type, rows, cols, rng)
    w = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), ggml_type, data))
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    xb = pool.alloc("scratch", x.nbytes, "x")
    rt.upload(xb.ptr, x)
    xh = pool.alloc("scratch", quant_ops.f16_nbytes(cols, tokens), "xh")
    quant_ops.to_f16(rt, xb.ptr, xh.ptr, cols, tokens)
    y = pool.alloc("scratch", tokens * rows * 4, "y")
    ref = x.astype(np.float64) @ dequantize_weight(ggml_type, data, rows, cols).T.astype(np.float64)
    for variant in quant_ops.gemm_tiles(w, rt.max_shared):
        rt.memset_u32(y.ptr, NAN_BITS, tokens * rows)
        quant_ops.gemm(rt, w, xb.ptr, y.ptr, tokens, xh.ptr, variant=variant)
        got = rt.download(y.ptr, (tokens, rows), np.float32)
        rt.check()
        assert np.isfinite(got).all(), f"{variant}: unwritten (NaN-poisoned) outputs"
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err <= 1e-3, f"{variant}: rel err {err:.2e}"


@pytest.mark.parametrize("cols", [77, 1024])
def test_f16_copy_of_x_rounds_like_numpy_and_zeroes_the_pad(gpu, cols):
    """The pipelined tiles' input: f16(x) exactly as numpy rounds it, rows of f16_ld(cols), 0 past cols."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((33, cols)) * 3).astype(np.float32)
    xb = pool.alloc("scratch", x.nbytes, "x")
    rt.upload(xb.ptr, x)
    ld = quant_ops.f16_ld(cols)
    xh = pool.alloc("scratch", quant_ops.f16_nbytes(cols, 33), "xh")
    rt.memset_u32(xh.ptr, NAN_BITS, quant_ops.f16_nbytes(cols, 33) // 4)
    quant_ops.to_f16(rt, xb.ptr, xh.ptr, cols, 33)
    got = rt.download(xh.ptr, (33, ld), np.float16)
    rt.check()
    assert np.array_equal(got[:, :cols].view(np.uint16), x.astype(np.float16).view(np.uint16))
    assert not got[:, cols:].any()


@pytest.mark.parametrize("rows,cols,tokens", [(64, 2048, 512), (67, 77, 33), (160, 512, 17), (33, 4100, 45),
                                              (128, 2048, 100)])
def test_f32_gemm_is_float32_exact_enough_for_the_router(gpu, rows, cols, tokens):
    """sgemm_f32 (prefill's f32 weights: the MoE router) against float64: float32 FMAs only, so
    within 1e-5 relative (f16 operands would be ~4e-4); the same bits on a second run."""
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows + cols + tokens)
    wf = rng.standard_normal((rows, cols)).astype(np.float32)
    w = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), GGMLQuantizationType.F32, wf.reshape(-1)))
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    xb = pool.alloc("scratch", x.nbytes, "x")
    rt.upload(xb.ptr, x)
    y = pool.alloc("scratch", tokens * rows * 4, "y")
    rt.memset_u32(y.ptr, NAN_BITS, tokens * rows)
    quant_ops.sgemm_f32(rt, w, xb.ptr, y.ptr, tokens)
    got = rt.download(y.ptr, (tokens, rows), np.float32)
    ref = x.astype(np.float64) @ wf.T.astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 1e-5
    quant_ops.sgemm_f32(rt, w, xb.ptr, y.ptr, tokens)
    assert np.array_equal(rt.download(y.ptr, (tokens, rows), np.float32), got)
    # a token's logits do not depend on the 16-token tile it lands in (prefill chunks start anywhere)
    shift = 16 if tokens > 16 else 1
    rt.upload(xb.ptr, np.ascontiguousarray(x[shift:]))
    quant_ops.sgemm_f32(rt, w, xb.ptr, y.ptr, tokens - shift)
    assert np.array_equal(rt.download(y.ptr, (tokens - shift, rows), np.float32), got[shift:])
    rt.check()
