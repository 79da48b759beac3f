"""The column of engine panes; it hands each new EngineStats down to them."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive

from memra_engine.events import EngineStats
from memra_tui.widgets.context_usage import ContextPane
from memra_tui.widgets.memory_pool import MemoryPoolPane
from memra_tui.widgets.moe_cache import MoeCachePane
from memra_tui.widgets.spec_acceptance import SpecPane
from memra_tui.widgets.throughput import ThroughputPane


class EnginePanes(VerticalScroll):
    DEFAULT_CSS = """
    EnginePanes { height: 1fr; }
    EnginePanes > * { height: auto; border: round $primary 40%; border-title-color: $text-accent; padding: 0 1; }
    """
    stats: reactive[EngineStats | None] = reactive(None, always_update=True, init=False)
    history: reactive[list[float]] = reactive(list, always_update=True, init=False)

    def __init__(self, n_ctx: int, remote: bool = False, **kwargs) -> None:
        """remote: the model runs on a server (EngineInfo.remote), whose memory and experts the
        memory and MoE panes cannot see."""
        super().__init__(**kwargs)
        self._n_ctx = n_ctx
        self._remote = remote

    def compose(self) -> ComposeResult:
        yield ThroughputPane()
        yield SpecPane()
        yield MoeCachePane(remote=self._remote)
        yield MemoryPoolPane(remote=self._remote)
        yield ContextPane()

    def on_mount(self) -> None:
        self.query_one(ContextPane).n_ctx = self._n_ctx

    def watch_stats(self, stats: EngineStats | None) -> None:
        if stats is None:
            return
        for pane in (self.query_one(ThroughputPane), self.query_one(SpecPane), self.query_one(MoeCachePane),
                     self.query_one(MemoryPoolPane)):
            pane.stats = stats
        context = self.query_one(ContextPane)
        context.n_ctx = stats.n_ctx or self._n_ctx
        context.used = stats.n_ctx_used

    def watch_history(self, history: list[float]) -> None:
        self.query_one(ThroughputPane).history = history
