"""How much decode speed the app's own threads cost the engine, on the CPU (no GPU needed).

On the H200 the panes showed decode 11-23% below memra-bench's figure at the same depth (gpu-log,
session 28). The suspect is the GIL: the engine thread gives it up while it waits for a token,
and gets it back only when the UI or the pump thread lets go (at most sys.getswitchinterval()
later). This replays that pattern without a device: a model GPU runs steps of STEP_US back to back
while at least one is queued; the engine thread keeps AHEAD steps queued, sleeps until each token
is due (the GIL released, as cuEventSynchronize does), does HOST_US of Python per token and queues
the next step through a GIL-releasing call (as cuGraphLaunch through ctypes does). The rate it
reaches alone, then inside the real app (headless, the reply streaming into the transcript), says
what the app's threads take.

--prefill-launches N models an eager prefill before the first token: N kernel launches of
--launch-us of Python each (PyCUDA's prepared_async_call: ~10 µs), the GIL released once a launch,
while the app renders the pasted prompt (--prompt-chars of it in the first message). It reports the
prefill's wall time alone and in the app: what a long paste's TTFT pays for the UI.

Usage: python scripts/ui_gil_probe.py [--step-us 570] [--host-us 60] [--tokens 512] [--switch-ms 0.5]
       [--prefill-launches 6000 --launch-us 10 --prompt-chars 40000]
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

from memra_engine.events import DoneEvent, StatsEvent, TokenEvent
from memra_tui.scripted_engine import Script, ScriptedEngine, split_tokens

_libc = ctypes.CDLL(None)
AHEAD = 2  # engine/gpu/backend.py AHEAD_STEPS


def python_work(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class ModelGpuEngine(ScriptedEngine):
    """The scripted engine, its tokens paced by a model GPU instead of a clock."""

    step_s = 570e-6
    host_s = 60e-6
    launch_holds_gil = False  # True: the launch as a PyDLL call would be, the GIL kept
    prefill_launches, launch_s = 0, 10e-6
    rates: list[float] = []
    prefills: list[float] = []  # seconds

    def _prefill(self) -> None:
        t0 = time.perf_counter()
        for _ in range(self.prefill_launches):
            python_work(self.launch_s * 1e6)
            if not ModelGpuEngine.launch_holds_gil:
                _libc.getppid()  # a ctypes call that releases the GIL and does not sleep (usleep(0) takes ~80 µs)
        self.prefills.append(time.perf_counter() - t0)

    def _play(self, job) -> None:
        if self.prefill_launches:
            self._prefill()
        tokens = split_tokens(self.script.replies[0])
        tokens = [tokens[i % len(tokens)] for i in range(self.script.n_tokens)]
        n = len(tokens)
        launched = [time.perf_counter()] * AHEAD + [0.0] * n  # step k's launch time
        finish = 0.0
        first = None
        for k, text in enumerate(tokens):
            finish = max(finish, launched[k]) + self.step_s  # the device runs queued steps back to back
            while (wait := finish - time.perf_counter()) > 0:
                time.sleep(wait)  # the GIL is released, as in cuEventSynchronize
            if first is None:
                first = finish
            python_work(self.host_s * 1e6)
            if not ModelGpuEngine.launch_holds_gil:
                _libc.usleep(0)  # a ctypes call: the GIL released and taken back, as cuGraphLaunch
            launched[k + AHEAD] = time.perf_counter()
            job._events.put(TokenEvent(text, 1000 + k, -1.0))
        self.rates.append((n - 1) / (finish - first))
        job._events.put(StatsEvent(self._make_stats(job, 10, n, self.rates[-1])))
        job.done_reason = "length"
        job._events.put(DoneEvent("length"))


def alone(script: Script) -> float:
    engine = ModelGpuEngine.loader(script)("model.gguf", "cpu", 8192)
    try:
        from memra_engine.sampling import SamplingParams

        for _ in engine.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=script.n_tokens)):
            pass
    finally:
        engine.close()
    return ModelGpuEngine.rates.pop()


async def in_app(script: Script, replies: int, prompt_chars: int = 0) -> list[float]:
    from memra_tui.app import MemraApp
    from memra_tui.settings import AppPaths

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "tui"))
    from tui_helpers import send, wait_ready

    with tempfile.TemporaryDirectory() as tmp:
        paths = AppPaths(config_dir=Path(tmp) / "config", data_dir=Path(tmp) / "data")
        app = MemraApp(None, "cpu", 8192, False, paths=paths, load_engine=ModelGpuEngine.loader(script),
                       settle_gc=True)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_ready(pilot)
            story = ("The harbour town woke slowly. Fishing boats knocked against the pier, gulls argued over "
                     "the nets, and the baker opened his shutters to the smell of bread and salt. ")
            for i in range(replies):
                paste = story * (prompt_chars // len(story)) if i == 0 and prompt_chars else ""
                await send(pilot, f"Tell me a story, part {i}.\n\n{paste}")
    rates, ModelGpuEngine.rates[:] = list(ModelGpuEngine.rates), []
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step-us", type=float, default=570.0, help="device time per decode step (570: ~1,750 tok/s)")
    p.add_argument("--host-us", type=float, default=60.0, help="Python per token on the engine thread")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--replies", type=int, default=3)
    p.add_argument("--launch-holds-gil", action="store_true", help="model the launch as a call that keeps the GIL")
    p.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval for both runs (default: run_app's)")
    p.add_argument("--prefill-launches", type=int, default=0, help="launches of an eager prefill before each reply")
    p.add_argument("--launch-us", type=float, default=10.0, help="Python per prefill launch")
    p.add_argument("--prompt-chars", type=int, default=40000, help="pasted text in the first message (with a prefill)")
    args = p.parse_args()
    ModelGpuEngine.step_s, ModelGpuEngine.host_s = args.step_us * 1e-6, args.host_us * 1e-6
    ModelGpuEngine.prefill_launches, ModelGpuEngine.launch_s = args.prefill_launches, args.launch_us * 1e-6
    ModelGpuEngine.launch_holds_gil = args.launch_holds_gil
    from memra_tui.app import SWITCH_INTERVAL_S

    sys.setswitchinterval(SWITCH_INTERVAL_S if args.switch_ms is None else args.switch_ms / 1000)  # run_app's
    script = Script(tokens_per_s=1e9, n_tokens=args.tokens)
    device = 1e6 / args.step_us
    solo = statistics.median(alone(script) for _ in range(3))
    solo_prefill = statistics.median(ModelGpuEngine.prefills) if args.prefill_launches else 0.0
    ModelGpuEngine.prefills.clear()
    app = asyncio.run(in_app(script, args.replies, args.prompt_chars if args.prefill_launches else 0))
    if args.prefill_launches:
        first, *rest = ModelGpuEngine.prefills
        print(f"prefill ({args.prefill_launches} launches of {args.launch_us:g} us): alone {solo_prefill * 1e3:.1f} ms; "
              f"in the app {first * 1e3:.1f} ms after the paste ({first / solo_prefill:.2f}x), "
              f"{', '.join(f'{r * 1e3:.1f}' for r in rest)} ms after short turns")
    print(f"device {device:,.0f} tok/s; engine alone {solo:,.0f}; in the app {', '.join(f'{r:,.0f}' for r in app)} "
          f"(median {statistics.median(app) / solo:.1%} of alone); switch interval {sys.getswitchinterval() * 1e3:g} ms")


if __name__ == "__main__":
    main()
