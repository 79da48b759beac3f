"""Weights asked into L2 while attention runs (cuda/l2_prefetch.cu, engine/gpu/l2_ahead.py): the
kernel takes ranges of any size without a fault, and a model's decode and verify logits, captured
graphs and eager, are the same bits with the prefetch on as off (it moves no data a kernel reads)."""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.model.gguf_file import open_gguf

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("l2") / "smollm2.gguf", preset="smollm2-135m")


def test_the_kernel_takes_ranges_of_any_size(model):
    from memra_engine.gpu.backend import CudaBackend

    gpu = CudaBackend(open_gguf(model), n_ctx=64)
    try:
        if not gpu.rt.built_sm90:
            pytest.skip("bulk L2 prefetch is sm_90+")
        rng = np.random.default_rng(3)
        host = rng.integers(0, 255, (5 << 20) + 48, dtype=np.uint8)
        mem = gpu.rt.cuda.mem_alloc(host.nbytes)
        ptr = int(mem)
        gpu.rt.upload(ptr, host)
        sizes = [(5 << 20) + 3, 17, 0, 1000]  # tails below 16 bytes are left out, 0 skips a range
        offsets = [0, 16, 32, 48]
        args = []
        for off, n in zip(offsets, sizes):
            args += [ptr + off, np.int64(n)]
        for grid in (1, 32, 200):
            gpu.rt.launch("l2_prefetch", grid, 32, args)
        assert np.array_equal(gpu.rt.download(ptr, host.shape, np.uint8), host)
        mem.free()
    finally:
        gpu.close()


def run(model, mib: str, monkeypatch):
    from memra_engine.gpu.backend import CudaBackend

    monkeypatch.setenv("MEMRA_L2_AHEAD", mib)
    gpu = CudaBackend(open_gguf(model), n_ctx=512)
    try:
        if not gpu.rt.built_sm90:
            pytest.skip("bulk L2 prefetch is sm_90+")
        assert bool(gpu.ops.l2_ahead) == (mib != "0")
        prompt, tokens, draft = list(range(3, 300)), [5, 9, 11, 300, 2, 2, 7, 1], [4, 8, 15, 16, 23, 42]
        out = []
        for use_graphs in (True, False):
            gpu.truncate(0)
            gpu.use_graphs = use_graphs
            gpu.prefill(prompt)
            out.append(np.stack([gpu.decode(t) for t in tokens]))
            out.append(gpu.verify(draft))
        return out
    finally:
        gpu.close()


def test_decode_and_verify_are_the_same_bits_with_the_prefetch(model, monkeypatch):
    off = run(model, "0", monkeypatch)
    on = run(model, "4", monkeypatch)
    assert np.all(np.isfinite(off[0])) and np.abs(off[0]).max() > 0
    for a, b in zip(off, on):
        assert np.array_equal(a, b)
