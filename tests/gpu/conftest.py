"""Shared GPU fixtures: one runtime and scratch pool for the kernel tests, and buffer helpers.

Every test here is marked `gpu` and skipped without a device (tests/conftest.py).
"""
from __future__ import annotations

import numpy as np
import pytest

NAN_BITS = 0x7FC00000  # outputs are poisoned with NaN before a launch: unwritten elements show


class Gpu:
    def __init__(self, rt, pool):
        self.rt, self.pool = rt, pool

    def put(self, host: np.ndarray) -> int:
        host = np.ascontiguousarray(host)
        buf = self.pool.alloc("scratch", max(host.nbytes, 16), "t")
        self.rt.upload(buf.ptr, host)
        return buf.ptr

    def empty(self, n_items: int, itemsize: int = 4, poison: bool = True) -> int:
        buf = self.pool.alloc("scratch", max(n_items * itemsize, 16), "y")
        if poison:
            self.rt.memset_u32(buf.ptr, NAN_BITS, -(-n_items * itemsize // 4))
        return buf.ptr

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        return self.rt.download(ptr, shape, dtype)


@pytest.fixture(scope="session")
def gpu():
    from memra_engine.gpu.memory import VramPool
    from memra_engine.gpu.runtime import GpuRuntime

    rt = GpuRuntime(families=["norm", "rope", "activation", "attention", "attn_prefill", "embed", "sampling", "matvec",
                              "gemm", "moe", "kv_cache", "k256"])
    pool = VramPool({"weights": 256 << 20, "scratch": 512 << 20})
    yield Gpu(rt, pool)
    pool.close()
    rt.close()


@pytest.fixture(autouse=True)
def _fresh_scratch(request):
    """Each test starts with an empty scratch region (tests allocate freely)."""
    yield
    if "gpu" in request.fixturenames:
        request.getfixturevalue("gpu").pool.reset("scratch")
