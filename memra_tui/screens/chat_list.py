"""Saved chats: open (resume), rename, delete, export to Markdown. Dismisses with the Chat to open."""
from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from memra_tui.chats import Chat, ChatStore
from memra_tui.screens.text_prompt import ConfirmScreen, TextPromptScreen
from memra_tui.widgets.key_footer import KeyFooter


class ChatListScreen(ModalScreen[Chat | None]):
    DEFAULT_CSS = """
    ChatListScreen { align: center middle; }
    ChatListScreen > Vertical { width: 100; max-width: 100%; height: 90%; border: round $accent; padding: 0 1; }
    ChatListScreen DataTable { height: 1fr; }
    ChatListScreen .hint { color: $text-muted; }
    """
    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("e", "export", "Export .md"),
        Binding("escape", "dismiss(None)", "Back"),
    ]

    def __init__(self, store: ChatStore, current_id: str | None = None) -> None:
        super().__init__()
        self.store = store
        self.current_id = current_id
        self.chats: list[Chat] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]Chats[/b]", classes="hint")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="chats")
        yield KeyFooter()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("updated (UTC)", "title", "msgs", "model")
        self.reload()
        table.focus()

    def reload(self, select_id: str | None = None, select_row: int = 0) -> None:
        """List the chats again; the cursor goes to the chat select_id (say, the one just renamed,
        so the next key acts on it), else to row select_row (the one after a deleted chat)."""
        self.chats, problems = self.store.list()
        for line in problems:
            self.notify(line, severity="warning", timeout=8)
        table = self.query_one(DataTable)
        table.clear()
        for chat in self.chats:
            mark = "● " if chat.id == self.current_id else ""
            table.add_row(time.strftime("%Y-%m-%d %H:%M", time.gmtime(chat.updated)), mark + chat.title,
                          str(len(chat.messages)), chat.model_path.rsplit("/", 1)[-1], key=chat.id)
        if not self.chats:
            table.add_row("", "no saved chats yet", "", "")
            return
        ids = [c.id for c in self.chats]
        row = ids.index(select_id) if select_id in ids else min(select_row, len(ids) - 1)
        table.move_cursor(row=row, animate=False)

    def _selected(self) -> Chat | None:
        table = self.query_one(DataTable)
        if not self.chats or table.cursor_row >= len(self.chats):
            return None
        return self.chats[table.cursor_row]

    def action_open(self) -> None:
        chat = self._selected()
        if chat is not None:
            self.dismiss(chat)

    def action_rename(self) -> None:
        chat = self._selected()
        if chat is None:
            return

        def renamed(title: str | None) -> None:
            if title:
                self.store.rename(chat, title)
                self.reload(select_id=chat.id)

        self.app.push_screen(TextPromptScreen("Rename chat", chat.title), renamed)

    def action_delete(self) -> None:
        chat = self._selected()
        if chat is None:
            return
        if chat.id == self.current_id:
            self.notify("this chat is open; start a new chat (ctrl+n) before deleting it", severity="warning")
            return

        row = self.query_one(DataTable).cursor_row

        def answered(yes: bool | None) -> None:
            if yes:
                self.store.delete(chat.id)
                self.notify(f"deleted {chat.title}")
                self.reload(select_row=row)

        self.app.push_screen(ConfirmScreen(f"Delete chat “{chat.title}”?"), answered)

    def action_export(self) -> None:
        chat = self._selected()
        if chat is not None:
            path = self.store.export_markdown(chat)
            self.notify(f"exported to {path}")
