"""Helpers shared by the app tests (imported by name: tests/ has no __init__.py)."""
from __future__ import annotations

import itertools
from pathlib import Path

MODELS_DIR = Path(__file__).parent / "models"  # two placeholder .gguf files for the file picker
EPOCH = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC


class FixedClock:
    """Each call is one second after the previous one: timestamps are deterministic."""

    def __init__(self, start: float = EPOCH) -> None:
        self._ticks = itertools.count()
        self.start = start

    def __call__(self) -> float:
        return self.start + next(self._ticks)


async def wait_for(pilot, condition, timeout: float = 5.0, step: float = 0.02) -> None:
    """Let the app run until condition() is true; fail the test after `timeout` seconds."""
    waited = 0.0
    while not condition():
        if waited >= timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(step)
        waited += step


async def wait_ready(pilot) -> None:
    from memra_tui.screens.chat import ChatScreen

    # the screen's widgets mount after it is pushed: wait for the last of them, not just the screen
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ChatScreen) and pilot.app.screen.query("#knobs-tab"))
    await pilot.pause()


async def send(pilot, text: str, wait_done: bool = True) -> None:
    from memra_tui.widgets.composer import Composer

    n_jobs = len(pilot.app.engine.jobs)
    composer = pilot.app.screen.query_one(Composer)
    composer.focus()
    await pilot.pause()  # let a knob field that lost focus apply its value, as it would for a user
    composer.text = text  # typing key by key is slow under the pilot; test_newline_key_does_not_send types
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(pilot.app.engine.jobs) > n_jobs)
    if wait_done:
        await wait_for(pilot, lambda: not pilot.app.screen.streaming)
        await pilot.pause()


async def hold_still(pilot) -> None:
    """Before a snapshot: stop cursor blinking (its phase depends on timing) and drop toasts."""
    from textual.widgets import Input, TextArea

    for screen in pilot.app.screen_stack:
        for widget in screen.query("Input, TextArea"):
            if isinstance(widget, (Input, TextArea)):
                # Stop the blink timer with the cursor shown where there is focus. (Turning
                # cursor_blink off instead can leave a cached line drawn in the blink-off phase.)
                widget._pause_blink(visible=widget.has_focus)
                widget.refresh()
    pilot.app.clear_notifications()
    for transcript in pilot.app.screen.query("Transcript"):
        transcript.scroll_end(animate=False, immediate=True)
    await pilot.pause(0.1)
    await pilot.wait_for_scheduled_animations()


async def set_field(pilot, field: str, text: str) -> None:
    """Type into a knob field the way a user does: focus, clear, type."""
    from textual.widgets import Input

    field_input = pilot.app.screen.query_one(f"#knob-{field}", Input)
    field_input.focus()
    field_input.value = ""
    await pilot.press(*text)
    await pilot.pause()
