"""UI throughput benchmark (not a test): can the transcript keep up with a very fast engine?

The scripted engine emits TOKENS tokens at RATE tokens/s into one reply. Reported:
- frames: screen updates the app sent to the (headless) terminal per second while streaming;
- transcript updates per second (Markdown appends), which the app caps at FLUSH_HZ;
- UI thread busy share: CPU time of the UI (asyncio) thread / wall time while streaming;
- the lag from the last token leaving the engine to the complete text in the Markdown widget;
- whether the final transcript text equals the emitted text, exactly.

With --inspector the token inspector is open (F7) before the message is sent, so the reply comes
with its top 10 candidates per token, and the cursor is put on the reply in flight, which is then
drawn as tokens (one span each) rather than markdown; the tokens with candidates are counted.

    python scripts/bench_ui.py [--rate 5000] [--tokens 20000] [--size 120x40] [--inspector] [--message-file F]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from memra_tui.app import MemraApp
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.settings import AppPaths
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.message_view import MessageView
from memra_tui.widgets.transcript import Transcript

REPLY = (
    "Streaming **markdown** at speed, with `inline code`, a list and a fenced block:\n\n"
    "- first point\n- second point\n\n"
    "```python\nfor i in range(3):\n    print(i)\n```\n\n"
    "And a closing paragraph that runs on for a while so that lines wrap in the transcript.\n\n"
)


async def measure(rate: float, tokens: int, size: tuple[int, int], inspector: bool = False,
                  message: str = "go") -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="memra-bench-ui-"))
    script = Script(replies=[REPLY], tokens_per_s=rate, n_tokens=tokens, stats_every=64)
    from memra_engine.sampling import SamplingParams
    from memra_tui.settings import save_sampling_defaults

    paths = AppPaths(tmp / "config", tmp / "data")
    save_sampling_defaults(paths, SamplingParams(max_tokens=tokens))
    app = MemraApp(None, "cpu", 1 << 20, False, paths=paths, load_engine=ScriptedEngine.loader(script))

    frames = 0
    real_display = app._display

    def counting_display(*args, **kwargs):
        nonlocal frames
        frames += 1
        return real_display(*args, **kwargs)

    app._display = counting_display
    appends = 0
    real_write = MessageView.write

    async def counting_write(self, fragment):
        nonlocal appends
        appends += 1
        await real_write(self, fragment)

    MessageView.write = counting_write

    async with app.run_test(size=size) as pilot:
        while app.engine is None:
            await pilot.pause(0.01)
        await pilot.pause(0.2)
        composer = app.screen.query_one(Composer)
        if inspector:
            await app.screen.action_inspect()  # no reply yet: the next one comes with candidates
            await pilot.pause(0.2)
        composer.text = message
        frames0, appends0 = frames, appends
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        composer.action_send()  # as Enter does (pilot.press would wait for the UI to go idle)
        while not app.engine.jobs:
            await asyncio.sleep(0.001)

        job = app.engine.jobs[0]
        if inspector:  # the cursor on the reply in flight, once its first tokens are shown
            while not (app.screen._reply_view and app.screen._reply_view.tokens):
                await asyncio.sleep(0.001)
            await app.screen.action_inspect()
        while not job.done_reason:  # the engine is still emitting
            await asyncio.sleep(0.001)
        cpu1, wall1, frames1, appends1 = time.thread_time(), time.perf_counter(), frames, appends
        view: MessageView = app.screen.query_one(Transcript).message_views[-1]
        emitted = job.emitted_text
        # Complete = the reply's end was handled: the last fragment is parsed and its blocks mounted.
        while app.screen.streaming:
            await asyncio.sleep(0.001)
        complete = time.perf_counter()
        result = {
            "tokens": len(job.emitted),
            "emit_s": job.last_token_time - wall0,
            "frames_per_s": (frames1 - frames0) / (wall1 - wall0),
            "appends_per_s": (appends1 - appends0) / (wall1 - wall0),
            "ui_busy_share": (cpu1 - cpu0) / (wall1 - wall0),
            "last_token_to_complete_s": complete - job.last_token_time,
            "text_equal": view.shown_source == emitted and view.text == emitted
                          and app.screen.chat.messages[-1].content == emitted,
            "chars": len(emitted),
            "token_view": view.token_view,
            "with_candidates": sum(t.candidates is not None for t in view.tokens or ()),
        }
    MessageView.write = real_write
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--size", default="120x40")
    parser.add_argument("--inspector", action="store_true", help="the token inspector open, its cursor on the reply")
    parser.add_argument("--message-file", type=Path, help="send this file's text (a long pasted prompt) instead of 'go'")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    message = args.message_file.read_text() if args.message_file else "go"
    r = asyncio.run(measure(args.rate, args.tokens, (width, height), args.inspector, message))
    print(f"emitted {r['tokens']:,} tokens ({r['chars']:,} chars) in {r['emit_s']:.2f} s "
          f"({r['tokens'] / r['emit_s']:,.0f} tok/s) at {width}x{height}")
    print(f"frames/s while streaming:        {r['frames_per_s']:.1f}")
    print(f"transcript updates/s:            {r['appends_per_s']:.1f}")
    print(f"UI thread busy share:            {r['ui_busy_share']:.0%}")
    print(f"last token -> complete text:     {r['last_token_to_complete_s'] * 1000:.0f} ms (target < 500 ms)")
    print(f"final transcript == emitted:     {r['text_equal']}")
    if args.inspector:
        print(f"inspector: reply drawn as tokens {r['token_view']}, {r['with_candidates']:,} of {r['tokens']:,} "
              "tokens with candidates")


if __name__ == "__main__":
    main()
