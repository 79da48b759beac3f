"""The tokens of this session's replies, for the token inspector and the low-probability tint.

Each reply generated in this session keeps its TokenEvents (text piece, id, logprob, and the
candidates when top_logprobs was on) in memory, in a TokenLog; they are never written to the chat
files, so a reply from an earlier session has none. The tint works from the logprob alone (the
draw's probability under the distribution it was drawn from), so it needs no candidates.
"""
from __future__ import annotations

import math

from memra_engine.events import TokenEvent

INSPECTOR_TOP_LOGPROBS = 10  # candidates per token while the inspector is open
UNLIKELY, SURPRISING = 0.10, 0.01  # the tint's two thresholds on the draw's probability


def tint_level(logprob: float) -> int:
    """0: an ordinary draw; 1: below UNLIKELY; 2: below SURPRISING."""
    p = math.exp(logprob) if logprob > -700 else 0.0
    return 2 if p < SURPRISING else 1 if p < UNLIKELY else 0


def show_piece(text: str) -> str:
    """A token's text as one visible line: quoted, with whitespace spelled out."""
    shown = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    return f"'{shown}'"


def percent(p: float) -> str:
    """A probability in at most 5 cells: 45.1%, 0.3%, <0.1%."""
    if p <= 0.0:
        return "0%"
    return "<0.1%" if p < 0.0005 else "100%" if p >= 0.9995 else f"{p:.1%}"


class TokenLog:
    """Tokens per reply, keyed by (chat id, message index, text): a chat opened again in this
    session (from the chat list, or after the system prompt changed) finds its replies' tokens."""

    def __init__(self) -> None:
        self._replies: dict[tuple[str, int, str], list[TokenEvent]] = {}

    def put(self, chat_id: str, index: int, text: str, tokens: list[TokenEvent]) -> None:
        self._replies[(chat_id, index, text)] = tokens

    def get(self, chat_id: str, index: int, text: str) -> list[TokenEvent] | None:
        return self._replies.get((chat_id, index, text))

    def __len__(self) -> int:
        return len(self._replies)
