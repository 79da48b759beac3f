"""The top line: which model runs, on what."""
from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from memra_engine.events import EngineInfo


def describe_params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


class EngineHeader(Static):
    DEFAULT_CSS = """
    EngineHeader { dock: top; height: 1; background: $panel; color: $text; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """
    info: reactive[EngineInfo | None] = reactive(None)

    def __init__(self, info: EngineInfo, **kwargs) -> None:
        super().__init__(**kwargs)
        self.set_reactive(EngineHeader.info, info)

    def render(self) -> str:
        i = self.info
        if i is None:
            return "memra"
        kv = f" · KV {i.kv_type}" if i.kv_type != "f16" else ""  # the default goes unsaid
        return (f"[b]memra[/b] │ [b]{i.model_name}[/b] │ {i.arch} {describe_params(i.n_params)} │ {i.backend} · "
                f"{i.device_name}{kv} │ {i.quant_mix}")
