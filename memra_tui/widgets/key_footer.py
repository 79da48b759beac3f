"""The footer of key bindings, showing only whole keys.

Textual's Footer lays its keys out in a row and cuts the last one that does not fit mid-word
("f5 Sys"). This one hides each key that does not fit in what is left of the row, so what is
shown reads whole; F1 still lists every key.
"""
from __future__ import annotations

from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class KeyFooter(Footer):
    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("compact", True)
        super().__init__(**kwargs)

    async def recompose(self) -> None:
        await super().recompose()
        self.call_after_refresh(self.fit_keys)

    def on_resize(self) -> None:
        self.fit_keys()

    @staticmethod
    def _width(key: FooterKey) -> int:
        return key.render().cell_len + key.styles.gutter.width + key.styles.margin.width

    def fit_keys(self) -> None:
        keys = [k for k in self.query_children(FooterKey) if k.is_mounted]
        palette = [k for k in keys if k.has_class("-command-palette")]
        room = self.size.width - sum(self._width(k) for k in palette)
        used = 0
        for key in keys:
            if key in palette:
                continue
            width = self._width(key)
            key.display = used + width <= room  # a key too long for what is left: skipped, not cut
            used += width if key.display else 0

    @property
    def shown_keys(self) -> list[FooterKey]:
        """The keys on screen, in order (the command palette's last)."""
        return [k for k in self.query_children(FooterKey) if k.display]
