"""Sampling parameters and the CPU reference sampler.

SamplingParams is plain data: the UI edits it, the engine reads it at the start of a job.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)
