"""Where a decode step's device time goes: per-kernel times of the captured decode+sample graph.

The launches of one captured step are recorded, then each kernel name's launches are captured
into a graph of their own and replayed; the median replay time is that kernel's share of the
step. The full graph is timed the same way, so the table also shows the launch-gap overhead
(full graph minus the sum of the parts).

    python scripts/profile_decode.py MODEL.gguf [--ctx 128] [--ctx 4096] [--off fuse_qkv_rope ...]

--off turns one of GpuOps' fusion switches off (an A/B in the same device call).
--verify T profiles the speculative verify graph of T rows (T - 1 drafts and the bonus row, each
row sampled) beside the decode step at the same context, e.g. `--verify 9` for draft_max 8.
--prefill N profiles one N-token prefill forward instead (at most PREFILL_CHUNK tokens: one
forward): its launches replayed as one graph, then replayed in order with a CUDA event pair
around each launch (a kernel group replayed on its own would read what later launches left in
the scratch arena: MoE's slot order, for one, and faulted).
"""
from __future__ import annotations

import argparse
from collections import OrderedDict

from memra_engine.gpu.backend import PREFILL_CHUNK, CudaBackend
from memra_engine.gpu.graph import CudaGraph
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams


def recorded(rt, fn) -> list[tuple]:
    """The launches fn() makes (they still run), as (name, grid, block, args, shared)."""
    record, launch = [], rt.launch

    def recording(name, grid, block, args, shared=0):
        record.append((name, grid, block, args, shared))
        launch(name, grid, block, args, shared)

    rt.launch = recording
    try:
        fn()
    finally:
        rt.launch = launch
    return record


def graph_of(rt, items) -> CudaGraph:
    g = CudaGraph()
    with g.capture(rt):
        for name, grid, block, args, shared in items:
            rt.launch(name, grid, block, args, shared)
    return g


def report(rt, record: list[tuple], total_us: float, title: str) -> None:
    """Each kernel name's launches replayed as a graph of their own: their share of total_us."""
    groups: OrderedDict[str, list] = OrderedDict()
    for item in record:
        groups.setdefault(item[0], []).append(item)
    rows = []
    for name, items in groups.items():
        g = graph_of(rt, items)
        rows.append((g.replay_us(rt, replays=30), name, len(items)))
        g.destroy()
    rows.sort(reverse=True)
    parts = sum(r[0] for r in rows)
    print(f"\n{title}, sum of kernel groups {parts:.1f} µs")
    for us, name, n in rows:
        print(f"  {name:<28} x{n:<4} {us:8.1f} µs  {us / n:6.2f} µs each  {100 * us / parts:5.1f}%")


def report_by_events(rt, record: list[tuple], title: str, reps: int = 3) -> None:
    """The record replayed in order, each launch between two events: per kernel name, the median
    over reps of its launches' summed times."""
    cuda = rt.cuda
    per_rep = []
    for _ in range(reps + 1):  # the first is a warm-up
        events = [(cuda.Event(), cuda.Event()) for _ in record]
        for (a, b), (name, grid, block, args, shared) in zip(events, record):
            a.record(rt.stream)
            rt.launch(name, grid, block, args, shared)
            b.record(rt.stream)
        rt.synchronize()
        sums: OrderedDict[str, float] = OrderedDict()
        for (a, b), item in zip(events, record):
            sums[item[0]] = sums.get(item[0], 0.0) + a.time_till(b) * 1e3
        per_rep.append(sums)
    counts: dict[str, int] = {}
    for item in record:
        counts[item[0]] = counts.get(item[0], 0) + 1
    rows = sorted(((sorted(r[name] for r in per_rep[1:])[reps // 2], name, counts[name]) for name in counts),
                  reverse=True)
    parts = sum(r[0] for r in rows)
    print(f"\n{title}, sum of kernels (timed by events, in order) {parts:.1f} µs")
    for us, name, n in rows:
        print(f"  {name:<28} x{n:<4} {us:8.1f} µs  {us / n:6.2f} µs each  {100 * us / parts:5.1f}%")


def profile(backend: CudaBackend, ctx: int) -> None:
    rt = backend.rt
    backend.truncate(0)
    backend.prefill(list(range(1, ctx + 1)))
    backend.set_sampling(SamplingParams(temperature=0.0), seed=0)
    backend.graphs.clear()
    full = None

    def capture():
        nonlocal full
        full = backend._graph(backend.splits_for(backend.n_past + 200), sample=True)

    record = recorded(rt, capture)
    backend._write_step(1)
    total = full.replay_us(rt, replays=30)
    report(rt, record, total, f"ctx {ctx}: {len(record)} kernels, graph {total:.1f} µs/token ({1e6 / total:.0f} tok/s)")


def profile_verify(backend: CudaBackend, ctx: int, T: int) -> None:
    """The verify graph of T rows at ctx tokens of context, per kernel name, as profile() does decode."""
    rt = backend.rt
    backend.truncate(0)
    backend.prefill(list(range(1, ctx + 1)))
    backend.set_sampling(SamplingParams(temperature=0.0), seed=0)
    backend.verify_sample(list(range(1, T + 1)))  # uploads the rows' tokens and positions; warms the kernels
    backend.truncate(ctx)
    n_keys = ctx + T
    record = recorded(rt, lambda: backend._verify_launches(T, backend.splits_for(n_keys),
                                                          backend.prefill_splits_for(n_keys)))
    rt.synchronize()
    g = graph_of(rt, record)
    total = g.replay_us(rt, replays=30)
    g.destroy()
    report(rt, record, total, f"verify {T} rows at ctx {ctx}: {len(record)} kernels, graph {total:.1f} µs")


def profile_prefill(backend: CudaBackend, n: int) -> None:
    rt = backend.rt
    if not 16 < n <= PREFILL_CHUNK:
        raise SystemExit(f"profile_decode: --prefill takes 17..{PREFILL_CHUNK} tokens (one GEMM forward)")
    backend.truncate(0)
    record = recorded(rt, lambda: backend.prefill(list(range(1, n + 1))))
    rt.synchronize()
    g = graph_of(rt, record)
    total = g.replay_us(rt, replays=3)
    g.destroy()
    report_by_events(rt, record, f"prefill {n}: {len(record)} kernels, graph {total:.1f} µs ({n * 1e6 / total:,.0f} tok/s)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ctx", type=int, action="append")
    p.add_argument("--off", action="append", default=[], help="a GpuOps fusion switch to turn off")
    p.add_argument("--prefill", type=int, metavar="N", help="profile one N-token prefill forward instead")
    p.add_argument("--verify", type=int, action="append", metavar="T",
                   help="also profile the verify graph of T rows (repeatable)")
    args = p.parse_args()
    ctxs = args.ctx or [128]
    backend = CudaBackend(open_gguf(args.model), n_ctx=max(ctxs + [args.prefill or 0]) + 300)
    try:
        for name in args.off:
            if not name.startswith("fuse_") or not hasattr(backend.ops, name):
                raise SystemExit(f"profile_decode: no fusion switch {name!r}")
            setattr(backend.ops, name, False)
        if args.off:
            print("off:", ", ".join(args.off))
        if args.prefill:
            profile_prefill(backend, args.prefill)
            return
        for ctx in ctxs:
            profile(backend, ctx)
            for T in args.verify or []:
                profile_verify(backend, ctx, T)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
