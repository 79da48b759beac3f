"""The Backend protocol: what the generation loop calls, on the cpu and the gpu alike (DESIGN.md §4).

A backend owns the weights and the KV cache of one sequence. `n_past` counts the tokens in the
cache; prefill/decode/verify append at n_past, truncate rolls it back. Logits are float32 numpy
arrays on the host. A backend is created and used on one thread (the engine's).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from memra_engine.errors import ContextOverflowError
from memra_engine.events import VramStats
from memra_engine.model.config import ModelConfig


def check_tokens(tokens: Sequence[int], vocab_size: int, n_past: int, n_ctx: int) -> np.ndarray:
    """Token ids as int32, or a one-line error: empty, out of the vocabulary, or past n_ctx
    (ContextOverflowError, before anything changes). Both backends call it before a step."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if len(ids) == 0:
        raise ValueError("no tokens given")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token id out of range 0..{vocab_size - 1}")
    if n_past + len(ids) > n_ctx:
        raise ContextOverflowError(f"{len(ids)} more tokens do not fit: {n_past} of the {n_ctx}-token context are used")
    return ids.astype(np.int32)


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
