"""The device sampler vs the CPU reference sampler (memra_engine.sampling).

- penalties: the penalised logits equal apply_penalties' (<= 1e-6 relative);
- greedy: the same token, logprob within 1e-4;
- each filter: empirical frequencies of N draws vs final_distribution, chi-square statistic
  under df + 6 * sqrt(2 df) (a ~6 sigma bound: a wrong distribution fails by far), no token
  outside the support;
- same seed, same tokens; another seed, other tokens; the bitmask restricts the support.
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.gpu.sampler import OUT_DTYPE, GpuSampler
from memra_engine.sampling import SamplingParams, apply_penalties, final_distribution, sample

pytestmark = pytest.mark.gpu
VOCAB = 5000  # two stage-1 blocks with a ragged tail


@pytest.fixture
def sampler(gpu):
    return GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), VOCAB)


class _GraphPoolView:
    """The sampler allocates from 'graph'; the test pool has only scratch."""

    def __init__(self, pool):
        self.pool = pool

    def alloc(self, region, nbytes, name=""):
        return self.pool.alloc("scratch", nbytes, name)


def logits_case(seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(VOCAB) * 2.5).astype(np.float32)


def draw(gpu, sampler, logits, params, history, n, seed=1234, mask=None):
    """n draws with consecutive Philox counters; each draw re-uploads the logits (penalties
    work in place). Returns (tokens, logprobs)."""
    sampler.set_params(params, seed=seed, use_mask=mask is not None)
    sampler.set_mask(mask)
    hist = gpu.put(np.asarray(history or [0], np.int32))
    pos = gpu.put(np.array([len(history) - 1 if history else -1], np.int32))
    lp = gpu.put(logits)
    fresh = gpu.put(logits)
    outs = gpu.empty(2 * n, poison=True)
    for i in range(n):
        gpu.rt.cuda.memcpy_dtod_async(lp, fresh, logits.nbytes, gpu.rt.stream)
        sampler.launch(lp, hist, pos)
        gpu.rt.cuda.memcpy_dtod_async(outs + 8 * i, sampler.out_ptr, 8, gpu.rt.stream)
    out = gpu.get(outs, n, OUT_DTYPE)
    return out["token"].astype(np.int64), out["logprob"].astype(np.float64)


def test_penalties_match_the_cpu(gpu, sampler):
    logits = logits_case(0)
    history = list(np.random.default_rng(1).integers(0, 50, 100))
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                            repeat_last_n=64)
    sampler.set_params(params, seed=0)
    lp = gpu.put(logits)
    gpu.rt.launch("sample_penalize", 1, 256, (lp, sampler.params_ptr, gpu.put(np.array(history, np.int32)),
                                              gpu.put(np.array([len(history) - 1], np.int32)), VOCAB))
    got = gpu.get(lp, VOCAB)
    ref = apply_penalties(logits, params, history)
    assert np.max(np.abs(got - ref)) <= 1e-6 * np.max(np.abs(ref))
    assert not np.array_equal(got, logits)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_cpu(gpu, sampler, seed):
    logits = logits_case(seed)
    history = [int(np.argmax(logits)), 5, 5, 7]
    params = SamplingParams(temperature=0.0, repeat_penalty=1.5)
    tokens, logprobs = draw(gpu, sampler, logits, params, history, 3)
    ref_tok, ref_lp = sample(logits, params, history, np.random.default_rng(0))
    assert np.all(tokens == ref_tok)
    assert abs(logprobs[0] - ref_lp) < 1e-4


FILTERS = {
    "temperature": SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),
    "top_k": SamplingParams(temperature=1.0, top_k=20, top_p=1.0, min_p=0.0),
    "top_p": SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0),
    "min_p": SamplingParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.1),
    "default_chain": SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.2),
}


@pytest.mark.parametrize("name", list(FILTERS))
def test_draws_follow_the_cpu_distribution(gpu, sampler, name):
    params = FILTERS[name]
    logits = logits_case(10)
    logits[:8] += 6.0  # a few likely tokens, as in real logits
    history = [0, 1, 2, 3, 3]
    ids, probs = final_distribution(logits, params, history)
    n = 4000
    tokens, logprobs = draw(gpu, sampler, logits, params, history, n)
    support = set(ids.tolist())
    assert set(tokens.tolist()) <= support, "drew a token the filters remove"
    expected = dict(zip(ids.tolist(), probs.tolist()))
    counts = {t: 0 for t in support}
    for t in tokens.tolist():
        counts[t] += 1
    big = [t for t in support if expected[t] * n >= 5]
    small = [t for t in support if expected[t] * n < 5]
    obs = [counts[t] for t in big] + ([sum(counts[t] for t in small)] if small else [])
    exp = [expected[t] * n for t in big] + ([sum(expected[t] for t in small) * n] if small else [])
    chi2 = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    df = max(1, len(obs) - 1)
    assert chi2 < df + 6 * np.sqrt(2 * df), (name, chi2, df)
    # the reported logprob is that of the token under the final distribution
    for t, lp in list(zip(tokens, logprobs))[:50]:
        assert abs(lp - np.log(expected[int(t)])) < 1e-3


def test_same_seed_same_tokens(gpu, sampler):
    logits = logits_case(3)
    params = FILTERS["default_chain"]
    a, _ = draw(gpu, sampler, logits, params, [1, 2], 64, seed=99)
    b, _ = draw(gpu, sampler, logits, params, [1, 2], 64, seed=99)
    c, _ = draw(gpu, sampler, logits, params, [1, 2], 64, seed=100)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) > 1  # the counter advances: not one token repeated


def test_bitmask_restricts_the_support(gpu, sampler):
    logits = logits_case(4)
    allowed = np.zeros(VOCAB, bool)
    allowed[np.random.default_rng(5).choice(VOCAB, 30, replace=False)] = True
    greedy, _ = draw(gpu, sampler, logits, SamplingParams(temperature=0.0), [], 1, mask=allowed)
    assert greedy[0] == np.flatnonzero(allowed)[np.argmax(logits[allowed])]
    for params in (FILTERS["temperature"], FILTERS["default_chain"]):
        tokens, _ = draw(gpu, sampler, logits, params, [], 200, mask=allowed)
        assert allowed[tokens].all()
