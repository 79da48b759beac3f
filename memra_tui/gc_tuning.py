"""Garbage collection that does not stall the engine thread.

A full (generation 2) collection walks the whole heap with the GIL held: 110-130 ms in the app
with a chat open (measured with a probe thread asking for the GIL every 0.2 ms). The engine
thread cannot start its next step meanwhile, so one such pass in a short reply halved its tok/s,
and one at send time added its length to time to first token. Two things keep them off the path:
- settle_heap() after a model loads: collect once, then freeze what survived (modules, the
  tokenizer, the engine) out of every later collection, so a full pass walks only what came after;
- no_full_collections while a reply streams (younger generations are still collected, a few ms).
"""
from __future__ import annotations

import gc
import threading

# The GIL's hand-over interval for the app (Python's default is 5 ms). The engine thread gives
# the GIL up at each token's wait and then waits up to this long for it while the UI renders;
# scripts/ui_gil_probe.py (a model GPU at 1,754 tok/s, the real app headless): 0.5 ms kept 71% of
# the engine's rate, 0.1 ms 85%, 0.05 ms 91%, 0.01 ms 92%.
SWITCH_INTERVAL_S = 0.00005


def settle_heap() -> None:
    gc.collect()
    gc.freeze()


def unsettle_heap() -> None:
    """Before another model loads: what was frozen may be garbage once the old engine goes."""
    gc.unfreeze()


class NoFullCollections:
    """No full collection while a reply streams; the threshold comes back after the last reply in
    flight (process-wide, hence the count: replies of two screens may overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._saved = gc.get_threshold()

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                self._saved = gc.get_threshold()
                gc.set_threshold(self._saved[0], self._saved[1], 1 << 30)
            self._active += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                gc.set_threshold(*self._saved)


no_full_collections = NoFullCollections()
