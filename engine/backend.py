"""The Backend protocol: what the generation loop calls, on the cpu and the gpu alike (DESIGN.md §4).

A backend owns the weights and the KV cache of one sequence. `n_past` counts the tokens in the
cache; prefill/decode/verify append at n_past, truncate rolls it back. Logits are float32 numpy
arrays on the host. A backend is created and used on one thread (the engine's).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from memra_engine.events import VramStats
from memra_engine.model.config import ModelConfig


class Backend(Protocol):
    config: ModelConfig
    n_ctx: int
    n_past: int

    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Append tokens; logits [vocab] for the last one, or [len(tokens), vocab] if all_logits.
        Raises ContextOverflowError (and changes nothing) if they do not fit in n_ctx."""

    def decode(self, token: int) -> np.ndarray:
        """Append one token; its logits [vocab]."""

    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens; logits [len(tokens), vocab], each row computed exactly as decode would."""

    def truncate(self, n: int) -> None:
        """Keep the first n tokens of the cache (0 <= n <= n_past)."""

    def memory_stats(self) -> VramStats:
        """Memory in use; the cpu backend sets process_rss only."""

    def close(self) -> None:
        """Release weights and cache; the backend is unusable afterwards."""
