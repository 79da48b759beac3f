"""The token inspector (F7) and the low-probability tint (F8), on the scripted engine (snapshots and
keys) and once on the real CPU engine with the tiny model (candidates from the engine)."""
from __future__ import annotations

import json

import pytest
from tui_helpers import FixedClock, hold_still, send, wait_for, wait_ready

from memra_engine.sampling import SamplingParams
from memra_tui.chats import ChatMessage
from memra_tui.scripted_engine import Script
from memra_tui.settings import save_sampling_defaults
from memra_tui.tokens import INSPECTOR_TOP_LOGPROBS
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.message_view import MessageView, TokenChunk
from memra_tui.widgets.token_inspector import CandidateBars, TokenInspector
from memra_tui.widgets.transcript import Transcript

FAST = Script(tokens_per_s=3000)


def _transcript(app) -> Transcript:
    return app.screen.query_one(Transcript)


def _inspector_text(app) -> str:
    inspector = app.screen.query_one(TokenInspector)
    return "\n".join(str(w.render()) for w in inspector.query("Static, CandidateBars") if w.display)


async def _open_inspector(pilot) -> None:
    await pilot.press("f7")
    await wait_for(pilot, lambda: pilot.app.screen.query("#token-inspector"))
    await pilot.pause()


# -- snapshots --------------------------------------------------------------------------------------
def test_inspector_shows_the_candidates_and_the_stages(snap_compare, make_app, paths):
    """A JSON grammar and top-k 3: the token ' me' (drawn second-likeliest) with its candidates
    before and after the chain, removed by the grammar, top-k and top-p."""
    from memra_engine.grammar import Grammar

    save_sampling_defaults(paths, SamplingParams(top_k=3))

    async def run_before(pilot):
        await wait_ready(pilot)
        await _open_inspector(pilot)  # open before sending: the reply comes with candidates
        await send(pilot, "hello")
        await pilot.press("f7", "left", "left")  # the cursor on the last token, then two back
        await pilot.pause(0.2)
        await hold_still(pilot)

    app = make_app(FAST, grammar=Grammar.json())
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_tint_marks_the_unlikely_draws(snap_compare, make_app):
    """F8 with the inspector never opened: the tint reads the logprob alone."""
    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, "hello")
        await send(pilot, "list three things")
        await pilot.press("f8")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(FAST), terminal_size=(100, 32), run_before=run_before)


# -- keys and mouse ---------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_keys_move_the_cursor_and_esc_leaves(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await send(pilot, "list three things")
        first, second = _transcript(app).replies
        await _open_inspector(pilot)
        transcript = _transcript(app)
        last = len(second.tokens) - 1
        assert app.screen.inspecting and app.focused is transcript
        assert transcript.cursor_view is second and second.cursor == last and second.selected
        assert app.screen.query_one("#sidebar").active == "tokens-tab"
        assert "token " + str(last + 1) + " of " in _inspector_text(app)
        await pilot.press("left", "left")
        assert second.cursor == last - 2
        await pilot.press("right")
        assert second.cursor == last - 1
        await pilot.press("up")  # the previous reply, at its last token
        assert transcript.cursor_view is first and first.cursor == len(first.tokens) - 1 and not second.selected
        await pilot.press("right")  # past its end: on to the next reply's first token
        assert transcript.cursor_view is second and second.cursor == 0
        await pilot.press("left")  # and back
        assert transcript.cursor_view is first and first.cursor == len(first.tokens) - 1
        await pilot.press("down", "end", "home")
        assert transcript.cursor_view is second and second.cursor == 0
        await pilot.pause()
        assert second.query(TokenChunk) and not second.query("MarkdownChunk")  # drawn as tokens
        assert not first.query(TokenChunk)  # the reply the cursor left is markdown again
        await pilot.press("escape")
        await pilot.pause()
        assert not app.screen.inspecting and transcript.cursor_view is None and not second.selected
        assert not app.screen.query("#tokens-tab") and isinstance(app.focused, Composer)
        await pilot.pause()
        assert second.query("MarkdownChunk") and not second.query(TokenChunk)
        assert second.shown_source == second.text


@pytest.mark.anyio
async def test_a_click_puts_the_cursor_on_the_token(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        view = _transcript(app).replies[-1]
        await pilot.press("f8")  # the tint draws the reply as tokens: a click names one
        await wait_for(pilot, lambda: view.query(TokenChunk))
        await pilot.pause()
        chunk = view.query(TokenChunk).first()
        assert await pilot.click(chunk, offset=(0, 0))
        await wait_for(pilot, lambda: app.screen.query("#token-inspector"))
        await pilot.pause()
        assert app.screen.inspecting and view.cursor == 0  # 'Hello!' opened the inspector
        assert await pilot.click(chunk, offset=(8, 0))  # 'Hello! I am': the ' I' (cells 6-7) and ' am'
        await pilot.pause()
        assert view.tokens[view.cursor].text == " am"
        assert "' am'" in _inspector_text(app)


@pytest.mark.anyio
async def test_top_logprobs_follows_the_inspector(make_app):
    """On for the next reply and for the one in flight while the inspector is open; off when it closes."""
    app = make_app(Script(tokens_per_s=3000, pause_at={1: 3}))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await _open_inspector(pilot)
        assert "No reply yet" in _inspector_text(app)
        await send(pilot, "hello")
        job = app.engine.jobs[0]
        assert job.sampling.top_logprobs == INSPECTOR_TOP_LOGPROBS
        reply = _transcript(app).replies[-1]
        assert all(t.candidates is not None and len(t.candidates.model) == INSPECTOR_TOP_LOGPROBS
                   for t in reply.tokens)
        await pilot.press("escape")  # Esc in the composer, nothing streaming: closes the inspector
        await pilot.pause()
        assert not app.screen.inspecting
        await send(pilot, "list three things", wait_done=False)
        job = app.engine.jobs[1]
        assert job.sampling.top_logprobs == 0
        await wait_for(pilot, lambda: len(job.emitted) == 3)
        await _open_inspector(pilot)  # mid-reply: the job takes it at its next token
        assert job.sampling_updates[-1].top_logprobs == INSPECTOR_TOP_LOGPROBS
        reply = _transcript(app).replies[-1]
        await wait_for(pilot, lambda: reply.cursor is not None)  # the cursor waits for the first tokens
        assert "No candidates: this token came before the inspector was open." in _inspector_text(app)
        await pilot.press("escape")  # closed mid-reply: off again
        await pilot.pause()
        assert not app.screen.inspecting and job.sampling_updates[-1].top_logprobs == 0
        await _open_inspector(pilot)
        assert job.sampling_updates[-1].top_logprobs == INSPECTOR_TOP_LOGPROBS
        job.release()
        await wait_for(pilot, lambda: not app.screen.streaming)
        await pilot.pause()
        assert [t.candidates is None for t in reply.tokens[:3]] == [True] * 3
        assert all(t.candidates is not None for t in reply.tokens[3:])
        assert app.sampling.top_logprobs == 0  # the knobs as set (and saved) do not have it
        saved = json.loads(app.store.path_of(app.screen.chat.id).read_text())
        for m in saved["messages"]:  # tokens are kept in memory only
            assert not {"tokens", "candidates", "logprob"} & set(m)
            assert m["sampling"] is None or m["sampling"]["top_logprobs"] == 0


@pytest.mark.anyio
async def test_a_reply_from_an_earlier_session_has_no_token_data(make_app, paths):
    app = make_app(FAST, resume=True)
    chat = app.store.new_chat("m.gguf", {})
    chat.messages = [ChatMessage("user", "hi"), ChatMessage("assistant", "Hello from yesterday.")]
    app.store.save(chat)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await _open_inspector(pilot)
        await pilot.pause()
        view = _transcript(app).replies[-1]
        assert _transcript(app).cursor_view is view and view.tokens is None
        assert "No token data for this reply" in _inspector_text(app)
        await pilot.press("f8")
        await pilot.pause()
        assert not view.query(TokenChunk)  # nothing to tint: markdown as it was


# -- the real CPU engine ----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_the_real_engine_reports_candidates(tmp_path, paths):
    from memra_engine.generate import Engine
    from memra_engine.model.synthetic import write_synthetic_gguf
    from memra_tui.app import MemraApp

    model = write_synthetic_gguf(tmp_path / "tiny-llama.gguf", preset="tiny-llama", seed=7)
    save_sampling_defaults(paths, SamplingParams(seed=5, max_tokens=8))
    app = MemraApp(str(model), "cpu", 256, False, paths=paths, load_engine=Engine.load, clock=FixedClock())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await _open_inspector(pilot)
        app.screen.query_one(Composer).text = "Hello there"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.screen.chat.messages) == 2 and not app.screen.streaming, timeout=60)
        await pilot.press("f7")
        await pilot.pause(0.2)
        view = _transcript(app).cursor_view
        token = view.tokens[view.cursor]
        c = token.candidates
        assert c is not None and len(c.model) == len(c.final) == INSPECTOR_TOP_LOGPROBS
        assert token.id in [f.id for f in c.final] and all(f.text for f in c.final[:1])
        bars = app.screen.query_one("#bars-final", CandidateBars)
        assert bars.rows == c.final and bars.drawn == token.id
        assert "▶" in str(bars.render())
        assert view.shown_source == view.text == app.screen.chat.messages[-1].content
