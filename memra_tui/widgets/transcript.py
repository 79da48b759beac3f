"""The scrolling list of messages. Only the reply being streamed changes while tokens arrive."""
from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Label

from memra_tui.chats import Chat, ChatMessage
from memra_tui.widgets.fit_text import WrappedText
from memra_tui.widgets.message_view import MessageView


def dropped_note(n: int) -> str:
    return (f"▲ the {n} messages above are kept here but no longer sent to the model "
            "(dropped to fit the context)")


class Transcript(VerticalScroll):
    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1; border: round $primary 40%; border-title-color: $text-muted; }
    Transcript > .system { color: $text-muted; text-style: italic; margin: 0 0 1 0; }
    Transcript > .empty { color: $text-muted; width: 1fr; content-align: center middle; height: 3; }
    Transcript > .dropped-note { color: $warning; margin: 0 0 1 0; }
    Transcript > MessageView.-dropped { text-opacity: 60%; }
    """

    def on_mount(self) -> None:
        self.anchor()  # keep the newest text in view while it streams, until the user scrolls up

    async def show_chat(self, chat: Chat) -> None:
        await self.remove_children()
        self.border_title = chat.title
        widgets = []
        if chat.system_prompt:
            widgets.append(Label(f"system: {chat.system_prompt}", classes="system"))
        for i, m in enumerate(chat.messages):
            if i == chat.context_start and i:
                widgets.append(WrappedText(dropped_note(i), classes="dropped-note"))
            view = MessageView(m.role, m.content, m.status, m.error, structured=bool(m.grammar))
            widgets.append(view.set_class(i < chat.context_start, "-dropped"))
        if not widgets:
            widgets.append(Label("Type a message below; Enter sends, Ctrl+J adds a line. F1 lists every key.",
                                 classes="empty"))
        await self.mount_all(widgets)
        self.anchor()

    async def add_message(self, message: ChatMessage) -> MessageView:
        await self.query(".empty").remove()
        view = MessageView(message.role, message.content, message.status, message.error,
                           structured=bool(message.grammar))
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
