"""Speculative decoding in the reply so far: how much of the drafts the target kept, per round and
per draft position (a draft's later tokens are kept less often: the bars show where it falls off)."""
from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineStats

BLOCKS = "▁▂▃▄▅▆▇█"


def position_bars(shares: list[float]) -> str:
    """One block per draft position, its height the share kept there. A share above 0 is never
    drawn as the lowest block, which stands for nothing kept."""
    return "".join(BLOCKS[0] if share <= 0 else BLOCKS[max(1, min(7, round(share * 7)))] for share in shares)


class SpecPane(Static):
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)

    def on_mount(self) -> None:
        self.border_title = "Speculative"
        self.update(self._describe(None))

    def _describe(self, s: EngineStats | None) -> str | Content:
        if s is None or s.spec_drafted == 0:
            return "[dim]off (no drafts this reply)[/dim]"
        shares = s.spec_acceptance_by_pos()
        return Content.from_markup(
            f"accepted [b]{s.spec_acceptance:.0%}[/b]  {s.spec_accepted:,} of {s.spec_drafted:,}\n"
            f"mean [b]{s.spec_mean_length:.2f}[/b] per round  {s.spec_rounds:,} rounds\n"
            f"by position [$accent]$bars[/] [dim]1–{len(shares)}[/dim]",
            bars=position_bars(shares))

    def watch_stats(self, stats: EngineStats | None) -> None:
        self.update(self._describe(stats))
