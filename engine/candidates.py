"""Why each token was drawn: its candidates before and after the sampler chain (the sampling
workbench). For a drawn token, with N = SamplingParams.top_logprobs:
- `model`: the N most likely tokens under the model's own distribution (softmax of the raw
  logits, temperature 1, no mask, no penalties), best first;
- `final`: the N most likely tokens of the distribution the draw used (after the grammar mask,
  penalties, top-k, top-p, min-p and temperature; greedy: the one argmax), best first;
- each candidate's probability under both, and the first stage of the chain that removed it;
- the drawn token's rank under the model's distribution (0 = its most likely token).
This is the host reference; it reuses engine/sampling.py's stages, so it describes exactly the
chain `sample` runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from memra_engine.sampling import (
    SamplingParams, apply_mask, apply_penalties, min_p_filter, softmax, top_k_filter, top_p_filter,
)

MAX_TOP_LOGPROBS = 20
KEPT = ""
STAGES = ("grammar", "top_k", "top_p", "min_p", "greedy")  # what `removed_by` may say, in chain order


@dataclass(frozen=True)
class Candidate:
    id: int
    model_prob: float  # softmax of the raw logits
    final_prob: float  # in the distribution the draw used; 0.0 when removed
    removed_by: str    # KEPT, or the first stage of STAGES that removed it
    text: str = ""     # the token's text (the generation loop fills it in)


@dataclass(frozen=True)
class TokenCandidates:
    model: tuple[Candidate, ...]  # the N most likely under the model's distribution, best first
    final: tuple[Candidate, ...]  # the N most likely of the final distribution, best first
    rank: int                     # the drawn token's rank under the model's distribution

    def with_texts(self, text_of: Callable[[int], str]) -> "TokenCandidates":
        return TokenCandidates(tuple(replace(c, text=text_of(c.id)) for c in self.model),
                               tuple(replace(c, text=text_of(c.id)) for c in self.final), self.rank)


def _survivors(logits: np.ndarray, params: SamplingParams, history: Sequence[int],
               allowed: np.ndarray | None) -> tuple[list[tuple[str, np.ndarray]], np.ndarray, np.ndarray]:
    """The chain stage by stage: [(stage, bool [vocab]: survives it)], and the final (ids, probs)."""
    vocab = logits.shape[0]
    penalised = apply_penalties(apply_mask(logits, allowed), params, history)
    stages = []

    def survive(stage: str, ids: np.ndarray) -> None:
        mask = np.zeros(vocab, bool)
        mask[ids] = True
        stages.append((stage, mask))

    if allowed is not None:
        stages.append(("grammar", np.asarray(allowed[:vocab], bool)))
    if params.temperature <= 0.0:
        token = int(np.argmax(penalised))
        survive("greedy", np.array([token]))
        return stages, np.array([token]), np.array([1.0])
    ids, kept = top_k_filter(None, penalised, params.top_k)
    survive("top_k", ids)
    ids, kept = top_p_filter(ids, kept, params.top_p)
    survive("top_p", ids)
    ids, kept = min_p_filter(ids, kept, params.min_p)
    finite = np.isfinite(kept)  # as filtered_candidates: top_k over fewer allowed tokens than k
    ids, kept = ids[finite], kept[finite]
    survive("min_p", ids)
    return stages, ids, softmax(kept / params.temperature)


def token_candidates(logits: np.ndarray, params: SamplingParams, history: Sequence[int],
                     allowed: np.ndarray | None, token: int, n: int) -> TokenCandidates:
    """The candidates of `token`, drawn from `logits` under `params` (module doc)."""
    logits = np.asarray(logits, dtype=np.float32)
    model = softmax(logits.astype(np.float64))
    order = np.argsort(-model, kind="stable")  # ties: the lower id first
    stages, final_ids, final_probs = _survivors(logits, params, history, allowed)
    final_of = dict(zip(final_ids.tolist(), final_probs.tolist()))

    def candidate(i: int) -> Candidate:
        removed = next((stage for stage, survives in stages if not survives[i]), KEPT)
        return Candidate(i, float(model[i]), float(final_of.get(i, 0.0)), removed)

    top_final = np.lexsort((final_ids, -final_probs))[:n]
    return TokenCandidates(tuple(candidate(int(i)) for i in order[:n]),
                           tuple(candidate(int(final_ids[j])) for j in top_final),
                           int(np.flatnonzero(order == token)[0]))
