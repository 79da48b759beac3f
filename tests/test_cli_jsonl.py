"""`memra-chat --prompt … --top-logprobs N` / `--format jsonl`: one JSON object per token (with its
candidates), then one for the end; the tokens are the ones the text mode prints for the seed."""
from __future__ import annotations

import json

from memra_tui import cli
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)


def run(capsys, *args: str) -> tuple[int, list[str], str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err


def test_jsonl_carries_each_token_and_its_candidates(capsys, tiny_llama_path):
    base = (str(tiny_llama_path), "--backend", "cpu", "--prompt", "hello", "--seed", "4", "-n", "10", "--top-k", "6")
    rc, text_lines, _ = run(capsys, *base)
    assert rc == 0
    rc, lines, _ = run(capsys, *base, "--top-logprobs", "4")
    assert rc == 0
    rows = [json.loads(line) for line in lines]
    tokens, end = rows[:-1], rows[-1]
    assert end["done"] in ("length", "eos") and end["n_generated"] == len(tokens) > 0
    assert "".join(t["text"] for t in tokens) == "\n".join(text_lines).rstrip("\n")  # the same draws
    for t in tokens:
        assert {"text", "id", "logprob", "rank", "model", "final"} <= t.keys()
        assert len(t["model"]) == 4 and 1 <= len(t["final"]) <= 4
        assert [c["model_prob"] for c in t["model"]] == sorted((c["model_prob"] for c in t["model"]), reverse=True)
        assert all(c["removed_by"] == "" and c["final_prob"] > 0 for c in t["final"])
        assert all(c["removed_by"] in ("", "top_k", "top_p", "min_p") for c in t["model"])


def test_jsonl_without_candidates_and_the_flag_mistakes(capsys, tiny_llama_path):
    base = (str(tiny_llama_path), "--backend", "cpu", "--prompt", "hello", "--seed", "4", "-n", "5")
    rc, lines, _ = run(capsys, *base, "--format", "jsonl")
    assert rc == 0 and all("model" not in json.loads(line) for line in lines)
    assert json.loads(lines[-1])["done"] in ("length", "eos")
    rc, lines, err = run(capsys, *base, "--top-logprobs", "3", "--format", "text")
    assert rc == 1 and not lines and err.strip().splitlines()[-1].startswith("memra-chat: error: --top-logprobs")
    rc, lines, err = run(capsys, *base, "--top-logprobs", "21")
    assert rc == 1 and "top_logprobs must be in [0, 20]" in err.strip().splitlines()[-1]
