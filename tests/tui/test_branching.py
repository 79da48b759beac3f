"""Branching a reply from a token (issue 18, item 3), in the UI: from the token inspector, pick
another candidate (1-9, 0) or re-sample (r) at the cursor token; [ and ] move between the
branches where the chat forks, marked ‹ n/m › in the message's header. On the scripted engine
(which honours reply_prefix), and once on the real CPU engine with the tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tui_helpers import hold_still, send, wait_for, wait_ready

from memra_engine.sampling import SamplingParams
from memra_tui.chats import Chat, ChatMessage
from memra_tui.scripted_engine import DEFAULT_REPLIES, Script, split_tokens
from memra_tui.settings import save_sampling_defaults
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.transcript import Transcript

FAST = Script(tokens_per_s=3000)


def _transcript(app) -> Transcript:
    return app.screen.query_one(Transcript)


def _roles(app) -> list[str]:
    return [str(v.query_one(".role").render()) for v in _transcript(app).message_views]


async def _inspect(pilot) -> None:
    await pilot.press("f7")
    await wait_for(pilot, lambda: pilot.app.screen.query("#token-inspector"))
    await pilot.pause()


async def _reply_then_cursor_at(pilot, at: int) -> None:
    """A reply with candidates (the inspector open before it), the cursor on its token `at`."""
    await wait_ready(pilot)
    await _inspect(pilot)
    await send(pilot, "hello")
    await pilot.press("f7", "home", *["right"] * at)
    await pilot.pause()


async def _wait_reply(pilot, n_jobs: int) -> None:
    await wait_for(pilot, lambda: len(pilot.app.engine.jobs) == n_jobs and not pilot.app.screen.streaming)
    await pilot.pause()


@pytest.mark.anyio
async def test_picking_a_candidate_forks_the_reply_there(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _reply_then_cursor_at(pilot, 3)
        view = _transcript(app).cursor_view
        old, at = app.screen.chat.messages[1].content, view.cursor
        token = view.tokens[at]
        pick = token.candidates.model[1]
        head = "".join(t.text for t in view.tokens[:at])
        await pilot.press("2")  # the model's second candidate
        await _wait_reply(pilot, 2)
        job = app.engine.jobs[1]
        assert list(job.reply_prefix) == [t.id for t in view.tokens[:at]] + [pick.id]
        assert job.messages == [{"role": "user", "content": "hello"}]  # not the branch's own text
        rest = "".join(split_tokens(DEFAULT_REPLIES[1])[at + 1:])
        chat = app.screen.chat
        assert chat.messages[1].content == head + pick.text + rest and rest
        assert chat.siblings(1) == (1, 2) and chat.messages[1].branches[0][0].content == old
        reply = _transcript(app).replies[-1]
        assert reply.text == chat.messages[1].content and "Assistant  ‹ 2/2 ›" in _roles(app)
        assert [t.id for t in reply.tokens[:at + 1]] == list(job.reply_prefix)  # the branch can fork again
        saved = Chat.from_json(app.store.path_of(chat.id).read_text())
        assert saved == chat and [b[0].content for b in saved.messages[1].branches] == [old]


@pytest.mark.anyio
async def test_resample_keeps_the_tokens_before_the_cursor(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _reply_then_cursor_at(pilot, 4)
        view = _transcript(app).cursor_view
        at = view.cursor
        head = "".join(t.text for t in view.tokens[:at])
        await pilot.press("r")
        await _wait_reply(pilot, 2)
        assert list(app.engine.jobs[1].reply_prefix) == [t.id for t in view.tokens[:at]]
        reply = app.screen.chat.messages[1]
        assert reply.content == head + "".join(split_tokens(DEFAULT_REPLIES[1])[at:])
        assert reply.status == "done" and app.screen.chat.siblings(1) == (1, 2)
        await pilot.press("ctrl+r")  # where branches fork, a new reply is one more branch
        await _wait_reply(pilot, 3)
        chat = app.screen.chat
        assert chat.siblings(1) == (2, 3) and chat.messages[1].content == DEFAULT_REPLIES[2]
        assert [b[0].content for b in chat.messages[1].branches] == [DEFAULT_REPLIES[0], reply.content]


@pytest.mark.anyio
async def test_brackets_move_between_the_branches(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _reply_then_cursor_at(pilot, 2)
        await send(pilot, "more")  # a turn after the reply: it stays on the old branch
        await pilot.press("f7", "up", "home", "right")
        await pilot.press("r")
        await _wait_reply(pilot, 3)
        await pilot.press("2")  # a third branch, forked from the second
        await _wait_reply(pilot, 4)
        chat, transcript = app.screen.chat, _transcript(app)
        third = chat.messages[1].content
        assert chat.siblings(1) == (2, 3) and len(chat.messages) == 2
        assert app.focused is transcript
        await pilot.press("[", "[")
        await pilot.pause()
        assert chat.siblings(1) == (0, 3) and [m.content for m in chat.messages][2:] == ["more", DEFAULT_REPLIES[1]]
        assert _roles(app) == ["You", "Assistant  ‹ 1/3 ›", "You", "Assistant"]
        assert [v.text for v in transcript.message_views] == [m.content for m in chat.messages]
        assert transcript.cursor_view is transcript.replies[0]  # the cursor stays at the fork
        await pilot.press("[")  # round to the last
        await pilot.pause()
        assert chat.siblings(1) == (2, 3) and transcript.replies[0].text == third
        assert "Assistant  ‹ 3/3 ›" in _roles(app)
        saved = json.loads(app.store.path_of(chat.id).read_text())
        assert saved["messages"][1]["branch"] == 2 and len(saved["messages"][1]["branches"]) == 2
        await pilot.press("]")
        await pilot.pause()
        assert chat.siblings(1) == (0, 3) and len(chat.messages) == 4


@pytest.mark.anyio
async def test_a_branch_cut_short_is_saved_in_place_of_the_fork(make_app):
    """A kill mid-branch (the checkpoint, then abandon_reply): the file has the branch's text so
    far where the fork is, the old reply among its branches, not a reply after it."""
    app = make_app(Script(tokens_per_s=3000, pause_at={1: 2}))
    async with app.run_test(size=(120, 36)) as pilot:
        await _reply_then_cursor_at(pilot, 2)
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app.engine.jobs) == 2 and len(app.engine.jobs[1].emitted) == 2)
        job = app.engine.jobs[1]
        await wait_for(pilot, lambda: "interrupted" in app.store.path_of(app.screen.chat.id).read_text(), timeout=3)
        saved = Chat.from_json(app.store.path_of(app.screen.chat.id).read_text())
        head = "".join(split_tokens(DEFAULT_REPLIES[0])[:2])
        assert len(saved.messages) == 2 and saved.siblings(1) == (1, 2) and saved.messages[1].status == "interrupted"
        assert saved.messages[1].content == head + job.emitted_text
        assert saved.messages[1].branches[0][0].content == DEFAULT_REPLIES[0]
        app.screen.abandon_reply("interrupted")
        chat = app.screen.chat
        assert len(chat.messages) == 2 and chat.siblings(1) == (1, 2) and chat.messages[1].status == "interrupted"
        assert chat.messages[1].content == head + job.emitted_text


def _branched_chat(app) -> Chat:
    chat = app.store.new_chat("m.gguf", {})
    chat.title = "a branched chat"
    chat.messages = [ChatMessage("user", "Name a colour.", created=1.0),
                     ChatMessage("assistant", "Blue, like the sea.", created=2.0)]
    chat.fork(1, [ChatMessage("assistant", "Blue, like the sky at noon.", created=3.0),
                  ChatMessage("user", "And another?", created=4.0), ChatMessage("assistant", "Green.", created=5.0)])
    chat.fork(1, [ChatMessage("assistant", "Blue, or red.", created=6.0)])
    chat.switch(1, 1)
    app.store.save(chat)
    return chat


@pytest.mark.anyio
async def test_a_resumed_chat_shows_its_branches_and_switches(make_app):
    app = make_app(FAST, resume=True)
    chat = _branched_chat(app)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        assert _roles(app) == ["You", "Assistant  ‹ 2/3 ›", "You", "Assistant"]
        transcript = _transcript(app)
        transcript.focus()  # no token cursor: [ ] act on the last fork
        await pilot.press("]")
        await pilot.pause()
        assert [v.text for v in transcript.message_views] == ["Name a colour.", "Blue, or red."]
        await pilot.press("f7", "r")  # a reply from an earlier session has no tokens
        await pilot.pause()
        assert len(app.engine.jobs) == 0
        assert Chat.from_json(app.store.path_of(chat.id).read_text()).siblings(1) == (2, 3)
        md = app.store.export_markdown(app.screen.chat).read_text()
        assert "Blue, or red." in md and "sea" not in md and "(branch 3 of 3)" in md


@pytest.mark.anyio
async def test_a_remote_engine_says_branching_needs_the_local_one(make_app):
    app = make_app(FAST)
    async with app.run_test(size=(120, 36)) as pilot:
        await _reply_then_cursor_at(pilot, 1)
        app.screen.info = type(app.screen.info)(**{**app.screen.info.__dict__, "backend": "remote"})
        await pilot.press("2")
        await pilot.pause()
        assert len(app.engine.jobs) == 1 and app.screen.chat.siblings(1) == (0, 1)
        assert any("branching needs the local engine" in n.message for n in app._notifications)


def test_a_branched_chat(snap_compare, make_app):
    """The first reply forked at its fourth token with the model's second candidate: the header
    says ‹ 2/2 ›, the cursor stays on the picked token, the inspector shows what it replaced."""
    async def run_before(pilot):
        await _reply_then_cursor_at(pilot, 3)
        await pilot.press("2")
        await _wait_reply(pilot, 2)
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(FAST), terminal_size=(120, 36), run_before=run_before)


# -- the real CPU engine ----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_the_real_engine_branches_from_a_token(tmp_path, paths):
    from memra_engine.generate import Engine
    from memra_engine.model.synthetic import write_synthetic_gguf
    from memra_tui.app import MemraApp
    from tui_helpers import FixedClock

    model = write_synthetic_gguf(tmp_path / "tiny-llama.gguf", preset="tiny-llama", seed=7)
    knobs = SamplingParams(temperature=0.0, max_tokens=8)
    save_sampling_defaults(paths, knobs)
    app = MemraApp(str(model), "cpu", 256, False, paths=paths, load_engine=Engine.load, clock=FixedClock())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await _inspect(pilot)
        app.screen.query_one(Composer).text = "Hello there"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.screen.chat.messages) == 2 and not app.screen.streaming, timeout=60)
        await pilot.press("f7", "left", "left", "left")
        await pilot.pause()
        view = _transcript(app).cursor_view
        at = view.cursor
        pick = view.tokens[at].candidates.model[1]
        prefix = [t.id for t in view.tokens[:at]] + [pick.id]
        head = "".join(t.text for t in view.tokens[:at]) + pick.text
        await pilot.press("2")
        await wait_for(pilot, lambda: app.screen.chat.siblings(1) == (1, 2) and not app.screen.streaming, timeout=60)
        await pilot.pause()
        branch = app.screen.chat.messages[1].content
        expected = app.engine.chat([{"role": "user", "content": "Hello there"}], knobs, reply_prefix=prefix).collect()
        assert branch == head + expected.text and expected.text


@pytest.mark.anyio
async def test_a_chat_file_from_before_branches_opens_and_goes_on(make_app):
    """A file the previous version wrote (tests/data/chats: format 1 before the chat tree, with an
    interrupted reply) opens as it was; a new turn saves it in the tree format without losing a
    message or a field."""
    raw = (Path(__file__).parents[1] / "data" / "chats" / "pre-branches-a76d5ea.json").read_text()
    old = json.loads(raw)["messages"]
    app = make_app(FAST, resume=True)
    path = app.store.path_of("20261130-101500")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(raw)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        assert app.screen.chat.id == "20261130-101500" and app.screen.chat.system_prompt == "You are terse."
        assert [v.text for v in _transcript(app).message_views] == [m["content"] for m in old]
        await send(pilot, "And one about the moon.")
        await _wait_reply(pilot, 1)
        assert app.engine.jobs[0].messages[-1]["content"] == "And one about the moon."
    saved = Chat.from_json(path.read_text())
    assert [(m.role, m.content, m.status, m.created, m.sampling) for m in saved.messages[:4]] == \
        [(m["role"], m["content"], m["status"], m["created"], m["sampling"]) for m in old]
    assert [m.content for m in saved.messages[4:]] == ["And one about the moon.", DEFAULT_REPLIES[0]]
    assert all(not m.branches for m in saved.messages)
