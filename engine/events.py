"""Plain data that crosses the seam between the engine and the UI (docs/design.md §3.2)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memra_engine.candidates import TokenCandidates


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    arch: str
    n_params: int
    quant_mix: str  # e.g. "Q4_1 x210, Q8_0 x1, F32 x61"
    n_ctx: int
    backend: str  # "cpu" | "cuda" | "remote" (an OpenAI-compatible server, engine/remote.py)
    device_name: str
    has_chat_template: bool
    kv_type: str = "f16"  # the KV cache's element type: "f16" | "q8_0"
    draft_model_name: str = ""  # the draft model loaded for speculative decoding ("" = none)
    # (knob, note) for the knobs the engine does not apply as given: the remote engine's extra
    # fields (engine/remote_knobs.py). The knobs pane shows each note under its knob.
    knob_notes: tuple[tuple[str, str], ...] = ()

    @property
    def remote(self) -> bool:
        """The model runs on a server: no VRAM pool or expert cache here to show."""
        return self.backend == "remote"


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
    """The MoE expert cache (engine/gpu/expert_cache.py). A hit is one routed (token, expert)
    whose weights were in a VRAM slot; a miss read them from host memory and queued a copy-in.
    Fields without `total_` count this reply; `total_` ones count since the model loaded."""

    hits: int = 0
    misses: int = 0
    bytes_moved: int = 0  # expert bytes copied host -> VRAM slots
    copy_seconds: float = 0.0  # time those copies took on the copy stream
    resident_experts: int = 0  # experts in VRAM now (all of them when the cache is off)
    total_experts: int = 0  # n_layer * n_expert
    slot_bytes: int = 0  # VRAM reserved for expert slots (0: every expert resident with the weights)
    total_hits: int = 0
    total_misses: int = 0
    total_bytes_moved: int = 0
    total_copy_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def total_hit_rate(self) -> float:
        n = self.total_hits + self.total_misses
        return self.total_hits / n if n else 0.0

    def since(self, base: "MoeStats") -> "MoeStats":
        """This reply's counters: the totals now less the totals `base` had when it began."""
        return replace(self, hits=self.total_hits - base.total_hits, misses=self.total_misses - base.total_misses,
                       bytes_moved=self.total_bytes_moved - base.total_bytes_moved,
                       copy_seconds=self.total_copy_seconds - base.total_copy_seconds)

    @property
    def copy_gb_s(self) -> float:
        """Host -> VRAM copy rate of this reply's misses (0 when nothing was copied)."""
        return self.bytes_moved / self.copy_seconds / 1e9 if self.copy_seconds > 0 else 0.0


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
    # speculative decoding (engine/speculative.py), this reply so far
    spec_rounds: int = 0  # verify passes
    spec_drafted: int = 0  # draft tokens verified
    spec_accepted: int = 0  # draft tokens the target kept
    spec_drafted_by_pos: list[int] = field(default_factory=list)  # [i]: rounds that drafted a token at position i
    spec_accepted_by_pos: list[int] = field(default_factory=list)  # [i]: rounds that kept it
    moe: MoeStats | None = None  # None: dense model
    vram: VramStats = field(default_factory=VramStats)

    @property
    def spec_acceptance(self) -> float:
        """Share of drafted tokens the target kept (0 when nothing was drafted)."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def spec_mean_length(self) -> float:
        """Draft tokens kept per verify pass (each pass also yields one token of the target's own)."""
        return self.spec_accepted / self.spec_rounds if self.spec_rounds else 0.0

    def spec_acceptance_by_pos(self) -> list[float]:
        """[i]: of the rounds that drafted a token at position i, the share that kept it."""
        return [a / d if d else 0.0 for a, d in zip(self.spec_accepted_by_pos, self.spec_drafted_by_pos)]


@dataclass(frozen=True)
class TokenEvent:
    text: str  # may be "" while a multi-byte character is incomplete
    id: int
    logprob: float
    # SamplingParams.top_logprobs > 0: why this token was drawn (engine/candidates.py); None: off,
    # or a step that reports none (the cuda backend's speculative rounds, a remote server)
    candidates: TokenCandidates | None = None


@dataclass(frozen=True)
class StatsEvent:
    stats: EngineStats


ERROR_KINDS = ("out_of_memory", "prompt_too_long")  # the errors the UI offers a way out of


@dataclass(frozen=True)
class DoneEvent:
    reason: str  # "eos" | "stop" | "length" (max tokens) | "context" (context full) | "cancelled" | "error"
    error: str = ""  # one-line message when reason == "error"
    # with reason "error": "out_of_memory" (a smaller context may fit), "prompt_too_long" (the
    # conversation outgrew the context: old turns could go), "" for any other. A label for the UI
    # to act on, derived from the error: two events with the same message are equal whatever it is.
    error_kind: str = field(default="", compare=False)
