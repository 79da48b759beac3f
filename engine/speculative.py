"""Speculative decoding: what drafts the tokens, how long drafts are, and the exact accept walk.

A round drafts k tokens cheaply, the target scores fed + k drafts in one verify pass (k + 1 rows,
each computed exactly as a one-token decode would), and a walk over the rows keeps a prefix of
the drafts plus one token of the target's own. The strategies that run rounds are in
engine/steps.py; this module holds the parts that do not touch a backend's sampling:

- SpecConfig: the knobs (mode off / lookup / draft, draft_max, draft_min, adaptive length);
- PromptLookup: n-gram drafts from the prompt and the reply so far (no model);
- DraftModel: a second, smaller model with its own backend and KV cache;
- DraftLength: the adaptive draft length, following recent acceptance;
- accept_sampled: min(1, p/q) acceptance and the residual norm(max(0, p - q)) for drafts drawn
  from a distribution q. A point-mass draft (prompt lookup, a greedy draft) needs no q: drawing
  y ~ p and keeping the draft x iff y == x accepts x with probability p(x) and, on rejection,
  yields p with x removed, renormalised, which is the rule for a point mass. So the target's
  ordinary sampler (engine/sampling.py, or the device sampler per verify row) does that walk.
- SpecCounters: drafted / accepted / rounds and acceptance by draft position, for EngineStats.

Exactness (docs/design.md §5 rules 4 and 5): p and q are final distributions after the grammar mask, penalties,
filters and temperature, with the same knobs; the penalties of row i see the history plus the
drafts before i, which are exactly the accepted tokens whenever row i is used.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from memra_engine.backend import common_prefix_len
from memra_engine.model.gguf_file import GGUFFile

SPEC_MODES = ("off", "lookup", "draft")
MAX_DRAFT = 15          # a verify pass is at most 16 rows: the GPU's batched matvec bound (rows
                        # beyond it take the prefill GEMM, whose rows are not bit-identical to decode)
DEFAULT_DRAFT_MAX = 8   # docs/gpu-log.md, "Speculative decoding": the measured best on the H200
DEFAULT_DRAFT_MIN = 1
LOOKUP_NGRAM_MAX = 3    # prompt lookup matches the last 3 tokens, then the last 2; a lone token
LOOKUP_NGRAM_MIN = 2    # matches often and is mostly wrong, and a rejected round costs more than a step
LOOKUP_OCCURRENCES = 8  # the latest occurrences of the n-gram compared by their context
LOOKUP_CONTEXT = 16     # how far back an occurrence's context is compared
LOOKUP_WEAK_DRAFT = 2   # most tokens drafted from a match shorter than LOOKUP_NGRAM_MAX


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding knobs for a job. mode: "off", "lookup" (prompt lookup) or "draft"
    (the draft model given to Engine.load). draft_max: most tokens drafted per round; draft_min: a
    round with fewer drafts is a plain step; adaptive: the draft length follows acceptance."""

    mode: str = "off"
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = DEFAULT_DRAFT_MIN
    adaptive: bool = True

    def validate(self) -> None:
        """Raise ValueError with a one-line message naming the bad field."""
        if self.mode not in SPEC_MODES:
            raise ValueError(f"spec mode must be one of {', '.join(SPEC_MODES)}")
        if not 1 <= self.draft_max <= MAX_DRAFT:
            raise ValueError(f"draft_max must be in [1, {MAX_DRAFT}]")
        if not 1 <= self.draft_min <= self.draft_max:
            raise ValueError("draft_min must be in [1, draft_max]")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SpecConfig":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# ---------------------------------------------------------------------------------------- drafters


class PromptLookup:
    """Drafts the tokens that followed an earlier occurrence of the history's last n tokens (n = 3,
    then 2: the longest match wins). Of the n-gram's latest occurrences, the one whose preceding
    tokens agree with the history's for longest is taken (the latest on a tie): a reply that
    copies from the prompt continues the passage it is copying, not a later echo of the same
    words. A match of only the shorter n-gram is weak (the reply is mostly not copying there), so
    it drafts at most LOOKUP_WEAK_DRAFT tokens. Measured offline with scripts/spec_model.py on
    greedy SmolLM2-135M replies to ten input-grounded prompts (docs/gpu-log.md, session 37). The
    n-gram index grows with the history, so a round costs a few dict lookups however long the
    prompt is."""

    def __init__(self, ngram_max: int = LOOKUP_NGRAM_MAX, ngram_min: int = LOOKUP_NGRAM_MIN):
        self.ngram_max = ngram_max
        self.ngrams = range(ngram_max, ngram_min - 1, -1)
        self.index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> the position after each occurrence
        self.heads: set[tuple[int, ...]] = set()  # every indexed n-gram less its last token
        self.n_indexed = 0  # n-grams ending before this position are in the index

    def _index(self, history: list[int], end: int) -> None:
        """Index every n-gram that ends before position `end`."""
        for last in range(self.n_indexed, end):
            for n in self.ngrams:
                if last + 1 >= n:
                    key = tuple(history[last + 1 - n:last + 1])
                    self.index.setdefault(key, []).append(last + 1)
                    self.heads.add(key[:-1])
        self.n_indexed = max(self.n_indexed, end)

    @staticmethod
    def _context(history: list[int], start: int) -> int:
        """How many tokens before `start` equal the history's last ones (at most LOOKUP_CONTEXT)."""
        n, end = 0, len(history)
        while n < LOOKUP_CONTEXT and start - 1 - n >= 0 and history[start - 1 - n] == history[end - 1 - n]:
            n += 1
        return n

    def propose(self, history: list[int], k: int) -> list[int]:
        # the last n tokens are the key and must match an earlier occurrence, not themselves
        self._index(history, len(history) - 1)
        for n in self.ngrams:
            if len(history) < n:
                continue
            starts = self.index.get(tuple(history[-n:]))
            if starts:
                start = max(reversed(starts[-LOOKUP_OCCURRENCES:]), key=lambda s: self._context(history, s))
                return history[start:start + (k if n == self.ngram_max else min(k, LOOKUP_WEAK_DRAFT))]
        return []

    def may_draft_next(self, history: list[int]) -> bool:
        """Whether propose could find a draft once one more token follows `history`: some earlier
        n-gram begins with its last n - 1 tokens. False is certain: whatever the token, the next
        step drafts nothing."""
        self._index(history, len(history))  # the n-grams ending at the last token: earlier than the next one
        return any(len(history) >= n - 1 and tuple(history[len(history) - n + 1:]) in self.heads for n in self.ngrams)


class DraftModel:
    """A draft model: its backend, and the tokens its KV cache holds (like LoadedModel's)."""

    def __init__(self, name: str, backend):
        self.name, self.backend = name, backend
        self.cached: list[int] = []

    def catch_up(self, history: list[int]) -> None:
        """Bring the cache to history[:-1] (the common prefix is kept); the last token is fed by
        the first draft step."""
        head = history[:-1]
        keep = common_prefix_len(self.cached, head)
        self.backend.truncate(keep)
        self.cached = self.cached[:keep]
        step = self.backend.prefill_chunk
        for start in range(keep, len(head), step):
            chunk = head[start:start + step]
            self.backend.prefill(chunk)
            self.cached.extend(chunk)

    def forget(self) -> None:
        self.cached = []
        self.backend.truncate(0)


def check_draft_vocab(target: GGUFFile, draft: GGUFFile, target_vocab: int, draft_vocab: int) -> str | None:
    """None when a draft model can propose tokens for the target; else how the vocabularies differ."""
    if target_vocab != draft_vocab:
        return f"the draft model's vocabulary has {draft_vocab} tokens, the target's {target_vocab}"
    a, b = target.metadata.get("tokenizer.ggml.tokens") or [], draft.metadata.get("tokenizer.ggml.tokens") or []
    if len(a) != len(b):
        return f"the draft model's tokenizer has {len(b)} tokens, the target's {len(a)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"the vocabularies differ at token {i}: {y!r} in the draft model, {x!r} in the target"
    return None


# ---------------------------------------------------------------------------------------- draft length


class DraftLength:
    """How many tokens the next round drafts: the recent mean accepted length plus two, within
    [draft_min, draft_max] (fixed at draft_max when not adaptive). A verify pass grows with k
    (on the H200, SmolLM2: 1.2x a decode step at k = 2, 1.5x at 4, 2.3x at 8), so drafts much
    longer than what is kept cost more than they bring.

    Two rounds in a row that keep nothing rest the drafter: the next step drafts nothing (next()
    is 0), the next two after a third such round, doubling up to REST_MAX; a round that keeps a
    draft ends it. A drafter that keeps missing (a reply that does not repeat its prompt) then
    pays a round every REST_MAX steps, not every step (on the 8B shape a round of one or two
    drafts costs 1.3-1.5x a step; resting from the first miss cost 5% on prompts that copy their
    input: docs/gpu-log.md, session 41)."""

    REST_MAX = 16

    def __init__(self, spec: SpecConfig):
        self.spec = spec
        self.mean = float(spec.draft_max) / 2  # start optimistic: the first rounds decide
        self.misses = 0  # rounds in a row that kept nothing
        self.rest = 0    # steps left that draft nothing

    def next(self) -> int:
        if not self.spec.adaptive:
            return self.spec.draft_max
        if self.rest > 0:
            self.rest -= 1
            return 0
        return int(min(self.spec.draft_max, max(self.spec.draft_min, round(self.mean) + 2)))

    def resting(self) -> bool:
        """Whether the next step drafts nothing (so a plain step may queue the next ahead)."""
        return self.spec.adaptive and self.rest > 0

    def update(self, accepted: int) -> None:
        self.mean = 0.7 * self.mean + 0.3 * accepted
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= 2:
            self.rest = min(self.REST_MAX, 1 << (self.misses - 2))


# ---------------------------------------------------------------------------------------- acceptance


def accept_sampled(x: int, p_ids: np.ndarray, p: np.ndarray, q_ids: np.ndarray, q: np.ndarray,
                   rng: np.random.Generator, n_vocab: int) -> tuple[int, bool]:
    """One row of the walk for a draft x drawn from q: keep x with probability min(1, p(x)/q(x));
    otherwise draw from norm(max(0, p - q)). Returns (token, kept)."""
    dense_p = np.zeros(n_vocab, np.float64)
    dense_p[p_ids] = p
    dense_q = np.zeros(n_vocab, np.float64)
    dense_q[q_ids] = q
    px, qx = dense_p[x], dense_q[x]
    if qx > 0 and rng.random() * qx < px:  # u < p/q without dividing
        return x, True
    residual = np.maximum(dense_p - dense_q, 0.0)
    total = residual.sum()
    if total <= 0:  # p == q up to rounding: the rejection had probability ~0; p is the residual
        residual, total = dense_p, dense_p.sum()
    cdf = np.cumsum(residual)
    pick = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    return min(pick, n_vocab - 1), False


@dataclass
class SpecCounters:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        grow = drafted - len(self.drafted_by_pos)
        if grow > 0:
            self.drafted_by_pos += [0] * grow
            self.accepted_by_pos += [0] * grow
        for i in range(drafted):
            self.drafted_by_pos[i] += 1
        for i in range(accepted):
            self.accepted_by_pos[i] += 1
