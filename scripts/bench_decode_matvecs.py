"""Decode matvecs of the benchmark models' shapes, every one-column variant (µs per launch).

bench_kernels.py times its fixed shape list; this times the SmolLM2-135M and Gemma3-270M decode
shapes (qkv, o, gate_up, down) with the same method (HBM-resident weights, graph replays), to
pick quant_ops.matvec_variant. Run on the GPU machine: python scripts/bench_decode_matvecs.py
[ROWSxCOLS:TYPE ...] (other shapes, e.g. the LM heads: 262144x640:Q8_0 49152x576:Q8_0).
"""
from __future__ import annotations

import sys

import bench_kernels as bk
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import quant_ops
from memra_engine.gpu.memory import VramPool
from memra_engine.gpu.runtime import GpuRuntime

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (1536, 640), (640, 1024), (4096, 640), (640, 2048)]
TYPES = [QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K]


def main() -> None:
    runs = [(SHAPES, TYPES)]
    if sys.argv[1:]:
        runs = []
        for spec in sys.argv[1:]:
            shape, qtype = spec.split(":")
            rows, cols = (int(n) for n in shape.split("x"))
            runs.append(([(rows, cols)], [QT[qtype]]))
    rt = GpuRuntime(families=["matvec", "k256"])
    pool = VramPool({"weights": 2560 << 20, "scratch": 256 << 20})
    try:
        for name in quant_ops.kernel_names():
            if name.startswith("matvec_") or name == "quantize_q8_1":
                rt.kernel(name)
        for bk.MATVEC_SHAPES, bk.MATVEC_TYPES in runs:
            for r in bk.bench_matvec(rt, pool, quick=False):
                variants = "  ".join(f"{k[3:]} {v:.2f}" for k, v in r.items() if k.startswith("us_") and "_c" not in k)
                print(f"  {r['type']} {r['rows']}x{r['cols']}: best {r['best']} ({r['us_' + r['best']]:.2f} us), "
                      f"default {r['default']} ({r['us_' + r['default']]:.2f} us)  [{variants}]  batched: "
                      + "  ".join(f"{k[3:]} {v:.2f}" for k, v in r.items() if k.startswith("us_c")))
    finally:
        pool.close()
        rt.close()


if __name__ == "__main__":
    main()
