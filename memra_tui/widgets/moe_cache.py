"""The MoE expert cache: hits, misses, bytes copied in, experts resident in VRAM."""
from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineStats
from memra_tui.format import fmt_bytes, fmt_count


class MoeCachePane(Static):
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)

    def on_mount(self) -> None:
        self.border_title = "MoE cache"
        self.update(self._describe(None))

    def _describe(self, s: EngineStats | None) -> str:
        if s is None:
            return "[dim]—[/dim]"
        if s.moe is None:
            return "[dim]dense model[/dim]"
        m = s.moe
        return (f"hits {fmt_count(m.hits)}  misses {fmt_count(m.misses)}  [b]{m.hit_rate:.1%}[/b]\n"
                f"moved {fmt_bytes(m.bytes_moved)}  resident {m.resident_experts}/{m.total_experts}")

    def watch_stats(self, stats: EngineStats | None) -> None:
        self.update(self._describe(stats))
