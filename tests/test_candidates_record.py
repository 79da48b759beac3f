"""The device sampler's candidates record (cuda/sampling.cu SampleCandidates), decoded on the host
by engine/gpu/sampler.py candidates_from_record, checked without a GPU: a numpy model writes the
record as the kernels do (sample_finish's cuts as (value, index) bounds of the last survivor of
each stage, its normaliser; sample_candidates' best n of the raw and of the penalised logits and
the drawn token's rank), and the decoded candidates must equal engine/candidates.py's reference
on the same logits. tests/gpu/test_candidates_gpu.py checks the kernels' records the same way.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from memra_engine.candidates import token_candidates
from memra_engine.gpu.sampler import (
    MODE_FILTERED, MODE_GREEDY, MODE_PLAIN, RESULT_DTYPE, candidates_from_record,
)
from memra_engine.sampling import SamplingParams, apply_penalties, make_rng, sample

NONE = (-np.inf, 0x7FFFFFFF)  # a stage that is off: every token passes its bound


def ordered(v: np.ndarray) -> np.ndarray:
    """Ids by value, best first; ties: the lower id (the kernels' before())."""
    return np.lexsort((np.arange(v.size), -v.astype(np.float64)))


def device_record(logits, p: SamplingParams, history, allowed, token: int, n: int) -> np.ndarray:
    vocab = logits.size
    raw = logits.astype(np.float32)
    pen = apply_penalties(raw, p, history).astype(np.float32)
    if allowed is not None:
        pen = np.where(allowed, pen, np.float32(-np.inf))
    rec = np.zeros(1, RESULT_DTYPE)
    c = rec[0]["cand"]
    temp = p.temperature if p.temperature > 0 else 1.0
    k_on = 0 < p.top_k < vocab
    order = ordered(pen)
    sv = pen[order]
    if p.temperature <= 0:
        c["mode"] = MODE_GREEDY
        final = order[:1]
    elif not (k_on or p.top_p < 1.0 or p.min_p > 0.0):
        c["mode"], c["c0"] = MODE_PLAIN, sv[0]
        c["log_z"] = np.log(np.exp((sv[np.isfinite(sv)] - sv[0]) / temp).sum())
        final = order[:n]
    else:
        c["mode"] = MODE_FILTERED
        c0 = sv[0]
        kept = int(np.isfinite(sv).sum())
        cuts = []
        if k_on:
            kept = min(kept, p.top_k)
        cuts.append((sv[kept - 1], order[kept - 1]) if k_on else NONE)
        if p.top_p < 1.0 and kept > 1:
            w = np.exp(sv[:kept].astype(np.float64) - c0)
            z1 = np.exp(sv[np.isfinite(sv)].astype(np.float64) - c0).sum()  # the whole vocabulary
            target = p.top_p * (w.sum() if k_on else z1)
            hit = np.flatnonzero(np.cumsum(w) >= target)
            if hit.size:
                kept = int(hit[0]) + 1
        cuts.append((sv[kept - 1], order[kept - 1]) if p.top_p < 1.0 else NONE)
        if p.min_p > 0.0:
            kept = max(int((sv[:kept] >= c0 + np.log(p.min_p)).sum()), 1)
        cuts.append((sv[kept - 1], order[kept - 1]) if p.min_p > 0.0 else NONE)
        c["cut_v"], c["cut_i"] = [v for v, _ in cuts], [i for _, i in cuts]
        c["c0"], c["kept"] = c0, kept
        c["log_z"] = np.log(np.exp((sv[:kept].astype(np.float64) - c0) / temp).sum())
        final = order[:n]
    model = ordered(raw)[:n]
    c["n"] = n
    c["model_id"][:n], c["model_logit"][:n], c["model_final"][:n] = model, raw[model], pen[model]
    c["final_id"][:final.size], c["final_logit"][:final.size] = final, pen[final]
    c["final_raw"][:final.size] = raw[final]
    c["rank"] = int(np.sum((raw > raw[token]) | ((raw == raw[token]) & (np.arange(vocab) < token))))
    c["model_max"] = raw.max()
    c["model_z"] = np.exp(raw.astype(np.float64) - raw.max()).sum()
    rec[0]["token"] = token
    return rec


KNOBS = {
    "greedy": SamplingParams(temperature=0.0),
    "plain": SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0),
    "default": SamplingParams(),
    "top_k": SamplingParams(temperature=1.0, top_k=7, top_p=1.0, min_p=0.0),
    "top_p, top_k off": SamplingParams(temperature=1.0, top_k=0, top_p=0.2, min_p=0.0),
    "min_p": SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.2),
    "penalties": SamplingParams(temperature=0.7, repeat_penalty=1.4, presence_penalty=0.5, frequency_penalty=0.3),
}


@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "mask"])
@pytest.mark.parametrize("name", list(KNOBS))
def test_decoded_record_equals_the_host_reference(name, masked):
    vocab = 3000
    rng = np.random.default_rng(len(name) + masked)
    history = rng.integers(0, vocab, 40).tolist()
    removed = set()
    for draw in range(5):
        logits = (rng.standard_normal(vocab) * 2.5).astype(np.float32)
        logits[history[:8]] += 4.0
        allowed = None
        if masked:
            allowed = rng.random(vocab) < 0.6
            allowed[np.argsort(-logits)[:2]] = False  # the model's two best are disallowed
        for n in (5, 20):
            params = replace(KNOBS[name], top_logprobs=n)
            token, _ = sample(logits, params, history, make_rng(draw), allowed)
            got = candidates_from_record(device_record(logits, params, history, allowed, token, n)[0], params,
                                         token, vocab)
            want = token_candidates(logits, params, history, allowed, token, n)
            assert [x.id for x in got.model] == [x.id for x in want.model]
            assert [x.id for x in got.final] == [x.id for x in want.final]
            assert got.rank == want.rank
            for g, w in zip(got.model + got.final, want.model + want.final):
                assert g.removed_by == w.removed_by, (g, w)
                assert g.model_prob == pytest.approx(w.model_prob, rel=1e-5, abs=1e-9)
                assert g.final_prob == pytest.approx(w.final_prob, rel=1e-5, abs=1e-9)
            removed |= {x.removed_by for x in got.model}
    expected = {"greedy": "greedy", "top_k": "top_k", "top_p, top_k off": "top_p", "min_p": "min_p"}.get(name)
    assert expected is None or expected in removed  # the knob's own stage shows among the candidates
    assert not masked or "grammar" in removed
