"""Sampling parameters and the CPU reference sampler.

SamplingParams is plain data: the UI edits it, the engine reads it at the start of a job.

The sampler applies llama.cpp's default `common_sampler` chain, minus the samplers we do not have
(DRY, top-n-sigma, typical-p, XTC), after the grammar mask when a grammar constrains the reply:

    grammar mask -> penalties -> top_k -> top_p -> min_p -> temperature -> draw

0. the grammar mask (engine/grammar.py), when given, sets every disallowed logit to -inf, so a
   masked token is never drawn and the filters and temperature act on the allowed tokens only.

1. penalties, over the last `repeat_last_n` tokens of the history (prompt + reply so far;
   -1 = the whole history, 0 = off). For each token seen c > 0 times in that window:
       logit = logit / repeat_penalty  if logit > 0  else logit * repeat_penalty
       logit -= c * frequency_penalty + presence_penalty
   (llama.cpp `llama_sampler_penalties_apply`).
2. top_k keeps the k highest logits (0 = off).
3. top_p keeps the smallest set of highest-probability tokens whose probability, renormalised
   over what top_k left, sums to >= top_p (1.0 = off). The token that crosses top_p is kept.
4. min_p keeps tokens with probability >= min_p * the highest probability (0.0 = off).
5. temperature divides the surviving logits; 0 means greedy: the argmax of the penalised logits.
6. draw one token from the softmax of what is left, with the job's numpy Generator.

Like llama.cpp, top_p and min_p look at probabilities at temperature 1: temperature only
reshapes the distribution over the survivors. Every step is vectorised: the vocabulary can be
262k entries and this runs once per generated token.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off
    repeat_last_n: int = 64  # window for all three penalties; -1 = whole context, 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None = random per job
    max_tokens: int = 512
    top_logprobs: int = 0  # >0: every TokenEvent carries its N candidates (engine/candidates.py)

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the bad field."""
        if not (0.0 <= self.temperature <= 10.0):
            raise ValueError("temperature must be in [0, 10]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError("min_p must be in [0, 1]")
        if self.repeat_penalty <= 0.0:
            raise ValueError("repeat_penalty must be > 0 (1 = off)")
        if self.repeat_last_n < -1:
            raise ValueError("repeat_last_n must be >= -1")
        if not (-2.0 <= self.presence_penalty <= 2.0) or not (-2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError("presence/frequency penalties must be in [-2, 2]")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ValueError("seed must be a non-negative integer")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not (0 <= self.top_logprobs <= 20):
            raise ValueError("top_logprobs must be in [0, 20]")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def make_rng(seed: int | None) -> np.random.Generator:
    """One Generator per job. seed None draws a fresh random seed from the OS."""
    return np.random.default_rng(seed)


def penalty_window(history: Sequence[int], last_n: int) -> np.ndarray:
    if last_n == 0 or len(history) == 0:
        return np.empty(0, dtype=np.int64)
    window = history if last_n < 0 else history[-last_n:]
    return np.asarray(window, dtype=np.int64)


def apply_penalties(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    """Repetition, frequency and presence penalties (llama.cpp semantics). Returns a new array."""
    off = params.repeat_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0
    window = penalty_window(history, params.repeat_last_n)
    if off or window.size == 0:
        return logits
    ids, counts = np.unique(window, return_counts=True)
    in_vocab = (ids >= 0) & (ids < logits.shape[0])
    ids, counts = ids[in_vocab], counts[in_vocab]
    out = logits.copy()
    seen = out[ids]
    seen = np.where(seen > 0, seen / params.repeat_penalty, seen * params.repeat_penalty)
    seen -= counts * params.frequency_penalty + params.presence_penalty
    out[ids] = seen.astype(out.dtype, copy=False)
    return out


# The filters below work on a candidate set: (ids, logits) pairs, ids into the vocabulary.
# Starting from the whole vocabulary, each filter returns a subset in no particular order.


def top_k_filter(ids: np.ndarray | None, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """ids None: `logits` is the whole vocabulary (saves building a 262k index array per token)."""
    if k <= 0 or k >= logits.shape[0]:
        return (np.arange(logits.shape[0]) if ids is None else ids), logits
    keep = np.argpartition(logits, -k)[-k:]
    return (keep if ids is None else ids[keep]), logits[keep]


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(), dtype=np.float64)
    return z / z.sum()


def top_p_filter(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    if p >= 1.0 or logits.shape[0] <= 1:
        return ids, logits
    probs = softmax(logits)
    # Sorting 262k probabilities every token is the slow part, and the nucleus is usually a
    # few dozen tokens: sort only the top n, growing n 8-fold until those n already reach p.
    n = min(64, probs.shape[0])
    while True:
        top = np.argpartition(probs, -n)[-n:] if n < probs.shape[0] else np.arange(probs.shape[0])
        top = top[np.argsort(-probs[top], kind="stable")]
        cum = np.cumsum(probs[top])
        if cum[-1] >= p or n == probs.shape[0]:
            break
        n = min(8 * n, probs.shape[0])
    last = int(np.searchsorted(cum, p))  # first index where cum >= p: kept
    keep = top[: min(last, top.shape[0] - 1) + 1]
    return ids[keep], logits[keep]


def min_p_filter(ids: np.ndarray, logits: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    if min_p <= 0.0:
        return ids, logits
    # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
    keep = logits >= logits.max() + np.log(min_p)
    return ids[keep], logits[keep]


def apply_mask(logits: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """allowed: bool [vocab] from the grammar (None: no grammar). Disallowed logits become -inf."""
    logits = np.asarray(logits, dtype=np.float32)
    if allowed is None:
        return logits
    if not allowed.any():
        raise ValueError("the grammar allows no token here")
    return np.where(allowed[: logits.shape[0]], logits, np.float32(-np.inf))


def filtered_candidates(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int], allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mask, penalties, then top_k -> top_p -> min_p. Returns (ids, penalised logits) of the survivors."""
    logits = apply_penalties(apply_mask(logits, allowed), params, history)
    ids, logits = top_k_filter(None, logits, params.top_k)
    ids, logits = top_p_filter(ids, logits, params.top_p)
    ids, logits = min_p_filter(ids, logits, params.min_p)
    finite = np.isfinite(logits)  # top_k over fewer allowed tokens than k keeps some -inf ones
    if not finite.all():
        ids, logits = ids[finite], logits[finite]
    return ids, logits


def final_distribution(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int], allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The distribution `sample` draws from, as (ids, probabilities); for temperature > 0 only.

    Speculative decoding and the statistical tests need it as a whole.
    """
    ids, kept = filtered_candidates(logits, params, history, allowed)
    return ids, softmax(kept / params.temperature)


def sample(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int], rng: np.random.Generator,
    allowed: np.ndarray | None = None,
) -> tuple[int, float]:
    """Pick the next token. Returns (token id, log-probability of it under the final distribution).
    allowed: the grammar's bool mask over the vocabulary (None: no grammar).

    For temperature 0 the final distribution is a point mass; the logprob reported is then that of
    the argmax under the penalised softmax at temperature 1, which says how sure the model was.
    """
    if params.temperature <= 0.0:
        penalised = apply_penalties(apply_mask(logits, allowed), params, history)
        token = int(np.argmax(penalised))
        # float32 is enough here: every term is <= 1 and numpy sums pairwise
        return token, float(-np.log(np.exp(penalised - penalised[token]).sum(dtype=np.float64)))
    ids, probs = final_distribution(logits, params, history, allowed)
    # Inverse-CDF draw: one uniform per token keeps a seeded job reproducible.
    cdf = np.cumsum(probs)
    pick = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), ids.shape[0] - 1)
    return int(ids[pick]), float(np.log(probs[pick]))
