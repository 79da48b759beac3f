"""Run one forward on the CPU and the GPU backend side by side, op by op, and print each op's
relative error: the first op that diverges is the bug. Debugging aid for the GPU backend.

    python scripts/compare_ops.py MODEL.gguf [--tokens N]
"""
from __future__ import annotations

import argparse

import numpy as np

from memra_engine.cpu.backend import CpuBackend
from memra_engine.gpu.backend import CudaBackend
from memra_engine.gpu.ops import DArray
from memra_engine.model import arch_module
from memra_engine.model.gguf_file import open_gguf


class Twin:
    def __init__(self, c, g):
        self.c, self.g = c, g


class TwinOps:
    """Calls each op on both backends; after each, flushes the GPU and compares."""

    def __init__(self, cpu: CpuBackend, gpu: CudaBackend):
        self.cpu, self.gpu, self.n = cpu, gpu, 0

    def __getattr__(self, name):
        def call(*args, **kw):
            ca = [a.c if isinstance(a, Twin) else a for a in args]
            ga = [a.g if isinstance(a, Twin) else a for a in args]
            c = getattr(self.cpu.ops, name)(*ca, **kw)
            g = getattr(self.gpu.ops, name)(*ga, **kw)
            return self._pair(name, c, g)
        return call

    def _pair(self, name, c, g):
        if isinstance(c, tuple):
            return tuple(self._pair(name, a, b) for a, b in zip(c, g))
        self.gpu.ops.flush()
        if isinstance(g, DArray) and g.contiguous:
            got = self.gpu.rt.download(g.ptr, c.shape, np.float32)
            err = np.linalg.norm(got - c) / max(np.linalg.norm(c), 1e-30)
            self.n += 1
            print(f"{self.n:4d} {name:12s} {tuple(c.shape)!s:18s} rel err {err:.2e}")
        return Twin(c, g)


class TwinWeights:
    def __init__(self, cw, gw):
        self.cw, self.gw = cw, gw

    def __getattr__(self, name):
        return Twin(getattr(self.cw, name), getattr(self.gw, name))

    def layer(self, i):
        return TwinWeights(self.cw.layer(i), self.gw.layer(i))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=24)
    a = p.parse_args()
    g = open_gguf(a.model)
    cpu, gpu = CpuBackend(g, 128), CudaBackend(g, n_ctx=128, use_graphs=False)
    ids = np.random.default_rng(1).integers(3, cpu.config.vocab_size, a.tokens).astype(np.int32)
    pos = np.arange(a.tokens, dtype=np.int32)
    gpu.rt.upload(gpu.tokens_ptr, ids)
    gpu.rt.upload(gpu.positions_ptr, pos)
    gpu.ops.begin(gpu.splits_for(a.tokens), gpu.history_ptr, gpu.prefill_splits_for(a.tokens))
    gpu.ops._positions_ptr = gpu.positions_ptr
    t = Twin(ids, DArray(gpu.tokens_ptr, (a.tokens,), 1))
    ps = Twin(pos, DArray(gpu.positions_ptr, (a.tokens,), 1))
    arch_module(cpu.config.arch).forward(TwinOps(cpu, gpu), TwinWeights(cpu.weights, gpu.weights), cpu.config, t, ps)
    gpu.close()


if __name__ == "__main__":
    main()
