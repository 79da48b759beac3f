"""Shown while the engine loads on its worker thread: each progress step as it is reported."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Label, LoadingIndicator, Log
from memra_tui.widgets.key_footer import KeyFooter


class LoadingScreen(Screen):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical { width: 72; max-width: 100%; height: auto; border: round $accent; padding: 1 2; }
    LoadingScreen LoadingIndicator { height: 1; }
    LoadingScreen Log { height: 8; background: $surface; }
    """

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Loading [b]{self.model}[/b]")
            yield LoadingIndicator()
            yield Log(id="load-steps")
        yield KeyFooter()

    def add_step(self, text: str) -> None:
        self.query_one(Log).write_line(text)
