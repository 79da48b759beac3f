"""One side of an A/B run: the knobs that set it apart, its live tok/s and the mean logprob of its
tokens, and the reply streaming in (a MessageView, drawn as in the transcript)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineStats, TokenEvent
from memra_tui.format import fmt_rate
from memra_tui.widgets.fit_text import OneLine
from memra_tui.widgets.message_view import MessageView


def mean_logprob(tokens: list[TokenEvent]) -> float | None:
    """The mean of the tokens' logprobs (None: no tokens yet)."""
    return sum(t.logprob for t in tokens) / len(tokens) if tokens else None


class ABColumn(Vertical):
    DEFAULT_CSS = """
    ABColumn { width: 1fr; border: round $primary 40%; border-title-color: $text; border-title-style: bold;
               padding: 0 1; }
    ABColumn.-chosen { border: round $accent; }
    ABColumn > .ab-numbers { height: 1; }
    ABColumn > .ab-knobs { color: $text-muted; }
    ABColumn > VerticalScroll { height: 1fr; margin: 1 0 0 0; }
    ABColumn MessageView { margin: 0; }
    ABColumn MessageView > .role { display: none; }
    """
    chosen: reactive[bool] = reactive(False, init=False)  # the one Enter keeps

    def __init__(self, label: str, differs: str, knobs: str, logprobs_known: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.label, self.differs, self.knobs = label, differs, knobs
        self.logprobs_known = logprobs_known  # False: a remote engine, whose tokens come without logprobs
        # the engine runs one reply at a time: B's column says so until A is done
        self.reply = MessageView("assistant", status="waiting: the other reply runs first", tokens=[])
        self.stats: EngineStats | None = None

    def compose(self) -> ComposeResult:
        yield OneLine(self._numbers(), separator="·", classes="ab-numbers")
        yield OneLine(self.knobs, separator="·", classes="ab-knobs")
        with VerticalScroll() as body:
            body.can_focus = False  # the screen's arrows choose a side; scrolling is up / down there
            yield self.reply

    def on_mount(self) -> None:
        self.border_title = f"{self.label} · {self.differs}"

    def scroll_reply(self, delta: int) -> None:
        self.query_one(VerticalScroll).scroll_relative(y=delta, animate=False)

    def watch_chosen(self, chosen: bool) -> None:
        self.set_class(chosen, "-chosen")
        self.border_subtitle = "Enter keeps this" if chosen else ""

    @property
    def mean_logprob(self) -> float | None:
        return mean_logprob(self.reply.tokens or [])

    def _numbers(self) -> str:
        rate = fmt_rate(self.stats.decode_tok_s) if self.stats is not None and self.stats.n_generated else "— tok/s"
        mean = self.mean_logprob
        shown = "n/a (server)" if not self.logprobs_known else "—" if mean is None else f"{mean:.3f}"
        n = len(self.reply.tokens or [])
        return f"{rate} · mean logprob {shown} · {n} tokens"

    def _show_numbers(self) -> None:
        self.query_one(".ab-numbers", OneLine).set_text(self._numbers())

    def start(self) -> None:
        self.reply.start_stream()
        self._show_numbers()

    async def add(self, text: str, tokens: list[TokenEvent], stats: EngineStats | None) -> None:
        body = self.query_one(VerticalScroll)
        following = body.scroll_y >= body.max_scroll_y  # not scrolled back by the user: follow the reply
        if tokens:
            await self.reply.add_tokens(tokens)
        if text:
            await self.reply.write(text)
        if stats is not None:
            self.stats = stats
        self._show_numbers()
        if following:
            body.call_after_refresh(body.scroll_end, animate=False)

    async def end(self, status: str, error: str = "") -> None:
        await self.reply.end_stream(status, error)
        self._show_numbers()
