"""One message in the transcript: a role line, the markdown body, and a status line for replies.

A reply's body is drawn by Rich's Markdown (code blocks highlighted with Pygments), with every
line break kept as a line break (Markdown would join single ones into a paragraph, and the model
meant them); the user's message is drawn as typed, plain text. Replies go in chunks split at
top-level block boundaries. Textual's Markdown widget mounts a widget per block;
at thousands of tokens per second that is ~1 ms of style matching per block, more than the
engine leaves (scripts/bench_ui.py measured it falling seconds behind). Here a streamed update
re-renders only the last chunk (at most 2 * CHUNK_CHARS of text), at most FLUSH_HZ times a
second, and a finished chunk is one widget that renders once.

A reply generated in this session also has its tokens (MessageView.tokens). While the token
cursor is on it (`cursor`), or the low-probability tint is on (`tint`), it is drawn as the tokens
the model wrote, in TokenChunks: plain text, not markdown (a token can be half a `**` or a code
fence, which markdown would hide), each token its own span, so the cursor token is highlighted,
an unlikely draw tinted, and a click names the token under the mouse.
"""
from __future__ import annotations

import re

from rich.markdown import Markdown as RichMarkdown
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Label

from memra_engine.events import TokenEvent
from memra_tui.tokens import tint_level

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


class CachedLines(Widget):
    """A widget drawn as Rich lines, cached per width and style: the transcript is laid out again
    each time the streamed chunk grows, and every other chunk then answers its height and lines
    from memory instead of rendering again. Subclasses give the renderable (None: no lines) and
    call invalidate() when it changes."""

    def __init__(self) -> None:
        super().__init__()
        self._cache: tuple[int, object, list[Strip]] | None = None  # (width, style, lines)

    def _renderable(self):
        raise NotImplementedError

    def invalidate(self) -> None:
        self._cache = None
        self.refresh(layout=True)

    def _lines(self, width: int) -> list[Strip]:
        style = self.rich_style
        if self._cache is None or self._cache[:2] != (width, style):
            console = self.app.console
            options = console.options.update(width=max(width, 1), height=None)
            body = self._renderable()
            lines = console.render_lines(body, options, style=style, pad=True) if body is not None else []
            self._cache = (width, style, [Strip(line, width) for line in lines])
        return self._cache[2]

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width))

    def render_line(self, y: int) -> Strip:
        lines = self._lines(self.size.width)
        return lines[y] if y < len(lines) else Strip.blank(self.size.width, self.rich_style)


class MarkdownChunk(CachedLines):
    """A run of markdown blocks drawn by Rich, as lines cached per width (CachedLines)."""

    DEFAULT_CSS = "MarkdownChunk { height: auto; }"

    def __init__(self, source: str, markdown: bool = True) -> None:
        super().__init__()
        self.source = source
        self.markdown = markdown  # False: the text as typed (the user's message)

    def set_source(self, source: str) -> None:
        self.source = source
        self.invalidate()

    def _renderable(self):
        if not self.source:
            return None
        return HardBreakMarkdown(self.source, code_theme="monokai", hyperlinks=False) if self.markdown else Text(self.source)


def token_chunk_ends(tokens: list[TokenEvent], start: int = 0, min_chars: int = CHUNK_CHARS) -> list[int]:
    """Where to cut tokens[start:] into chunks: after a token that ends a line, once a chunk holds
    min_chars characters (a cut inside a line would wrap it differently). The last end is len(tokens)."""
    ends, chars = [], 0
    for i in range(start, len(tokens)):
        text = tokens[i].text
        chars += len(text)
        if chars >= min_chars and text.endswith("\n") and i + 1 < len(tokens):
            ends.append(i + 1)
            chars = 0
    return ends + [len(tokens)]


class TokenChunk(CachedLines):
    """tokens[start:end] of a reply, drawn as plain text with a span per token; each span's style
    carries its index (meta "token") for the mouse. Lines are cached per width like MarkdownChunk."""

    COMPONENT_CLASSES = {"token-chunk--cursor", "token-chunk--unlikely", "token-chunk--surprising"}
    DEFAULT_CSS = """
    TokenChunk { height: auto; }
    TokenChunk > .token-chunk--cursor { background: $accent; color: $text; text-style: bold; }
    TokenChunk > .token-chunk--unlikely { background: $warning 30%; }
    TokenChunk > .token-chunk--surprising { background: $error 55%; }
    """

    class Clicked(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, tokens: list[TokenEvent], start: int, end: int, cursor: int | None, tint: bool) -> None:
        super().__init__()
        self.tokens, self.start, self.end = tokens, start, end
        self.cursor, self.tint = cursor, tint

    def holds(self, index: int | None) -> bool:
        return index is not None and self.start <= index < self.end

    def set_marks(self, cursor: int | None, tint: bool) -> None:
        changed = self.holds(cursor) or self.holds(self.cursor) or tint != self.tint
        self.cursor, self.tint = cursor, tint
        if changed:
            self.invalidate()

    def grow(self, end: int) -> None:
        self.end = end
        self.invalidate()

    @property
    def source(self) -> str:
        return "".join(t.text for t in self.tokens[self.start:self.end])

    def _text(self) -> Text:
        text = Text(end="")
        styles = {level: self.get_component_rich_style(f"token-chunk--{name}")
                  for level, name in ((1, "unlikely"), (2, "surprising"))} if self.tint else {}
        cursor_style = self.get_component_rich_style("token-chunk--cursor")
        for i in range(self.start, self.end):
            token = self.tokens[i]
            piece = token.text
            if i == self.cursor:
                style = cursor_style
                piece = piece.replace("\n", "↵\n") or "∅"  # a line break or an empty piece, made visible
            else:
                style = styles.get(tint_level(token.logprob)) if self.tint else None
            meta = Style(meta={"token": i})
            text.append(piece, meta if style is None else style + meta)
        if text.plain.endswith("\n"):  # the chunk's end is a line break already
            text.right_crop(1)
        return text

    def _renderable(self):
        text = self._text()
        return text if text.plain else None

    def on_click(self, event: events.Click) -> None:
        index = event.style.meta.get("token")
        if index is not None:
            event.stop()
            self.post_message(self.Clicked(index))


class MessageView(Vertical):
    DEFAULT_CSS = """
    MessageView { height: auto; padding: 0 1; margin: 0 0 1 0; }
    MessageView.-user { border-left: outer $accent; background: $boost; }
    MessageView.-assistant { border-left: outer $success 60%; }
    MessageView.-assistant.-selected { border-left: outer $accent; }
    MessageView > .role { color: $text-muted; text-style: bold; }
    MessageView > .status { color: $warning; display: none; }
    MessageView > .status.-shown { display: block; }
    MessageView > .status.-error { color: $error; }
    """

    selected: reactive[bool] = reactive(False, init=False)  # the token cursor is on this reply
    cursor: reactive[int | None] = reactive(None, init=False)  # the token under the cursor
    tint: reactive[bool] = reactive(False, init=False)  # tint low-probability draws

    class TokenClicked(Message):
        """A click on a reply: the token under the mouse (None: not drawn as tokens)."""

        def __init__(self, view: "MessageView", index: int | None) -> None:
            super().__init__()
            self.view = view
            self.index = index

    def __init__(self, role: str, content: str = "", status: str = "done", error: str = "",
                 structured: bool = False, tokens: list[TokenEvent] | None = None, index: int | None = None,
                 siblings: tuple[int, int] = (0, 1)) -> None:
        super().__init__(classes=f"-{role}")
        self.index = index  # its place in chat.messages (None: not in the chat yet)
        self.branch_place = siblings  # (place, count) of the branches forking here (Chat.siblings)
        self.role = role
        self.text = content
        self._status = status
        self._error = error
        self.structured = structured  # a grammar constrained it: cut short, it does not parse
        self.tokens = tokens  # this session's tokens of the reply; None: none kept (an earlier session's)

    @property
    def token_view(self) -> bool:
        """Drawn as tokens (the cursor or the tint is on it), not as markdown."""
        return self.tokens is not None and (self.selected or self.tint)

    def _body(self) -> list[Widget]:
        if self.role == "user":  # not markdown: one chunk, so no blank line is split off
            return [MarkdownChunk(self.text, markdown=False)]
        if self.token_view:
            bounds = [0, *token_chunk_ends(self.tokens)]
            return [TokenChunk(self.tokens, a, b, self.cursor, self.tint) for a, b in zip(bounds, bounds[1:])]
        return [MarkdownChunk(chunk) for chunk in split_chunks(self.text)]

    def compose(self) -> ComposeResult:
        # composed again (refresh(recompose=True)) when the body switches between markdown and tokens
        yield Label(self.role_line(), classes="role")
        yield from self._body()
        text, error = self._status_text()
        yield Label(text, classes=" ".join(["status", *(["-shown"] if text else []), *(["-error"] if error else [])]))

    def role_line(self) -> str:
        """The header: who wrote it, and where branches fork here, which one this is (‹ 2/3 ›)."""
        who = "You" if self.role == "user" else "Assistant"
        place, count = self.branch_place
        return f"{who}  ‹ {place + 1}/{count} ›" if count > 1 else who

    def watch_selected(self, selected: bool) -> None:
        self.set_class(selected, "-selected")
        if self.tokens is not None and not self.tint:
            self.refresh(recompose=True)  # markdown <-> tokens

    def watch_tint(self) -> None:
        if self.tokens is not None and not self.selected:
            self.refresh(recompose=True)
        else:
            self._mark_chunks()

    def watch_cursor(self) -> None:
        self._mark_chunks()

    def _mark_chunks(self) -> None:
        for chunk in self.query_children(TokenChunk):
            chunk.set_marks(self.cursor, self.tint)

    def cursor_chunk(self) -> TokenChunk | None:
        return next((c for c in self.query_children(TokenChunk) if c.holds(self.cursor)), None)

    def on_click(self, event: events.Click) -> None:
        if self.role == "assistant":
            self.post_message(self.TokenClicked(self, None))

    def on_token_chunk_clicked(self, event: TokenChunk.Clicked) -> None:
        event.stop()
        self.post_message(self.TokenClicked(self, event.index))

    async def add_tokens(self, tokens: list[TokenEvent]) -> None:
        """Tokens of the reply in flight (their text comes by write()); drawn at once in token view."""
        if self.tokens is None:
            self.tokens = []
        self.tokens.extend(tokens)
        live = self._last_chunk(TokenChunk) if self.token_view else None
        if live is None:  # markdown, or a recompose to tokens is pending (it draws them all)
            return
        ends = token_chunk_ends(self.tokens, live.start)
        live.grow(ends[0])
        status = self.query_children(".status").first()
        for a, b in zip(ends, ends[1:]):
            await self.mount(TokenChunk(self.tokens, a, b, self.cursor, self.tint), before=status)

    def _last_chunk(self, kind: type[Widget]):
        chunks = self.query_children(kind)
        return chunks.last() if chunks else None

    def _status_text(self) -> tuple[str, bool]:
        text = STATUS_TEXT.get(self._status, self._status)
        if self._status == "error" and self._error:
            text = f"{text}: {self._error}"
        if self._status in ("length", "context") and self.structured:
            text = f"{text} · structured reply incomplete"
        return text, self._status == "error"

    def _show_status(self) -> None:
        labels = self.query_children(".status")
        if not labels:  # being composed again (markdown <-> tokens): compose draws the status
            return
        label = labels.first(Label)
        text, error = self._status_text()
        label.update(text)
        label.set_class(bool(text), "-shown")
        label.set_class(error, "-error")

    def start_stream(self) -> None:
        self._status = "streaming"
        self._show_status()

    async def write(self, fragment: str) -> None:
        """Append streamed text: only the last chunk is drawn again."""
        self.text += fragment
        live = None if self.token_view else self._last_chunk(MarkdownChunk)
        if live is None:  # the tokens draw it (add_tokens), or a recompose to markdown is pending
            return
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

    @property
    def shown_source(self) -> str:
        """The text on screen: the markdown chunks', or the token chunks' in token view."""
        return "".join(w.source for w in self.query_children("MarkdownChunk, TokenChunk"))
