"""The MoE expert cache: the hit rate (this reply, since load, and a sparkline of recent updates),
the host -> VRAM copies of the misses, and how many experts are resident in how much VRAM."""
from __future__ import annotations

from collections import deque
from statistics import fmean

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from memra_engine.events import EngineStats, MoeStats
from memra_tui.format import fmt_bytes, fmt_count

HISTORY = 60  # stats updates the sparkline keeps (a few a second while a reply streams)


def fmt_share(hits: int, misses: int) -> str:
    return f"{hits / (hits + misses):.1%}" if hits + misses else "—"  # no lookups yet: no rate


class MoeCachePane(Vertical):
    """The sparkline plots the hit rate of the lookups between one update and the next (from the
    since-load totals), so it shows the cache warming up across replies and is not reset by a new
    reply; the numbers above it are this reply's. Every line is kept to one row (cut, not wrapped)
    and the MoE layout has a fixed number of rows, so the pane does not change height as it updates."""

    DEFAULT_CSS = """
    MoeCachePane { height: auto; }
    MoeCachePane > Static { text-wrap: nowrap; text-overflow: ellipsis; }
    MoeCachePane > .-moe-only { display: none; }
    MoeCachePane.-moe > .-moe-only { display: block; }
    MoeCachePane > Sparkline { height: 1; }
    MoeCachePane > #moe-history-label { color: $text-muted; }
    """
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)

    def __init__(self, remote: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.remote = remote  # the model runs on a server: no expert cache here to show
        self.history: deque[float] = deque(maxlen=HISTORY)  # hit rate per update, oldest first
        self._seen = (0, 0)  # (total_hits, total_misses) at the last update

    def compose(self) -> ComposeResult:
        yield Static("remote [dim](not reported)[/dim]" if self.remote else "[dim]—[/dim]", id="moe-rates")
        yield Sparkline([], id="moe-history", classes="-moe-only", summary_function=fmean)
        yield Static("", id="moe-history-label", classes="-moe-only")
        yield Static("", id="moe-traffic", classes="-moe-only")

    def on_mount(self) -> None:
        self.border_title = "MoE cache"

    def watch_stats(self, stats: EngineStats | None) -> None:
        if self.remote:
            return
        m = stats.moe if stats is not None else None
        self.set_class(m is not None, "-moe")
        rates = self.query_one("#moe-rates", Static)
        if m is None:
            rates.update("[dim]—[/dim]" if stats is None else "[dim]dense model[/dim]")
            return
        self._record(m)
        rates.update(f"hit rate [b]{fmt_share(m.hits, m.misses)}[/b]  total {fmt_share(m.total_hits, m.total_misses)}\n"
                     f"hits {fmt_count(m.hits)}  misses {fmt_count(m.misses)}")
        self.query_one(Sparkline).data = list(self.history)
        n = len(self.history)
        self.query_one("#moe-history-label", Static).update(
            f"last {n} update{'s' if n > 1 else ''}: {min(self.history):.0%}–{max(self.history):.0%}" if n
            else "no lookups yet")
        copied = f"copied {fmt_bytes(m.bytes_moved)}" + (f" at {m.copy_gb_s:.1f} GB/s" if m.copy_seconds > 0 else "")
        slots = f"slots {fmt_bytes(m.slot_bytes)} of VRAM" if m.slot_bytes else "no expert slots (cache off)"
        self.query_one("#moe-traffic", Static).update(
            f"{copied}\nresident {m.resident_experts}/{m.total_experts} experts\n{slots}")

    def _record(self, m: MoeStats) -> None:
        """Add the hit rate of the lookups since the last update (none since: nothing to add)."""
        seen_hits, seen_misses = self._seen
        if m.total_hits < seen_hits or m.total_misses < seen_misses:  # another model: its own totals
            seen_hits, seen_misses = 0, 0
        hits, misses = m.total_hits - seen_hits, m.total_misses - seen_misses
        if hits + misses:
            self.history.append(hits / (hits + misses))
        self._seen = (m.total_hits, m.total_misses)
