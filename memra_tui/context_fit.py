"""Which oldest messages to leave out so that a conversation fits the context again, with room
for a reply. The UI asks the user before it drops any (issue 17 §4: never silently)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from memra_tui.chats import Chat

CountTokens = Callable[[list[dict]], int]  # Engine.count_tokens


@dataclass(frozen=True)
class Fit:
    tokens: int  # the conversation as it is sent now
    start: int | None  # the first message to keep so it fits; None: not even the last message does
    tokens_after: int = 0  # the conversation from `start` on


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens to leave free for the reply: its max tokens, at most a quarter of the context."""
    return max(16, min(max_tokens, n_ctx // 4))


def fit_to_context(chat: Chat, count_tokens: CountTokens, n_ctx: int, room: int) -> Fit:
    """The smallest drop of oldest messages (a whole turn at a time: the kept part starts with one
    of the user's messages, and the last one is always kept) after which the chat plus `room`
    fits in n_ctx tokens. The system prompt is always kept."""
    tokens = count_tokens(chat.engine_messages())
    starts = [i for i, m in enumerate(chat.messages) if m.role == "user" and i > chat.context_start]
    lo, hi, best = 0, len(starts) - 1, None
    while lo <= hi:  # fewer messages never take more tokens: bisect for the first start that fits
        mid = (lo + hi) // 2
        n = count_tokens(chat.engine_messages(starts[mid]))
        if n + room <= n_ctx:
            best, hi = (starts[mid], n), mid - 1
        else:
            lo = mid + 1
    if best is None:
        return Fit(tokens, None)
    return Fit(tokens, best[0], best[1])
