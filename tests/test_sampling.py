"""The CPU reference sampler: each filter's support and renormalised probabilities, penalties
against hand-computed values, seeding, greedy, and a goodness-of-fit test of the draws."""
from __future__ import annotations

import time

import numpy as np
import pytest

from memra_engine.sampling import (
    SamplingParams,
    apply_penalties,
    final_distribution,
    make_rng,
    min_p_filter,
    sample,
    softmax,
    top_k_filter,
    top_p_filter,
)

OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


def params(**kw) -> SamplingParams:
    return SamplingParams(**{**OFF, **kw})


def logits_for(probs, rng) -> tuple[np.ndarray, np.ndarray]:
    """Logits whose softmax is `probs`, shuffled over the vocabulary; returns (logits, permutation)."""
    perm = rng.permutation(len(probs))
    logits = np.empty(len(probs), dtype=np.float32)
    logits[perm] = np.log(np.asarray(probs, dtype=np.float64)) + 3.7  # the shift must not matter
    return logits, perm


def as_dict(ids, probs) -> dict[int, float]:
    return {int(i): float(p) for i, p in zip(ids, probs)}


def test_top_k_keeps_the_k_highest_and_renormalises():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32) * 3
    ids, probs = final_distribution(logits, params(top_k=7), [])
    want = np.argsort(-logits)[:7]
    assert set(ids.tolist()) == set(want.tolist())
    expected = softmax(logits[want])
    got = as_dict(ids, probs)
    for i, p in zip(want, expected):
        assert got[int(i)] == pytest.approx(p, rel=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p():
    rng = np.random.default_rng(1)
    probs = [0.5, 0.2, 0.15, 0.1, 0.05]
    logits, perm = logits_for(probs, rng)
    ids, out = final_distribution(logits, params(top_p=0.8), [])
    # 0.5 + 0.2 = 0.7 < 0.8, so the token that crosses (0.15) is kept as well
    assert set(ids.tolist()) == {int(perm[0]), int(perm[1]), int(perm[2])}
    got = as_dict(ids, out)
    assert got[int(perm[0])] == pytest.approx(0.5 / 0.85, rel=1e-6)
    assert got[int(perm[2])] == pytest.approx(0.15 / 0.85, rel=1e-6)
    ids, _ = final_distribution(logits, params(top_p=0.45), [])
    assert ids.tolist() == [int(perm[0])]


def test_top_p_with_a_nucleus_wider_than_the_first_partial_sort():
    # A flat 262k vocabulary: the nucleus holds ~half of it, far more than the first 64 sorted.
    rng = np.random.default_rng(2)
    logits = rng.normal(size=262144).astype(np.float32) * 0.1
    ids, kept = top_p_filter(np.arange(logits.size), logits, 0.5)
    probs = softmax(logits)
    order = np.argsort(-probs, kind="stable")
    n_want = int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1
    assert ids.size == n_want
    assert set(ids.tolist()) == set(order[:n_want].tolist())
    assert np.array_equal(kept, logits[ids])


def test_min_p_keeps_tokens_above_a_fraction_of_the_best():
    rng = np.random.default_rng(3)
    probs = [0.4, 0.3, 0.12, 0.08, 0.06, 0.04]
    logits, perm = logits_for(probs, rng)
    ids, out = final_distribution(logits, params(min_p=0.25), [])  # threshold 0.1
    assert set(ids.tolist()) == {int(perm[0]), int(perm[1]), int(perm[2])}
    got = as_dict(ids, out)
    for rank in range(3):
        assert got[int(perm[rank])] == pytest.approx(probs[rank] / 0.82, rel=1e-6)


def test_temperature_reshapes_only_the_survivors():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=50).astype(np.float32) * 2
    ids, out = final_distribution(logits, params(top_k=5, temperature=0.5), [])
    want = np.argsort(-logits)[:5]
    expected = softmax(logits[want] / 0.5)
    got = as_dict(ids, out)
    for i, p in zip(want, expected):
        assert got[int(i)] == pytest.approx(p, rel=1e-6)


def test_filter_order_is_top_k_then_top_p_then_min_p():
    rng = np.random.default_rng(5)
    probs = [0.3, 0.25, 0.2, 0.15, 0.1]
    logits, perm = logits_for(probs, rng)
    # top_k=2 leaves {0.3, 0.25}, renormalised to {0.545, 0.455}; top_p=0.5 then keeps only the first.
    # Were top_p applied to the full distribution first, it would keep two tokens (0.3 + 0.25 >= 0.5).
    ids, _ = final_distribution(logits, params(top_k=2, top_p=0.5), [])
    assert ids.tolist() == [int(perm[0])]
    # min_p after top_p: top_p=0.9 keeps 4 tokens, min_p=0.6 of 0.3 = 0.18 then keeps 3.
    ids, _ = final_distribution(logits, params(top_p=0.9, min_p=0.6), [])
    assert set(ids.tolist()) == {int(perm[0]), int(perm[1]), int(perm[2])}


def test_penalties_match_hand_computed_values():
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0], dtype=np.float32)
    history = [5, 0, 1, 0, 3, 0, 1]  # with last_n=5 the window is [1, 0, 3, 0, 1]
    p = params(repeat_penalty=1.25, repeat_last_n=5, frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits, p, history)
    want = logits.copy()
    want[0] = 2.0 / 1.25 - 2 * 0.5 - 0.25  # seen twice, positive: divided
    want[1] = -1.0 * 1.25 - 2 * 0.5 - 0.25  # seen twice, negative: multiplied
    want[3] = 3.0 / 1.25 - 1 * 0.5 - 0.25  # seen once
    # token 5 is outside the window: untouched; tokens 2 and 4 never seen
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert logits[0] == 2.0, "apply_penalties must not modify its input"


def test_penalty_window_whole_history_and_off():
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    history = [0, 1, 1, 1]
    whole = apply_penalties(logits, params(repeat_penalty=2.0, repeat_last_n=-1), history)
    np.testing.assert_allclose(whole, [0.5, 0.5, 1.0])
    off = apply_penalties(logits, params(repeat_penalty=2.0, repeat_last_n=0), history)
    np.testing.assert_allclose(off, logits)


def test_temperature_zero_is_the_argmax_after_penalties():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=300).astype(np.float32) + 4.0  # all positive: the penalty divides
    best = int(np.argmax(logits))
    token, logprob = sample(logits, params(temperature=0.0), [], make_rng(0))
    assert token == best
    assert logprob == pytest.approx(float(np.log(softmax(logits)[best])), rel=1e-5)
    # a strong repetition penalty on the best token moves the argmax to the runner-up
    token, _ = sample(logits, params(temperature=0.0, repeat_penalty=100.0), [best], make_rng(0))
    assert token == int(np.argsort(-logits)[1])


def test_fixed_seed_reproduces_and_different_seeds_differ():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=5000).astype(np.float32)
    p = params(temperature=1.0, top_k=100)

    def draws(seed):
        gen = make_rng(seed)
        return [sample(logits, p, [], gen)[0] for _ in range(40)]

    assert draws(123) == draws(123)
    assert draws(123) != draws(124)


def test_logprob_is_of_the_chosen_token_under_the_final_distribution():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=400).astype(np.float32) * 2
    p = params(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02)
    ids, probs = final_distribution(logits, p, [])
    table = as_dict(ids, probs)
    gen = make_rng(9)
    for _ in range(20):
        token, logprob = sample(logits, p, [], gen)
        assert token in table
        assert logprob == pytest.approx(np.log(table[token]), abs=1e-9)


def test_draws_follow_the_filtered_distribution():
    rng = np.random.default_rng(10)
    logits = rng.normal(size=2000).astype(np.float32) * 2.5
    history = rng.integers(0, 2000, size=100).tolist()
    p = params(temperature=0.7, top_k=12, top_p=0.95, min_p=0.01, repeat_penalty=1.3, presence_penalty=0.2)
    ids, probs = final_distribution(logits, p, history)
    table = as_dict(ids, probs)
    n = 20000
    gen = make_rng(11)
    counts: dict[int, int] = {}
    for _ in range(n):
        token, _ = sample(logits, p, history, gen)
        assert token in table, "a filtered-out token was drawn"
        counts[token] = counts.get(token, 0) + 1
    expected = np.array([table[i] * n for i in table])
    observed = np.array([counts.get(i, 0) for i in table])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = len(table) - 1
    # 99.9th percentile of chi-square: Wilson-Hilferty approximation with z = 3.09
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * np.sqrt(2 / (9 * dof))) ** 3
    assert dof >= 3, "the test needs a few tokens left after the filters"
    assert chi2 < critical, f"chi2={chi2:.1f} over {dof} dof exceeds {critical:.1f}"


def test_top_k_and_min_p_helpers_on_candidate_sets():
    ids = np.array([10, 20, 30, 40])
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    k_ids, k_logits = top_k_filter(ids, logits, 2)
    assert set(k_ids.tolist()) == {20, 40}
    assert set(k_logits.tolist()) == {3.0, 2.0}
    m_ids, _ = min_p_filter(ids, logits, float(np.exp(-1.5)))  # keeps logits >= 1.5
    assert set(m_ids.tolist()) == {20, 40}


def test_sampling_a_262k_vocabulary_is_fast():
    rng = np.random.default_rng(12)
    logits = rng.normal(size=262144).astype(np.float32) * 3
    history = rng.integers(0, 262144, size=64).tolist()
    gen = make_rng(0)
    p = SamplingParams(repeat_penalty=1.1)  # the defaults: top_k 40, top_p 0.95, min_p 0.05
    sample(logits, p, history, gen)
    start = time.perf_counter()
    for _ in range(10):
        sample(logits, p, history, gen)
    per_token = (time.perf_counter() - start) / 10
    # generous: a shared 2-core machine; the point is no full sort of the vocabulary per token
    assert per_token < 0.05, f"{per_token * 1e3:.1f} ms per token"
