"""Shown while the engine loads on its worker thread: each progress step as it is reported.

The model's path and the steps wrap at word and path boundaries (a long path never runs off the
box or breaks inside a directory name where a separator can take the break)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Label, LoadingIndicator

from memra_tui.widgets.fit_text import WrappedText
from memra_tui.widgets.key_footer import KeyFooter


class LoadingScreen(Screen):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical { width: 72; max-width: 100%; height: auto; border: round $accent; padding: 1 2; }
    LoadingScreen #load-model { text-style: bold; }
    LoadingScreen LoadingIndicator { height: 1; }
    LoadingScreen #load-steps { height: 8; background: $surface; }
    """

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.steps: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Loading")
            yield WrappedText(self.model, id="load-model")
            yield LoadingIndicator()
            with VerticalScroll(id="load-steps"):
                yield WrappedText("", id="load-steps-text")
        yield KeyFooter()

    def add_step(self, text: str) -> None:
        self.steps.append(text)
        self.query_one("#load-steps-text", WrappedText).set_text("\n".join(self.steps))
        self.query_one("#load-steps", VerticalScroll).scroll_end(animate=False)
