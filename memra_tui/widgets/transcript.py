"""The scrolling list of messages. Only the reply being streamed changes while tokens arrive.

It holds the token cursor (the token inspector's): on one reply and, when that reply has this
session's tokens, on one of them. While it is on, the transcript has focus and its keys move it;
a click on a token puts it there.
"""
from __future__ import annotations

from textual import on
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Label

from memra_tui.chats import Chat, ChatMessage
from memra_tui.tokens import TokenLog
from memra_tui.widgets.fit_text import WrappedText
from memra_tui.widgets.message_view import MessageView


def dropped_note(n: int) -> str:
    return (f"▲ the {n} messages above are kept here but no longer sent to the model "
            "(dropped to fit the context)")


class Transcript(VerticalScroll):
    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1; border: round $primary 40%; border-title-color: $text-muted;
                 scrollbar-gutter: stable; }
    Transcript > .system { color: $text-muted; text-style: italic; margin: 0 0 1 0; }
    Transcript > .empty { color: $text-muted; width: 1fr; content-align: center middle; height: 3; }
    Transcript > .dropped-note { color: $warning; margin: 0 0 1 0; }
    Transcript > MessageView.-dropped { text-opacity: 60%; }
    Transcript.-token-cursor { border: round $accent; }
    """
    BINDINGS = [
        Binding("left", "token(-1)", "Prev token"),
        Binding("right", "token(1)", "Next token"),
        Binding("up", "reply(-1)", "Prev reply"),
        Binding("down", "reply(1)", "Next reply"),
        Binding("home", "token_end(0)", "First token", show=False),
        Binding("end", "token_end(1)", "Last token", show=False),
        Binding("escape", "screen.close_inspector", "Leave inspector"),
        # branching (issue 18): from the cursor token, and between the branches of a fork
        Binding("1", "screen.branch(0)", "Branch with candidate 1 (2-9, 0)", show=False),
        *(Binding(str((n + 1) % 10), f"screen.branch({n})", "", show=False) for n in range(1, 10)),
        Binding("r", "screen.branch(-1)", "Re-sample from the cursor token", show=False),
        Binding("[", "screen.sibling(-1)", "Previous branch", show=False),
        Binding("]", "screen.sibling(1)", "Next branch", show=False),
    ]

    tint: reactive[bool] = reactive(False, init=False)  # tint low-probability draws (the replies with tokens)

    class CursorMoved(Message):
        """The token cursor is on view (None: on no reply) at token index (None: the reply has none)."""

        def __init__(self, view: MessageView | None, index: int | None) -> None:
            super().__init__()
            self.view = view
            self.index = index

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.token_log = TokenLog()  # the chat screen's: this session's tokens per reply
        self.chat_id = ""
        self.cursor_view: MessageView | None = None
        self.cursor_on = False  # the token cursor is shown (the inspector is open)

    def on_mount(self) -> None:
        self.anchor()  # keep the newest text in view while it streams, until the user scrolls up

    # -- the token cursor --------------------------------------------------------------------------
    @property
    def replies(self) -> list[MessageView]:
        return [v for v in self.message_views if v.role == "assistant"]

    def start_cursor(self) -> bool:
        """Put the cursor on the last reply's last token; False when there is no reply."""
        self.cursor_on = True
        self.add_class("-token-cursor")
        replies = self.replies
        if not replies:
            self._select(None)
            return False
        self._select(replies[-1], self._last_token(replies[-1]))
        return True

    def stop_cursor(self) -> None:
        self.cursor_on = False
        self.remove_class("-token-cursor")
        self._select(None)

    @staticmethod
    def _visible(view: MessageView) -> list[int]:
        return [i for i, t in enumerate(view.tokens or ()) if t.text]  # an empty piece cannot be shown

    def _last_token(self, view: MessageView) -> int | None:
        shown = self._visible(view)
        return shown[-1] if shown else None

    def _select(self, view: MessageView | None, index: int | None = None) -> None:
        old = self.cursor_view
        if old is not None and old is not view:
            old.cursor = None
            old.selected = False
        self.cursor_view = view
        if view is not None:
            view.cursor = index
            view.selected = True
            self.call_after_refresh(self._scroll_to_cursor)
        self.post_message(self.CursorMoved(view, index))

    def _scroll_to_cursor(self) -> None:
        view = self.cursor_view
        if view is None or not view.is_mounted:
            return
        target = view.cursor_chunk() or view
        if view is not self.replies[-1]:
            self.release_anchor()  # looking back: new text must not pull the view down
        self.scroll_to_widget(target, animate=False, immediate=True)

    def action_token(self, delta: int) -> None:
        view = self.cursor_view
        if view is None:
            return
        shown = self._visible(view)
        if not shown:
            return
        at = view.cursor if view.cursor is not None else shown[-1]
        after = [i for i in shown if (i > at if delta > 0 else i < at)]
        if after:
            self._select(view, after[0] if delta > 0 else after[-1])
        else:  # past the reply's end: on to the next reply's first token, or the previous one's last
            self.action_reply(delta, at_start=delta > 0)

    def action_token_end(self, last: int) -> None:
        if not self.cursor_on:
            self.scroll_end(animate=False) if last else self.scroll_home(animate=False)
            return
        view = self.cursor_view
        shown = self._visible(view) if view is not None else []
        if shown:
            self._select(view, shown[-1] if last else shown[0])

    def action_reply(self, delta: int, at_start: bool = False) -> None:
        if not self.cursor_on:  # arrows scroll, as in any scrolling view
            self.scroll_relative(y=delta, animate=False)
            return
        replies = self.replies
        if self.cursor_view not in replies:
            if replies:
                self._select(replies[-1], self._last_token(replies[-1]))
            return
        k = replies.index(self.cursor_view) + delta
        if 0 <= k < len(replies):
            shown = self._visible(replies[k])
            self._select(replies[k], (shown[0] if at_start else shown[-1]) if shown else None)

    def select_message(self, index: int) -> None:
        """The cursor on chat.messages[index] (its last token), or the first reply after it."""
        after = [v for v in self.replies if v.index is not None and v.index >= index]
        if self.cursor_on and after:
            self._select(after[0], self._last_token(after[0]))

    def reply_ended(self, view: MessageView) -> None:
        """The reply in flight is over: the inspector shows its whole length under the cursor."""
        if self.cursor_on and view is self.cursor_view:
            self.post_message(self.CursorMoved(view, view.cursor))

    def follow_reply(self, view: MessageView) -> None:
        """Tokens arrived on view: a cursor on it with no token yet goes to its last one."""
        if self.cursor_on and view is self.cursor_view and view.cursor is None:
            self._select(view, self._last_token(view))

    @on(MessageView.TokenClicked)
    def _token_clicked(self, event: MessageView.TokenClicked) -> None:
        event.stop()
        if event.index is None and not self.cursor_on:
            return  # a click on a markdown reply while the cursor is off: nothing to do
        if not self.cursor_on:
            self.cursor_on = True
            self.add_class("-token-cursor")
            self.focus()
        index = event.index if event.index is not None else (
            event.view.cursor if event.view is self.cursor_view else self._last_token(event.view))
        self._select(event.view, index)

    def watch_tint(self, tint: bool) -> None:
        for view in self.message_views:
            view.tint = tint

    def _forget_cursor_if_gone(self) -> None:
        if self.cursor_view is not None and self.cursor_view not in self.message_views:
            self.cursor_view = None
            if self.cursor_on:
                self.post_message(self.CursorMoved(None, None))

    async def show_chat(self, chat: Chat) -> None:
        await self.remove_children()
        self.border_title = chat.title
        widgets = []
        if chat.system_prompt:
            widgets.append(Label(f"system: {chat.system_prompt}", classes="system"))
        self.chat_id = chat.id
        for i, m in enumerate(chat.messages):
            if i == chat.context_start and i:
                widgets.append(WrappedText(dropped_note(i), classes="dropped-note"))
            tokens = self.token_log.get(chat.id, i, m.content) if m.role == "assistant" else None
            view = MessageView(m.role, m.content, m.status, m.error, structured=bool(m.grammar), tokens=tokens,
                               index=i, siblings=chat.siblings(i))
            view.set_reactive(MessageView.tint, self.tint)
            widgets.append(view.set_class(i < chat.context_start, "-dropped"))
        if not widgets:
            widgets.append(Label("Type a message below; Enter sends, Ctrl+J adds a line. F1 lists every key.",
                                 classes="empty"))
        await self.mount_all(widgets)
        self.anchor()
        self._forget_cursor_if_gone()

    async def add_message(self, message: ChatMessage, index: int, tokens: list | None = None) -> MessageView:
        """The message at chat.messages[index] (a reply in flight: where it will be). tokens: the
        reply in flight's list, which it fills (None: no token data)."""
        await self.query(".empty").remove()
        view = MessageView(message.role, message.content, message.status, message.error,
                           structured=bool(message.grammar), tokens=tokens, index=index)
        view.set_reactive(MessageView.tint, self.tint)
        await self.mount(view)
        self.anchor()
        return view

    @property
    def message_views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    async def remove_from(self, index: int) -> None:
        """Drop message views index.. (for regenerate and edit-resend)."""
        for view in self.message_views[index:]:
            await view.remove()
        self._forget_cursor_if_gone()
