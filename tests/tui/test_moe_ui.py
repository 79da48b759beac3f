"""The MoE expert cache in the UI: the MoE pane shows the reply's hit rate and the total, a
sparkline of recent hit rates, the copy traffic and the residency, live while a reply streams; a
dense model says so; the Memory pane shows the expert slots as a region of their own; --moe-vram
reaches the loader."""
from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Sparkline, Static
from tui_helpers import send, wait_for, wait_ready

from memra_engine.events import EngineStats, MoeStats, VramStats
from memra_tui.format import fmt_bytes, fmt_count
from memra_tui.scripted_engine import EXPERT_BYTES, MOE_SLOTS, Script
from memra_tui.widgets.memory_pool import MemoryPoolPane, pool_segments
from memra_tui.widgets.moe_cache import HISTORY, MoeCachePane

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def moe_text(app) -> str:
    """The pane's shown lines (the sparkline draws blocks, not text: it is left out)."""
    pane = app.screen.query_one(MoeCachePane)
    return "\n".join(str(w.render()) for w in pane.query(Static) if w.display)


def moe(hits, misses, total_hits, total_misses, **kw) -> EngineStats:
    return EngineStats(moe=MoeStats(hits=hits, misses=misses, total_hits=total_hits, total_misses=total_misses,
                                    total_experts=1536, **kw))


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield MoeCachePane()


# -- the pane ------------------------------------------------------------------------------------


async def test_the_pane_shows_rates_traffic_and_residency():
    app = PaneApp()
    async with app.run_test(size=(40, 12)) as pilot:
        pane = app.query_one(MoeCachePane)
        assert moe_text(app) == "—"
        pane.stats = moe(900, 100, 1900, 400, bytes_moved=100 * EXPERT_BYTES, copy_seconds=100 * EXPERT_BYTES / 25e9,
                         resident_experts=384, slot_bytes=384 * EXPERT_BYTES)
        await pilot.pause()
        assert moe_text(app).splitlines() == [
            "hit rate 90.0%  total 82.6%",
            "hits 900  misses 100",
            "last 1 update: 83%–83%",  # the first update: the lookups since load
            "copied 112.5 MiB at 25.0 GB/s",
            "resident 384/1536 experts",
            "slots 432.0 MiB of VRAM",
        ]
        height = pane.outer_size.height
        # nothing copied this reply, no slots (every expert with the weights)
        pane.stats = moe(1900, 150, 2900, 450, resident_experts=1536)
        await pilot.pause()
        assert moe_text(app).splitlines()[2:] == ["last 2 updates: 83%–95%", "copied 0 B",
                                                  "resident 1536/1536 experts", "no expert slots (cache off)"]
        assert pane.query_one(Sparkline).data == pytest.approx([1900 / 2300, 1000 / 1050])
        assert pane.outer_size.height == height  # the pane keeps its size as it updates


async def test_the_sparkline_plots_new_lookups_only_and_keeps_the_last_updates():
    app = PaneApp()
    async with app.run_test(size=(40, 12)) as pilot:
        pane = app.query_one(MoeCachePane)
        pane.stats = moe(0, 0, 0, 0)  # a reply's first stats, before any lookup
        await pilot.pause()
        assert moe_text(app).splitlines()[:3] == ["hit rate —  total —", "hits 0  misses 0", "no lookups yet"]
        for i in range(1, HISTORY + 11):
            pane.stats = moe(3 * i, i, 3 * i, i)
            pane.stats = moe(3 * i, i, 3 * i, i)  # the same stats again (no new lookups): no new point
        await pilot.pause()
        assert list(pane.history) == [0.75] * HISTORY


async def test_a_dense_model_says_dense_model():
    app = PaneApp()
    async with app.run_test(size=(40, 12)) as pilot:
        app.query_one(MoeCachePane).stats = EngineStats(n_generated=10)
        await pilot.pause()
        assert moe_text(app) == "dense model"
        assert not app.query_one(Sparkline).display


# -- the app, on the scripted engine -------------------------------------------------------------


async def test_the_pane_is_live_while_a_reply_streams(make_app):
    script = Script(tokens_per_s=3000, n_tokens=200, pause_at={1: 120}, moe=True, backend="cuda")
    app = make_app(script)
    async with app.run_test(size=(130, 44)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        pane = app.screen.query_one(MoeCachePane)
        n_first = len(pane.history)
        assert n_first >= 1
        await send(pilot, "more", wait_done=False)
        await wait_for(pilot, lambda: len(app.engine.jobs[1].emitted) == 120 and app.engine.stats().n_generated == 120)
        m = app.engine.stats().moe  # the held job's stats: the pane shows them once past the throttle
        assert m.hits > 0 and m.hits < m.total_hits  # this reply's counters, and the totals since load
        await wait_for(pilot, lambda: f"hits {fmt_count(m.hits)}  misses {fmt_count(m.misses)}" in moe_text(app))
        assert app.screen.streaming
        lines = moe_text(app).splitlines()
        assert lines[0] == f"hit rate {m.hit_rate:.1%}  total {m.total_hit_rate:.1%}"
        assert lines[3] == f"copied {fmt_bytes(m.bytes_moved)} at 25.5 GB/s"  # the second job's copy rate
        assert lines[4:] == [f"resident {MOE_SLOTS}/1536 experts", f"slots {fmt_bytes(m.slot_bytes)} of VRAM"]
        assert len(pane.history) > n_first  # not reset by the new reply
        assert list(pane.query_one(Sparkline).data) == list(pane.history)
        assert all(0 < share < 1 for share in pane.history)
        memory = str(app.screen.query_one(MemoryPoolPane).render())
        assert f"experts {fmt_bytes(MOE_SLOTS * EXPERT_BYTES)}" in memory
        app.engine.jobs[1].release()
        await wait_for(pilot, lambda: not app.screen.streaming)


async def test_a_dense_model_says_so_after_a_reply(make_app):
    app = make_app(Script(tokens_per_s=3000, backend="cuda"))
    async with app.run_test(size=(130, 44)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: moe_text(app) == "dense model")
        assert "experts" not in str(app.screen.query_one(MemoryPoolPane).render())


async def test_moe_vram_reaches_the_loader(make_app):
    app = make_app(Script(tokens_per_s=3000, moe=True), moe_vram=512 * MiB)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.engine.moe_vram == 512 * MiB


# -- the Memory pane -----------------------------------------------------------------------------


def test_experts_are_a_region_of_their_own():
    vram = VramStats(reserved={"weights": 4000 * MiB, "kv": 512 * MiB, "experts": 432 * MiB, "scratch": 96 * MiB,
                               "graph": 8 * MiB}, device_total=10000 * MiB, device_free=4000 * MiB)
    assert pool_segments(EngineStats(vram=vram)) == [
        ("weights", 4000 * MiB), ("kv", 512 * MiB), ("experts", 432 * MiB), ("scratch", 104 * MiB),
        ("other", 952 * MiB), ("free", 4000 * MiB)]
    del vram.reserved["experts"]  # a dense model (or every expert with the weights): no experts segment
    assert [name for name, _ in pool_segments(EngineStats(vram=vram))] == ["weights", "kv", "scratch", "other", "free"]
