"""One message in the transcript: a role line, the markdown body, and a status line for replies."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Markdown
from textual.widgets.markdown import MarkdownStream

STATUS_TEXT = {
    "done": "",
    "streaming": "▍ generating…",
    "stopped": "■ stopped",
    "length": "… cut at max tokens",
    "error": "✗ error",
}


class MessageView(Vertical):
    DEFAULT_CSS = """
    MessageView { height: auto; padding: 0 1; margin: 0 0 1 0; }
    MessageView.-user { border-left: outer $accent; background: $boost; }
    MessageView.-assistant { border-left: outer $success 60%; }
    MessageView > .role { color: $text-muted; text-style: bold; }
    MessageView > Markdown { margin: 0; padding: 0; }
    MessageView > .status { color: $warning; display: none; }
    MessageView > .status.-shown { display: block; }
    MessageView > .status.-error { color: $error; }
    """

    def __init__(self, role: str, content: str = "", status: str = "done", error: str = "") -> None:
        super().__init__(classes=f"-{role}")
        self.role = role
        self.text = content
        self._status = status
        self._error = error
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="role")
        yield Markdown(self.text)
        yield Label("", classes="status")

    def on_mount(self) -> None:
        self._show_status()

    def _show_status(self) -> None:
        label = self.query_one(".status", Label)
        text = STATUS_TEXT.get(self._status, self._status)
        if self._status == "error" and self._error:
            text = f"{text}: {self._error}"
        label.update(text)
        label.set_class(bool(text), "-shown")
        label.set_class(self._status == "error", "-error")

    def start_stream(self) -> None:
        self._status = "streaming"
        self._show_status()
        self._stream = Markdown.get_stream(self.query_one(Markdown))

    async def write(self, fragment: str) -> None:
        self.text += fragment
        await self._stream.write(fragment)

    async def end_stream(self, status: str, error: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._status, self._error = status, error
        self._show_status()

    @property
    def markdown_source(self) -> str:
        """What the Markdown widget holds: equals `text` once the stream has caught up."""
        return self.query_one(Markdown).source
