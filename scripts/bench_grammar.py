"""Decode speed with a grammar against the same run without one, in the engine path users get
(Engine.chat: decode_sample or the masked step pair, default knobs), and the host's mask time.

    python scripts/bench_grammar.py MODEL.gguf [--backend cuda] [--runs 5] [--tokens 256]

For each case, --runs replies of up to --tokens tokens (seeds 0..runs-1); the figure is the median
of the replies' decode tok/s (EngineStats.decode_tok_s: the first token, which feeds the prompt's
last, is prefill). Mask time: median and p99 over every token of every reply. A random-weight model
writes long JSON strings, which is the steady state the ratio is about; the person schema adds
short replies with more structure. Prints one JSON line per case and a table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "grammars"
TEXT_SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
               "required": ["title", "text"]}
PROMPT = [{"role": "user", "content": "Write a short story about a fox, as JSON."}]


def cases() -> list[tuple[str, Grammar | None]]:
    return [("none", None), ("json_schema:text", Grammar.json_schema(TEXT_SCHEMA)),
            ("json_schema:person.json", Grammar.from_file(ASSETS / "person.json")), ("json", Grammar.json())]


def run_case(eng: Engine, grammar: Grammar | None, runs: int, tokens: int) -> dict:
    speeds, n_tokens, mask_med, mask_p99 = [], [], [], []
    for seed in range(runs):
        result = eng.chat(PROMPT, SamplingParams(seed=seed, max_tokens=tokens), grammar=grammar).collect()
        if result.done.reason == "error":
            raise SystemExit(f"bench_grammar: {result.done.error}")
        stats = result.stats
        if stats.n_generated > 8:  # a reply that ended at once says nothing about decode speed
            speeds.append(stats.decode_tok_s)
        n_tokens.append(stats.n_generated)
        mask_med.append(stats.grammar_mask_ms_median)
        mask_p99.append(stats.grammar_mask_ms_p99)
    return {"decode_tok_s": statistics.median(speeds) if speeds else 0.0, "replies": runs,
            "tokens": n_tokens, "mask_ms_median": statistics.median(mask_med),
            "mask_ms_p99": max(mask_p99)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--backend", default="cuda", choices=("auto", "cpu", "cuda"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--ctx", type=int, default=2048)
    args = p.parse_args(argv)
    rows = []
    with Engine.load(args.model, backend=args.backend, n_ctx=args.ctx) as eng:
        eng.chat(PROMPT, SamplingParams(seed=0, max_tokens=32), grammar=Grammar.json()).collect()  # warm up
        for name, grammar in cases():
            row = {"model": args.model.name, "backend": eng.info.backend, "grammar": name,
                   **run_case(eng, grammar, args.runs, args.tokens)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    base = rows[0]["decode_tok_s"]
    print(f"\n{'grammar':26} {'tok/s':>9} {'vs none':>8} {'mask ms med':>12} {'p99':>7}  tokens")
    for row in rows:
        ratio = row["decode_tok_s"] / base if base else 0.0
        print(f"{row['grammar']:26} {row['decode_tok_s']:9.1f} {ratio:8.3f} {row['mask_ms_median']:12.3f} "
              f"{row['mask_ms_p99']:7.3f}  {row['tokens']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
