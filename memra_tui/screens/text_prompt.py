"""A small modal that asks for text (rename a chat, set the system prompt). Dismisses with str | None."""
from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from memra_tui.widgets.fit_text import WrappedText


class TextPromptScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    TextPromptScreen { align: center middle; }
    TextPromptScreen > Vertical { width: 72; max-width: 100%; height: auto; border: round $accent; padding: 0 1; }
    TextPromptScreen TextArea { height: 8; }
    TextPromptScreen Horizontal { height: auto; align-horizontal: right; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, title: str, initial: str = "", multiline: bool = False) -> None:
        super().__init__()
        self.title_text, self.initial, self.multiline = title, initial, multiline

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            if self.multiline:
                yield TextArea(self.initial, id="prompt-text", soft_wrap=True)
            else:
                yield Input(self.initial, id="prompt-text")
            with Horizontal():
                yield Button("Save (ctrl+s)", id="save", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#prompt-text").focus()

    def _value(self) -> str:
        widget = self.query_one("#prompt-text")
        return widget.text if isinstance(widget, TextArea) else widget.value

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        self.dismiss(self._value().strip())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 60; max-width: 100%; height: auto; border: round $warning; padding: 0 1; }
    """
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield WrappedText(self.question, id="question")  # a long question wraps at word boundaries
            yield Label("[b]y[/b] yes   [b]n[/b] no")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
