"""The VRAM pool as one bar (weights, KV, MoE experts, scratch, other, free) with numbers; process memory on cpu."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineStats
from memra_tui.format import fmt_bytes

COLORS = {"weights": "#5f87d7", "kv": "#5fafaf", "experts": "#87af5f", "scratch": "#d7af5f", "other": "#875f87",
          "free": "#3a3a3a"}


def pool_segments(s: EngineStats) -> list[tuple[str, int]]:
    """Bytes per bar segment. `other` is what the device uses outside our pool (context, other processes).
    `experts` (the MoE expert cache's slots) is a segment only when the backend reports the region."""
    v = s.vram
    reserved = dict(v.reserved)
    weights, kv = reserved.pop("weights", 0), reserved.pop("kv", 0)
    experts = [("experts", reserved.pop("experts"))] if "experts" in reserved else []
    scratch = sum(reserved.values())  # scratch, graph and any other named region
    other = max(0, v.device_total - v.device_free - weights - kv - sum(n for _, n in experts) - scratch)
    return [("weights", weights), ("kv", kv), *experts, ("scratch", scratch), ("other", other), ("free", v.device_free)]


REMOTE = "remote [dim](not reported)[/dim]"  # the server's memory


class MemoryPoolPane(Static):
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)

    def __init__(self, remote: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.remote = remote  # the model runs on a server: its memory is not ours to see

    def on_mount(self) -> None:
        self.border_title = "Memory"
        self.update(REMOTE if self.remote else "[dim]—[/dim]")

    def watch_stats(self, stats: EngineStats | None) -> None:
        self.update(self._describe(stats))

    def _describe(self, s: EngineStats | None):
        if self.remote:
            return REMOTE
        if s is None:
            return "[dim]—[/dim]"
        if s.vram.device_total == 0:
            return Text.from_markup(f"process memory [b]{fmt_bytes(s.vram.process_rss)}[/b]\n[dim](cpu backend: no VRAM pool)[/dim]")
        segments = pool_segments(s)
        width = max(10, self.content_size.width or 30)
        total = sum(n for _, n in segments) or 1
        bar = Text()
        cells_left = width
        for i, (name, n) in enumerate(segments):
            cells = cells_left if i == len(segments) - 1 else min(cells_left, round(width * n / total))
            cells = max(cells, 1 if n and cells_left else 0)
            bar.append("█" * cells, style=COLORS[name])
            cells_left -= cells
        legend = Text()
        for name, n in segments:
            legend.append("■ ", style=COLORS[name])
            legend.append(f"{name} {fmt_bytes(n)}\n")
        # the KV buffers are allocated whole at load, so the pool's own "used" is always all of
        # them: what a user wants is how much of the cache the conversation fills
        kv = s.vram.reserved.get("kv", 0)
        filled = kv * min(s.n_ctx_used, s.n_ctx) // s.n_ctx if s.n_ctx else s.vram.used.get("kv", 0)
        legend.append(f"KV filled {fmt_bytes(filled)} of {fmt_bytes(kv)}", style="dim")
        return Text("\n").join([bar, legend])
