"""Where a decode step's device time goes: per-kernel times of the captured decode+sample graph.

The launches of one captured step are recorded, then each kernel name's launches are captured
into a graph of their own and replayed; the median replay time is that kernel's share of the
step. The full graph is timed the same way, so the table also shows the launch-gap overhead
(full graph minus the sum of the parts).

    python scripts/profile_decode.py MODEL.gguf [--ctx 128] [--ctx 4096] [--off fuse_qkv_rope ...]

--off turns one of GpuOps' fusion switches off (an A/B in the same device call).
"""
from __future__ import annotations

import argparse
from collections import OrderedDict

from memra_engine.gpu.backend import CudaBackend
from memra_engine.gpu.graph import CudaGraph
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams


def profile(backend: CudaBackend, ctx: int) -> None:
    rt = backend.rt
    backend.truncate(0)
    backend.prefill(list(range(1, ctx + 1)))
    backend.set_sampling(SamplingParams(temperature=0.0), seed=0)
    record = []
    launch = rt.launch

    def recording(name, grid, block, args, shared=0):
        record.append((name, grid, block, args, shared))
        launch(name, grid, block, args, shared)

    rt.launch = recording
    backend.graphs.clear()
    full = backend._graph(backend.splits_for(backend.n_past + 200), sample=True)
    rt.launch = launch
    backend._write_step(1)
    total = full.replay_us(rt, replays=30)
    groups: OrderedDict[str, list] = OrderedDict()
    for item in record:
        groups.setdefault(item[0], []).append(item)
    rows = []
    for name, items in groups.items():
        g = CudaGraph()
        with g.capture(rt):
            for _, grid, block, args, shared in items:
                launch(name, grid, block, args, shared)
        rows.append((g.replay_us(rt, replays=30), name, len(items)))
        g.destroy()
    rows.sort(reverse=True)
    parts = sum(r[0] for r in rows)
    print(f"\nctx {ctx}: {len(record)} kernels, graph {total:.1f} µs/token ({1e6 / total:.0f} tok/s), "
          f"sum of kernel groups {parts:.1f} µs")
    for us, name, n in rows:
        print(f"  {name:<28} x{n:<4} {us:8.1f} µs  {us / n:6.2f} µs each  {100 * us / parts:5.1f}%")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ctx", type=int, action="append")
    p.add_argument("--off", action="append", default=[], help="a GpuOps fusion switch to turn off")
    args = p.parse_args()
    ctxs = args.ctx or [128]
    backend = CudaBackend(open_gguf(args.model), n_ctx=max(ctxs) + 300)
    try:
        for name in args.off:
            if not name.startswith("fuse_") or not hasattr(backend.ops, name):
                raise SystemExit(f"profile_decode: no fusion switch {name!r}")
            setattr(backend.ops, name, False)
        if args.off:
            print("off:", ", ".join(args.off))
        for ctx in ctxs:
            profile(backend, ctx)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
