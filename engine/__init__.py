"""memra's inference engine: GGUF models on a numpy reference backend or on PyCUDA."""
from memra_engine.errors import (
    ContextOverflowError,
    DeviceError,
    DeviceOutOfMemory,
    GrammarError,
    HostOutOfMemory,
    MemraError,
    ModelFetchError,
    ModelFormatError,
    OutOfMemory,
    RemoteError,
    TemplateError,
    UnsupportedModelError,
)
from memra_engine.events import DoneEvent, EngineInfo, EngineStats, MoeStats, StatsEvent, TokenEvent, VramStats

__all__ = [
    "ContextOverflowError", "DeviceError", "DeviceOutOfMemory", "GrammarError", "HostOutOfMemory", "MemraError",
    "ModelFetchError", "ModelFormatError", "OutOfMemory", "RemoteError", "TemplateError", "UnsupportedModelError",
    "DoneEvent", "EngineInfo", "EngineStats", "MoeStats", "StatsEvent", "TokenEvent", "VramStats",
]
