"""Pilot tests of the chat: streaming, stop, regenerate, edit-resend, copy, new chat, quit."""
from __future__ import annotations

import gc
import threading
import time

import pytest

from memra_tui.chats import Chat
from memra_tui.scripted_engine import DEFAULT_REPLIES, Script, split_tokens
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.message_view import MessageView
from memra_tui.widgets.transcript import Transcript

from tui_helpers import send, wait_for, wait_ready

pytestmark = pytest.mark.anyio


def views(app) -> list[MessageView]:
    return app.screen.query_one(Transcript).message_views


async def test_send_streams_the_scripted_reply(make_app):
    app = make_app(Script(tokens_per_s=1000, pause_at={0: 6}))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello", wait_done=False)
        # Mid-stream: the first six tokens are on screen, and the reply is still marked as streaming.
        first_six = "".join(split_tokens(DEFAULT_REPLIES[0])[:6])
        await wait_for(pilot, lambda: len(views(app)) == 2 and views(app)[1].markdown_source == first_six)
        assert app.screen.streaming and "generating" in str(views(app)[1].query_one(".status").render())
        app.engine.jobs[0].release()
        await wait_for(pilot, lambda: not app.screen.streaming)
        await pilot.pause()
        user, reply = views(app)
        assert user.text == "hello"
        assert reply.text == DEFAULT_REPLIES[0]
        assert reply.markdown_source == DEFAULT_REPLIES[0]
        assert app.engine.jobs[0].messages == [{"role": "user", "content": "hello"}]
        assert [m.content for m in app.screen.chat.messages] == ["hello", DEFAULT_REPLIES[0]]
        assert app.screen.chat.messages[1].status == "done"


async def test_escape_stops_and_the_next_message_works(make_app):
    app = make_app(Script(tokens_per_s=2000, pause_at={0: 5}))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello", wait_done=False)
        await wait_for(pilot, lambda: len(app.engine.jobs[0].emitted) == 5)
        await pilot.pause(0.1)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.screen.streaming)
        partial = "".join(split_tokens(DEFAULT_REPLIES[0])[:5])
        assert app.engine.jobs[0].done_reason == "cancelled"
        stopped = app.screen.chat.messages[-1]
        assert (stopped.content, stopped.status) == (partial, "stopped")
        assert "stopped" in str(views(app)[-1].query_one(".status").render())

        await send(pilot, "again")
        assert app.engine.jobs[1].messages == [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": partial},
            {"role": "user", "content": "again"},
        ]
        assert views(app)[-1].text == DEFAULT_REPLIES[1]
        assert app.screen.chat.messages[-1].status == "done"


async def test_regenerate_replaces_the_last_reply(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(app.engine.jobs) == 2 and not app.screen.streaming)
        await pilot.pause()
        assert app.engine.jobs[1].messages == app.engine.jobs[0].messages == [{"role": "user", "content": "hi"}]
        assert [m.content for m in app.screen.chat.messages] == ["hi", DEFAULT_REPLIES[1]]
        assert [v.text for v in views(app)] == ["hi", DEFAULT_REPLIES[1]]


async def test_edit_and_resend_the_last_user_message(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        await pilot.press("ctrl+e")
        composer = app.screen.query_one(Composer)
        assert composer.text == "second"
        composer.clear()
        await send(pilot, "changed")
        assert app.engine.jobs[2].messages == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": DEFAULT_REPLIES[0]},
            {"role": "user", "content": "changed"},
        ]
        await wait_for(pilot, lambda: not app.screen.streaming)
        expected = ["first", DEFAULT_REPLIES[0], "changed", DEFAULT_REPLIES[2]]
        assert [m.content for m in app.screen.chat.messages] == expected
        assert [v.text for v in views(app)] == expected
        # the edited message and its reply stay, a sibling branch at the edited place
        chat = app.screen.chat
        assert chat.siblings(2) == (1, 2)
        assert [m.content for m in chat.messages[2].branches[0]] == ["second", DEFAULT_REPLIES[1]]
        assert Chat.from_json(app.store.path_of(chat.id).read_text()).siblings(2) == (1, 2)
        app.screen.query_one(Transcript).focus()
        await pilot.press("[")
        await pilot.pause()
        assert [v.text for v in views(app)] == ["first", DEFAULT_REPLIES[0], "second", DEFAULT_REPLIES[1]]


async def test_copy_reply_and_code_block(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "code please")
        await pilot.press("ctrl+y")
        assert app.clipboard == DEFAULT_REPLIES[0]
        await pilot.press("ctrl+k")
        assert app.clipboard == "def add(a: int, b: int) -> int:\n    return a + b\n"


async def test_system_prompt_goes_first(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await pilot.press(*"Be brief.", "ctrl+s")
        await pilot.pause()
        await send(pilot, "hi")
        assert app.engine.jobs[0].messages[0] == {"role": "system", "content": "Be brief."}
        assert app.screen.chat.system_prompt == "Be brief."


async def test_newline_key_does_not_send(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.screen.query_one(Composer).text == "a\nb"
        assert app.engine.jobs == []
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.engine.jobs) == 1 and not app.screen.streaming)
        assert app.engine.jobs[0].messages[-1]["content"] == "a\nb"


async def test_new_chat_keeps_the_old_one_saved(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "old chat")
        old_id = app.screen.chat.id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.screen.chat.id != old_id and app.screen.chat.messages == []
        assert views(app) == []
        await send(pilot, "new chat")
    chats, problems = app.store.list()
    assert problems == []
    assert sorted(c.messages[0].content for c in chats) == ["new chat", "old chat"]


async def test_engine_error_is_one_line_on_screen(make_app):
    app = make_app(Script(tokens_per_s=3000, n_ctx=8))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "this prompt is far too long for eight tokens of context")
        status = str(views(app)[-1].query_one(".status").render())
        assert "does not fit in n_ctx=8" in status
        assert app.screen.chat.messages[-1].role == "user"  # an empty failed reply is not saved


async def test_quit_mid_reply_stops_the_engine_thread_within_a_second(make_app, paths):
    app = make_app(Script(tokens_per_s=50, n_tokens=200))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        engine = app.engine
        await send(pilot, "hello", wait_done=False)
        await wait_for(pilot, lambda: len(engine.jobs[0].emitted) >= 3)
        # The second is the app's: late in the suite, pytest's own heap makes a full collection
        # long enough to eat it (CI once took 1.007 s here), so the heap so far is frozen first.
        gc.collect()
        gc.freeze()
        start = time.perf_counter()
        await pilot.press("ctrl+q")
    try:
        deadline = start + 1.0
        while engine.thread.is_alive() and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert not engine.thread.is_alive()
        workers = [t for t in threading.enumerate() if t is not threading.main_thread() and "_stream_job" in t.name]
        for t in workers:
            t.join(max(0.0, deadline - time.perf_counter()))
        assert time.perf_counter() - start < 1.0
    finally:
        gc.unfreeze()
    assert engine.jobs[0].done_reason == "cancelled"
    chats, _ = app.store.list()
    reply = chats[0].messages[-1]
    assert reply.role == "assistant" and reply.status == "stopped"
    assert reply.content == engine.jobs[0].emitted_text[: len(reply.content)] and reply.content


async def test_help_lists_every_key(make_app):
    from memra_tui.app import MemraApp
    from memra_tui.screens.chat import ChatScreen
    from memra_tui.screens.chat_list import ChatListScreen
    from memra_tui.screens.help import HelpScreen

    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(100, 50)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        listed = {(key, does) for _, key, does in app.screen.rows}
        for bindings in (MemraApp.BINDINGS, ChatScreen.BINDINGS, Composer.BINDINGS, ChatListScreen.BINDINGS):
            for b in bindings:
                for key in b.key.split(","):
                    assert (key, b.description) in listed, (key, b.description)
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen)


async def test_command_palette_runs_the_main_actions(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Regenerate")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.engine.jobs) == 2 and not app.screen.streaming)
        assert [m.content for m in app.screen.chat.messages] == ["hi", DEFAULT_REPLIES[1]]


async def test_toggle_panes_and_narrow_layout(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        sidebar = app.screen.query_one("#sidebar")
        assert not sidebar.display  # narrow: the transcript gets the width
        await pilot.press("f2")
        await pilot.pause()
        assert sidebar.display and sidebar.size.width > 0
        assert app.screen.query_one(Composer).size.width >= 30
        await pilot.resize_terminal(140, 40)
        await pilot.pause()
        assert sidebar.display
        await pilot.press("f2")
        await pilot.pause()
        assert not sidebar.display


async def test_a_long_paste_is_wrapped_once_not_again_when_the_transcript_overflows(make_app, monkeypatch):
    """Wrapping a 40,000-character paste costs the UI thread ~45 ms, and on the GPU the prefill
    (Python kernel launches) waits for the GIL meanwhile: the transcript keeps its scrollbar's
    gutter, so the message keeps its width when the scrollbar appears and is wrapped once a turn."""
    from memra_tui.widgets.message_view import MarkdownChunk

    wraps = []  # the long chunk's renders (a render is a wrap: CachedLines calls it on a cache miss)
    renderable = MarkdownChunk._renderable

    def counted(self):
        if len(self.source) > 10_000:
            wraps.append(len(self.source))
        return renderable(self)

    monkeypatch.setattr(MarkdownChunk, "_renderable", counted)
    paste = "The harbour town woke slowly, and the baker opened his shutters. " * 600
    app = make_app(Script(tokens_per_s=2000, n_ctx=65536))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, f"Summarise this.\n\n{paste}")
        await pilot.pause()
        sent = app.screen.chat.messages[0].content
        assert paste.strip() in sent and app.screen.chat.messages[1].status == "done"
        assert len(wraps) == 1 and wraps[0] >= len(paste.strip()), f"the paste was wrapped {len(wraps)} times"
