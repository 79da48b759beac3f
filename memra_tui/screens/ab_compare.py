"""A/B (issue 18): the same messages answered with two knob sets, side by side; keep one.

The engine serves one job at a time, so reply A runs first and reply B after it, each into its own
column. The screen dismisses with an ABResult (both replies and the one kept) or None (Esc: both
cancelled); the chat screen turns the two replies into sibling branches.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen

from memra_engine.events import EngineStats, TokenEvent
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import SpecConfig
from memra_tui.streaming import DONE_STATUS, FLUSH_HZ, ReplyBuffer, ReplyFinished, ReplyProgress, pump_job
from memra_tui.widgets.ab_column import ABColumn
from memra_tui.widgets.fit_text import OneLine
from memra_tui.widgets.key_footer import KeyFooter
from memra_tui.widgets.knobs import KNOBS, show_knob

def knob_differences(a: SamplingParams, b: SamplingParams) -> tuple[str, str]:
    """What sets each knob set apart from the other, e.g. ("seed 7", "seed 8")."""
    fields = [(label, f) for f, label, _ in KNOBS if getattr(a, f) != getattr(b, f)]
    if not fields:
        return "same knobs", "same knobs"
    return tuple(" · ".join(f"{label} {show_knob(getattr(p, f))}" for label, f in fields) for p in (a, b))


@dataclass
class ABRun:
    label: str  # "A" | "B"
    knobs: SamplingParams  # as the chat records them
    engine_params: SamplingParams  # as the engine gets them (with candidates while the inspector is open)
    summary: str  # every knob, in one line (the chat screen's describe_knobs)


@dataclass
class ABReply:
    label: str
    knobs: SamplingParams
    text: str = ""
    status: str = "stopped"
    error: str = ""
    tokens: list[TokenEvent] = field(default_factory=list)
    stats: EngineStats | None = None


@dataclass
class ABResult:
    replies: list[ABReply]
    kept: int  # index into replies


class ABScreen(Screen[ABResult | None]):
    DEFAULT_CSS = """
    ABScreen #ab-message { padding: 0 1; text-style: bold; }
    ABScreen #ab-hint { padding: 0 1; color: $text-muted; }
    ABScreen #ab-columns { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel A/B"),
        Binding("a", "keep(0)", "Keep A"),
        Binding("b", "keep(1)", "Keep B"),
        Binding("left", "choose(0)", "Choose A"),
        Binding("right", "choose(1)", "Choose B"),
        Binding("enter", "keep_chosen", "Keep chosen"),
        Binding("up", "scroll(-1)", "Scroll up", show=False),
        Binding("down", "scroll(1)", "Scroll down", show=False),
    ]

    def __init__(self, engine, messages: list[dict], runs: list[ABRun], grammar: Grammar | None,
                 spec: SpecConfig | None, message: str, logprobs_known: bool = True) -> None:
        super().__init__()
        self.engine, self.messages, self.runs = engine, messages, runs
        self.grammar, self.spec, self.message = grammar, spec, message
        self.logprobs_known = logprobs_known
        self.replies = [ABReply(r.label, r.knobs) for r in runs]
        self.chosen = 0
        self._in_flight: int | None = None  # the run in flight
        self._job = None
        self._buffer: ReplyBuffer | None = None
        self._last_flush = 0.0
        self._ticker = None
        self.finished = False  # both replies are in: one can be kept

    def compose(self) -> ComposeResult:
        yield OneLine(f"A/B · {' '.join(self.message.split())}", id="ab-message")
        yield OneLine("a / b keeps one, the other stays a branch ([ and ] reach it) · Esc cancels both · "
                      "reply A runs first, then reply B, to the same message", separator="·", id="ab-hint")
        differs = knob_differences(self.runs[0].knobs, self.runs[1].knobs)
        with Horizontal(id="ab-columns"):
            for i, run in enumerate(self.runs):
                yield ABColumn(run.label, differs[i], run.summary, self.logprobs_known,
                               id=f"ab-{run.label.lower()}")
        yield KeyFooter()

    @property
    def columns(self) -> list[ABColumn]:
        return list(self.query(ABColumn))

    def on_mount(self) -> None:
        self.columns[0].chosen = True
        self._ticker = self.set_interval(1 / FLUSH_HZ, lambda: self.post_message(ReplyProgress()), pause=True)
        self._start(0)

    def _start(self, i: int) -> None:
        self._in_flight = i
        self._buffer = ReplyBuffer()
        self.columns[i].start()
        self._job = self.engine.chat(self.messages, sampling=self.runs[i].engine_params, grammar=self.grammar,
                                     spec=self.spec)
        self._ticker.resume()
        self._pump(self._job, self._buffer)

    @work(thread=True, group="ab-reply", exit_on_error=False)
    def _pump(self, job, buffer: ReplyBuffer) -> None:
        pump_job(job, buffer, self.post_message)

    @on(ReplyProgress)
    async def _progress(self) -> None:
        # woken by the buffer and by the ticker: draw at most FLUSH_HZ times a second
        if time.perf_counter() - self._last_flush >= 1 / FLUSH_HZ:
            await self._flush()

    async def _flush(self) -> None:
        if self._buffer is None or self._in_flight is None:
            return
        self._last_flush = time.perf_counter()
        text, stats, tokens = self._buffer.drain_all()
        if text or tokens or stats is not None:
            await self.columns[self._in_flight].add(text, tokens, stats)

    @on(ReplyFinished)
    async def _finished(self, event: ReplyFinished) -> None:
        if event.job is not self._job or self._in_flight is None:
            return
        await self._flush()
        i, column, done = self._in_flight, self.columns[self._in_flight], event.done
        status = DONE_STATUS.get(done.reason, "error")
        await column.end(status, done.error)
        self.replies[i] = ABReply(self.runs[i].label, self.runs[i].knobs, column.reply.text, status, done.error,
                                  list(column.reply.tokens or []), column.stats)
        self._job = self._buffer = self._in_flight = None
        self._ticker.pause()
        if i + 1 < len(self.runs):
            self._start(i + 1)
        else:
            self.finished = True

    # -- actions -------------------------------------------------------------------------------
    def action_choose(self, i: int) -> None:
        self.chosen = i
        for k, column in enumerate(self.columns):
            column.chosen = k == i

    def action_keep_chosen(self) -> None:
        self.action_keep(self.chosen)

    def action_keep(self, i: int) -> None:
        if not self.finished:
            self.notify(f"reply {self.runs[self._in_flight].label} is still streaming: wait for both (Esc cancels)",
                        severity="warning", timeout=3)
            return
        self.dismiss(ABResult(self.replies, i))

    def action_scroll(self, delta: int) -> None:
        for column in self.columns:
            column.scroll_reply(delta)

    def action_cancel(self) -> None:
        self._cancel_job()
        self.dismiss(None)

    def _cancel_job(self) -> None:
        if self._job is not None:
            self._job.cancel()
        self._job = self._in_flight = None

    def on_unmount(self) -> None:
        self._cancel_job()  # the app quits with a reply in flight: the engine thread stops it
