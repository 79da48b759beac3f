"""Speculative decoding in the UI: the Speculative pane draws acceptance, mean length and one bar
per draft position, live while a reply streams; the knobs pane offers a draft model only when one
is loaded; a spec change reaches the next job and the running one (update_spec); an invalid draft
length is refused at the field; the command line's spec is where the app starts."""
from __future__ import annotations

import json

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Input, Select, Static
from tui_helpers import send, set_field, wait_for, wait_ready

from memra_engine.events import DoneEvent, EngineStats, StatsEvent
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import SpecConfig
from memra_tui.screens.load_error import LoadErrorScreen
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.widgets.spec_acceptance import SpecPane, position_bars

pytestmark = pytest.mark.anyio

DRAFT = "models/smol-draft.gguf"  # the scripted engine names the draft model after the file


def spec_stats() -> EngineStats:
    # 4 rounds of 4 drafts: every round kept the first, 3 the second, 2 the third, none the fourth
    return EngineStats(spec_rounds=4, spec_drafted=16, spec_accepted=9,
                       spec_drafted_by_pos=[4, 4, 4, 4], spec_accepted_by_pos=[4, 3, 2, 0])


class PaneApp(App):
    def compose(self) -> ComposeResult:
        yield SpecPane()


def pane_text(app) -> str:
    return str(app.screen.query_one(SpecPane).render())




def test_a_scripted_engine_bug_ends_the_job_with_an_error(monkeypatch):
    """An exception inside the scripted engine's thread (as a ZeroDivisionError in its spec rounds
    did, and hung the UI tests) ends the job with an error event; the thread takes the next job."""
    engine = ScriptedEngine(Script(n_tokens=5))
    try:
        monkeypatch.setattr(engine, "_play", lambda job: 1 / 0)
        events = list(engine.chat([{"role": "user", "content": "hi"}], SamplingParams()))
        assert isinstance(events[-1], DoneEvent) and events[-1].reason == "error"
        assert "ZeroDivisionError" in events[-1].error
        monkeypatch.undo()
        events = list(engine.chat([{"role": "user", "content": "hi"}], SamplingParams()))
        assert events[-1].reason != "error"
    finally:
        engine.close()


async def choose_spec(pilot, mode: str) -> None:
    await pilot.press("f3")
    pilot.app.screen.query_one("#knob-spec", Select).value = mode
    await pilot.pause()


def spec_options(app) -> list[tuple[str, str]]:
    return [(str(prompt), value) for prompt, value in app.screen.query_one("#knob-spec", Select)._options]


# -- the pane ------------------------------------------------------------------------------------


def test_position_bars_are_one_block_per_position():
    assert position_bars([1.0, 0.75, 0.5, 0.0]) == "█▆▅▁"
    assert position_bars([0.01]) == "▂"  # something kept is never drawn as nothing kept
    assert position_bars([]) == ""


async def test_the_pane_shows_acceptance_mean_length_and_position_bars():
    app = PaneApp()
    async with app.run_test() as pilot:
        assert pane_text(app) == "off (no drafts this reply)"
        app.query_one(SpecPane).stats = spec_stats()
        await pilot.pause()
        assert pane_text(app).splitlines() == [
            "accepted 56%  9 of 16",
            "mean 2.25 per round  4 rounds",
            "by position █▆▅▁ 1–4",
        ]
        app.query_one(SpecPane).stats = EngineStats(n_generated=40)  # spec off: nothing drafted
        await pilot.pause()
        assert pane_text(app) == "off (no drafts this reply)"


async def test_the_pane_is_live_while_a_reply_streams(make_app):
    script = Script(tokens_per_s=3000, n_tokens=200, pause_at={0: 120})
    app = make_app(script, draft=DRAFT, spec=SpecConfig("draft"))
    async with app.run_test(size=(130, 44)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait_done=False)
        await wait_for(pilot, lambda: len(app.engine.jobs[0].emitted) == 120)
        rounds = app.engine.jobs[0].spec_rounds.counters
        await wait_for(pilot, lambda: f"{rounds.accepted} of {rounds.drafted}" in pane_text(app))  # the held stats
        assert app.screen.streaming
        lines = pane_text(app).splitlines()
        assert f"{rounds.rounds} rounds" in lines[1]
        bars = lines[2].removeprefix("by position ").split()[0]
        assert len(bars) == len(rounds.drafted_by_pos) > 1  # a bar per draft position
        app.engine.jobs[0].release()
        await wait_for(pilot, lambda: not app.screen.streaming)


# -- the knobs -----------------------------------------------------------------------------------


async def test_draft_model_is_offered_only_with_a_draft_loaded(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert spec_options(app) == [("off", "off"), ("prompt lookup", "lookup")]
    app = make_app(Script(tokens_per_s=3000), draft=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.engine.info.draft_model_name == "smol-draft"
        assert spec_options(app) == [("off", "off"), ("prompt lookup", "lookup"), ("draft: smol-draft", "draft")]
        assert app.screen.query_one("#knob-spec", Select).value == "off"  # loading a draft does not turn it on


async def test_the_command_line_spec_is_where_the_app_starts(make_app):
    app = make_app(Script(tokens_per_s=3000), draft=DRAFT, spec=SpecConfig("draft", draft_max=5))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.query_one("#knob-spec", Select).value == "draft"
        assert app.screen.query_one("#knob-draft_max", Input).value == "5"
        assert "spec draft ≤5" in app.screen.query_one("#knob-summary").text
        await send(pilot, "hi")
        await pilot.press("ctrl+n")  # a new chat keeps it: it is the session's, like the sampling knobs
        await send(pilot, "again")
        assert [job.spec for job in app.engine.jobs] == [SpecConfig("draft", draft_max=5)] * 2


async def test_a_draft_spec_without_a_draft_model_falls_back_to_off(make_app):
    app = make_app(Script(tokens_per_s=3000), spec=SpecConfig("draft", draft_max=5))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert [n.message for n in app._notifications if "draft" in n.message] == [
            "no draft model is loaded; speculative decoding off"]
        assert app.screen.query_one("#knob-spec", Select).value == "off"
        await send(pilot, "hi")
        assert app.engine.jobs[0].spec == SpecConfig("off", draft_max=5)
        assert app.engine.jobs[0].done_reason == "eos"


async def test_a_spec_change_reaches_the_next_job_exactly(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "plain")
        await choose_spec(pilot, "lookup")
        await set_field(pilot, "draft_max", "4")
        await send(pilot, "drafted")
        assert [job.spec for job in app.engine.jobs] == [SpecConfig(), SpecConfig("lookup", draft_max=4)]
        assert "spec lookup ≤4" in app.screen.query_one("#knob-summary").text
        assert app.screen.query_one(SpecPane).stats.spec_drafted > 0  # the scripted engine drafted
        chat_id = app.screen.chat.id
    saved = json.loads(app.store.path_of(chat_id).read_text())  # each reply records how it was drafted
    assert [m["spec"] for m in saved["messages"] if m["role"] == "assistant"] == [
        None, SpecConfig("lookup", draft_max=4).to_dict()]
    assert saved["spec"] == SpecConfig("lookup", draft_max=4).to_dict()
    assert not paths.settings_file.exists()  # not a saved default: the command line decides it at start


async def test_a_spec_change_mid_reply_reaches_the_running_job(make_app):
    app = make_app(Script(tokens_per_s=3000, pause_at={0: 3}), draft=DRAFT, spec=SpecConfig("draft"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait_done=False)
        job = app.engine.jobs[0]
        await wait_for(pilot, lambda: len(job.emitted) == 3)
        await choose_spec(pilot, "lookup")
        assert job.spec_updates == [SpecConfig("lookup")]
        await set_field(pilot, "draft_max", "3")
        await pilot.press("enter")
        assert job.spec_updates == [SpecConfig("lookup"), SpecConfig("lookup", draft_max=3)]
        await choose_spec(pilot, "off")
        assert job.spec_updates[-1] == SpecConfig("off", draft_max=3)
        assert job.sampling_updates == []  # the sampling knobs did not move
        job.release()
        await wait_for(pilot, lambda: not app.screen.streaming)
        assert job.done_reason == "eos"


@pytest.mark.parametrize("text, message", [
    ("0", "draft_max must be in [1, 15]"),
    ("16", "draft_max must be in [1, 15]"),
    ("many", "draft_max must be an integer"),
])
async def test_an_invalid_draft_max_is_refused_at_the_field(make_app, text, message):
    app = make_app(Script(tokens_per_s=3000, pause_at={0: 2}), spec=SpecConfig("lookup"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi", wait_done=False)
        await wait_for(pilot, lambda: len(app.engine.jobs[0].emitted) == 2)
        await pilot.press("f3")
        await set_field(pilot, "draft_max", text)
        await pilot.press("enter")
        error = app.screen.query_one("#error-draft_max", Static)
        assert error.has_class("-shown") and str(error.render()) == f"✗ {message} (not applied)"
        assert app.screen.query_one("#knob-draft_max", Input).has_class("-invalid")
        assert app.engine.jobs[0].spec_updates == []  # neither the running job
        app.engine.jobs[0].release()
        await wait_for(pilot, lambda: not app.screen.streaming)
        await send(pilot, "again")
        assert app.engine.jobs[1].spec == SpecConfig("lookup")  # nor the next one


# -- loading and the scripted engine -------------------------------------------------------------


async def test_a_draft_model_that_does_not_fit_is_a_load_error(make_app):
    mismatch = "the draft model's vocabulary has 32000 tokens, the target's 49152"
    app = make_app(Script(fail_drafts={DRAFT: mismatch}), draft=DRAFT, spec=SpecConfig("draft"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadErrorScreen))
        await pilot.pause()
        assert str(app.screen.query_one("#load-error").render()) == mismatch


def test_the_scripted_engine_follows_the_spec_seam():
    plain, drafter = ScriptedEngine(Script(tokens_per_s=5000)), ScriptedEngine(Script(tokens_per_s=5000),
                                                                                  draft_path=DRAFT)
    try:
        events = list(plain.chat([{"role": "user", "content": "hi"}], SamplingParams(), spec=SpecConfig("draft")))
        assert isinstance(events[-1], DoneEvent) and "no draft model loaded" in events[-1].error
        for engine, spec in ((plain, SpecConfig("lookup", draft_max=4)), (drafter, SpecConfig("draft"))):
            events = list(engine.chat([{"role": "user", "content": "hi"}], SamplingParams(), spec=spec))
            s = [e for e in events if isinstance(e, StatsEvent)][-1].stats
            assert s.spec_rounds > 0 and 0 < s.spec_accepted <= s.spec_drafted
            assert 1 <= len(s.spec_drafted_by_pos) <= spec.draft_max and sum(s.spec_drafted_by_pos) == s.spec_drafted
            assert sum(s.spec_accepted_by_pos) == s.spec_accepted
            # every kept draft and one token of the target's own per round (the last may be cut)
            assert s.spec_accepted + s.spec_rounds >= s.n_generated
        events = list(plain.chat([{"role": "user", "content": "hi"}], SamplingParams()))
        assert [e for e in events if isinstance(e, StatsEvent)][-1].stats.spec_drafted == 0
    finally:
        plain.close()
        drafter.close()
