"""Cancel storms on the CPU backend (issue 17 §4): 100 replies cancelled at random points, then the
next greedy reply equals a fresh engine's, token for token; also with a grammar and with
speculative decoding (prompt lookup). The GPU twin is tests/gpu/test_cancel_storm_gpu.py."""
from __future__ import annotations

import pytest
from cancel_storm import greedy_ids, run_cancel_storm
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)

from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.speculative import SpecConfig

CASES = {
    "plain": (None, None),
    "grammar": (Grammar.regex("[a-z ]{8,80}"), None),
    "lookup": (None, SpecConfig(mode="lookup", draft_max=4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cancel_storm_leaves_the_next_greedy_reply_as_a_fresh_engines(tiny_llama_path, case):
    grammar, spec = CASES[case]
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        tally = run_cancel_storm(eng, n_cancels=100, seed=17, grammar=grammar, spec=spec)
        after, done = greedy_ids(eng, grammar, spec)
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as fresh:
        want, want_done = greedy_ids(fresh, grammar, spec)
    assert tally.get("cancelled", 0) >= 60, tally  # most cuts land while the reply runs
    assert after == want and done == want_done, (case, tally)
