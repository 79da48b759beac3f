"""The token inspector (the Tokens tab, shown while the token cursor is on): why the token under
the cursor was drawn. Its candidates as bars, before the sampler chain (the model's own
distribution) and after it (the distribution the draw used), the drawn one marked (▶), each
removed candidate with the stage that removed it (grammar, top-k, top-p, min-p, greedy); the
drawn token's rank and logprob. A reply without candidates says why in one line. The model's
candidates are numbered: keys 1-9, 0 branch the reply there with that one (ChatScreen.action_branch).
"""
from __future__ import annotations

import math

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from memra_engine.candidates import Candidate
from memra_engine.events import TokenEvent
from memra_tui.tokens import INSPECTOR_TOP_LOGPROBS, percent, show_piece

STAGE_NAMES = {"grammar": "grammar", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p", "greedy": "greedy"}
EIGHTHS = " ▏▎▍▌▋▊▉"
LABEL_CELLS = 10  # a candidate's text, quoted, cut to this many cells


def bar(fraction: float, width: int) -> str:
    """fraction of width cells, in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)


def label(text: str, cells: int = LABEL_CELLS) -> str:
    shown = show_piece(text)
    if cell_len(shown) > cells:
        while cell_len(shown) > cells - 1:
            shown = shown[:-1]
        shown += "…"
    return shown + " " * (cells - cell_len(shown))


class CandidateBars(Widget):
    """One chart: a row per candidate, its probability under `side` ("model" or "final") as a bar."""

    COMPONENT_CLASSES = {"candidate-bars--bar", "candidate-bars--drawn", "candidate-bars--removed",
                         "candidate-bars--stage"}
    DEFAULT_CSS = """
    CandidateBars { height: auto; }
    CandidateBars > .candidate-bars--bar { color: $success; }
    CandidateBars > .candidate-bars--drawn { color: $accent; text-style: bold; }
    CandidateBars > .candidate-bars--removed { color: $text-muted; }
    CandidateBars > .candidate-bars--stage { color: $warning; }
    """
    rows: reactive[tuple[Candidate, ...]] = reactive(tuple, layout=True)
    drawn: reactive[int] = reactive(-1)

    def __init__(self, side: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.side = side  # "model": before the chain, with the stage that removed each; "final": after

    def render(self) -> Text:
        width = max(self.content_size.width, 24)
        stage_cells = 8  # the same columns in both charts, so their bars compare
        bar_cells = max(4, width - 3 - LABEL_CELLS - 1 - 6 - stage_cells)
        styles = {name: self.get_component_rich_style(f"candidate-bars--{name}")
                  for name in ("bar", "drawn", "removed", "stage")}
        text = Text(no_wrap=True, overflow="crop")
        for k, c in enumerate(self.rows):
            p = c.model_prob if self.side == "model" else c.final_prob
            drawn, removed = c.id == self.drawn, bool(c.removed_by)
            row_style = styles["drawn"] if drawn else styles["removed"] if removed else None
            if k:
                text.append("\n")
            key = str((k + 1) % 10) if self.side == "model" and k < 10 else " "  # its branch key
            text.append(key, styles["stage"])
            text.append("▶ " if drawn else "  ", styles["drawn"])
            text.append(label(c.text), row_style)
            text.append(" ")
            text.append(bar(p, bar_cells), styles["removed"] if removed else styles["bar"])
            text.append(f"{percent(p):>6}", row_style)
            stage = STAGE_NAMES.get(c.removed_by, c.removed_by) if self.side == "model" else ""
            text.append(f" {stage:<7}", styles["stage"])
        return text


class TokenInspector(VerticalScroll):
    DEFAULT_CSS = """
    TokenInspector { height: 1fr; padding: 0 1; }
    TokenInspector > #inspect-summary { margin: 0 0 1 0; }
    TokenInspector > .chart-title { color: $text-muted; text-style: bold; }
    TokenInspector > CandidateBars { margin: 0 0 1 0; }
    TokenInspector > #inspect-note { color: $text-muted; }
    TokenInspector > #inspect-keys { color: $text-muted; margin: 1 0 0 0; }
    TokenInspector > #model-below { text-style: none; margin: -1 0 1 0; }
    TokenInspector.-no-candidates > CandidateBars, TokenInspector.-no-candidates > .chart-title { display: none; }
    """

    def __init__(self, backend: str = "cpu", **kwargs) -> None:
        super().__init__(**kwargs)
        self.backend = backend  # the cuda backend's speculative rounds report no candidates

    def compose(self) -> ComposeResult:
        yield Static("", id="inspect-summary", markup=False)
        yield Static("before the chain: the model", classes="chart-title")
        yield CandidateBars("model", id="bars-model")
        yield Static("", id="model-below", classes="chart-title", markup=False)
        yield Static("after the chain: the draw", classes="chart-title")
        yield CandidateBars("final", id="bars-final")
        yield Static("", id="inspect-note", markup=False)
        yield Static("1-9, 0: branch with that candidate · r: re-sample here · [ ]: branches",
                     id="inspect-keys", markup=False)

    def on_mount(self) -> None:
        self.show(None, None)

    def show(self, tokens: list[TokenEvent] | None, index: int | None, has_reply: bool = True) -> None:
        """The token tokens[index] of the reply under the cursor (tokens None: the reply has no
        token data; index None: it has no tokens yet)."""
        summary, note = "", ""
        token = tokens[index] if tokens is not None and index is not None else None
        if not has_reply:
            note = (f"No reply yet: while this pane is open, replies come with their top "
                    f"{INSPECTOR_TOP_LOGPROBS} candidates per token. Esc closes it.")
        elif tokens is None:
            note = "No token data for this reply: tokens are kept in memory for this session's replies only."
        elif token is None:
            note = "No tokens in this reply yet."
        else:
            p = math.exp(token.logprob)
            summary = (f"token {index + 1} of {len(tokens)}: {show_piece(token.text)}\n"
                       f"id {token.id} · logprob {token.logprob:.3f} ({percent(p)})")
            c = token.candidates
            if c is None:
                note = ("No candidates: this token came before the inspector was open, or from a speculative "
                        "round (they report none on the cuda backend)." if self.backend == "cuda"
                        else "No candidates: this token came before the inspector was open.")
            else:
                summary += f"\nrank {c.rank + 1} of the model's (1: top)"
                for side, rows in (("model", c.model), ("final", c.final)):
                    chart = self.query_one(f"#bars-{side}", CandidateBars)
                    chart.drawn, chart.rows = token.id, rows
                below = all(m.id != token.id for m in c.model)
                self.query_one("#model-below", Static).update(
                    f"▶ {show_piece(token.text)} is below these: rank {c.rank + 1}" if below else "")
                self.query_one("#model-below").display = below
        self.set_class(token is None or token.candidates is None, "-no-candidates")
        self.query_one("#inspect-summary", Static).update(summary)
        self.query_one("#inspect-summary").display = bool(summary)
        self.query_one("#inspect-note", Static).update(note)
        self.query_one("#inspect-note").display = bool(note)
        self.query_one("#inspect-keys").display = token is not None
