"""Speculative decoding: how many drafted tokens the target model accepted."""
from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineStats


class SpecPane(Static):
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)

    def on_mount(self) -> None:
        self.border_title = "Speculative"
        self.update(self._describe(None))

    def _describe(self, s: EngineStats | None) -> str:
        if s is None or s.spec_proposed == 0:
            return "[dim]off (no drafts this reply)[/dim]"
        rate = s.spec_accepted / s.spec_proposed
        return f"accepted {s.spec_accepted:,} / {s.spec_proposed:,}  [b]{rate:.0%}[/b]"

    def watch_stats(self, stats: EngineStats | None) -> None:
        self.update(self._describe(stats))
