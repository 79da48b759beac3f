"""The knobs pane: a change reaches the next job exactly, bad values are refused at the field,
presets apply, and the knobs are the defaults at the next start. (The grammar:
test_grammar_picker.py; speculative decoding: test_speculative_ui.py.)"""
from __future__ import annotations

import json

import pytest
from textual.widgets import Input, Select, Static
from tui_helpers import send, set_field, wait_for, wait_ready

from memra_engine.sampling import SamplingParams
from memra_tui.scripted_engine import Script
from memra_tui.settings import PRESETS

pytestmark = pytest.mark.anyio




async def test_a_knob_change_reaches_the_next_job_exactly(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await set_field(pilot, "temperature", "0.3")
        await set_field(pilot, "top_k", "7")
        await set_field(pilot, "top_p", "0.8")
        await set_field(pilot, "repeat_last_n", "-1")
        await set_field(pilot, "seed", "1234")
        await set_field(pilot, "max_tokens", "99")
        await send(pilot, "hi")
        expected = SamplingParams(temperature=0.3, top_k=7, top_p=0.8, repeat_last_n=-1, seed=1234, max_tokens=99)
        assert app.engine.jobs[0].sampling == expected
        summary = app.screen.query_one("#knob-summary").text
        assert "T 0.3" in summary and "top-k 7" in summary and "seed 1234" in summary
    saved = json.loads(paths.settings_file.read_text())
    assert SamplingParams.from_dict(saved["sampling"]) == expected

    # The next start uses them as defaults, in the pane and in the first job.
    app2 = make_app(Script(tokens_per_s=3000))
    async with app2.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app2.screen.query_one("#knob-top_k", Input).value == "7"
        await send(pilot, "again")
        assert app2.engine.jobs[0].sampling == expected


async def test_command_line_knobs_start_the_run_without_replacing_the_saved_ones(make_app, paths):
    """`memra-chat -t 0.2 --seed 9 --system "..."`: the knobs this run starts with are the saved ones
    with the flags over them, the chat it opens (and the next new one) has that system prompt, and
    the settings file is written only when a knob changes in the UI."""
    saved = SamplingParams(temperature=0.9, top_k=11, max_tokens=77)
    paths.settings_file.parent.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_text(json.dumps({"sampling": saved.to_dict()}))
    app = make_app(Script(tokens_per_s=3000), sampling={"temperature": 0.2, "seed": 9}, system="Answer in French.")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        expected = SamplingParams(temperature=0.2, top_k=11, max_tokens=77, seed=9)
        job = app.engine.jobs[0]
        assert job.sampling == expected
        assert job.messages[0] == {"role": "system", "content": "Answer in French."}
        assert "T 0.2" in app.screen.query_one("#knob-summary").text
        await pilot.press("ctrl+n")
        await send(pilot, "again")
        assert app.engine.jobs[1].messages[0] == {"role": "system", "content": "Answer in French."}
    assert SamplingParams.from_dict(json.loads(paths.settings_file.read_text())["sampling"]) == saved

    # --resume with --system: the flag wins over the resumed chat's own, as --grammar does
    app2 = make_app(Script(tokens_per_s=3000), resume=True, system="Answer in German.")
    async with app2.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "more")
        assert app2.engine.jobs[0].messages[0] == {"role": "system", "content": "Answer in German."}
        assert app2.engine.jobs[0].sampling == saved  # no sampling flags this time: the saved knobs


@pytest.mark.parametrize("field, text, message", [
    ("top_p", "1.7", "top_p must be in (0, 1]"),
    ("top_k", "-3", "top_k must be >= 0 (0 = off)"),
    ("temperature", "warm", "temperature must be a number"),
    ("seed", "1.5", "seed must be an integer or 'random'"),
])
async def test_an_invalid_value_is_refused_at_the_field(make_app, paths, field, text, message):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await set_field(pilot, field, text)
        error = app.screen.query_one(f"#error-{field}", Static)
        assert error.has_class("-shown") and message in str(error.render())
        assert app.screen.query_one(f"#knob-{field}", Input).has_class("-invalid")
        await send(pilot, "hi")
        assert app.engine.jobs[0].sampling == SamplingParams()  # the bad value never left the field
    assert not paths.settings_file.exists()


async def test_presets_fill_the_fields_and_apply(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await pilot.click("#preset-creative")
        await pilot.pause()
        assert app.screen.query_one("#knob-temperature", Input).value == str(PRESETS["creative"].temperature)
        await send(pilot, "hi")
        assert app.engine.jobs[0].sampling == PRESETS["creative"]


async def test_a_change_mid_reply_reaches_the_running_job(make_app):
    app = make_app(Script(tokens_per_s=3000, pause_at={0: 3}))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait_done=False)
        await wait_for(pilot, lambda: len(app.engine.jobs[0].emitted) == 3)
        await pilot.press("f3")
        await set_field(pilot, "temperature", "0.1")
        await pilot.press("enter")
        assert app.engine.jobs[0].sampling_updates[-1] == SamplingParams(temperature=0.1)
        app.engine.jobs[0].release()


async def test_grammar_and_spec_mode_are_live(make_app):
    # the grammar selector itself is tested in test_grammar_picker.py, the spec knobs in test_speculative_ui.py
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        for selector in ("#knob-grammar", "#knob-spec"):
            select = app.screen.query_one(selector, Select)
            assert not select.disabled and select.value == "off"
        assert not app.screen.query_one("#knob-draft_max", Input).disabled
