"""F1: every key the app answers to, read from the bindings themselves so the list stays true."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label


def key_rows(sections: list[tuple[str, list]]) -> list[tuple[str, str, str]]:
    """(where, key, description) for every binding with a description; a key listed in an earlier
    section (the composer repeats some chat keys so they work while it has focus) is not repeated."""
    rows, seen = [], set()
    for where, bindings in sections:
        for b in bindings:
            if not isinstance(b, Binding) or b.system or not b.description:
                continue
            for key in (k.strip() for k in b.key.split(",")):
                if (key, b.description) in seen:
                    continue
                seen.add((key, b.description))
                rows.append((where, key, b.description))
    return rows


class HelpScreen(ModalScreen):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 72; max-width: 100%; height: 90%; border: round $accent; padding: 0 1; }
    HelpScreen DataTable { height: 1fr; }
    HelpScreen .hint { color: $text-muted; }
    """
    BINDINGS = [Binding("escape,f1", "dismiss", "Close help")]

    def __init__(self, sections: list[tuple[str, list]]) -> None:
        super().__init__()
        self.rows = key_rows(sections)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Keys[/b]  (Ctrl+P opens the command palette; Esc or F1 closes this)", classes="hint")
            table = DataTable(cursor_type="row", zebra_stripes=True, id="keys")
            table.add_columns("where", "key", "does")
            for where, key, does in self.rows:
                table.add_row(where, self.app.get_key_display(Binding(key, "")), does)
            yield table
