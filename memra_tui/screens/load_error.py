"""A model that failed to load: the one-line reason, a picker for another file and, when it ran out
of memory, the context to load it with (half the one that failed, to start with)."""
from __future__ import annotations

from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, DirectoryTree, Input, Label

from memra_tui.screens.context_size import MIN_CTX, parse_context
from memra_tui.widgets.fit_text import WrappedText
from memra_tui.widgets.key_footer import KeyFooter


class GgufTree(DirectoryTree):
    def filter_paths(self, paths):
        return [p for p in paths if not p.name.startswith(".") and (p.is_dir() or p.suffix.lower() == ".gguf")]


class LoadErrorScreen(Screen):
    DEFAULT_CSS = """
    LoadErrorScreen { align: center middle; }
    LoadErrorScreen > Vertical { width: 90; max-width: 100%; height: 1fr; max-height: 30; border: round $error; padding: 0 1; }
    LoadErrorScreen #load-error { color: $error; text-style: bold; margin: 0 0 1 0; }
    LoadErrorScreen #model-path { margin: 0 0 0 0; }
    LoadErrorScreen GgufTree { height: 1fr; border: round $primary 40%; }
    LoadErrorScreen Horizontal { height: auto; align-horizontal: right; }
    LoadErrorScreen #context-row { align-horizontal: left; }
    LoadErrorScreen #context-row Label { padding: 1 1 0 0; }
    LoadErrorScreen #context-size { width: 16; }
    """
    BINDINGS = [Binding("ctrl+o", "load", "Load file"), Binding("ctrl+q", "app.quit", "Quit")]

    def __init__(self, message: str, model: str, picker_root: Path, n_ctx: int | None = None) -> None:
        """model: the path that failed ("" for the default model, which an empty path loads).
        n_ctx: the context to offer (out of memory), None: no context field."""
        super().__init__()
        self.message = message
        self.model = model
        self.picker_root = picker_root
        self.n_ctx = n_ctx

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Could not load the model", classes="title")
            yield WrappedText(self.message, id="load-error")  # a long path wraps at its separators
            yield Label("Pick another GGUF file (type a path, or choose below):")
            yield Input(self.model, id="model-path", placeholder="path/to/model.gguf, or empty for the default model")
            if self.n_ctx is not None:
                with Horizontal(id="context-row"):
                    yield Label("Context (tokens, the KV cache grows with it):")
                    yield Input(str(self.n_ctx), id="context-size", type="integer")
            yield GgufTree(self.picker_root, id="model-picker")
            with Horizontal():
                yield Button("Load", id="load", variant="primary")
                yield Button("Quit", id="quit", variant="error")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#context-size" if self.n_ctx is not None else "#model-path", Input).focus()

    @on(DirectoryTree.FileSelected)
    def _file_picked(self, event: DirectoryTree.FileSelected) -> None:
        self.query_one(Input).value = str(event.path)
        self.action_load()

    @on(Input.Submitted)
    def _path_submitted(self) -> None:
        self.action_load()

    @on(Button.Pressed, "#load")
    def _load_pressed(self) -> None:
        self.action_load()

    @on(Button.Pressed, "#quit")
    async def _quit_pressed(self) -> None:
        await self.app.run_action("quit")

    def action_load(self) -> None:
        path = self.query_one("#model-path", Input).value.strip()
        n_ctx = None
        if self.n_ctx is not None:
            n_ctx = parse_context(self.query_one("#context-size", Input).value)
            if n_ctx is None:
                self.notify(f"the context is a whole number of tokens, {MIN_CTX} or more", severity="error")
                return
        self.app.load_model(path or None, n_ctx)
