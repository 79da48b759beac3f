"""Cancel storms on the cuda backend (issue 17 §4), the twin of tests/test_cancel_storm.py: 100
replies cancelled at random points (before the job, inside the prefill, after a few tokens, after
a random delay), then the next greedy reply equals a fresh cuda engine's, token for token; also
with a grammar and with speculative decoding (prompt lookup)."""
from __future__ import annotations

import pytest
from cancel_storm import greedy_ids, run_cancel_storm

from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.speculative import SpecConfig

pytestmark = pytest.mark.gpu

CASES = {
    "plain": (None, None),
    "grammar": (Grammar.regex("[a-z ]{8,80}"), None),
    "lookup": (None, SpecConfig(mode="lookup", draft_max=4)),
}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", preset="tiny-llama", seed=7,
                                head_dim=64, n_head=4, n_kv_head=2, d_model=256)


@pytest.mark.parametrize("case", list(CASES))
def test_cuda_cancel_storm_leaves_the_next_greedy_reply_as_a_fresh_engines(tiny_path, case):
    grammar, spec = CASES[case]
    with Engine.load(tiny_path, backend="cuda", n_ctx=256) as eng:
        assert eng.info.backend == "cuda"
        tally = run_cancel_storm(eng, n_cancels=100, seed=17, grammar=grammar, spec=spec)
        after, done = greedy_ids(eng, grammar, spec)
    with Engine.load(tiny_path, backend="cuda", n_ctx=256) as fresh:
        want, want_done = greedy_ids(fresh, grammar, spec)
    assert tally.get("cancelled", 0) >= 50, tally
    assert after == want and done == want_done, (case, tally)
