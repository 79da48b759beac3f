"""The top line: which model runs, on what, and the grammar the chat's replies follow."""
from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineInfo
from memra_engine.grammar import Grammar
from memra_tui.widgets.fit_text import ellipsize


def describe_params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


class EngineHeader(Static):
    DEFAULT_CSS = """
    EngineHeader { dock: top; height: 1; background: $panel; color: $text; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """
    info: reactive[EngineInfo | None] = reactive(None)
    grammar: reactive[Grammar | None] = reactive(None)  # bound to the chat screen's

    def __init__(self, info: EngineInfo, grammar: Grammar | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.set_reactive(EngineHeader.info, info)
        self.set_reactive(EngineHeader.grammar, grammar)

    def render(self) -> str | Content:
        i = self.info
        if i is None:
            return "memra"
        kv = f" · KV {i.kv_type}" if i.kv_type != "f16" else ""  # the default goes unsaid
        # next to the model, so a narrow terminal cuts the quant mix first, not the grammar; the
        # label (and the model's name) go in as variables because their brackets are not markup
        label = self.grammar.label if self.grammar is not None else ""
        grammar = " │ [b $accent]grammar $grammar[/]" if label else ""
        # a model without a chat template continues the turns as plain text (README: the header says so)
        mode = "" if i.has_chat_template else " │ [b $warning]completion mode[/]"
        size = f" {describe_params(i.n_params)}" if i.n_params else ""  # a remote server may not say
        quant = f" │ {i.quant_mix}" if i.quant_mix else ""
        line = Content.from_markup(f"[b]memra[/b] │ [b]$model[/b]{mode}{grammar} │ $arch{size}"
                                   f" │ {i.backend} · $device{kv}{quant}", grammar=label,
                                   model=i.model_name, arch=i.arch, device=i.device_name)
        width = self.content_size.width  # too wide: cut at a word boundary, never inside a word
        return ellipsize(line, width) if width > 0 else line
