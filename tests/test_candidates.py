"""The candidates of each drawn token (engine/candidates.py), against a brute-force reading of
the sampler chain: softmax of the raw logits for the model's distribution, and each filter's
definition (grammar mask, top-k rank after penalties, the nucleus's cumulative mass, min-p's ratio)
for the stage that removed a candidate. Then through the Engine on the tiny model: every token
carries them, the drawn token is among the final ones, and a fixed seed gives the same ones."""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.generate import Engine
from memra_engine.candidates import KEPT, token_candidates
from memra_engine.events import TokenEvent
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams, apply_mask, apply_penalties, final_distribution, make_rng, sample
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)

VOCAB = 300


def brute_force_stage(i: int, logits, params, history, allowed) -> str:
    """Which filter removes token i, by each filter's definition (no code shared with the engine
    but the penalties, whose arithmetic is llama.cpp's and tested on its own)."""
    if allowed is not None and not allowed[i]:
        return "grammar"
    z = apply_penalties(apply_mask(logits, allowed), params, history).astype(np.float64)
    if params.temperature <= 0:
        return KEPT if i == int(np.argmax(z)) else "greedy"
    alive = np.isfinite(z)
    if params.top_k and (z > z[i]).sum() >= params.top_k:
        return "top_k"
    if params.top_k:
        alive &= np.array([(z > z[j]).sum() < params.top_k for j in range(len(z))])
    p = np.where(alive, np.exp(z - z[alive].max()), 0.0)
    p /= p.sum()
    if params.top_p < 1.0:
        before = p[(p > p[i]) & alive].sum()  # the mass of the tokens sorted ahead of i
        if before >= params.top_p:
            return "top_p"
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        nucleus = order[: int(np.searchsorted(cum, params.top_p)) + 1]
        alive &= np.isin(np.arange(len(z)), nucleus)
    if params.min_p > 0 and p[i] < params.min_p * p[alive].max():
        return "min_p"
    return KEPT


CHAINS = {
    "filters": SamplingParams(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05),
    "penalties": SamplingParams(temperature=1.1, top_k=0, top_p=0.95, min_p=0.02, repeat_penalty=1.3,
                                presence_penalty=0.5, frequency_penalty=0.2, repeat_last_n=16),
    "greedy": SamplingParams(temperature=0.0),
    "grammar": SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_candidates_match_the_chain_stage_by_stage(name):
    params = CHAINS[name]
    rng = np.random.default_rng(7)
    for trial in range(20):
        logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
        history = rng.integers(0, VOCAB, 24).tolist()
        allowed = rng.random(VOCAB) < 0.3 if name == "grammar" else None
        token, _ = sample(logits, params, history, make_rng(trial), allowed)
        c = token_candidates(logits, params, history, allowed, token, 20)

        model = np.exp(logits.astype(np.float64) - logits.max())
        model /= model.sum()
        want_order = np.argsort(-model, kind="stable")
        assert [x.id for x in c.model] == want_order[:20].tolist()
        np.testing.assert_allclose([x.model_prob for x in c.model], model[want_order[:20]], rtol=1e-12)
        assert c.rank == int(np.flatnonzero(want_order == token)[0])
        for x in c.model + c.final:
            assert x.removed_by == brute_force_stage(x.id, logits, params, history, allowed), (trial, x)
            assert (x.final_prob > 0) == (x.removed_by == KEPT)

        if params.temperature > 0:
            ids, probs = final_distribution(logits, params, history, allowed)
            final = dict(zip(ids.tolist(), probs.tolist()))
            assert [x.final_prob for x in c.final] == sorted(final.values(), reverse=True)[:20]
            for x in c.final:
                assert x.final_prob == pytest.approx(final[x.id], rel=1e-12)
        else:
            assert [(x.id, x.final_prob) for x in c.final] == [(token, 1.0)]
        if len(c.final) < 20:  # every survivor is listed: the drawn token is among them
            assert token in [x.id for x in c.final]


def test_the_engine_reports_candidates_per_token_and_a_seed_repeats_them(tiny_llama_path):
    messages = [{"role": "user", "content": "hello there"}]
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95, min_p=0.0, seed=11, max_tokens=12, top_logprobs=10)
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as eng:
        runs = [[e for e in eng.chat(messages, params) if isinstance(e, TokenEvent)] for _ in range(2)]
        off = [e for e in eng.chat(messages, SamplingParams(**{**params.to_dict(), "top_logprobs": 0}))
               if isinstance(e, TokenEvent)]
        constrained = [e for e in eng.chat(messages, params, grammar=Grammar.regex("[0-9]{6}"))
                       if isinstance(e, TokenEvent)]
    first, again = runs
    assert first and [e.candidates for e in first] == [e.candidates for e in again]
    assert [e.id for e in off] == [e.id for e in first]  # asking for candidates changes no draw
    assert all(e.candidates is None for e in off)
    for e in first:
        c = e.candidates
        assert len(c.model) == 10 and 1 <= len(c.final) <= 8  # top_k 8: at most 8 survive
        assert e.id in [x.id for x in c.final]  # N = 10 covers every survivor
        assert abs(sum(x.final_prob for x in c.final) - 1.0) < 1e-9
        assert all(x.text for x in c.model)
        if c.rank < 10:
            assert c.model[c.rank].id == e.id
    # the grammar removes what it refuses before the filters see it: no refused token survives
    assert any(x.removed_by == "grammar" for e in constrained for x in e.candidates.model)
    assert all(x.removed_by == KEPT for e in constrained for x in e.candidates.final)
    assert all(x.text.isdigit() for e in constrained if e.text for x in e.candidates.final)


def test_top_logprobs_is_bounded():
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingParams(top_logprobs=21).validate()
