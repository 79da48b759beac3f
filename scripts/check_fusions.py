"""A/B of GpuOps' fusions against the CPU backend: prefill + decode error per switch setting.

    python scripts/check_fusions.py MODEL.gguf
"""
from __future__ import annotations

import sys

import numpy as np

from memra_engine.cpu.backend import CpuBackend
from memra_engine.gpu.backend import CudaBackend
from memra_engine.model.gguf_file import open_gguf

SWITCHES = ("fuse_add_norm", "fuse_rope_kv", "fuse_quant", "fuse_qkv_rope")


def main() -> None:
    g = open_gguf(sys.argv[1])
    cpu = CpuBackend(g, 128)
    gpu = CudaBackend(g, 128)
    try:
        for n in (20, 12, 2):  # GEMM prefill, batched-matvec prefill, decode
            prompt = list(np.random.default_rng(0).integers(0, cpu.config.vocab_size, n))
            cpu.truncate(0)
            ref = cpu.prefill(prompt, all_logits=True)
            ref_next = cpu.decode(5)
            print(f"prompt {n}")
            for off in (None,) + SWITCHES + ("all",):
                for name in SWITCHES:
                    setattr(gpu.ops, name, not (off == name or off == "all"))
                gpu.graphs.clear()
                gpu.truncate(0)
                got = gpu.prefill(prompt, all_logits=True)
                nxt = gpu.decode(5)
                err = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
                err_d = np.linalg.norm(nxt - ref_next) / np.linalg.norm(ref_next)
                print(f"off={off!s:<18} prefill row err max {err.max():.4f} (row0 {err[0]:.4f}) decode {err_d:.4f}")
    finally:
        gpu.close()


if __name__ == "__main__":
    main()
