"""`memra-bench`: prompt processing (pp512), decode (tg128) and peak memory, llama-bench style.

Each figure is the median of --runs repetitions on the backend directly (no engine thread, no
sampling beyond argmax), so it measures the forward pass:
- pp512: one prefill of 512 random tokens into an empty cache;
- tg128: 128 greedy decode steps after a one-token prompt;
- tg128 at --ctx-depth N (optional): the same after prefilling N tokens;
- peak_rss_mb: the process's peak resident set (VmHWM), weights and caches included.

A backend may add its own figures (VRAM pool, graph replay share, …) by providing
    bench_extras(runs: int, depth: int) -> dict[str, float | int | str]
which is called after the standard tests; its keys are merged into the JSON and printed.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from memra_engine.errors import MemraError
from memra_engine.kv_type import check_kv_type

PROG = "memra-bench"
PREFILL_CHUNK = 512


def peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: ru_maxrss survives execve, so a bench started from a large process
    # (a test runner holding torch) would report its parent's resident set from before the exec
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def random_tokens(vocab_size: int, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, size=n).tolist()


def fill_cache(backend, tokens: list[int]) -> np.ndarray:
    logits = None
    for start in range(0, len(tokens), PREFILL_CHUNK):
        logits = backend.prefill(tokens[start : start + PREFILL_CHUNK])
    return logits


def time_prefill(backend, tokens: list[int]) -> float:
    backend.truncate(0)
    t0 = time.perf_counter()
    backend.prefill(tokens)
    return len(tokens) / (time.perf_counter() - t0)


def time_decode(backend, context: list[int], n: int) -> float:
    backend.truncate(0)
    logits = fill_cache(backend, context)
    t0 = time.perf_counter()
    for _ in range(n):
        logits = backend.decode(int(np.argmax(logits)))
    return n / (time.perf_counter() - t0)


def run_bench(model: Path, kind: str, runs: int, n_prompt: int, n_gen: int, ctx_depth: int | None,
              progress=lambda msg: None, kv_type: str = "f16", moe_share: float | None = None) -> dict:
    from memra_engine.backend_select import choose_backend, create_backend
    from memra_engine.model.gguf_file import open_gguf

    kind = choose_backend(kind, progress)
    g = open_gguf(model)
    n_ctx = max(n_prompt, (ctx_depth or 0) + n_gen + 1, n_gen + 2) + 16
    moe_vram = None
    if moe_share is not None:  # that share of the experts' bytes in VRAM: the expert cache
        moe_vram = int(moe_share * sum(t.n_bytes for n, t in g.tensors.items() if n.endswith("_exps.weight")))
    backend = create_backend(kind, g, n_ctx, kv_type=kv_type, moe_vram=moe_vram)
    try:
        vocab = backend.config.vocab_size
        progress("warming up…")  # both paths at their timed sizes, as llama-bench warms up
        time_prefill(backend, random_tokens(vocab, n_prompt, runs))
        time_decode(backend, random_tokens(vocab, 8, 0), 4)
        result: dict = {"model": model.name, "backend": kind, "kv_type": kv_type, "runs": runs}
        progress(f"pp{n_prompt} x{runs}…")
        result[f"pp{n_prompt}_tok_s"] = statistics.median(
            time_prefill(backend, random_tokens(vocab, n_prompt, seed)) for seed in range(runs))
        progress(f"tg{n_gen} x{runs}…")
        result[f"tg{n_gen}_tok_s"] = statistics.median(
            time_decode(backend, random_tokens(vocab, 1, seed), n_gen) for seed in range(runs))
        if ctx_depth:
            progress(f"tg{n_gen} at depth {ctx_depth} x{runs}…")
            result[f"tg{n_gen}_at_{ctx_depth}_tok_s"] = statistics.median(
                time_decode(backend, random_tokens(vocab, ctx_depth, seed), n_gen) for seed in range(runs))
        moe = backend.moe_stats()
        if moe is not None:  # over pp and tg above (the graph-only figures below do not update the cache)
            result.update(moe_hit_rate=round(moe.total_hit_rate, 4), moe_copy_gb_s=round(moe.copy_gb_s, 2),
                          moe_resident=f"{moe.resident_experts}/{moe.total_experts}")
        extras = getattr(backend, "bench_extras", None)
        if extras is not None:
            result.update(extras(runs, depth=ctx_depth or 4096))
        result["peak_rss_mb"] = peak_rss_mb()
        return result
    finally:
        backend.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Measure prompt processing (pp), decode (tg) and peak memory.")
    p.add_argument("model", nargs="?", metavar="MODEL", help="path to a .gguf file (default: the default model)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto", help="backend to measure (default auto)")
    p.add_argument("--kv-type", default="f16", metavar="f16|q8_0",
                   help="KV cache element type: f16, or q8_0 for about half the memory (default f16)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--runs", type=int, default=None, metavar="N", help="repetitions per test (default 5 cuda, 3 cpu)")
    p.add_argument("--ctx-depth", type=int, default=None, metavar="N", help="also time tg after N tokens of context")
    p.add_argument("--n-prompt", type=int, default=512, metavar="N", help="prompt tokens for pp (default 512)")
    p.add_argument("--n-gen", type=int, default=128, metavar="N", help="decoded tokens for tg (default 128)")
    p.add_argument("--moe-share", type=float, default=None, metavar="F",
                   help="MoE: keep this share (0-1) of the experts' bytes in VRAM, the rest behind the expert cache")
    return p


def print_table(result: dict) -> None:
    print(f"model: {result['model']}   backend: {result['backend']}   KV {result['kv_type']}   "
          f"median of {result['runs']} runs")
    for key, value in result.items():
        if key in ("model", "backend", "kv_type", "runs"):
            continue
        if isinstance(value, dict):  # vram_regions_mib: one line per pool region
            print(f"  {key}")
            for region, mib in value.items():
                print(f"    {region:<22} {mib['used']:>12,.1f} used of {mib['reserved']:,.1f}")
            continue
        shown = f"{value:,.1f}" if isinstance(value, float) else str(value)
        print(f"  {key:<24} {shown:>12}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    say = (lambda msg: None) if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        for name in ("runs", "n_prompt", "n_gen"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise MemraError(f"--{name.replace('_', '-')} must be >= 1")
        check_kv_type(args.kv_type)
        if args.model is None:
            from memra_engine.default_model import ensure_default_model

            model = ensure_default_model(lambda msg: print(msg, file=sys.stderr, flush=True))
        else:
            model = Path(args.model)
            if not model.is_file():
                raise MemraError(f"model file not found: {model}")
        runs = args.runs
        if runs is None:
            from memra_engine.backend_select import choose_backend

            runs = 5 if choose_backend(args.backend) == "cuda" else 3
        if args.moe_share is not None and not 0 < args.moe_share <= 1:
            raise MemraError("--moe-share must be in (0, 1]")
        result = run_bench(model, args.backend, runs, args.n_prompt, args.n_gen, args.ctx_depth, say, args.kv_type,
                           args.moe_share)
    except MemraError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
