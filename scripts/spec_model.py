"""A model of prompt lookup's speedup on the GPU, from greedy replies and measured verify costs.

Greedy replies do not depend on speculation (docs/design.md §5 rule 3), so one plain reply per
prompt says what every draft would keep: a round that drafts d tokens at position i keeps the
longest common prefix of the draft and the reply from i, and emits that plus one token. The
engine's own PromptLookup and DraftLength make the drafts, so the model follows the code. Each
round costs a verify of d + 1 rows, in decode steps, from the H200's measured table
(docs/gpu-log.md, "Speculative decoding"); a plain step costs one.

    python scripts/spec_model.py collect MODEL.gguf replies.json [--prompts bench|held-out|all]  # greedy replies (any backend)
    python scripts/spec_model.py model replies.json [--draft-max 8] [--always-ahead] [--switch 2] [--plain-step 1.1] [--round 0.16]
        [--verify-cost 1.05,1.25,1.56,2.40,4.08]  (what-if: verify costs other than the measured ones)
        [--verify-rows 1,2,4,8,9,16 --verify-cost 1,1.30,1.65,1.86,2.80,3.20]  (costs at other row counts;
        between two given counts the cost is interpolated, so a step such as 8 -> 9 rows needs both)

--switch: decode steps lost when a round follows a plain step that queued steps ahead (the
run-ahead queue its verify waits out: 2); --plain-step: a plain step's cost without its run-ahead
(the GPU waits out the host's round trip: estimated at 1.1, not measured); --round: host time per
round, in decode steps; --always-ahead: every plain step queues ahead, as before session 25. With
--always-ahead the model gave 1.31 / 1.47 / 1.31 / 2.42x on bench_spec.py's prompts where the H200
measured 1.27 / 1.42 / 1.28 / 2.35x (session 24), with the same acceptance and mean kept length.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from memra_engine.speculative import DraftLength, PromptLookup, SpecConfig

# verify of r rows against a decode+sample step, SmolLM2-135M on the H200 (R2 batched matvecs)
VERIFY_ROWS = [1, 2, 4, 8, 16]
VERIFY_COST = [1.049, 1.248, 1.563, 2.402, 4.081]


def collect(model: str, out: Path, backend: str, max_tokens: int, prompts: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_spec import prompt_set

    from memra_engine.generate import Engine, prompt_ids
    from memra_engine.model.gguf_file import open_gguf
    from memra_engine.chat_template import ChatTemplate
    from memra_engine.sampling import SamplingParams
    from memra_engine.tokenizer import load_tokenizer

    g = open_gguf(model)
    tokenizer, template = load_tokenizer(g), ChatTemplate.from_gguf(g)
    replies = []
    with Engine.load(model, backend=backend, n_ctx=4096) as eng:
        for prompt in prompt_set(prompts):
            messages = [{"role": "user", "content": prompt}]
            r = eng.chat(messages, SamplingParams(temperature=0.0, max_tokens=max_tokens)).collect()
            replies.append({"prompt": prompt_ids(tokenizer, template, messages, None), "reply": r.token_ids})
            print(f"prompt {len(replies) - 1}: {len(r.token_ids)} tokens ({r.done.reason})")
    out.write_text(json.dumps(replies))


def model_reply(prompt: list[int], reply: list[int], spec: SpecConfig, switch: float, round_s: float,
                plain_step: float, always_ahead: bool) -> dict:
    """The modelled speedup of one reply. A plain step queues steps ahead as DeviceSpeculative's
    does (only where PromptLookup.may_draft_next says no draft can follow; always, with
    always_ahead, as before session 25); one that did costs 1 and makes a round right after it
    pay `switch`; one that did not costs plain_step."""
    history, lookup, length = list(prompt), PromptLookup(), DraftLength(spec)
    i, cost, rounds, drafted, kept_total, queued = 0, 0.0, 0, 0, 0, False
    while i < len(reply):
        k = min(length.next(), len(reply) - i)
        drafts = lookup.propose(history, k) if k >= spec.draft_min else []
        if len(drafts) < spec.draft_min:
            queued = always_ahead or not lookup.may_draft_next(history) or length.resting()
            cost += 1.0 if queued else plain_step
            history.append(reply[i])
            i += 1
            continue
        kept = 0
        while kept < len(drafts) and i + kept < len(reply) and drafts[kept] == reply[i + kept]:
            kept += 1
        cost += float(np.interp(len(drafts) + 1, VERIFY_ROWS, VERIFY_COST)) + round_s + (switch if queued else 0.0)
        rounds, drafted, kept_total, queued = rounds + 1, drafted + len(drafts), kept_total + kept, False
        length.update(kept)
        n = min(kept + 1, len(reply) - i)
        history += reply[i:i + n]
        i += n
    return {"speedup": len(reply) / cost, "rounds": rounds, "acceptance": kept_total / max(drafted, 1),
            "kept": kept_total / max(rounds, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("model")
    c.add_argument("out", type=Path)
    c.add_argument("--backend", default="cpu")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--prompts", choices=("bench", "held-out", "all"), default="bench")
    m = sub.add_parser("model")
    m.add_argument("replies", type=Path)
    m.add_argument("--draft-max", type=int, default=SpecConfig().draft_max)
    m.add_argument("--switch", type=float, default=2.0)
    m.add_argument("--round", type=float, default=0.16)
    m.add_argument("--plain-step", type=float, default=1.1)
    m.add_argument("--always-ahead", action="store_true", help="every plain step queues ahead (before session 25)")
    m.add_argument("--verify-cost", default=None, metavar="C1,C2,C4,C8,C16",
                   help="verify of 1, 2, 4, 8, 16 rows in decode steps (default: the H200's measured VERIFY_COST)")
    m.add_argument("--verify-rows", default=None, metavar="R1,R2,...",
                   help="the row counts --verify-cost gives costs for (default 1,2,4,8,16)")
    args = p.parse_args()
    if args.command == "collect":
        collect(args.model, args.out, args.backend, args.max_tokens, args.prompts)
        return
    if args.verify_rows:
        VERIFY_ROWS[:] = [int(r) for r in args.verify_rows.split(",")]
    if args.verify_cost:
        VERIFY_COST[:] = [float(c) for c in args.verify_cost.split(",")]
        if len(VERIFY_COST) != len(VERIFY_ROWS):
            raise SystemExit(f"--verify-cost takes {len(VERIFY_ROWS)} costs, for {VERIFY_ROWS} rows")
    spec = SpecConfig(mode="lookup", draft_max=args.draft_max)
    rows = [model_reply(r["prompt"], r["reply"], spec, args.switch, args.round, args.plain_step, args.always_ahead) for r in json.loads(args.replies.read_text())]
    for i, r in enumerate(rows):
        print(f"prompt {i}: {r['speedup']:.2f}x  acceptance {r['acceptance']:.0%}  mean kept {r['kept']:.2f}  rounds {r['rounds']}")
    print(f"median {statistics.median(r['speedup'] for r in rows):.2f}x")


if __name__ == "__main__":
    main()
