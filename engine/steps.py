"""Step strategies: how the generation loop turns the token it feeds into the next token.

A reply is a sequence of steps. `Generation` (engine/generate.py) owns the prompt, the prefill,
stop strings, events and stats; a strategy owns only "feed a token, get the next one":
- HostSampling: the backend's logits come back, engine/sampling.py draws (the cpu backend);
- DeviceSampling: forward and sampler run on the GPU and only the token id comes back
  (`decode_sample`); with a grammar, the masked step pair overlaps the host's mask work with the
  GPU's forward (the forward of step t+1 needs only token t, which is already on the device);
- HostSpeculative / DeviceSpeculative: a speculative round (engine/speculative.py) drafts k
  tokens, one verify pass scores them, and the step returns the kept drafts plus one token of the
  target's own. They wrap the plain strategy of their backend, which runs the rounds that have no
  draft and owns the knobs and the random stream.

A step returns a list of Step (token, logprob, candidates): one token, or a round's tokens. At
most `budget`, so a reply never runs past max_tokens. candidates (SamplingParams.top_logprobs > 0)
say why the token was drawn (engine/candidates.py): computed on the host from the logits, or by the
device sampler inside the captured step (plain device steps; speculative rounds report none).

A grammar constraint (engine/grammar.py) is used the same way by every strategy: ask it for the
mask of the next position, draw, tell it the token drawn. Speculative rounds also cut drafts at
the first token it refuses and, to give every verify row its own mask, advance it through the
drafts and roll it back.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Protocol

import numpy as np

from memra_engine.backend import Backend
from memra_engine.candidates import TokenCandidates, token_candidates
from memra_engine.grammar import GrammarConstraint
from memra_engine.sampling import SamplingParams, final_distribution, make_rng, sample
from memra_engine.speculative import (
    DraftLength, DraftModel, PromptLookup, SpecConfig, SpecCounters, accept_sampled,
)



class Step(NamedTuple):
    token: int
    logprob: float
    candidates: TokenCandidates | None = None


Steps = list[Step]


class StepStrategy(Protocol):
    def step(self, fed: int, budget: int) -> Steps:
        """Feed `fed` at n_past; return the next 1..budget tokens with their logprobs (the
        constraint, if any, has accepted them). The KV cache then holds fed and every returned
        token but the last, which the next step feeds."""

    def set_params(self, params: SamplingParams, n_generated: int) -> None:
        """New knobs from the next step on; the random stream goes on."""


class MaskTimer:
    """Host time spent computing grammar masks, per token (the benchmark reports median and p99)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __enter__(self) -> "MaskTimer":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds.append(time.perf_counter() - self._t0)


class HostSampling:
    def __init__(self, backend: Backend, params: SamplingParams, history: list[int],
                 constraint: GrammarConstraint | None, mask_timer: MaskTimer):
        self.backend, self.params, self.history = backend, params, history
        self.constraint, self.mask_timer = constraint, mask_timer
        self.rng = make_rng(params.seed)

    def set_params(self, params: SamplingParams, n_generated: int) -> None:
        self.params = params

    def step(self, fed: int, budget: int = 1) -> Steps:
        step = self.draw(self.backend.decode(fed), self.history)
        if self.constraint is not None:
            self.constraint.accept(step.token)
        return [step]

    def allowed(self) -> np.ndarray | None:
        if self.constraint is None:
            return None
        with self.mask_timer:
            return self.constraint.allowed()

    def draw(self, logits: np.ndarray, history: list[int]) -> Step:
        allowed = self.allowed()
        token, logprob = sample(logits, self.params, history, self.rng, allowed)
        return Step(token, logprob, self.candidates(logits, history, allowed, token))

    def candidates(self, logits: np.ndarray, history: list[int], allowed: np.ndarray | None,
                   token: int) -> TokenCandidates | None:
        n = self.params.top_logprobs
        return token_candidates(logits, self.params, history, allowed, token, n) if n > 0 else None


class DeviceSampling:
    def __init__(self, backend: Backend, params: SamplingParams, constraint: GrammarConstraint | None,
                 mask_timer: MaskTimer):
        self.backend, self.constraint, self.mask_timer = backend, constraint, mask_timer
        self.seed = backend.set_sampling(params, seed=params.seed, use_mask=constraint is not None)

    def set_params(self, params: SamplingParams, n_generated: int) -> None:
        # a fresh counter stream, so draws never repeat
        self.seed = self.backend.set_sampling(params, seed=(self.seed + n_generated) % 2**63,
                                              use_mask=self.constraint is not None)

    def step(self, fed: int, budget: int = 1, ahead: bool = True) -> Steps:
        """ahead: the backend may queue the next steps (see Backend.decode_sample)."""
        if self.constraint is None:
            token, logprob = self.backend.decode_sample(fed, ahead=ahead)
            return [Step(token, logprob, self.backend.step_candidates())]
        mask = self.backend.begin_masked_step(fed)  # the GPU runs the forward meanwhile
        with self.mask_timer:
            self.constraint.mask_into(mask)
        token, logprob = self.backend.finish_masked_step(ahead=ahead)
        self.constraint.accept(token)
        return [Step(token, logprob, self.backend.step_candidates())]


class _Rounds:
    """What both speculative strategies share: the draft length, drafting, the fallback to a
    plain step, and the counters. `plain` is the backend's plain strategy."""

    def __init__(self, plain, history: list[int], drafter: PromptLookup | DraftModel, spec: SpecConfig,
                 counters: SpecCounters, stop_ids: set[int]):
        self.plain, self.history, self.drafter, self.spec, self.counters = plain, history, drafter, spec, counters
        self.backend, self.constraint, self.stop_ids = plain.backend, plain.constraint, stop_ids
        self.length = DraftLength(spec)

    def set_params(self, params: SamplingParams, n_generated: int) -> None:
        self.plain.set_params(params, n_generated)

    def set_spec(self, spec: SpecConfig) -> None:
        """New draft_max / draft_min / adaptive from the next round (the same drafter)."""
        self.spec = self.length.spec = spec

    def step(self, fed: int, budget: int) -> Steps:
        backend = self.backend
        k = min(self.length.next(), budget - 1, backend.n_ctx - backend.n_past - 1)
        drafts, q = self.draft(k) if k >= self.spec.draft_min else ([], None)
        if len(drafts) < self.spec.draft_min:
            return self.plain_step(fed)
        n_past = backend.n_past
        steps = self.verify(fed, drafts, q)
        kept = len(steps) - 1
        backend.truncate(n_past + 1 + kept)  # the rejected drafts' KV rows go
        self.counters.record(len(drafts), kept)
        self.length.update(kept)
        return steps

    def plain_step(self, fed: int) -> Steps:
        """One token without drafts (none found, or too few)."""
        return self.plain.step(fed, 1)

    def cut(self, drafts: list[int]) -> list[int]:
        """Drafts up to the first end-of-text token (the target draws its own) or the first token
        the grammar refuses, whichever comes first."""
        for i, t in enumerate(drafts):
            if t in self.stop_ids:
                drafts = drafts[:i]
                break
        if self.constraint is not None and drafts:
            drafts = drafts[:self.constraint.valid_prefix(drafts)]
        return drafts


class HostSpeculative(_Rounds):
    """Rounds on a backend that samples on the host: logits of every verify row come back and
    the walk runs here. A draft model at temperature > 0 samples its drafts from q (its own final
    distribution under the same knobs and mask), so the walk is min(1, p/q) with the residual."""

    def draft(self, k: int) -> tuple[list[int], list | None]:
        if isinstance(self.drafter, PromptLookup):
            return self.cut(self.drafter.propose(self.history, k)), None
        return self.draft_from_model(self.history, k)

    def draft_from_model(self, history: list[int], k: int) -> tuple[list[int], list | None]:
        dm, plain = self.drafter, self.plain
        params, constraint = plain.params, self.constraint
        dm.catch_up(history)
        drafts, qs, hist, token = [], [], list(history), history[-1]
        for _ in range(k):
            logits = dm.backend.decode(token)
            dm.cached.append(token)
            allowed = plain.allowed()
            if params.temperature <= 0:
                token, _ = sample(logits, params, hist, plain.rng, allowed)
            else:
                ids, q = final_distribution(logits, params, hist, allowed)
                cdf = np.cumsum(q)
                pick = min(int(np.searchsorted(cdf, plain.rng.random() * cdf[-1], side="right")), len(ids) - 1)
                token = int(ids[pick])
                qs.append((ids, q))
            if token in self.stop_ids:  # drafts stop before end-of-text (see cut)
                break
            drafts.append(token)
            hist.append(token)
            if constraint is not None:
                constraint.accept(token)
        if constraint is not None:
            constraint.rollback(len(drafts))
        return drafts, (qs[:len(drafts)] if params.temperature > 0 else None)

    def verify(self, fed: int, drafts: list[int], qs: list | None) -> Steps:
        plain, constraint = self.plain, self.constraint
        rows = self.backend.verify([fed] + drafts)
        hist, steps = list(self.history), []
        for i, row in enumerate(rows):
            x = drafts[i] if i < len(drafts) else None
            if x is None or qs is None:  # the bonus row, or a point-mass draft: y ~ p, keep x iff y == x
                step = plain.draw(row, hist)
                kept = step.token == x
            else:
                allowed = plain.allowed()
                ids, p = final_distribution(row, plain.params, hist, allowed)
                q_ids, q = qs[i]
                token, kept = accept_sampled(x, ids, p, q_ids, q, plain.rng, row.shape[0])
                step = Step(token, float(np.log(p[np.flatnonzero(ids == token)[0]])),
                            plain.candidates(row, hist, allowed, token))
            if constraint is not None:
                constraint.accept(step.token)
            steps.append(step)
            if not kept:
                break
            hist.append(step.token)
        return steps


class DeviceSpeculative(_Rounds):
    """Rounds on the GPU: one captured graph runs the verify forward and the device sampler on
    every row (row i's mask and penalty window are its own), and only the rows' tokens come back.
    Drafts are point masses (prompt lookup, or the draft model's greedy tokens, drafted on the
    device back to back; with a grammar, one masked step each), so y_i == x_i is the whole
    acceptance test (module doc of engine/speculative.py)."""

    def __init__(self, *args):
        super().__init__(*args)
        if isinstance(self.drafter, DraftModel):  # greedy drafts: a point mass, under the reply's grammar
            self.drafter.backend.set_sampling(SamplingParams(temperature=0.0), seed=0,
                                              use_mask=self.constraint is not None)

    def plain_step(self, fed: int) -> Steps:
        # steps queued past this one are lost when a round follows: its verify waits them out and
        # drops them (two decode steps per switch, most of the gap between prompt lookup's
        # modelled and measured speedup, docs/gpu-log.md). Queue them only where no draft can
        # follow: prompt lookup has no match for the next token, or the drafter rests
        lookup = self.drafter if isinstance(self.drafter, PromptLookup) else None
        ahead = self.length.resting() or (lookup is not None and not lookup.may_draft_next(self.history))
        return self.plain.step(fed, 1, ahead=ahead)

    def draft(self, k: int) -> tuple[list[int], None]:
        history = self.history
        if isinstance(self.drafter, PromptLookup):
            return self.cut(self.drafter.propose(history, k)), None
        dm, constraint = self.drafter, self.constraint
        dm.catch_up(history)
        if constraint is None:
            drafts = dm.backend.draft_tokens(history[-1], k)
        else:  # each draft under its grammar mask, or most drafts would be cut at once
            drafts, token = [], history[-1]
            for i in range(k):
                mask = dm.backend.begin_masked_step(token)
                with self.plain.mask_timer:
                    constraint.mask_into(mask)
                token, _ = dm.backend.finish_masked_step(ahead=i < k - 1)  # the last: the verify is next
                drafts.append(token)
                if token in self.stop_ids:
                    break
                constraint.accept(token)
            constraint.rollback(len(drafts) - (drafts[-1] in self.stop_ids))
        dm.cached += [history[-1]] + drafts[:-1]
        return self.cut(drafts), None

    def verify(self, fed: int, drafts: list[int], q: None) -> Steps:
        constraint, masks = self.constraint, None
        if constraint is not None:
            masks = np.empty((len(drafts) + 1, constraint.words), np.uint32)
            with self.plain.mask_timer:
                for i, t in enumerate(drafts):
                    constraint.mask_into(masks[i])
                    constraint.accept(t)
                constraint.mask_into(masks[-1])
                constraint.rollback(len(drafts))
        rows = self.backend.verify_sample([fed] + drafts, masks)
        kept = 0
        while kept < len(drafts) and rows[kept][0] == drafts[kept]:
            kept += 1
        steps = [Step(*row) for row in rows[:kept + 1]]
        if constraint is not None:
            for step in steps:
                constraint.accept(step.token)
        return steps


def speculative_for(plain: HostSampling | DeviceSampling, history: list[int], drafter: PromptLookup | DraftModel,
                    spec: SpecConfig, counters: SpecCounters, stop_ids: set[int]) -> _Rounds:
    kind = DeviceSpeculative if isinstance(plain, DeviceSampling) else HostSpeculative
    return kind(plain, history, drafter, spec, counters, stop_ids)


def strategy_for(backend: Backend, params: SamplingParams, history: list[int],
                 constraint: GrammarConstraint | None, mask_timer: MaskTimer) -> StepStrategy:
    if backend.samples_on_device:
        return DeviceSampling(backend, params, constraint, mask_timer)
    return HostSampling(backend, params, history, constraint, mask_timer)
