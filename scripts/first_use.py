"""First-use costs: the replies of a fresh engine, as the app sees them (Engine.load, then
complete() on the engine thread), for a long first prompt and short turns after it.

issue 16's real-app check found the first reply after a long prompt prefilling at half of
memra-bench's pp and decoding at 40% of later replies; this separates that from the app. Each
turn prints TTFT, the prefill and decode tok/s of EngineStats, and the reply's wall time.
Run on the GPU machine: python scripts/first_use.py MODEL [--words 2000] [--turns 3]
(CUDA_MODULE_LOADING=EAGER in the environment compares eager module loading).
"""
from __future__ import annotations

import argparse
import time

from memra_engine.generate import Engine
from memra_engine.sampling import SamplingParams

WORDS = ("the quiet river ran past old stone walls while children counted boats and "
         "merchants argued over the price of salt beneath a sky the color of pewter").split()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--words", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args()
    t0 = time.perf_counter()
    engine = Engine.load(args.model, backend=args.backend, n_ctx=args.ctx)
    print(f"load {time.perf_counter() - t0:.2f} s")
    prompt = " ".join(WORDS[i % len(WORDS)] for i in range(args.words))
    try:
        for turn in range(args.turns):
            sampling = SamplingParams(max_tokens=args.tokens, seed=turn + 1)
            t = time.perf_counter()
            result = engine.complete(prompt, sampling).collect()
            wall = time.perf_counter() - t
            s = engine.stats()
            print(f"turn {turn + 1}: prompt {s.n_prompt_tokens} tok, TTFT {1000 * s.time_to_first_token_s:.0f} ms, "
                  f"prefill {s.prefill_tok_s:,.0f} tok/s, decode {s.decode_tok_s:,.0f} tok/s over {s.n_generated}, "
                  f"wall {1000 * wall:.0f} ms, ctx {s.n_ctx_used}, end {result.done.reason}")
            prompt = prompt + result.text + " and then " + " ".join(WORDS[:8])
    finally:
        engine.close()


if __name__ == "__main__":
    main()
