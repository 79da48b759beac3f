"""The device sampler vs the CPU reference sampler (memra_engine.sampling).

- penalties: the penalised logits equal apply_penalties' (<= 1e-6 relative);
- greedy: the same token, logprob within 1e-4;
- each filter: empirical frequencies of N draws vs final_distribution, chi-square statistic
  under df + 6 * sqrt(2 df) (a ~6 sigma bound: a wrong distribution fails by far), no token
  outside the support;
- same seed, same tokens; another seed, other tokens; the bitmask restricts the support;
- at the real vocabularies (49152, 128256, 262144: stage-1 chunks of 1024, 2048, 4096), with
  top_k off (the path that sorts every candidate) and on, peaked and flat logits: chi-square
  over probability-ranked groups, the support, and each draw's logprob within 2e-5 of the CPU's
  (one token more or less in a wide nucleus moves the normaliser by ~1e-4: this sees the cut
  itself, not just the shape);
- a nucleus wider than the candidates (the documented bound) keeps exactly the candidates.
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.gpu.sampler import OUT_DTYPE, GpuSampler
from memra_engine.sampling import SamplingParams, apply_penalties, final_distribution, sample

pytestmark = pytest.mark.gpu
VOCAB = 5000  # five stage-1 blocks of 1024 with a ragged tail


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


# ---- real vocabularies: the filtered path with top_k off -----------------------------------------

BIG_CASES = {
    "top_p": SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0),
    "min_p": SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.02),
    "top_p+min_p": SamplingParams(temperature=0.7, top_k=0, top_p=0.95, min_p=0.01),
    "default": SamplingParams(),
    "top_k 300": SamplingParams(temperature=1.0, top_k=300, top_p=0.9, min_p=0.0),
    "top_k 64": SamplingParams(temperature=1.0, top_k=64, top_p=1.0, min_p=0.0),  # the 64-wide trees' widest
    "top_k 128": SamplingParams(temperature=1.0, top_k=128, top_p=1.0, min_p=0.0),  # sample_finish's widest tree
    "creative": SamplingParams(temperature=1.0, top_k=100, top_p=0.98, min_p=0.02),  # the app's preset
    "top_k off, min_p": SamplingParams(temperature=0.7, top_k=0, top_p=0.95, min_p=0.05),  # runs cut at the floor
}


@pytest.fixture(params=[49152, 128256, 262144], ids=lambda v: f"vocab{v}")  # chunks 1024, 2048, 4096
def big_sampler(gpu, request):
    return GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), request.param)


def big_logits(kind, vocab, seed):
    """As tests/test_sampler_model.py: 'peaked' (a dozen likely tokens over a noisy floor) or
    'flat' (top_p 0.9 keeps ~1% of the vocabulary: ~400 / ~3300 tokens)."""
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        x = rng.standard_normal(vocab) * 1.5
        x[rng.choice(vocab, 12, replace=False)] += rng.uniform(12, 17, 12)
    else:
        x = rng.standard_normal(vocab) * 3.6
    return x.astype(np.float32)


def grouped_chi_square(tokens, ids, probs, min_expected=10.0):
    """Chi-square of the draws against (ids, probs), tokens grouped in order of probability so
    that each group expects >= min_expected draws. Returns (chi2, df)."""
    n = tokens.size
    order = np.argsort(-probs, kind="stable")
    ids, probs = ids[order], probs[order]
    place = {t: i for i, t in enumerate(ids.tolist())}
    counts = np.bincount([place[t] for t in tokens.tolist()], minlength=ids.size)
    obs, exp = [], []
    o = e = 0.0
    for c, p in zip(counts.tolist(), (probs * n).tolist()):
        o, e = o + c, e + p
        if e >= min_expected:
            obs.append(o)
            exp.append(e)
            o = e = 0.0
    if e > 0:
        if exp:
            obs[-1], exp[-1] = obs[-1] + o, exp[-1] + e
        else:
            obs.append(o)
            exp.append(e)
    obs, exp = np.array(obs), np.array(exp)
    return float(np.sum((obs - exp) ** 2 / exp)), max(1, obs.size - 1)


@pytest.mark.parametrize("kind", ["peaked", "flat"])
@pytest.mark.parametrize("name", list(BIG_CASES))
def test_real_vocab_draws_follow_the_cpu_distribution(gpu, big_sampler, name, kind):
    params, vocab = BIG_CASES[name], big_sampler.vocab
    logits = big_logits(kind, vocab, seed=vocab % 97)
    ids, probs = final_distribution(logits, params, [])
    n = 5000
    tokens, logprobs = draw(gpu, big_sampler, logits, params, [], n)
    assert set(tokens.tolist()) <= set(ids.tolist()), "drew a token the filters remove"
    chi2, df = grouped_chi_square(tokens, ids, probs)
    assert chi2 < df + 6 * np.sqrt(2 * df), (name, kind, vocab, chi2, df, ids.size)
    prob_of = dict(zip(ids.tolist(), probs.tolist()))
    ref_lp = np.log([prob_of[t] for t in tokens.tolist()])
    assert np.max(np.abs(logprobs - ref_lp)) < 2e-5, "the kept set or its normaliser differs from the CPU's"


def test_real_vocab_same_seed_same_tokens(gpu, big_sampler):
    logits = big_logits("flat", big_sampler.vocab, seed=5)
    params = BIG_CASES["top_p+min_p"]
    a, _ = draw(gpu, big_sampler, logits, params, [], 200, seed=7)
    b, _ = draw(gpu, big_sampler, logits, params, [], 200, seed=7)
    c, _ = draw(gpu, big_sampler, logits, params, [], 200, seed=8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) > 20  # a wide nucleus: many distinct tokens


def test_a_nucleus_wider_than_the_candidates_keeps_the_candidates(gpu):
    """The bound in docs/gpu-engine.md, "The sampler": each stage-1 block gives its best
    local_k candidates; a nucleus with more than that in one block (N(0, 3^2) logits, top_p 0.95:
    ~23k tokens of 262k) is cut to the candidates, drawn from by their softmax."""
    vocab = 262144
    sampler = GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), vocab)
    logits = (np.random.default_rng(0).standard_normal(vocab) * 3).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.95, min_p=0.0)
    blocks = logits.reshape(-1, 4096)
    best = np.argsort(-blocks, axis=1, kind="stable")[:, : sampler.local_k]
    cand = (best + 4096 * np.arange(blocks.shape[0])[:, None]).ravel()
    tokens, logprobs = draw(gpu, sampler, logits, params, [], 300)
    assert set(tokens.tolist()) <= set(cand.tolist())
    lv = logits[cand].astype(np.float64)
    log_z = np.log(np.exp(lv - lv.max()).sum()) + lv.max()
    assert np.max(np.abs(logprobs - (logits[tokens] - log_z))) < 2e-5


def test_bitmask_with_top_k_off_at_a_real_vocab(gpu):
    vocab = 262144
    sampler = GpuSampler(gpu.rt, _GraphPoolView(gpu.pool), vocab)
    rng = np.random.default_rng(12)
    logits = (rng.standard_normal(vocab) * 3.6).astype(np.float32)
    allowed = rng.random(vocab) < 0.03
    params = BIG_CASES["top_p"]
    masked = np.where(allowed, logits, -np.inf).astype(np.float32)
    ids, probs = final_distribution(masked, params, [])
    tokens, logprobs = draw(gpu, sampler, logits, params, [], 3000, mask=allowed)
    assert allowed[tokens].all()
    assert set(tokens.tolist()) <= set(ids.tolist())
    chi2, df = grouped_chi_square(tokens, ids, probs)
    assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df, ids.size)
    prob_of = dict(zip(ids.tolist(), probs.tolist()))
    assert np.max(np.abs(logprobs - np.log([prob_of[t] for t in tokens.tolist()]))) < 2e-5


# ---- a verify pass's rows in one launch (GpuSampler.launch_rows) ---------------------------------

@pytest.mark.parametrize("name", ["greedy", "temperature", "default_chain", "top_p", "masked"])
def test_rows_in_one_launch_equal_one_launch_a_row(gpu, sampler, name):
    """launch_rows over T rows gives each row the token and logprob that T launches, one a row
    and in order, give: the same logits, penalty window (row r's ends at pos[r]), mask row and
    Philox counter (start + r), bit for bit; the counter then stands where the T launches leave
    it (the next draw agrees too)."""
    params = SamplingParams(temperature=0.0) if name == "greedy" else FILTERS.get(name, FILTERS["default_chain"])
    T, words = 9, -(-VOCAB // 32)
    rng = np.random.default_rng(77)
    logits = (rng.standard_normal((T, VOCAB)) * 2.5).astype(np.float32)
    logits[:, :8] += 6.0
    history = rng.integers(0, 40, 60).astype(np.int32)  # penalties see different windows per row
    positions = np.arange(50, 50 + T, dtype=np.int32)
    masks = np.full((T, words), 0xFFFFFFFF, np.uint32)
    if name == "masked":
        allowed = rng.random((T, VOCAB)) < 0.3
        bits = np.zeros((T, 32 * words), np.uint8)
        bits[:, :VOCAB] = allowed
        masks = np.packbits(bits, axis=1, bitorder="little").view("<u4")  # set_mask's layout, a row each
    hist, pos = gpu.put(history), gpu.put(positions)

    def one_a_row() -> np.ndarray:
        sampler.set_params(params, seed=4321, use_mask=True)
        lp, outs = gpu.put(logits), gpu.empty(2 * (T + 1), poison=True)
        for r in range(T):
            sampler.launch(lp + 4 * VOCAB * r, hist, pos + 4 * r, mask_ptr=gpu.put(masks[r]), out_ptr=outs + 8 * r)
        sampler.launch(lp, hist, pos, mask_ptr=gpu.put(masks[0]), out_ptr=outs + 8 * T)  # the counter after
        return gpu.get(outs, T + 1, OUT_DTYPE)

    def in_one_launch() -> np.ndarray:
        sampler.set_params(params, seed=4321, use_mask=True)
        lp, outs = gpu.put(logits), gpu.empty(2 * (T + 1), poison=True)
        sampler.launch_rows(lp, hist, pos, gpu.put(masks), outs, T)
        sampler.launch(lp, hist, pos, mask_ptr=gpu.put(masks[0]), out_ptr=outs + 8 * T)
        return gpu.get(outs, T + 1, OUT_DTYPE)

    a, b = one_a_row(), in_one_launch()
    assert np.isfinite(a["logprob"]).all()
    assert len(set(a["token"][:T].tolist())) > 1  # rows differ: each row read its own logits
    assert np.array_equal(a["token"], b["token"]), (a["token"], b["token"])
    assert np.array_equal(a["logprob"].view(np.uint32), b["logprob"].view(np.uint32))
    if name == "masked":
        assert all(((masks[r][a["token"][r] >> 5] >> (a["token"][r] & 31)) & 1) for r in range(T))
