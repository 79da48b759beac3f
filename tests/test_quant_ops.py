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

from memra_engine.errors import DeviceError, ModelFormatError, UnsupportedModelError
from memra_engine.gpu import build, quant_ops, quant_ref
from memra_engine.gpu.quant_ref import (dequantize_q8_1_ref, q8_1_bytes, quantize_q8_1_ref, quantize_q8_k256_ref,
                                        random_weight_bytes, supported_types)
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
    max_shared: int = 227 * 1024  # an H100's opt-in limit

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
        if "_mma_" in name:  # tensor-core verify matvec: MMA_ROWS rows a block
            per_block = quant_ops.MMA_ROWS
        else:  # a warp per R rows
            per_block = (block // 32) * (int(name.split("_r")[1][0]) if "_r" in name else 1)
        assert grid[0] * per_block >= rows, f"{name}: grid {grid} misses rows"
        done += args[-2] if not w.layout.is_float else args[-1]  # n_tokens argument
    assert done == n_tokens


@pytest.mark.parametrize("ggml_type", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens,expect", [(1, "_r"), (2, "u1_c2"), (3, "_mma_c8"), (8, "_mma_c8"), (9, "_mma_c16"),
                                             (16, "_mma_c16")])
def test_k_quant_verify_columns_take_the_tensor_core_matvec(ggml_type, n_tokens, expect, monkeypatch):
    """3-16 columns of Q4_K and Q6_K launch matvec_<type>_mma_c{8,16} (grid: 16 rows a block); one
    column stays on decode's kernel, two take the dp4a one (quant_ops.MMA_MIN_COLUMNS);
    MEMRA_VERIFY_MMA=0 puts verify back on the dp4a kernels."""
    rt = RecordingRuntime()
    w, _ = upload(rt, ggml_type, 4099, 512)
    quant_ops.matvec(rt, w, 0x1000, 0x2000, 0x3000, n_tokens)
    (name, grid, block, _, _), = rt.launches
    assert name.startswith(f"matvec_{w.layout.kernel_type}_") and expect in name, name
    assert "_mma_" not in name or (grid[0], block) == (-(-4099 // 16), 256), name
    monkeypatch.setenv("MEMRA_VERIFY_MMA", "0")
    rt.launches.clear()
    quant_ops.matvec(rt, w, 0x1000, 0x2000, 0x3000, n_tokens)
    assert "_mma_" not in rt.launches[0][0]


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
    tiles = quant_ops.gemm_tiles(w, rt.max_shared)
    assert quant_ops.gemm_variant(w, n_tokens, rt.max_shared) in tiles
    for variant in [None, *tiles]:
        rt.launches.clear()
        quant_ops.gemm(rt, w, 0x1000, 0x2000, n_tokens, 0x3000, variant=variant)
        (launch,) = rt.launches
        check_launch(launch)
        name, grid, block, args, shared = launch
        prefix = name.split("_")[0]
        assert variant in (None, prefix)
        bm, bn, threads = quant_ops.GEMM_TILES[prefix]
        smem = quant_ops.gemm_shared(prefix, w.layout)
        assert smem <= rt.max_shared
        row_tiles, token_tiles = grid[::-1] if prefix in quant_ops.TOKEN_MAJOR_TILES else grid
        assert row_tiles * bn >= rows and token_tiles * bm >= n_tokens and block == threads and shared == smem
        if smem > quant_ops.SHARED_OPT_IN:
            assert rt.smem_opt_in[name] == smem


def test_gemm_tiles_fit_the_device_shared_memory():
    """gemm5 and gemm7 (the default for big chunks) need an sm_90-class block (156-200 KB); a 99 KB GPU
    (sm_86/89) never gets them, and gets gemm6 (61-83 KB) wherever gemm3/gemm4 do not fit either, so
    every type has a prefill tile there."""
    rt = RecordingRuntime()
    for ggml_type in supported_types():
        w, _ = upload(rt, ggml_type, 4096, 256)
        if w.layout.kernel_type == "f32":
            continue  # f32 weights have only the unpipelined tiles
        for tile in ("gemm5", "gemm7"):
            assert tile in quant_ops.gemm_tiles(w, 227 * 1024), ggml_type.name
            assert 150 * 1024 < quant_ops.gemm_shared(tile, w.layout) <= 227 * 1024, ggml_type.name
        assert quant_ops.gemm_variant(w, 512, 227 * 1024) == "gemm7", ggml_type.name
        assert quant_ops.gemm_variant(w, 64, 227 * 1024) == "gemm4", ggml_type.name
        small = quant_ops.gemm_tiles(w, 99 * 1024)
        assert not {"gemm5", "gemm7", "gemm3"} & set(small) and "gemm6" in small, ggml_type.name
        for n_tokens in (64, 512):
            tile = quant_ops.gemm_variant(w, n_tokens, 99 * 1024)
            assert tile in small and quant_ops.gemm_shared(tile, w.layout) <= 99 * 1024, (ggml_type.name, tile)
    with pytest.raises(DeviceError, match="shared memory"):
        quant_ops.gemm_variant(w, 512, 32 * 1024)


def test_k256_reference_is_two_terms_a_256_block():
    """quantize_q8_k256_ref (the candidate format of scripts/proto/mma_q4k.cu): the two int8 terms with
    one d1 = amax/127 per 256 values (K padded), x ~ d2 (254 q1 + q2) to ~16 bits of the block's amax,
    and bs the integer sums of 254 q1 + q2 per 32."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 600)) * rng.uniform(0.01, 100, (2, 1))).astype(np.float32)
    x[1, 256:512] *= 1e3  # one block far larger than the rest
    q1, q2, d2, bs = quantize_q8_k256_ref(x)
    assert q1.shape == q2.shape == (2, 768) and d2.shape == (2, 3) and bs.shape == (2, 24) and bs.dtype == np.int32
    blocks = np.zeros((2, 768), np.float32)
    blocks[:, :600] = x
    blocks = blocks.reshape(2, 3, 256)
    amax = np.abs(blocks).max(-1)
    assert np.array_equal(d2, (amax / np.float32(127) / np.float32(254)).astype(np.float32))
    assert np.abs(q1).max() == 127 and np.all(q1[:, 600:] == 0) and np.all(q2[:, 600:] == 0)
    v = 254 * q1.astype(np.int64) + q2
    err = np.abs(d2[..., None] * v.reshape(2, 3, 256) - blocks)
    assert np.all(err.max(-1) <= amax / 127 / 254 * 1.01)
    assert np.array_equal(bs, v.reshape(2, 24, 32).sum(-1))


def test_q8_k256_row_image():
    """q8_k256_bytes (the image quantize_q8_k256 must write): in a term block, the 16 bytes at 64 i + 16 t
    are values 8t .. 8t + 7 of sub-block 2i, then of sub-block 2i + 1 (an MMA lane's B words of a pair),
    and the 64 bytes at 64 i are pair i's values and nothing else (a dp4a lane's); bs and d2 follow the
    terms; the image holds the values d2 (254 q1 + q2) and nothing is lost."""
    pos = quant_ref.q8_k256_positions()
    assert sorted(pos) == list(range(256))
    for i in range(4):
        assert sorted(np.flatnonzero((pos >= 64 * i) & (pos < 64 * i + 64))) == list(range(64 * i, 64 * i + 64))
        for t in range(4):
            want = [32 * s + 8 * t + e for s in (2 * i, 2 * i + 1) for e in range(8)]
            assert [int(np.flatnonzero(pos == 64 * i + 16 * t + o)[0]) for o in range(16)] == want
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((3, 600)) * rng.uniform(0.1, 10, (3, 1))).astype(np.float32)
    q1, q2, d2, bs = quantize_q8_k256_ref(x)
    stride = quant_ops.q8_k256_stride(600)
    assert stride == 3 * 548 + 4 and quant_ops.q8_k256_stride(4096) == 16 * 548 == 16 * quant_ops.Q8_K256_BYTES
    rows = quant_ref.q8_k256_bytes(q1, q2, d2, bs, stride)
    back = quant_ref.dequantize_q8_k256_bytes(rows)
    assert np.array_equal(back, quant_ref.dequantize_q8_k256_ref(q1, q2, d2))
    assert np.array_equal(back, d2.astype(np.float64).repeat(256, 1) * (254 * q1.astype(np.float64) + q2))
    assert np.array_equal(rows[:, 3 * 512:3 * 544].copy().view(np.int32), bs)
    assert np.array_equal(rows[:, 512 + 256:512 + 512].view(np.int8), q2[:, 256:512][:, np.argsort(pos)])  # super-block 1, term 2
    assert np.abs(back[:, :600] - x).max() <= np.abs(x).max() / 127 / 254 * 1.01


def test_q8_1_sizes():
    """A row is qs[Kq] | qs2[Kq] | float4 ds[Kq/32], no padding needed (Kq a multiple of 32)."""
    assert quant_ops.q8_1_stride(576) == 2 * 576 + 18 * 16
    assert quant_ops.q8_1_stride(32) == 80
    assert quant_ops.q8_1_stride(1000) == 2 * 1024 + 32 * 16  # K rounded up to 32
    assert quant_ops.q8_1_nbytes(4096, 3) == 3 * (2 * 4096 + 128 * 16)
    assert all(quant_ops.q8_1_stride(k) % 16 == 0 for k in range(1, 700))


def test_q8_1_reference_is_two_int8_terms():
    """quantize_q8_1_ref: qs from d1 = amax/127, qs2 the residual's int8 term with the fixed
    d2 = d1/254, x ~ d1*qs + d2*qs2 within d2/2 (plus float rounding), ds = (d1, sum, d2, 0), and
    the bytes at their offsets."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 200)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
    x[0, 32:64] = np.arange(-127, 129, 8).astype(np.float32) / 8  # multiples of d1 = 1/8: residual 0
    x[1, :32] = 0.0                                               # all zero: d1 = d2 = 0
    x[2, 64:96] *= 1e4                                            # one block far larger than the rest
    qs, qs2, ds = quantize_q8_1_ref(x)
    kq = 224
    assert qs.shape == qs2.shape == (3, kq) and ds.shape == (3, kq // 32, 4) and ds.dtype == np.float32
    blocks = np.zeros((3, kq), np.float32)
    blocks[:, :200] = x
    blocks = blocks.reshape(3, -1, 32)
    d1, d2 = ds[..., 0], ds[..., 2]
    assert np.allclose(d1, np.abs(blocks).max(-1) / 127, rtol=1e-6)
    assert np.allclose(ds[..., 1], blocks.sum(-1, dtype=np.float64), rtol=1e-5, atol=1e-4)
    assert np.all(ds[..., 3] == 0) and np.array_equal(d2, (d1 / np.float32(254)).astype(np.float32))
    assert np.abs(qs).max() == 127 and 120 <= np.abs(qs2).max() <= 127  # |residual| <= d1/2
    xhat = dequantize_q8_1_ref(qs, qs2, ds).reshape(3, -1, 32)
    err = np.abs(xhat - blocks)
    assert np.all(err <= d2[..., None] * 0.5 + np.abs(blocks) * 1e-6)
    assert np.all(err.max(-1) <= np.abs(blocks).max(-1) / 127 / 254 * 1.001)  # ~16-bit, relative to the block
    one_term = qs.reshape(3, -1, 32) * d1[..., None].astype(np.float64)
    assert np.abs(one_term - blocks).max() > 100 * err.max()  # the second term is what buys it
    assert not qs2[0, 32:64].any() and d1[1, 0] == 0 and d2[1, 0] == 0 and not qs[1, :32].any()

    stride = quant_ops.q8_1_stride(200)
    image = q8_1_bytes(qs, qs2, ds, stride)
    assert image.shape == (3, stride)
    assert np.array_equal(image[:, :kq].view(np.int8), qs) and np.array_equal(image[:, kq:2 * kq].view(np.int8), qs2)
    assert np.array_equal(image[:, 2 * kq:].copy().view(np.float32).reshape(3, -1, 4), ds)


def test_fused_matvec_with_a_long_row_opts_in_to_its_shared_memory():
    """The fused matvec keeps the q8_1 row (2.5 bytes per column) in shared memory: past 48 KiB
    (K > 19,660) the launch needs the kernel's opt-in, below it none."""
    rt = RecordingRuntime()
    for cols in (1024, 24576):
        w, _ = upload(rt, QT.Q4_0, 8, cols)
        quant_ops.matvec(rt, w, 0x1000, None, 0x3000, 1)
    (small, _, _, _, shared_small), (big, _, _, _, shared_big) = rt.launches
    assert shared_small == quant_ops.q8_1_stride(1024) and shared_big == quant_ops.q8_1_stride(24576) > 48 * 1024
    assert rt.smem_opt_in == {big: shared_big}


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
