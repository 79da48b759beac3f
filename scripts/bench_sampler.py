"""Device time of the sampler alone (penalize + stage 1 + finish), greedy vs filtered knobs.

Each setting's launches are captured 20 times into one graph and the graph is replayed (METHOD.md:
graphs shrink the launch gaps; python launches cost ~10 us each). Logits stay the same between
draws (penalties off), so every draw does the same work.

Two kinds of logits: "normal3" is N(0, 3^2) (the round-2 figures; with top_p 0.95 and top_k off
its nucleus is ~9% of the vocabulary, wider than the candidates: the worst case), "peaked" a
dozen likely tokens over a N(0, 1.5^2) floor (closer to a model's logits).

    python scripts/bench_sampler.py          # vocabularies 49152 (SmolLM2) and 262144 (Gemma3)

Each setting is also timed with 10 candidates per draw (top_logprobs=10, the token inspector),
and for the default knobs each launch of the candidates path alone (where their cost goes).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from memra_engine.gpu.graph import CudaGraph
from memra_engine.gpu.memory import VramPool
from memra_engine.gpu.runtime import GpuRuntime
from memra_engine.gpu.sampler import GpuSampler
from memra_engine.sampling import SamplingParams

SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "temp 0.7 (gumbel)": SamplingParams(top_k=0, top_p=1.0, min_p=0.0),
    "default (k40 p.95 m.05)": SamplingParams(),
    "top_k 0, top_p 0.95": SamplingParams(top_k=0, min_p=0.0),
    "top_k 0, min_p 0.05": SamplingParams(top_k=0, top_p=1.0),
    "top_k 0, p.95 m.05": SamplingParams(top_k=0),
}


def make_logits(kind: str, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "normal3":
        return (rng.standard_normal(vocab) * 3).astype(np.float32)
    x = rng.standard_normal(vocab) * 1.5
    x[rng.choice(vocab, 12, replace=False)] += rng.uniform(12, 17, 12)
    return x.astype(np.float32)
PER_GRAPH = 20


def main() -> None:
    rt = GpuRuntime(families=["sampling"])
    rt.resolve_all()
    pool = VramPool({"graph": 64 << 20, "scratch": 64 << 20})
    try:
        run(rt, pool)
    finally:  # PyCUDA aborts at exit when the context is still current
        pool.close()
        rt.close()


def run(rt, pool) -> None:
    print(f"{'vocab':>7}  {'logits':<8} {'setting':<24} {'us/draw':>8} {'+cand10':>8}")
    for vocab, kind in [(v, k) for v in (49152, 262144) for k in ("normal3", "peaked")]:
        sampler = GpuSampler(rt, pool, vocab)
        logits = pool.alloc("scratch", vocab * 4, "logits").ptr
        hist = pool.alloc("scratch", 256, "hist").ptr
        pos = pool.alloc("scratch", 16, "pos").ptr
        rt.upload(logits, make_logits(kind, vocab))
        rt.upload(hist, np.arange(64, dtype=np.int32))
        rt.upload(pos, np.array([63], np.int32))
        for name, params in SETTINGS.items():
            us = [timed(rt, sampler, lambda: sampler.launch(logits, hist, pos), replace(params, top_logprobs=n))
                  for n in (0, 10)]
            print(f"{vocab:>7}  {kind:<8} {name:<24} {us[0]:8.1f} {us[1]:8.1f}")
        breakdown(rt, sampler, logits, hist, pos)


def timed(rt, sampler, launch, params) -> float:
    """Device µs of one `launch` (PER_GRAPH of them in a graph, replayed)."""
    sampler.set_params(params, seed=1)
    rt.synchronize()
    graph = CudaGraph()
    with graph.capture(rt):
        for _ in range(PER_GRAPH):
            launch()
    us = graph.replay_us(rt, batches=7) / PER_GRAPH
    graph.destroy()
    return us


def breakdown(rt, sampler, logits, hist, pos) -> None:
    """The candidates path's launches one by one, default knobs (after a full draw set the state)."""
    params = SamplingParams(top_logprobs=10)
    sampler.set_params(params, seed=1)
    sampler.launch(logits, hist, pos)
    rt.synchronize()
    s, n = sampler, sampler.n_blocks
    out, cuts = s.out_ptr, s.out_ptr + 8
    steps = {
        "copy raw": lambda: rt.copy_async(s.raw_ptr, logits, 4 * s.vocab),
        "stage1 raw (skipped: no penalties)": lambda: s._stage1(s.raw_ptr, s.cand_params_ptr, s.cand_part, s.model_v, s.model_i, 32),
        "penalize": lambda: rt.launch("sample_penalize", 1, 256, (logits, s.params_ptr, hist, pos, s.vocab)),
        "stage1 (draw)": lambda: s._stage1(logits, s.params_ptr, s.part_ptr, s.cand_v, s.cand_i, s.local_k),
        "finish (+cuts)": lambda: rt.launch("sample_finish", 1, 1024, (
            logits, s.params_ptr, s.part_ptr, s.cand_v, s.cand_i, n, s.local_k, s.vocab, 0, 0, out, cuts),
            shared=s.finish_shared),
        "stage1 final (skipped)": lambda: s._stage1(logits, s.final_params_ptr, s.part_ptr, s.final_v, s.final_i, 32),
        "sample_candidates": lambda: rt.launch("sample_candidates", 1, 1024, (
            s.raw_ptr, logits, s.params_ptr, s.cand_part, s.model_v, s.model_i, s.final_v, s.final_i, s.part_ptr, n,
            s.vocab, out, cuts)),
    }
    print("  " + "  ".join(f"{name} {timed(rt, sampler, fn, params):.1f}" for name, fn in steps.items()))


if __name__ == "__main__":
    main()
