"""The device sampler's candidates (SamplingParams.top_logprobs, the sampling workbench) against
the host reference engine/candidates.py token_candidates, on the same logits and the token the
device drew: the same ids in the same order, the same stage removing each one, the same drawn
token rank; probabilities within 1e-4 relative (+1e-7 absolute: the device sums its softmax
normalisers in float32, the host in float64). Cases cover each stage of the chain (greedy, plain
temperature, top_k, top_p with top_k off, min_p, penalties, a grammar bitmask), draws outside the
best N (the rank counts the vocabulary), and two vocabulary sizes (a ragged 2-block one and the
SmolLM2 one). End to end: the engine's TokenEvents carry them on the CUDA backend, a fixed seed
repeats them, and the drawn token is among the final candidates whenever N covers them.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from memra_engine.candidates import token_candidates
from memra_engine.gpu.sampler import RESULT_DTYPE, GpuSampler, candidates_from_record
from memra_engine.sampling import SamplingParams

pytestmark = pytest.mark.gpu

CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0),
    "default_chain": SamplingParams(),
    "top_k": SamplingParams(temperature=1.0, top_k=7, top_p=1.0, min_p=0.0),
    "top_p_k_off": SamplingParams(temperature=1.0, top_k=0, top_p=0.2, min_p=0.0),  # < 20 tokens: top_p shows
    "min_p": SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.2),
    "penalties": SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.4,
                                presence_penalty=0.5, frequency_penalty=0.3),
}


class _GraphPoolView:
    def __init__(self, pool):
        self.pool = pool

    def alloc(self, region, nbytes, name=""):
        return self.pool.alloc("scratch", nbytes, name)


def device_candidates(gpu, sampler, logits, params, history, seed, allowed=None):
    sampler.set_params(params, seed=seed, use_mask=allowed is not None)
    sampler.set_mask(allowed)
    hist = gpu.put(np.asarray(history or [0], np.int32))
    pos = gpu.put(np.array([len(history) - 1 if history else -1], np.int32))
    sampler.launch(gpu.put(logits), hist, pos)
    result = gpu.get(sampler.out_ptr, (1,), RESULT_DTYPE)
    token = int(result[0]["token"])
    return token, sampler.candidates(result, token)


def assert_same(got, want):
    assert [c.id for c in got.model] == [c.id for c in want.model]
    assert [c.id for c in got.final] == [c.id for c in want.final]
    assert got.rank == want.rank
    for g, w in zip(got.model + got.final, want.model + want.final):
        assert g.removed_by == w.removed_by, (g, w)
        assert g.model_prob == pytest.approx(w.model_prob, rel=1e-4, abs=1e-7), (g, w)
        assert g.final_prob == pytest.approx(w.final_prob, rel=1e-4, abs=1e-7), (g, w)


@pytest.mark.parametrize("vocab", [5000, 49152])
@pytest.mark.parametrize("name", list(CASES))
def test_device_candidates_equal_the_host_reference(gpu, name, vocab):
    sampler = GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), vocab)
    rng = np.random.default_rng(vocab + len(name))
    history = rng.integers(0, vocab, 48).tolist()
    stages_seen = set()
    for draw in range(6):
        logits = (rng.standard_normal(vocab) * 2.5).astype(np.float32)
        logits[history[:8]] += 4.0  # the penalised tokens are among the best, so penalties matter
        for n in (5, 20):
            params = replace(CASES[name], top_logprobs=n)
            token, got = device_candidates(gpu, sampler, logits, params, history, seed=draw)
            want = token_candidates(logits, params, history, None, token, n)
            assert_same(got, want)
            stages_seen |= {c.removed_by for c in got.model}
            if name != "greedy":
                assert got.rank < n or all(c.id != token for c in got.model)
    if name in ("top_k", "top_p_k_off", "min_p", "greedy"):  # the case's own stage removed something
        assert {"top_k": "top_k", "top_p_k_off": "top_p", "min_p": "min_p", "greedy": "greedy"}[name] in stages_seen


def test_device_candidates_with_a_bitmask(gpu):
    vocab = 5000
    sampler = GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), vocab)
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(vocab) * 2.5).astype(np.float32)
    allowed = rng.random(vocab) < 0.5
    allowed[np.argsort(-logits)[:3]] = False  # the model's three best are disallowed
    for params in (SamplingParams(temperature=0.0, top_logprobs=10), SamplingParams(top_logprobs=10)):
        token, got = device_candidates(gpu, sampler, logits, params, [], seed=1, allowed=allowed)
        want = token_candidates(logits, params, [], allowed, token, 10)
        assert_same(got, want)
        assert [c.removed_by for c in got.model[:3]] == ["grammar"] * 3
        assert allowed[token]


def test_draws_outside_the_best_n_have_their_rank_counted(gpu):
    """A flat distribution at a high temperature draws far down the list: the rank comes from
    counting the vocabulary, not from the list."""
    vocab = 49152
    sampler = GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), vocab)
    logits = (np.random.default_rng(9).standard_normal(vocab) * 0.3).astype(np.float32)
    params = SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, top_logprobs=3)
    ranks = []
    for seed in range(8):
        token, got = device_candidates(gpu, sampler, logits, params, [], seed=seed)
        want = token_candidates(logits, params, [], None, token, 3)
        assert got.rank == want.rank
        ranks.append(got.rank)
    assert max(ranks) > 100


def test_engine_reports_device_candidates_and_a_seed_repeats_them(tmp_path):
    from memra_engine.events import TokenEvent
    from memra_engine.generate import Engine
    from memra_engine.model.synthetic import write_synthetic_gguf

    path = write_synthetic_gguf(tmp_path / "m.gguf", preset="tiny-llama", seed=2, head_dim=64, n_head=4,
                                n_kv_head=2, d_model=256)
    params = SamplingParams(top_logprobs=8, seed=11, max_tokens=24, temperature=1.0, top_k=0, top_p=0.9, min_p=0.0)
    with Engine.load(path, backend="cuda", n_ctx=256) as engine:
        runs = []
        for _ in range(2):
            events = [e for e in engine.complete("Once upon a time", params) if isinstance(e, TokenEvent)]
            runs.append(events)
    a, b = runs
    assert len(a) >= 8 and [e.id for e in a] == [e.id for e in b]
    for ea, eb in zip(a, b):
        assert ea.candidates is not None and ea.candidates == eb.candidates
        c = ea.candidates
        assert all(x.text for x in c.model)  # the loop fills the texts in
        final_ids = [x.id for x in c.final]
        if len(c.final) < 8:  # N covers the whole final distribution
            assert ea.id in final_ids
        if c.rank < 8:
            assert c.model[c.rank].id == ea.id
        assert sum(x.final_prob for x in c.final) <= 1.0 + 1e-5
