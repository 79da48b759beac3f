"""Speculative decoding benchmarks (the GPU; the cpu backend works too, slowly).

  python scripts/bench_spec.py verify MODEL [--runs 30]
      wall time of verify_sample over k = 1, 2, 4, 8, 9, 16 tokens (forward + device sampler on every
      row, one graph, 8 bytes a row back) against one decode step: verify_sample of 1 token, and
      the graph replay of a decode+sample step (device time, what memra-bench's tg128 times).
  python scripts/bench_spec.py lookup MODEL [--max-tokens 256]
      greedy replies to input-grounded prompts (edit this code, quote this text), plain and with
      prompt lookup, in the engine (the path users get): tok/s, the same tokens or not, acceptance
      and mean accepted length. --prompts bench (the four below, default) | held-out | all.
  python scripts/bench_spec.py draft MODEL --draft DRAFT
      the same with a draft model.
Medians over the prompts' runs; print a table last.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

CODE = '''def parse_config(path):
    """Read a key = value file into a dict, skipping comments and blank lines."""
    config = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def merge_configs(base, override):
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
'''
TEXT = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
        "the members agreed to increase funding for the library by ten percent, to repair the roof of the "
        "community hall before winter, and to postpone the new parking lot until the spring. The chair "
        "thanked the volunteers who had organised the summer festival, which raised more money than in any "
        "previous year, and asked the secretary to publish the minutes on the town website by Friday.")
PROMPTS = [
    f"Rename the function parse_config to read_config in this code. Show the whole code.\n\n{CODE}",
    f"Add type hints to this code and show the whole code.\n\n{CODE}",
    f"Quote the following text exactly, then say in one line what it is about.\n\n{TEXT}",
    f"Repeat this text word for word:\n\n{TEXT}",
]

CODE2 = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1]

    def __len__(self):
        return len(self.items)
'''
TEXT2 = ("Rivers shape the land they cross. Over thousands of years, a river carves valleys, moves sediment "
         "downstream and builds deltas where it meets the sea. Floods spread fertile silt across the plains, "
         "which is why so many early farming villages grew up beside rivers. Today dams and levees control "
         "many of the world's large rivers, trading the old floods for electricity and safer towns.")
# a second set, written after PromptLookup's session-37 rules were first picked on PROMPTS (both
# sets then compared the candidates: docs/gpu-log.md, session 37)
HELD_OUT_PROMPTS = [
    f"Add a docstring to every method of this class and show the whole class.\n\n{CODE2}",
    f"Fix the bug in peek (it fails on an empty stack) and show the whole class.\n\n{CODE2}",
    f"Rename merge_configs to combine_configs in this code and show all of it.\n\n{CODE}",
    f"Copy this paragraph exactly, then give it a title.\n\n{TEXT2}",
    f"Rewrite this paragraph in the past tense.\n\n{TEXT2}",
    f"Turn each sentence of this text into a bullet point.\n\n{TEXT}",
]


def prompt_set(name: str) -> list[str]:
    """--prompts: "bench" (the four the figures in docs/gpu-log.md use), "held-out" or "all"."""
    return {"bench": PROMPTS, "held-out": HELD_OUT_PROMPTS, "all": PROMPTS + HELD_OUT_PROMPTS}[name]


def bench_verify(args) -> None:
    from memra_engine.backend_select import choose_backend, create_backend
    from memra_engine.model.gguf_file import open_gguf
    from memra_engine.sampling import SamplingParams

    b = create_backend(choose_backend(args.backend), open_gguf(args.model), 1024)
    rng = np.random.default_rng(0)
    b.prefill(rng.integers(0, b.config.vocab_size, 128).tolist())
    n0 = b.n_past
    b.set_sampling(SamplingParams(temperature=0.0), seed=0)
    tokens = rng.integers(0, b.config.vocab_size, 16).tolist()
    rows = []
    for k in (1, 2, 4, 8, 9, 16):  # 9: draft_max 8's full round (8 drafts and the bonus row)
        times = []
        for i in range(args.runs + 3):
            b.truncate(n0)
            t0 = time.perf_counter()
            b.verify_sample(tokens[:k])
            if i >= 3:  # the first calls capture the graph
                times.append(time.perf_counter() - t0)
        rows.append((k, statistics.median(times) * 1e6))
    b.truncate(n0)
    graph_us, _ = b.graph_step_us(64)
    base = rows[0][1]
    print(f"verify cost, {args.model}: one decode step = verify_sample(1) {base:.0f} us wall "
          f"(decode+sample graph replay: {graph_us:.0f} us device)")
    print("| k | verify_sample wall us | x one decode step |")
    print("|---|---|---|")
    for k, us in rows:
        print(f"| {k} | {us:.0f} | {us / base:.2f} |")
    b.close()


def bench_replies(args, mode: str) -> None:
    from memra_engine.generate import Engine
    from memra_engine.sampling import SamplingParams
    from memra_engine.speculative import SpecConfig

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    table = []
    with Engine.load(args.model, backend=args.backend, n_ctx=4096, draft=args.draft) as eng:
        for i, prompt in enumerate(prompt_set(args.prompts)):
            msgs = [{"role": "user", "content": prompt}]
            eng.chat(msgs, SamplingParams(temperature=0.0, max_tokens=8)).collect()  # warm the graphs
            plain_runs = [eng.chat(msgs, params).collect() for _ in range(args.runs)]
            p_tok_s = statistics.median(r.stats.decode_tok_s for r in plain_runs)
            for draft_max in args.draft_max:
                spec = SpecConfig(mode=mode, draft_max=draft_max)
                spec_runs = [eng.chat(msgs, params, spec=spec).collect() for _ in range(args.runs)]
                for r in plain_runs + spec_runs:
                    if r.done.reason == "error":
                        raise SystemExit(f"prompt {i}: {r.done.error}")
                plain, sp = plain_runs[-1], spec_runs[-1]
                s_tok_s = statistics.median(r.stats.decode_tok_s for r in spec_runs)
                st = sp.stats
                table.append((i, draft_max, len(plain.token_ids), p_tok_s, s_tok_s, plain.token_ids == sp.token_ids,
                              st.spec_acceptance, st.spec_mean_length, st.spec_rounds))
    print(f"{mode}, {args.model}" + (f", draft {args.draft}" if args.draft else "") +
          f", greedy, max {args.max_tokens} tokens, median of {args.runs}")
    print("| prompt | draft_max | tokens | plain tok/s | spec tok/s | speedup | same tokens | acceptance | mean kept/round | rounds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, k, n, p, s, same, acc, mean, rounds in table:
        print(f"| {i} | {k} | {n} | {p:.0f} | {s:.0f} | {s / p:.2f}x | {same} | {acc:.0%} | {mean:.2f} | {rounds} |")
    for k in args.draft_max:
        speedups = [s / p for _, kk, _, p, s, *_ in table if kk == k]
        print(f"draft_max {k}: median speedup {statistics.median(speedups):.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("verify", "lookup", "draft"))
    p.add_argument("model")
    p.add_argument("--draft", default=None)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompts", choices=("bench", "held-out", "all"), default="bench")
    p.add_argument("--draft-max", default=None, help="comma-separated draft_max values (default: the engine's)")
    args = p.parse_args()
    if args.draft_max is None:
        from memra_engine.speculative import DEFAULT_DRAFT_MAX

        args.draft_max = str(DEFAULT_DRAFT_MAX)
    args.draft_max = [int(k) for k in args.draft_max.split(",")]
    if args.what == "verify":
        args.runs = max(args.runs, 30)
        bench_verify(args)
    else:
        bench_replies(args, "lookup" if args.what == "lookup" else "draft")


if __name__ == "__main__":
    main()
