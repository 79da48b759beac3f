"""The hand-off between a reply's worker thread and the UI thread.

The worker pushes every token as it arrives and wakes the UI (a ReplyProgress message) only when
the buffer goes from drained to filled. The UI drains it at most FLUSH_HZ times a second, so the
number of messages and transcript updates does not grow with the token rate, and nothing runs
while the engine is quiet.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from textual.message import Message

from memra_engine.events import DoneEvent, EngineStats, StatsEvent, TokenEvent
from memra_tui.gc_tuning import no_full_collections

log = logging.getLogger("memra_tui")

# a reply's DoneEvent reason -> its status in the chat
DONE_STATUS = {"eos": "done", "stop": "done", "length": "length", "context": "context", "cancelled": "stopped",
               "error": "error"}
FLUSH_HZ = 30  # transcript updates per second at most
STATS_HZ = 4  # pane updates per second at most


class ReplyBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._pending_tokens: list[TokenEvent] = []  # the tokens behind _pending (the token inspector's)
        self._stats: EngineStats | None = None
        self._parts: list[str] = []  # everything pushed, for saving a reply cut short
        self._wake_pending = False

    def push_text(self, text: str) -> bool:
        """Returns True when the UI must be woken: nothing was waiting for it before."""
        if not text:
            return False
        with self._lock:
            self._pending.append(text)
            self._parts.append(text)
            return self._mark_wake()

    def push_token(self, token: TokenEvent) -> bool:
        """A token with its text (which may be ""), id, logprob and candidates. Returns True when
        the UI must be woken."""
        with self._lock:
            self._pending_tokens.append(token)
            if token.text:
                self._pending.append(token.text)
                self._parts.append(token.text)
            return self._mark_wake()

    def push_stats(self, stats: EngineStats) -> bool:
        with self._lock:
            self._stats = stats
            return self._mark_wake()

    def _mark_wake(self) -> bool:
        wake = not self._wake_pending
        self._wake_pending = True
        return wake

    def drain(self) -> tuple[str, EngineStats | None]:
        text, stats, _ = self.drain_all()
        return text, stats

    def drain_all(self) -> tuple[str, EngineStats | None, list[TokenEvent]]:
        """The text, the newest stats and the tokens pushed since the last drain, together."""
        with self._lock:
            text, stats, tokens = "".join(self._pending), self._stats, self._pending_tokens
            self._pending.clear()
            self._pending_tokens = []
            self._stats = None
            self._wake_pending = False
        return text, stats, tokens

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)


class ReplyProgress(Message):
    """Posted by the reply worker: the buffer has new tokens or stats."""


class ReplyFinished(Message):
    """Posted by the reply worker when the job's iterator has ended."""

    def __init__(self, job, done: DoneEvent) -> None:
        super().__init__()
        self.job = job
        self.done = done


def pump_job(job, buffer: ReplyBuffer, post: Callable[[Message], object]) -> None:
    """Run in a worker thread: move the job's events into buffer, waking the UI (ReplyProgress)
    when it goes from drained to filled, and post ReplyFinished when the job is over."""
    done = DoneEvent("error", "the engine ended the reply without saying why")
    try:
        with no_full_collections:
            for event in job:
                if isinstance(event, TokenEvent):
                    wake = buffer.push_token(event)
                elif isinstance(event, StatsEvent):
                    wake = buffer.push_stats(event.stats)
                else:
                    wake = False
                if wake:
                    post(ReplyProgress())
                elif isinstance(event, DoneEvent):
                    done = event
    except Exception as e:  # a bug in the engine: log it, show one line
        log.exception("reply stream failed")
        done = DoneEvent("error", f"internal error ({type(e).__name__}: {e}); see the log file")
    post(ReplyFinished(job, done))
