"""cuda/quants.cuh on the CPU: every per-type dot product and dequant against gguf's numpy code.

tests/quant_host_check.cu includes the header (its functions are __host__ __device__) and runs
them over the exact bytes quant_ops.repack and the q8_1 reference produce. No GPU needed, nvcc
(as the host compiler driver) is. Bounds: the int8 dot products against the float64 emulation
of the q8_1 path ||d||/||ref|| <= 1e-5 (float32 summation only); dequantized f16 against gguf's
float32 values rounded to f16: within one f16 ulp (rtol 1e-3).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import build, quant_ops
from memra_engine.gpu.quant_ref import (dequantize_weight, matvec_q8_1_ref, q8_1_bytes, quantize_q8_1_ref,
                                        random_weight_bytes, supported_types)

pytestmark = pytest.mark.skipif(not build.nvcc_available(), reason="nvcc not installed")
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def host_check(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("qhc") / "quant_host_check"
    subprocess.run([build.find_nvcc(), "-O2", "-std=c++17", "-x", "cu", "-I", str(build.source_dir()),
                    "-o", str(exe), str(HERE / "quant_host_check.cu")], check=True, capture_output=True)
    return exe


def run_host(exe: Path, tmp_path: Path, ggml_type: QT, data, rows: int, cols: int, x: np.ndarray):
    name = quant_ops.weight_layout(ggml_type, rows, cols).kernel_type
    tokens = x.shape[0]
    xq = q8_1_bytes(*quantize_q8_1_ref(x), quant_ops.q8_1_stride(cols))
    (tmp_path / "in.bin").write_bytes(quant_ops.repack(ggml_type, data, rows, cols).tobytes() + xq.tobytes())
    subprocess.run([str(exe), name, str(rows), str(cols), str(tokens), str(tmp_path / "in.bin"),
                    str(tmp_path / "out.bin")], check=True)
    out = np.fromfile(tmp_path / "out.bin", np.uint8)
    y = out[: tokens * rows * 4].view(np.float32).reshape(tokens, rows)
    deq = out[tokens * rows * 4:].view(np.float16).reshape(rows, cols)
    return y, deq


@pytest.mark.parametrize("ggml_type", supported_types(), ids=lambda t: t.name)
def test_dot_and_dequant_match_numpy(host_check, tmp_path, ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    rows, cols = 5, 768 if ggml_type in quant_ops.QUANT_PLANES else 77
    data = random_weight_bytes(ggml_type, rows, cols, rng)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    y, deq = run_host(host_check, tmp_path, ggml_type, data, rows, cols, x)

    w = dequantize_weight(ggml_type, data, rows, cols)
    np.testing.assert_allclose(deq.astype(np.float32), w.astype(np.float16).astype(np.float32), rtol=1e-3, atol=1e-6)
    if ggml_type in quant_ops.QUANT_PLANES:
        ref = matvec_q8_1_ref(ggml_type, data, rows, cols, x)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-5


def test_kquant_scales_are_get_scale_min_k4(host_check):
    """The branch-free Q4_K/Q5_K scale decode gives ggml's get_scale_min_k4 integers, folded with d
    and dmin bit for bit, on every unit of 200,000 pseudo-random metas."""
    out = subprocess.run([str(host_check), "kscales"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "kscales: 0 mismatches"


def test_repack_is_a_byte_permutation():
    """Every byte of every block lands exactly once in the planes (meta pad bytes are zeros)."""
    rng = np.random.default_rng(7)
    for ggml_type in quant_ops.QUANT_PLANES:
        rows, cols = 3, 512
        data = random_weight_bytes(ggml_type, rows, cols, rng)
        packed = quant_ops.repack(ggml_type, data, rows, cols)
        lay = quant_ops.weight_layout(ggml_type, rows, cols)
        assert lay.meta_offset % 256 == 0 and lay.q_bytes % 16 == 0
        nblocks = rows * cols // lay.block_values
        used = np.concatenate([packed[: nblocks * lay.q_bytes], packed[lay.meta_offset:]])
        assert np.array_equal(np.sort(used), np.sort(np.concatenate(
            [data.reshape(-1), np.zeros(nblocks * (lay.q_bytes + lay.meta_bytes) - data.size, np.uint8)])))

