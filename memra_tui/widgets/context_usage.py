"""Tokens in the context window versus its size."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static


class ContextPane(Vertical):
    DEFAULT_CSS = """
    ContextPane { height: auto; }
    ContextPane > ProgressBar { height: 1; }
    ContextPane Bar { width: 1fr; }
    """
    used: reactive[int] = reactive(0, init=False)
    n_ctx: reactive[int] = reactive(0, init=False)

    def compose(self) -> ComposeResult:
        yield Static("", id="context-numbers")
        yield ProgressBar(total=1, show_eta=False, show_percentage=False, id="context-bar")

    def on_mount(self) -> None:
        self.border_title = "Context"
        self._show()

    def _show(self) -> None:
        share = self.used / self.n_ctx if self.n_ctx else 0.0
        numbers = (f"{self.used:,} / {self.n_ctx:,} tokens  ({share:.0%})" if self.n_ctx
                   else f"{self.used:,} tokens  (size not reported)")  # a remote server that does not say
        self.query_one("#context-numbers", Static).update(numbers)
        self.query_one(ProgressBar).update(total=max(self.n_ctx, 1), progress=self.used)

    def watch_used(self) -> None:
        self._show()

    def watch_n_ctx(self) -> None:
        self._show()
