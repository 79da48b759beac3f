"""Step strategies: how the generation loop turns the token it feeds into the next token.

A reply is a sequence of steps. `Generation` (engine/generate.py) owns the prompt, the prefill,
stop strings, events and stats; a strategy owns only "feed a token, get the next one":
- HostSampling: the backend's logits come back, engine/sampling.py draws (the cpu backend);
- DeviceSampling: forward and sampler run on the GPU and only the token id comes back
  (`decode_sample`); with a grammar, the masked step pair overlaps the host's mask work with the
  GPU's forward (the forward of step t+1 needs only token t, which is already on the device);
- speculative rounds come next, behind the same interface.

A grammar constraint (engine/grammar.py) is used the same way by every strategy: ask it for the
mask of the next position, draw, tell it the token drawn.
"""
from __future__ import annotations

import time
from typing import Protocol

from memra_engine.backend import Backend
from memra_engine.grammar import GrammarConstraint
from memra_engine.sampling import SamplingParams, make_rng, sample


class StepStrategy(Protocol):
    def step(self, fed: int) -> tuple[int, float]:
        """Feed `fed` at n_past; return the next token and its logprob (the constraint, if any,
        has accepted it)."""

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

    def step(self, fed: int) -> tuple[int, float]:
        logits = self.backend.decode(fed)
        allowed = None
        if self.constraint is not None:
            with self.mask_timer:
                allowed = self.constraint.allowed()
        token, logprob = sample(logits, self.params, self.history, self.rng, allowed)
        if self.constraint is not None:
            self.constraint.accept(token)
        return token, logprob


class DeviceSampling:
    def __init__(self, backend: Backend, params: SamplingParams, constraint: GrammarConstraint | None,
                 mask_timer: MaskTimer):
        self.backend, self.constraint, self.mask_timer = backend, constraint, mask_timer
        self.seed = backend.set_sampling(params, seed=params.seed, use_mask=constraint is not None)

    def set_params(self, params: SamplingParams, n_generated: int) -> None:
        # a fresh counter stream, so draws never repeat
        self.seed = self.backend.set_sampling(params, seed=(self.seed + n_generated) % 2**63,
                                              use_mask=self.constraint is not None)

    def step(self, fed: int) -> tuple[int, float]:
        if self.constraint is None:
            return self.backend.decode_sample(fed)
        mask = self.backend.begin_masked_step(fed)  # the GPU runs the forward meanwhile
        with self.mask_timer:
            self.constraint.mask_into(mask)
        token, logprob = self.backend.finish_masked_step()
        self.constraint.accept(token)
        return token, logprob


def strategy_for(backend: Backend, params: SamplingParams, history: list[int],
                 constraint: GrammarConstraint | None, mask_timer: MaskTimer) -> StepStrategy:
    if backend.samples_on_device:
        return DeviceSampling(backend, params, constraint, mask_timer)
    return HostSampling(backend, params, history, constraint, mask_timer)
