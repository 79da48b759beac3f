"""The multi-line message box. Enter sends; Ctrl+J (any terminal), Alt+Enter or Shift+Enter add a line.

Terminals send the same byte for Enter and Shift+Enter unless they speak the kitty keyboard
protocol, while Ctrl+J is a distinct byte (LF) everywhere, so it is the newline key we advertise.
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
            self.action_send()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")

    def action_send(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Send(text))
