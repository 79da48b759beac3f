"""The Backend protocol: what the generation loop calls, on the cpu and the gpu alike (docs/design.md §4.1).

A backend owns the weights and the KV cache of one sequence. `n_past` counts the tokens in the
cache; prefill/decode/verify append at n_past, truncate rolls it back. Logits are float32 numpy
arrays on the host. A backend is created and used on one thread (the engine's).

Everything engine/generate.py, engine/steps.py and engine/bench.py use is declared here; they
never probe a backend for attributes. A backend that samples on the device (`samples_on_device`)
implements the device-sampling methods (and the speculative verify_sample / draft_tokens); the
cpu backend raises NotImplementedError from them, and the generation loop does not call them there.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from memra_engine.errors import ContextOverflowError
from memra_engine.events import MoeStats, VramStats
from memra_engine.model.config import ModelConfig
from memra_engine.sampling import SamplingParams


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


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share: what a KV cache holding `a` keeps for `b`."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class Backend(Protocol):
    config: ModelConfig
    n_ctx: int
    n_past: int
    kv_type: str            # "f16" | "q8_0" (engine/kv_type.py)
    device_name: str        # what the chat header names: "NVIDIA H200", "AMD EPYC ... (2 threads)"
    prefill_chunk: int      # tokens per prefill call the generation loop makes
    samples_on_device: bool # True: set_sampling / decode_sample / the masked step pair work

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

    def moe_stats(self) -> MoeStats | None:
        """Expert-cache counters; None for a dense model."""

    def bench_extras(self, runs: int, depth: int) -> dict:
        """Backend-specific figures for memra-bench ({} when there are none); depth: the context
        (memra-bench --ctx-depth) that figures "at depth" decode after."""

    # ---- device sampling (samples_on_device only) ------------------------------------------
    def set_sampling(self, params: SamplingParams, seed: int | None = None, use_mask: bool = False) -> int:
        """Knobs for the next sampled steps (no recapture); returns the seed in use.
        use_mask: the sampler applies the bitmask of the masked step pair below."""

    def decode_sample(self, token: int, ahead: bool = True) -> tuple[int, float]:
        """Decode `token` at n_past and sample the next one on the device: (token id, logprob).
        ahead: the backend may queue the steps after this one, for a caller that feeds back the
        token it gets (a plain decode loop); False when the next call may be something else (a
        speculative round's verify), which would throw that queued work away."""

    def begin_masked_step(self, token: int) -> np.ndarray:
        """Queue the forward of `token` at n_past and return the pinned uint32 bitmask buffer that
        the step's sampling will use: the caller fills it (engine/grammar.py layout) while the GPU
        runs the forward, then calls finish_masked_step()."""

    def finish_masked_step(self, ahead: bool = True) -> tuple[int, float]:
        """Upload the mask, sample on the device, and return (token id, logprob). ahead: the
        backend may queue the next token's forward meanwhile (as decode_sample's ahead)."""

    def step_candidates(self) -> "TokenCandidates | None":
        """The candidates (engine/candidates.py) of the token the last decode_sample or
        finish_masked_step returned, when set_sampling's params.top_logprobs > 0; else None."""

    def verify_sample(self, tokens: Sequence[int], masks: np.ndarray | None = None) -> list[tuple[int, float]]:
        """Append tokens (a speculative round: the fed token and its drafts, at most 16) and sample
        every row on the device: row i's penalty window ends at tokens[i], and with use_mask its
        bitmask is masks[i] (uint32 [len(tokens), words]). Returns (token id, logprob) per row; each
        row consumes one draw of the random stream."""

    def draft_tokens(self, token: int, k: int) -> list[int]:
        """Feed `token` at n_past and k - 1 of the tokens sampled after it, back to back on the
        device with the knobs of set_sampling (a draft model's greedy drafts); returns the k
        sampled tokens. n_past grows by k."""
