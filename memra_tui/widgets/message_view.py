"""One message in the transcript: a role line, the markdown body, and a status line for replies.

A reply's body is drawn by Rich's Markdown (code blocks highlighted with Pygments), with every
line break kept as a line break (Markdown would join single ones into a paragraph, and the model
meant them); the user's message is drawn as typed, plain text. Replies go in chunks split at
top-level block boundaries. Textual's Markdown widget mounts a widget per block;
at thousands of tokens per second that is ~1 ms of style matching per block, more than the
engine leaves (scripts/bench_ui.py measured it falling seconds behind). Here a streamed update
re-renders only the last chunk (at most 2 * CHUNK_CHARS of text), at most FLUSH_HZ times a
second, and a finished chunk is one widget that renders once.
"""
from __future__ import annotations

import re

from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Label

STATUS_TEXT = {
    "done": "",
    "streaming": "▍ generating…",
    "stopped": "■ stopped",
    "interrupted": "■ interrupted: memra was closed while this reply streamed",
    "length": "… cut at max tokens",
    "context": "… context full: cut here (a larger --ctx, or a new chat)",
    "error": "✗ error",
}
CHUNK_CHARS = 800  # the streamed chunk is split once it is twice this long
_FENCE = re.compile(r"^\s{0,3}(```|~~~)", re.M)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def split_frozen(text: str, min_chars: int = CHUNK_CHARS) -> tuple[str, str]:
    """(head, tail): head ends at the last blank line outside a code fence at or after min_chars,
    so it renders the same on its own; head is "" when there is no such boundary yet."""
    cut = 0
    for m in _BLANK_LINE.finditer(text, min_chars):
        if len(_FENCE.findall(text, 0, m.start())) % 2 == 0:
            cut = m.end()
    return text[:cut], text[cut:]


def split_chunks(text: str) -> list[str]:
    chunks = []
    while len(text) >= 2 * CHUNK_CHARS:
        head, text = split_frozen(text)
        if not head:
            break
        chunks.append(head)
    return chunks + [text]


class HardBreakMarkdown(RichMarkdown):
    """Rich's Markdown with each single line break inside a paragraph drawn as a line break."""

    def __init__(self, markup: str, **kwargs) -> None:
        super().__init__(markup, **kwargs)
        stack = list(self.parsed)
        while stack:
            token = stack.pop()
            if token.type == "softbreak":
                token.type = "hardbreak"
            stack.extend(token.children or ())


class MarkdownChunk(Widget):
    """A run of markdown blocks drawn by Rich, as lines cached per width.

    The transcript is laid out again each time the streamed chunk grows; caching the lines means
    every other chunk answers its height and lines from memory instead of rendering again.
    """

    DEFAULT_CSS = "MarkdownChunk { height: auto; }"

    def __init__(self, source: str, markdown: bool = True) -> None:
        super().__init__()
        self.source = source
        self.markdown = markdown  # False: the text as typed (the user's message)
        self._cache: tuple[int, object, list[Strip]] | None = None  # (width, style, lines)

    def set_source(self, source: str) -> None:
        self.source = source
        self._cache = None
        self.refresh(layout=True)

    def _lines(self, width: int) -> list[Strip]:
        style = self.rich_style
        if self._cache is None or self._cache[:2] != (width, style):
            console = self.app.console
            options = console.options.update(width=max(width, 1), height=None)
            body = (HardBreakMarkdown(self.source, code_theme="monokai", hyperlinks=False) if self.markdown
                    else Text(self.source))
            lines = console.render_lines(body, options, style=style, pad=True) if self.source else []
            self._cache = (width, style, [Strip(line, width) for line in lines])
        return self._cache[2]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width))

    def render_line(self, y: int) -> Strip:
        lines = self._lines(self.size.width)
        return lines[y] if y < len(lines) else Strip.blank(self.size.width, self.rich_style)


class MessageView(Vertical):
    DEFAULT_CSS = """
    MessageView { height: auto; padding: 0 1; margin: 0 0 1 0; }
    MessageView.-user { border-left: outer $accent; background: $boost; }
    MessageView.-assistant { border-left: outer $success 60%; }
    MessageView > .role { color: $text-muted; text-style: bold; }
    MessageView > .status { color: $warning; display: none; }
    MessageView > .status.-shown { display: block; }
    MessageView > .status.-error { color: $error; }
    """

    def __init__(self, role: str, content: str = "", status: str = "done", error: str = "",
                 structured: bool = False) -> None:
        super().__init__(classes=f"-{role}")
        self.role = role
        self.text = content
        self._status = status
        self._error = error
        self.structured = structured  # a grammar constrained it: cut short, it does not parse

    def compose(self) -> ComposeResult:
        yield Label("You" if self.role == "user" else "Assistant", classes="role")
        if self.role == "user":  # not markdown: one chunk, so no blank line is split off
            yield MarkdownChunk(self.text, markdown=False)
        else:
            for chunk in split_chunks(self.text):
                yield MarkdownChunk(chunk)
        yield Label("", classes="status")

    def on_mount(self) -> None:
        self._show_status()

    def _show_status(self) -> None:
        label = self.query_one(".status", Label)
        text = STATUS_TEXT.get(self._status, self._status)
        if self._status == "error" and self._error:
            text = f"{text}: {self._error}"
        if self._status in ("length", "context") and self.structured:
            text = f"{text} · structured reply incomplete"
        label.update(text)
        label.set_class(bool(text), "-shown")
        label.set_class(self._status == "error", "-error")

    def start_stream(self) -> None:
        self._status = "streaming"
        self._show_status()

    async def write(self, fragment: str) -> None:
        """Append streamed text: only the last chunk is drawn again."""
        self.text += fragment
        live = self.query_children(MarkdownChunk).last()
        source = live.source + fragment
        head, tail = split_frozen(source) if len(source) >= 2 * CHUNK_CHARS else ("", source)
        if head:
            live.set_source(head)
            await self.mount(MarkdownChunk(tail), after=live)
        else:
            live.set_source(source)

    async def end_stream(self, status: str, error: str = "") -> None:
        self._status, self._error = status, error
        self._show_status()

    @property
    def markdown_source(self) -> str:
        """The text the chunks hold: equals `text` once every flush has been drawn."""
        return "".join(w.source for w in self.query_children(MarkdownChunk))
