"""A/B (issue 18, item 4): F9 sends the message with two knob sets (B's edited in a dialog first,
a new seed by default); reply A then reply B stream into two columns with their tok/s and mean
logprob; a / b (or the arrows and Enter) keeps one, and the other stays a sibling branch. On the
scripted engine, whose replies follow the job's index (A is job 0's reply, B job 1's)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from textual.widgets import Input
from tui_helpers import hold_still, wait_for, wait_ready

from memra_engine.sampling import SamplingParams
from memra_tui.chats import Chat
from memra_tui.screens.ab_compare import ABScreen
from memra_tui.screens.ab_knobs import ABKnobsScreen
from memra_tui.screens.chat import ChatScreen
from memra_tui.scripted_engine import DEFAULT_REPLIES, Script, split_tokens
from memra_tui.settings import save_sampling_defaults
from memra_tui.widgets.ab_column import ABColumn
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.fit_text import OneLine
from memra_tui.widgets.key_footer import KeyFooter
from memra_tui.widgets.transcript import Transcript

FAST = Script(tokens_per_s=3000)
USER = [{"role": "user", "content": "hello"}]


def _columns(app) -> list[ABColumn]:
    return list(app.screen.query(ABColumn))


def _numbers(column: ABColumn) -> str:
    return column.query_one(".ab-numbers", OneLine).text


async def _open_dialog(pilot, text: str = "hello") -> None:
    await wait_ready(pilot)
    pilot.app.screen.query_one(Composer).text = text
    await pilot.press("f9")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ABKnobsScreen))
    await pilot.pause()


async def _ab_run(pilot, text: str = "hello") -> None:
    """F9, the dialog's defaults sent, both replies in."""
    await _open_dialog(pilot, text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ABScreen) and pilot.app.screen.finished)
    await pilot.pause()


def _roles(app) -> list[str]:
    return [str(v.query_one(".role").render()) for v in app.screen.query_one(Transcript).message_views]


@pytest.mark.anyio
async def test_both_replies_stream_in_turn_and_b_is_kept_as_the_branch_on_screen(make_app, paths):
    save_sampling_defaults(paths, SamplingParams(seed=7))
    app = make_app(Script(tokens_per_s=3000, pause_at={0: 3, 1: 2}))
    async with app.run_test(size=(120, 36)) as pilot:
        await _open_dialog(pilot)
        assert app.screen.query_one("#ab-knob-seed", Input).value == "8"  # B: the next seed
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and len(app.engine.jobs) == 1
                       and len(app.engine.jobs[0].emitted) == 3)
        await pilot.pause(0.2)
        a, b = _columns(app)
        assert a.reply.text == "".join(split_tokens(DEFAULT_REPLIES[0])[:3]) and b.reply.text == ""
        assert "waiting" in str(b.reply.query_one(".status").render())
        assert a.border_title == "A · seed 7" and b.border_title == "B · seed 8"
        await pilot.press("b")  # not yet: B has not run
        assert isinstance(app.screen, ABScreen)
        app.engine.jobs[0].release()
        await wait_for(pilot, lambda: len(app.engine.jobs) == 2 and len(app.engine.jobs[1].emitted) == 2)
        await pilot.pause(0.2)
        assert a.reply.text == DEFAULT_REPLIES[0] and b.reply.text == "".join(split_tokens(DEFAULT_REPLIES[1])[:2])
        assert not app.screen.finished
        app.engine.jobs[1].release()
        await wait_for(pilot, lambda: app.screen.finished)
        await pilot.pause()
        jobs = app.engine.jobs
        assert [j.messages for j in jobs] == [USER, USER] and [j.sampling.seed for j in jobs] == [7, 8]
        for column, rate in ((a, "3,000 tok/s"), (b, "2,880 tok/s")):  # the scripted rate of jobs 0 and 1
            mean = sum(t.logprob for t in column.reply.tokens) / len(column.reply.tokens)
            assert _numbers(column) == f"{rate} · mean logprob {mean:.3f} · {len(column.reply.tokens)} tokens"
        keys = {k.key for k in app.screen.query_one(KeyFooter).shown_keys}
        assert {"escape", "a", "b", "left", "right", "enter"} <= keys
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await pilot.pause()
        chat = app.screen.chat
        assert [m.content for m in chat.messages] == ["hello", DEFAULT_REPLIES[1]]
        assert chat.siblings(1) == (1, 2) and chat.messages[1].branches[0][0].content == DEFAULT_REPLIES[0]
        assert chat.messages[1].sampling["seed"] == 8 and chat.messages[1].branches[0][0].sampling["seed"] == 7
        assert _roles(app) == ["You", "Assistant  ‹ 2/2 ›"]
        assert Chat.from_json(app.store.path_of(chat.id).read_text()) == chat
        assert app.screen.sampling.seed == 7  # the chat's knobs are not B's
        transcript = app.screen.query_one(Transcript)
        transcript.focus()
        await pilot.press("[")  # A is the sibling
        await pilot.pause()
        assert chat.siblings(1) == (0, 2) and transcript.replies[-1].text == DEFAULT_REPLIES[0]
        assert transcript.replies[-1].tokens  # this session's tokens: the inspector and branching work on it


@pytest.mark.anyio
async def test_edited_b_knobs_go_to_reply_b_and_the_arrows_keep_a(make_app, paths):
    save_sampling_defaults(paths, SamplingParams(seed=7))
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _open_dialog(pilot)
        dialog = app.screen
        top_p = dialog.query_one("#ab-knob-top_p", Input)
        top_p.value = "2"
        await pilot.pause()
        await pilot.press("ctrl+s")  # refused: the reason is shown, nothing is sent
        await pilot.pause()
        assert app.screen is dialog and not app.engine.jobs
        assert "top_p must be in (0, 1]" in str(dialog.query_one("#ab-error").render())
        top_p.value = "0.95"
        dialog.query_one("#ab-knob-temperature", Input).value = "0"
        dialog.query_one("#ab-knob-seed", Input).value = "42"
        await pilot.pause()
        assert dialog.query_one("#ab-label-temperature").has_class("-differs")
        assert not dialog.query_one("#ab-label-top_p").has_class("-differs")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and app.screen.finished)
        await pilot.pause()
        a_knobs, b_knobs = (j.sampling for j in app.engine.jobs)
        assert a_knobs == SamplingParams(seed=7) and b_knobs == SamplingParams(temperature=0.0, seed=42)
        a, b = _columns(app)
        assert a.border_title == "A · temperature 0.7 · seed 7" and b.border_title == "B · temperature 0.0 · seed 42"
        await pilot.press("right", "left", "enter")  # the arrows choose, Enter keeps the chosen: A
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await pilot.pause()
        chat = app.screen.chat
        assert chat.messages[1].content == DEFAULT_REPLIES[0] and chat.siblings(1) == (0, 2)
        assert chat.messages[1].branches[0][0].sampling == SamplingParams(temperature=0.0, seed=42).to_dict()
        assert _roles(app) == ["You", "Assistant  ‹ 1/2 ›"]


@pytest.mark.anyio
async def test_esc_cancels_both_and_keeps_the_message(make_app):
    app = make_app(Script(tokens_per_s=3000, pause_at={0: 3}))
    async with app.run_test(size=(120, 36)) as pilot:
        await _open_dialog(pilot)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.engine.jobs and len(app.engine.jobs[0].emitted) == 3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        await wait_for(pilot, lambda: app.engine.jobs[0].done_reason == "cancelled")
        await pilot.pause(0.2)
        assert len(app.engine.jobs) == 1  # B never started
        chat = app.screen.chat
        assert [(m.role, m.content) for m in chat.messages] == [("user", "hello")]
        assert [m.content for m in Chat.from_json(app.store.path_of(chat.id).read_text()).messages] == ["hello"]
        assert _roles(app) == ["You"] and app.screen.query_one(Composer).text == ""
        # the knobs were random: each side drew a seed of its own, B's the next one
        assert isinstance(app.engine.jobs[0].sampling.seed, int)
        await pilot.press("f9")  # the composer is empty: A/B answers the unanswered message
        await wait_for(pilot, lambda: isinstance(app.screen, ABKnobsScreen))
        b_seed = int(app.screen.query_one("#ab-knob-seed", Input).value)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and app.screen.finished)
        assert [j.messages for j in app.engine.jobs[1:]] == [USER, USER]
        assert app.engine.jobs[2].sampling.seed == b_seed == app.engine.jobs[1].sampling.seed + 1
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert [m.role for m in app.screen.chat.messages] == ["user", "assistant"]


@pytest.mark.anyio
async def test_a_saved_ab_chat_reopens_with_both_replies(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _ab_run(pilot)
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        chat_id = app.screen.chat.id
    again = make_app(FAST, resume=True)
    async with again.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        chat = again.screen.chat
        assert chat.id == chat_id and chat.siblings(1) == (1, 2)
        assert _roles(again) == ["You", "Assistant  ‹ 2/2 ›"]
        transcript = again.screen.query_one(Transcript)
        assert transcript.replies[-1].text == DEFAULT_REPLIES[1]
        transcript.focus()
        await pilot.press("]")  # round to A
        await pilot.pause()
        assert transcript.replies[-1].text == DEFAULT_REPLIES[0] and _roles(again)[1] == "Assistant  ‹ 1/2 ›"


@pytest.mark.anyio
async def test_f9_needs_a_message_and_a_remote_engine_shows_no_logprob(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f9")  # nothing typed, nothing to answer
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen) and not app.engine.jobs
        assert any("type a message first" in n.message for n in app._notifications)
        await pilot.press("f1")  # the help lists the A/B keys
        await pilot.pause()
        rows = app.screen.rows
        assert ("chat", "f9", "A/B send: two replies side by side") in rows and ("A/B (F9)", "a", "Keep A") in rows
        assert ("A/B (F9)", "escape", "Cancel A/B") in rows
        await pilot.press("escape")
        await pilot.pause()
        app.screen.info = replace(app.screen.info, backend="remote")  # its tokens carry no logprob
        await _ab_run(pilot)
        assert all("mean logprob n/a (server)" in _numbers(c) for c in _columns(app))


def test_ab_compare(snap_compare, make_app, paths):
    """Two finished scripted replies side by side: the seed that sets each apart, tok/s, mean logprob."""
    save_sampling_defaults(paths, SamplingParams(seed=7))

    async def run_before(pilot):
        await _ab_run(pilot, "Say hello, then list three things.")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(FAST), terminal_size=(120, 36), run_before=run_before)
