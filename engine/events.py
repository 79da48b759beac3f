"""Plain data that crosses the seam between the engine and the UI (DESIGN.md §3)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    arch: str
    n_params: int
    quant_mix: str  # e.g. "Q4_1 x210, Q8_0 x1, F32 x61"
    n_ctx: int
    backend: str  # "cpu" | "cuda"
    device_name: str
    has_chat_template: bool
    kv_type: str = "f16"  # the KV cache's element type: "f16" | "q8_0"


@dataclass
class VramStats:
    """Bytes per pool region. On the cpu backend, `process_rss` is set and the rest are 0."""

    reserved: dict[str, int] = field(default_factory=dict)  # region -> bytes reserved
    used: dict[str, int] = field(default_factory=dict)  # region -> bytes used
    device_free: int = 0
    device_total: int = 0
    process_rss: int = 0


@dataclass
class MoeStats:
    hits: int = 0
    misses: int = 0
    bytes_moved: int = 0
    resident_experts: int = 0
    total_experts: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


@dataclass
class EngineStats:
    decode_tok_s: float = 0.0
    prefill_tok_s: float = 0.0
    time_to_first_token_s: float = 0.0
    n_prompt_tokens: int = 0
    n_generated: int = 0
    n_ctx_used: int = 0
    n_ctx: int = 0
    grammar_mask_ms_median: float = 0.0  # host time per token to compute the grammar mask
    grammar_mask_ms_p99: float = 0.0
    spec_accepted: int = 0
    spec_proposed: int = 0
    moe: MoeStats | None = None  # None: dense model
    vram: VramStats = field(default_factory=VramStats)


@dataclass(frozen=True)
class TokenEvent:
    text: str  # may be "" while a multi-byte character is incomplete
    id: int
    logprob: float


@dataclass(frozen=True)
class StatsEvent:
    stats: EngineStats


@dataclass(frozen=True)
class DoneEvent:
    reason: str  # "eos" | "stop" | "length" | "cancelled" | "error"
    error: str = ""  # one-line message when reason == "error"
