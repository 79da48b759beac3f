"""Backends for the speculative-decoding tests on the CPU.

- MemoBackend: a CpuBackend whose logits are memoized by the whole token sequence, so the
  distribution tests can draw 20,000 times from the same few contexts cheaply. The logits are
  the real model's (a prefill of the prefix, then a one-token decode).
- HostDevice: the cuda backend's sampling surface (set_sampling, decode_sample, the masked step
  pair, verify_sample, draft_tokens) over any host backend, sampled with engine/sampling.py and
  the cache's tokens as the penalty history, as the device does. It runs DeviceSpeculative's
  logic in CI.
"""
from __future__ import annotations

import numpy as np

from memra_engine.grammar import unpack_mask
from memra_engine.sampling import make_rng, sample


class _Passthrough:
    def __init__(self, inner):
        self.inner = inner
        self.config, self.n_ctx, self.kv_type = inner.config, inner.n_ctx, inner.kv_type
        self.device_name, self.prefill_chunk = inner.device_name, inner.prefill_chunk

    def memory_stats(self):
        return self.inner.memory_stats()

    def moe_stats(self):
        return None

    def bench_extras(self, runs: int, depth: int) -> dict:
        return {}

    def close(self) -> None:
        self.inner.close()


class MemoBackend(_Passthrough):
    samples_on_device = False

    def __init__(self, inner):
        super().__init__(inner)
        self.tokens: list[int] = []
        self.memo: dict[tuple[int, ...], np.ndarray] = {}

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def logits(self, seq: list[int]) -> np.ndarray:
        key = tuple(seq)
        if key not in self.memo:
            self.inner.truncate(0)
            if len(seq) > 1:
                self.inner.prefill(list(seq[:-1]))
            self.memo[key] = self.inner.decode(seq[-1])
        return self.memo[key]

    def prefill(self, tokens, all_logits: bool = False):
        rows = [self.decode(t) for t in tokens]
        return np.stack(rows) if all_logits else rows[-1]

    def decode(self, token: int) -> np.ndarray:
        self.tokens.append(int(token))
        return self.logits(self.tokens)

    def verify(self, tokens) -> np.ndarray:
        return np.stack([self.decode(t) for t in tokens])

    def truncate(self, n: int) -> None:
        assert 0 <= n <= len(self.tokens)
        del self.tokens[n:]


class HostDevice(_Passthrough):
    samples_on_device = True

    def __init__(self, inner):
        super().__init__(inner)
        self.tokens: list[int] = []  # what the cache holds: the penalty history
        self.words = -(-self.config.vocab_size // 32)
        self.mask_buf = np.empty(self.words, np.uint32)
        self.params = self.rng = None
        self.use_mask = False
        self.calls: list[tuple] = []  # ("step", ahead) per sampled step, ("verify",) per round

    @property
    def n_past(self) -> int:
        return self.inner.n_past

    def prefill(self, tokens, all_logits: bool = False):
        self.tokens += [int(t) for t in tokens]
        return self.inner.prefill(tokens, all_logits)

    def decode(self, token: int) -> np.ndarray:
        self.tokens.append(int(token))
        return self.inner.decode(token)

    def verify(self, tokens) -> np.ndarray:
        self.tokens += [int(t) for t in tokens]
        return self.inner.verify(tokens)

    def truncate(self, n: int) -> None:
        self.inner.truncate(n)
        del self.tokens[n:]

    def set_sampling(self, params, seed=None, use_mask=False) -> int:
        seed = 1234 if seed is None else seed
        self.params, self.rng, self.use_mask = params, make_rng(seed), use_mask
        return seed

    def decode_sample(self, token: int, ahead: bool = True):
        self.calls.append(("step", ahead))
        return sample(self.decode(token), self.params, self.tokens, self.rng)

    def begin_masked_step(self, token: int) -> np.ndarray:
        self._logits = self.decode(token)
        return self.mask_buf

    def finish_masked_step(self, ahead: bool = True):
        self.calls.append(("step", ahead))
        allowed = unpack_mask(self.mask_buf, self.config.vocab_size)
        return sample(self._logits, self.params, self.tokens, self.rng, allowed)

    def step_candidates(self):
        return None

    def verify_sample(self, tokens, masks=None):
        self.calls.append(("verify",))
        start = self.n_past
        rows = self.verify(tokens)
        out = []
        for i, row in enumerate(rows):
            allowed = unpack_mask(masks[i], self.config.vocab_size) if self.use_mask and masks is not None else None
            out.append(sample(row, self.params, self.tokens[:start + i + 1], self.rng, allowed))
        return out

    def draft_tokens(self, token: int, k: int) -> list[int]:
        out = []
        for _ in range(k):
            token, _ = self.decode_sample(token)
            out.append(token)
        return out
