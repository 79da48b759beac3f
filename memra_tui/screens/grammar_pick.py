"""Which grammar of one kind: a shipped example, or a path (a pattern, for a regex) typed in.

The grammar is built here, so an invalid one is refused at once with its one-line reason and the
screen stays open to fix it. Dismisses with the Grammar, or None when cancelled.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList, Static

from memra_engine.errors import GrammarError
from memra_engine.grammar import KIND_LABELS, Grammar, kind_for_file

PLACEHOLDERS = {
    "json_schema": "path to a JSON schema (.json)",
    "regex": "a regex the whole reply matches, e.g. [0-9]+",
    "lark": "path to a Lark grammar (.lark)",
    "gbnf": "path to a llama.cpp GBNF grammar (.gbnf)",
}


def example_grammars(kind: str) -> list[Path]:
    """The example grammars shipped in memra_tui.assets of this kind, by file name."""
    folder = resources.files("memra_tui.assets") / "grammars"
    return sorted(Path(str(entry)) for entry in folder.iterdir() if kind_for_file(Path(entry.name)) == kind)


class GrammarPickScreen(ModalScreen[Grammar | None]):
    DEFAULT_CSS = """
    GrammarPickScreen { align: center middle; }
    GrammarPickScreen > Vertical { width: 72; max-width: 100%; height: auto; border: round $accent; padding: 0 1; }
    GrammarPickScreen OptionList { height: auto; max-height: 8; margin: 0 0 1 0; }
    GrammarPickScreen #grammar-error { color: $error; display: none; }
    GrammarPickScreen #grammar-error.-shown { display: block; }
    GrammarPickScreen .hint { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, kind: str, current: Grammar | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.examples = example_grammars(kind)
        # a regex typed earlier comes back to edit; a file's path is not kept, only its name
        typed_regex = kind == "regex" and current is not None and current.kind == "regex" and not current.name
        self.initial = current.source if typed_regex else ""

    def compose(self) -> ComposeResult:
        typed = "a pattern" if self.kind == "regex" else "a path"
        with Vertical():
            yield Label(f"[b]{KIND_LABELS[self.kind]}[/b]: pick an example or type {typed}")
            if self.examples:
                yield OptionList(*(path.name for path in self.examples), id="grammar-examples")
            yield Input(self.initial, placeholder=PLACEHOLDERS[self.kind], id="grammar-text")
            yield Static("", id="grammar-error", markup=False)  # the message may quote a pattern
            yield Label("enter uses it · tab switches · esc cancels", classes="hint")

    def on_mount(self) -> None:
        if self.kind == "regex" or not self.examples:
            self.query_one(Input).focus()
        else:
            self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _example_chosen(self, event: OptionList.OptionSelected) -> None:
        self._use(lambda: Grammar.from_file(self.examples[event.option_index], kind=self.kind))

    @on(Input.Submitted)
    def _text_submitted(self, event: Input.Submitted) -> None:
        if self.kind == "regex":
            self._use(lambda: Grammar.regex(event.value))  # spaces may be part of the pattern
        elif not event.value.strip():
            self._show_error("type a path or pick an example")
        else:
            self._use(lambda: Grammar.from_file(Path(event.value.strip()).expanduser(), kind=self.kind))

    def _use(self, build) -> None:
        try:
            grammar = build()
        except GrammarError as e:
            self._show_error(str(e))
            return
        self.dismiss(grammar)

    def _show_error(self, message: str) -> None:
        error = self.query_one("#grammar-error", Static)
        error.update(f"✗ {message}")
        error.add_class("-shown")

    def action_cancel(self) -> None:
        self.dismiss(None)
