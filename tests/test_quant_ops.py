"""quant_ops without a GPU: layouts, upload bytes, and every launch it makes (kernel names, grids
and argument lists checked against the signatures parsed from cuda/*.cu).

A recording runtime stands in for GpuRuntime, so a renamed kernel, a wrong argument count or a
grid that misses rows fails here in CI, before any device call.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.gpu import build, quant_ops
from memra_engine.gpu.quant_ref import random_weight_bytes, supported_types
from memra_engine.model.gguf_file import TensorInfo

SIGNATURES = build.kernel_signatures(["matvec", "gemm"])


@dataclass
class Buffer:
    ptr: int
    nbytes: int


@dataclass
class RecordingRuntime:
    uploads: dict = field(default_factory=dict)
    launches: list = field(default_factory=list)
    smem_opt_in: dict = field(default_factory=dict)

    def upload(self, ptr, host):
        self.uploads[ptr] = np.array(host, copy=True)

    def launch(self, name, grid, block, args, shared=0):
        self.launches.append((name, grid if isinstance(grid, tuple) else (grid,), block, tuple(args), shared))

    def set_max_dynamic_shared(self, name, nbytes):
        self.smem_opt_in[name] = nbytes


class BumpPool:
    def __init__(self):
        self.next = 1 << 20

    def alloc(self, region, nbytes, name=""):
        buf = Buffer(self.next, nbytes)
        self.next += -(-nbytes // 256) * 256
        return buf


def check_launch(launch):
    name, _, _, args, _ = launch
    assert name in SIGNATURES, f"{name} is not a kernel in cuda/"
    assert len(args) == len(SIGNATURES[name][1]), f"{name}: {len(args)} args for signature {SIGNATURES[name][1]}"
    assert all(isinstance(a, int) for a in args)


def upload(rt, ggml_type, rows, cols, seed=0):
    data = random_weight_bytes(ggml_type, rows, cols, np.random.default_rng(seed))
    return quant_ops.upload_weight(rt, BumpPool(), TensorInfo("w", (rows, cols), ggml_type, data)), data


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
def test_upload_writes_the_repacked_bytes(ggml_type):
    rt = RecordingRuntime()
    cols = 512 if ggml_type in quant_ops.QUANT_PLANES else 77
    w, data = upload(rt, ggml_type, 7, cols)
    assert (w.rows, w.cols, w.ggml_type) == (7, cols, ggml_type)
    assert np.array_equal(rt.uploads[w.buf.ptr], quant_ops.repack(ggml_type, data, 7, cols))
    if not w.layout.is_float:
        assert w.meta_ptr - w.q_ptr == w.layout.meta_offset and w.layout.meta_offset % 256 == 0


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [1, 3, 16, 21])
def test_matvec_launches(ggml_type, n_tokens):
    rt = RecordingRuntime()
    rows, cols = 4099, 512
    w, _ = upload(rt, ggml_type, rows, cols)
    quant_ops.matvec(rt, w, 0x1000, 0x2000, 0x3000, n_tokens)
    done = 0
    for launch in rt.launches:
        check_launch(launch)
        name, grid, block, args, _ = launch
        r = int(name.split("_r")[1][0]) if "_r" in name else 1
        assert grid[0] * (block // 32) * r >= rows, f"{name}: grid {grid} misses rows"
        done += args[-2] if not w.layout.is_float else args[-1]  # n_tokens argument
    assert done == n_tokens


@pytest.mark.parametrize("ggml_type", list(quant_ops.QUANT_PLANES), ids=lambda t: t.name)
def test_fused_matvec_and_quantize_launches(ggml_type):
    rt = RecordingRuntime()
    w, _ = upload(rt, ggml_type, 301, 768)
    quant_ops.quantize_q8_1(rt, 0x1000, 0x2000, 768, 2)
    quant_ops.matvec(rt, w, 0x1000, None, 0x3000, 2)
    q, *fused = rt.launches
    check_launch(q)
    assert q[1] == (3, 2) and q[2] == 256  # 768 values = 3 blocks of 256 threads, one row per token
    assert len(fused) == 2  # one launch per token
    for launch in fused:
        check_launch(launch)
        assert "_fused_" in launch[0] and launch[4] == quant_ops.q8_1_stride(768)


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
@pytest.mark.parametrize("rows,n_tokens", [(301, 100), (4096, 512)])
def test_gemm_launches(ggml_type, rows, n_tokens):
    rt = RecordingRuntime()
    w, _ = upload(rt, ggml_type, rows, 256)
    quant_ops.gemm(rt, w, 0x1000, 0x2000, n_tokens)
    (launch,) = rt.launches
    check_launch(launch)
    name, grid, block, args, shared = launch
    bm, bn, threads, smem = quant_ops.GEMM_TILES[name.split("_")[0]]
    assert grid[0] * bn >= rows and grid[1] * bm >= n_tokens and block == threads and shared == smem
    if smem > quant_ops.SHARED_OPT_IN:
        assert rt.smem_opt_in[name] == smem


def test_q8_1_sizes():
    assert quant_ops.q8_1_stride(576) == 576 + 18 * 8
    assert quant_ops.q8_1_stride(32) == 48  # 32 + 8, padded to 16
    assert quant_ops.q8_1_nbytes(4096, 3) == 3 * (4096 + 128 * 8)


def test_bad_weights_are_one_line_errors():
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        quant_ops.weight_layout(QT.IQ2_XXS, 4, 256)
    with pytest.raises(UnsupportedModelError) as err:  # IQ4_NL: a neighbour of IQ4_XS, still no kernel
        quant_ops.weight_layout(QT.IQ4_NL, 4, 256)
    message = str(err.value)
    assert "\n" not in message and message.startswith("weight type IQ4_NL has no GPU kernel")
    assert all(name in message for name in ("Q2_K", "Q3_K", "IQ4_XS", "Q6_K"))
    with pytest.raises(ModelFormatError, match="IQ4_XS weight has 320 columns, not a multiple of 256"):
        quant_ops.weight_layout(QT.IQ4_XS, 4, 320)
    with pytest.raises(ModelFormatError, match="multiple of 256"):
        quant_ops.weight_layout(QT.Q4_K, 4, 576)
    with pytest.raises(ModelFormatError, match="empty"):
        quant_ops.weight_layout(QT.Q8_0, 0, 32)
    with pytest.raises(ModelFormatError, match="expected 68"):  # a truncated tensor
        quant_ops.repack(QT.Q8_0, np.zeros(60, np.uint8), 2, 32)
