"""Decode speed now and over recent replies, prefill speed, and time to first token."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from memra_engine.events import EngineStats
from memra_tui.format import fmt_rate


class ThroughputPane(Vertical):
    DEFAULT_CSS = """
    ThroughputPane { height: auto; }
    ThroughputPane > Sparkline { height: 2; margin: 0 0 0 0; display: none; }
    ThroughputPane > Sparkline.-has-data { display: block; }
    ThroughputPane > #throughput-history-label { color: $text-muted; display: none; }
    ThroughputPane > #throughput-history-label.-has-data { display: block; }
    """
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)
    history: reactive[list[float]] = reactive(list, always_update=True, init=False)  # decode tok/s per reply

    def compose(self) -> ComposeResult:
        yield Static(self._describe(None), id="throughput-numbers")
        yield Static("", id="throughput-history-label")
        yield Sparkline([], id="throughput-history", summary_function=max)

    def on_mount(self) -> None:
        self.border_title = "Throughput"

    def _describe(self, s: EngineStats | None) -> str:
        if s is None:
            return "decode   —\nprefill  —\nTTFT     —"
        return (f"decode   [b]{fmt_rate(s.decode_tok_s)}[/b]\n"
                f"prefill  {fmt_rate(s.prefill_tok_s)}\n"
                f"TTFT     {s.time_to_first_token_s * 1000:.0f} ms")

    def watch_stats(self, stats: EngineStats | None) -> None:
        self.query_one("#throughput-numbers", Static).update(self._describe(stats))

    def watch_history(self, history: list[float]) -> None:
        recent = list(history[-24:])
        spark = self.query_one(Sparkline)
        spark.data = recent
        label = self.query_one("#throughput-history-label", Static)
        if len(recent) == 1:
            label.update(f"last reply: {recent[0]:,.0f} tok/s")
        elif recent:
            label.update(f"last {len(recent)} replies: {min(recent):,.0f}–{max(recent):,.0f} tok/s")
        label.set_class(bool(recent), "-has-data")
        spark.set_class(len(recent) > 1, "-has-data")  # one reply's line would be a solid block, not a trend
