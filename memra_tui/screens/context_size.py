"""Ask for a context size to load the model with again (after an out-of-memory error, or from the
command palette). Dismisses with the number of tokens, or None."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from memra_tui.widgets.fit_text import WrappedText

MIN_CTX = 16  # Engine.load's floor


def smaller_context(n_ctx: int) -> int:
    """The context to suggest after running out of memory with n_ctx: half of it."""
    return max(MIN_CTX, n_ctx // 2)


def parse_context(text: str) -> int | None:
    """A context size typed by the user, or None when it is not a whole number >= MIN_CTX."""
    try:
        n = int(text.strip())
    except ValueError:
        return None
    return n if n >= MIN_CTX else None


class ContextSizeScreen(ModalScreen[int | None]):
    DEFAULT_CSS = """
    ContextSizeScreen { align: center middle; }
    ContextSizeScreen > Vertical { width: 72; max-width: 100%; height: auto; border: round $warning; padding: 0 1; }
    ContextSizeScreen #context-note { color: $error; margin: 0 0 1 0; }
    ContextSizeScreen Horizontal { height: auto; align-horizontal: right; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, n_ctx: int, note: str = "") -> None:
        super().__init__()
        self.n_ctx = n_ctx  # the value to offer
        self.note = note  # why we ask (the out-of-memory error), "" from the palette

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.note:
                yield WrappedText(self.note, id="context-note")
            yield Label("Context to load the model with again (tokens; this chat stays open):")
            yield Input(str(self.n_ctx), id="context-size", type="integer")
            with Horizontal():
                yield Button("Reload (enter)", id="reload", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    @on(Button.Pressed, "#reload")
    def action_reload(self) -> None:
        n_ctx = parse_context(self.query_one(Input).value)
        if n_ctx is None:
            self.notify(f"the context is a whole number of tokens, {MIN_CTX} or more", severity="error")
            return
        self.dismiss(n_ctx)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
