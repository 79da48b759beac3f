"""Out of memory in the UI (issue 17 §4), with a scripted engine that raises the engine's own
error (DeviceOutOfMemory) at load above a context size, or ends a reply with it: one line on
screen, and a smaller context is picked and loaded without restarting the app."""
from __future__ import annotations

import pytest
from textual.widgets import Input
from tui_helpers import send, wait_for, wait_ready

from memra_tui.screens.chat import ChatScreen
from memra_tui.screens.context_size import ContextSizeScreen
from memra_tui.screens.load_error import LoadErrorScreen
from memra_tui.scripted_engine import Script
from memra_tui.widgets.message_view import MessageView

pytestmark = pytest.mark.anyio


async def load_error_shown(pilot) -> LoadErrorScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, LoadErrorScreen) and pilot.app.screen.query("#context-size"))
    await pilot.pause()
    return pilot.app.screen


async def test_out_of_memory_at_load_offers_a_smaller_context_and_loads_with_it(make_app):
    app = make_app(Script(oom_above_ctx=1024))  # the app asks for 4096
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await load_error_shown(pilot)
        error = screen.message  # drawn wrapped at word boundaries (WrappedText)
        assert error.startswith("cannot reserve 512 MiB for the kv region") and error.endswith("smaller model")
        assert "\n" not in error and " ".join(str(screen.query_one("#load-error").render()).split()) == error
        ctx = screen.query_one("#context-size", Input)
        assert ctx.value == "2048" and ctx.has_focus  # half the context that did not fit
        await pilot.press("enter")  # 2048 does not fit either: asked again, with half of that
        await wait_for(pilot, lambda: isinstance(app.screen, LoadErrorScreen)
                       and app.screen.query("#context-size") and app.screen.query_one("#context-size", Input).value == "1024")
        app.screen.query_one("#context-size", Input).value = "abc"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, LoadErrorScreen)
        assert any("a whole number of tokens" in n.message for n in app._notifications)
        app.screen.query_one("#context-size", Input).value = "1000"
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.engine.info.n_ctx == 1000 and app.n_ctx == 1000
        await send(pilot, "hello")
        assert app.screen.chat.messages[-1].status == "done"


async def test_a_load_error_other_than_memory_has_no_context_field(make_app):
    app = make_app(Script(fail_paths={"bad.gguf": "bad.gguf: not a GGUF file (bad magic b'not ')"}), model="bad.gguf")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadErrorScreen) and app.screen.query("#model-path"))
        assert not app.screen.query("#context-size")
        app.screen.query_one("#model-path", Input).value = ""  # empty: the default model
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.engine.info.model_name == "scripted-tiny"


async def test_out_of_memory_in_a_reply_offers_a_smaller_context_and_keeps_the_chat(make_app):
    app = make_app(Script(reply_oom_above_ctx=2048, tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        chat = app.screen.chat
        await send(pilot, "a long question", wait_done=False)
        await wait_for(pilot, lambda: isinstance(app.screen, ContextSizeScreen))
        await pilot.pause()
        note = app.screen.note
        assert note.startswith("Out of memory: scratch region full") and "\n" not in note
        assert app.screen.query_one("#context-size", Input).value == "2048"
        reply = chat.messages[-1]
        assert reply.status == "error" and reply.content and "scratch region full" in reply.error  # kept
        old_engine = app.engine
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.engine is not old_engine and old_engine._closed and app.engine.info.n_ctx == 2048
        assert app.screen.chat.id == chat.id and [m.content for m in app.screen.chat.messages] == \
            [m.content for m in chat.messages]
        views = list(app.screen.query(MessageView))
        assert len(views) == 2 and str(views[1].query_one(".status").render()).startswith("✗ error: scratch region full")
        await send(pilot, "again")
        assert app.screen.chat.messages[-1].status == "done"


async def open_from_the_palette(pilot) -> ContextSizeScreen:
    await pilot.press("ctrl+p")
    await pilot.pause(0.2)
    await pilot.press(*"context size")
    await pilot.pause(0.3)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ContextSizeScreen) and pilot.app.screen.query("#context-size"))
    return pilot.app.screen


async def test_the_palette_command_reloads_with_another_context_or_cancels(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await open_from_the_palette(pilot)
        assert app.screen.query_one("#context-size", Input).value == "4096"
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        engine = app.engine
        await open_from_the_palette(pilot)
        app.screen.query_one("#context-size", Input).value = "8192"
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.engine is not engine and app.engine.info.n_ctx == 8192 and len(app.screen.chat.messages) == 2
