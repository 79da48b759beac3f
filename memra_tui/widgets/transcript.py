"""The scrolling list of messages. Only the reply being streamed changes while tokens arrive."""
from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Label

from memra_tui.chats import Chat, ChatMessage
from memra_tui.widgets.message_view import MessageView


class Transcript(VerticalScroll):
    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1; border: round $primary 40%; border-title-color: $text-muted; }
    Transcript > .system { color: $text-muted; text-style: italic; margin: 0 0 1 0; }
    Transcript > .empty { color: $text-muted; width: 1fr; content-align: center middle; height: 3; }
    """

    def on_mount(self) -> None:
        self.anchor()  # keep the newest text in view while it streams, until the user scrolls up

    async def show_chat(self, chat: Chat) -> None:
        await self.remove_children()
        self.border_title = chat.title
        widgets = []
        if chat.system_prompt:
            widgets.append(Label(f"system: {chat.system_prompt}", classes="system"))
        widgets += [MessageView(m.role, m.content, m.status, m.error, structured=bool(m.grammar))
                    for m in chat.messages]
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
