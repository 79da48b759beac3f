"""The multi-line message box. Enter sends; these add a line instead:

- Ctrl+J, in every terminal (tmux included): it is its own byte (LF);
- a backslash typed just before Enter (`\\` then Enter): the backslash becomes the line break,
  in every terminal too;
- Alt+Enter and Shift+Enter, only where the terminal reports them apart from Enter (the kitty
  keyboard protocol, some others): tmux and most terminals send both as a plain Enter, which
  sends the message.
"""
from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "newline", "alt+enter", "shift+enter")


class Composer(TextArea):
    DEFAULT_CSS = """
    Composer { height: auto; min-height: 3; max-height: 10; border: round $accent 60%; }
    Composer:focus { border: round $accent; }
    """
    BINDINGS = [
        Binding("enter", "send", "Send"),
        Binding("ctrl+j", "newline", "Newline"),
        Binding("alt+enter", "newline", "Newline", show=False),
        # TextArea's emacs-style ctrl+e / ctrl+k / ctrl+y (end of line, kill, redo) would shadow the
        # chat's keys while the composer has focus; End, Shift+End+Delete and ctrl+z remain.
        Binding("ctrl+e", "screen.edit_last", "Edit last", show=False),
        Binding("ctrl+k", "screen.copy_code", "Copy code", show=False),
        Binding("ctrl+y", "screen.copy_reply", "Copy reply", show=False),
        # TextArea's F6 selects the line; here, as everywhere in the chat, it shows the engine panes
        Binding("f6", "screen.engine", "Engine"),
        # and its F7 selects all; here it opens the token inspector
        Binding("f7", "screen.inspect", "Inspect tokens", show=False),
    ]

    class Send(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":  # TextArea would insert a newline; here Enter sends
            event.stop()
            event.prevent_default()
            if not self._backslash_newline():
                self.action_send()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        await super()._on_key(event)

    def _backslash_newline(self) -> bool:
        """`\\` then Enter: the backslash before the cursor becomes a line break (True), as in a shell."""
        row, col = self.cursor_location
        if col == 0 or self.selected_text or self.document.get_line(row)[col - 1] != "\\":
            return False
        self.replace("\n", (row, col - 1), (row, col))
        return True

    def action_newline(self) -> None:
        self.insert("\n")

    def action_send(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Send(text))
