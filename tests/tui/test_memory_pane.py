"""The Memory pane's KV line: how much of the cache the conversation fills, not the pool's
allocation (the KV buffers are allocated whole at load, so that was always 'all of it')."""
from __future__ import annotations

from memra_engine.events import EngineStats, VramStats
from memra_tui.widgets.memory_pool import MemoryPoolPane

MiB = 1 << 20


def kv_line(stats: EngineStats) -> str:
    return str(MemoryPoolPane()._describe(stats)).splitlines()[-1]


def vram() -> VramStats:
    reserved = {"weights": 197 * MiB, "kv": 48 * MiB, "scratch": 1024 * MiB}
    return VramStats(reserved=reserved, used=dict(reserved), device_total=140_000 * MiB, device_free=138_000 * MiB)


def test_the_kv_line_follows_the_tokens_in_the_cache():
    assert kv_line(EngineStats(n_ctx=4096, n_ctx_used=1024, vram=vram())) == "KV filled 12.0 MiB of 48.0 MiB"
    assert kv_line(EngineStats(n_ctx=4096, n_ctx_used=0, vram=vram())).startswith("KV filled 0")
    assert kv_line(EngineStats(n_ctx=4096, n_ctx_used=4096, vram=vram())) == "KV filled 48.0 MiB of 48.0 MiB"
