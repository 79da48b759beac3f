"""The GLU matvecs (quant_ops.matvec_glu): the down projection applying silu / gelu-tanh to the
gate_up row itself, against the two launches it replaces and against numpy.

A one-token decode sends the gate_up matvec's output row [gate | up] straight to the down matvec,
whose blocks quantize act(gate, up) into shared memory. Bound: bit-identical to silu_mul_f32 /
gelu_tanh_mul_f32 (with its q8_1 output) followed by the plain matvec, since verify batches keep
those two launches and must give the same rows as decode; and within 2e-3 of the float64
W @ act(gate, up) (two-term q8_1 rounding, ~2e-5 of a block's amax per value).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import quant_ops
from memra_engine.gpu.quant_ref import dequantize_weight, random_weight_bytes
from memra_engine.model.gguf_file import TensorInfo

pytestmark = pytest.mark.gpu
NAN_BITS = 0x7FC00000


def silu_mul(g, u):
    return g / (1.0 + np.exp(-g)) * u


def gelu_tanh_mul(g, u):
    return 0.5 * g * (1.0 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) * u


ACTS = {"silu": ("silu_mul_f32", silu_mul), "gelu": ("gelu_tanh_mul_f32", gelu_tanh_mul)}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("ggml_type,rows,cols", [(QT.Q4_1, 576, 1536), (QT.Q5_0, 640, 2048), (QT.Q8_0, 97, 1536),
                                                 (QT.Q4_K, 640, 2048), (QT.Q6_K, 576, 1536), (QT.IQ4_XS, 33, 512),
                                                 (QT.Q4_0, 40000, 256)])
def test_glu_matvec_equals_activation_then_matvec(gpu, act, ggml_type, rows, cols):
    rt, pool = gpu.rt, gpu.pool
    rng = np.random.default_rng(rows + cols)
    data = random_weight_bytes(ggml_type, rows, cols, rng)
    w = quant_ops.upload_weight(rt, pool, TensorInfo("w", (rows, cols), ggml_type, data))
    gate_up = (rng.standard_normal(2 * cols) * 2).astype(np.float32)
    gu = pool.alloc("scratch", gate_up.nbytes, "gu")
    rt.upload(gu.ptr, gate_up)
    h = pool.alloc("scratch", cols * 4, "h")
    xq = pool.alloc("scratch", quant_ops.q8_1_nbytes(cols), "xq")
    y_ref, y = (pool.alloc("scratch", rows * 4, n) for n in ("y_ref", "y"))
    rt.memset_u32(y_ref.ptr, NAN_BITS, rows)
    rt.memset_u32(y.ptr, NAN_BITS, rows)

    kernel, f = ACTS[act]
    rt.launch(kernel, (-(-cols // 256), 1), 256,
              (gu.ptr, gu.ptr + 4 * cols, h.ptr, cols, 2 * cols, xq.ptr, quant_ops.q8_1_stride(cols)))
    quant_ops.matvec(rt, w, h.ptr, xq.ptr, y_ref.ptr, 1)
    quant_ops.matvec_glu(rt, w, gu.ptr, y.ptr, act)
    got, ref = rt.download(y.ptr, rows, np.float32), rt.download(y_ref.ptr, rows, np.float32)
    rt.check()
    assert np.all(np.isfinite(got))
    assert np.array_equal(got, ref)

    x = f(gate_up[:cols].astype(np.float64), gate_up[cols:].astype(np.float64))
    exact = dequantize_weight(ggml_type, data, rows, cols).astype(np.float64) @ x
    assert np.linalg.norm(got - exact) <= 2e-3 * np.linalg.norm(exact)
