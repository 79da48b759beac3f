"""Text that fits its width without cutting a word: ellipsized or wrapped at word boundaries.

Textual's `text-overflow: ellipsis` and its wrapping both cut inside a word when a word (a path, a
model name) does not fit, or where the line happens to end. Here a line breaks only after a space
or a path separator, and an ellipsis replaces whole words; only a single word longer than the
whole width is ever split (there is no boundary to use).
"""
from __future__ import annotations

import re

from rich.cells import cell_len
from rich.text import Text
from textual.content import Content
from textual.geometry import Size
from textual.widgets import Static

ELLIPSIS = "…"
_PIECE = re.compile(r"[^\s/]+/?|/|\s+")  # a word with the separator after it, or a run of spaces
BREAK_AFTER = " ,·│"  # an ellipsis goes after one of these (or before a space)


def ellipsize(content: Content | str, width: int, breaks: str = BREAK_AFTER, words: bool = True) -> Content:
    """content cut to `width` cells at a word boundary, with an ellipsis, or as it is when it fits.
    The cut goes after a character of `breaks`, or (words) before a space."""
    content = Content(content) if isinstance(content, str) else content
    if content.cell_length <= width:
        return content
    if width <= 1:
        return Content(ELLIPSIS[:width])
    plain, used, cut = content.plain, 0, 0
    for i, ch in enumerate(plain):
        used += cell_len(ch)
        if used > width - 1:
            break
        if ch in breaks or (words and i + 1 < len(plain) and plain[i + 1] == " "):
            cut = i + 1
    if cut == 0:  # one word wider than everything: nothing better than splitting it
        cut = len(plain[: width - 1])
        while cell_len(plain[:cut]) > width - 1:
            cut -= 1
    head = content[:cut]
    while head.plain and head.plain[-1] in " │·,":  # no dangling separator before the ellipsis
        head = head[: len(head.plain) - 1]
    return head + Content(ELLIPSIS)


def wrap_words(text: str, width: int) -> list[str]:
    """text in lines of at most `width` cells, broken after spaces and path separators."""
    width = max(width, 1)
    out: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for piece in _PIECE.findall(paragraph):
            if piece.isspace():
                if line and cell_len(line) + cell_len(piece) <= width:
                    line += piece
                elif line:
                    out.append(line.rstrip())
                    line = ""
                continue
            if cell_len(line) + cell_len(piece) <= width:
                line += piece
                continue
            if line.strip():
                out.append(line.rstrip())
            line = ""
            while cell_len(piece) > width:  # a word wider than the line: split it, there is no boundary
                out.append(piece[:width])
                piece = piece[width:]
            line = piece
        out.append(line.rstrip())
    return out


class WrappedText(Static):
    """A Static whose text wraps at word (and path) boundaries at any width."""

    DEFAULT_CSS = "WrappedText { width: 1fr; height: auto; }"

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text

    def set_text(self, text: str) -> None:
        self.text = text
        self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(wrap_words(self.text, width))

    def render(self) -> Text:
        width = self.content_size.width
        if width <= 0:  # not laid out yet: wrapping at width 1 would stack the text a letter a line
            return Text(self.text, no_wrap=True, overflow="crop")
        return Text("\n".join(wrap_words(self.text, width)), no_wrap=True, overflow="crop")


class OneLine(Static):
    """One line of text, ellipsized at a word boundary when it is wider than the widget; with
    `separator`, only after one (so "seed 1234" never loses its value: "… · seed…")."""

    DEFAULT_CSS = "OneLine { width: 1fr; height: 1; }"

    def __init__(self, text: str = "", separator: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text
        self.separator = separator

    def set_text(self, text: str) -> None:
        self.text = text
        self.refresh()

    def render(self) -> Content:
        width = self.content_size.width
        if width <= 0:
            return Content(self.text)
        if self.separator:
            return ellipsize(self.text, width, breaks=self.separator, words=False)
        return ellipsize(self.text, width)
