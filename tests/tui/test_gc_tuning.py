"""No full garbage collection while a reply streams, and the heap frozen after a model loads
(memra_tui/gc_tuning.py): a full pass holds the GIL for ~0.1 s, which the engine thread waits out."""
from __future__ import annotations

import gc

import pytest
from tui_helpers import MODELS_DIR, FixedClock, send, wait_ready

from memra_engine.events import DoneEvent, TokenEvent
from memra_tui.app import MemraApp
from memra_tui.gc_tuning import no_full_collections
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.streaming import ReplyBuffer, pump_job


class Cycle:
    def __init__(self) -> None:
        self.me = self  # garbage only a collection frees


@pytest.fixture
def eager_gc():
    """Thresholds that run a full collection every few allocations, and a log of the passes."""
    saved, passes = gc.get_threshold(), []

    def log(phase, info):
        if phase == "stop":
            passes.append(info["generation"])

    gc.set_threshold(10, 1, 1)
    gc.callbacks.append(log)
    yield passes
    gc.callbacks.remove(log)
    gc.set_threshold(*saved)


def test_a_streaming_reply_runs_no_full_collection(eager_gc):
    kept = []  # survivors, promoted to the oldest generation: what makes a full pass due

    def job():
        per_token = len(gc.get_objects()) // 100 + 1  # in all, twice the heap: a full pass is due several times
        eager_gc.clear()  # the reply is streaming from here on
        for i in range(200):
            kept.extend(Cycle() for _ in range(per_token))
            yield TokenEvent("x", i, -1.0)
        yield DoneEvent("eos")

    posted = []
    pump_job(job(), ReplyBuffer(), posted.append)
    assert eager_gc and 2 not in eager_gc  # young generations ran, never a full pass
    assert gc.get_threshold() == (10, 1, 1)  # restored once the reply ended


def test_overlapping_replies_restore_the_threshold_after_the_last(eager_gc):
    with no_full_collections:
        assert gc.get_threshold()[2] > 10**8
        with no_full_collections:
            pass
        assert gc.get_threshold()[2] > 10**8  # the other reply is still streaming
    assert gc.get_threshold() == (10, 1, 1)


@pytest.mark.anyio
async def test_the_app_freezes_the_heap_after_a_load_and_thaws_it_for_the_next(paths, monkeypatch):
    import memra_tui.app

    thawed = []  # the freeze count just after each thaw
    real_unsettle = memra_tui.app.unsettle_heap
    monkeypatch.setattr(memra_tui.app, "unsettle_heap", lambda: (real_unsettle(), thawed.append(gc.get_freeze_count())))
    app = MemraApp(None, "cpu", 4096, False, paths=paths, load_engine=ScriptedEngine.loader(Script()),
                   clock=FixedClock(), picker_root=MODELS_DIR, settle_gc=True)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_ready(pilot)
            assert gc.get_freeze_count() > 0 and thawed == [0]
            await send(pilot, "Hello")
            await app.reload_engine(2048)
            await wait_ready(pilot)
            assert gc.get_freeze_count() > 0 and app.engine.info.n_ctx == 2048
            assert thawed == [0, 0]  # the old engine's heap was thawed before the new one loaded
    finally:
        gc.unfreeze()
