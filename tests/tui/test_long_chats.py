"""Long chats (issue 17 §4): when a conversation outgrows the context the UI says so and offers to
drop the oldest turns from what the model sees; never silently, and nothing is lost: the dropped
messages stay in the chat file and on screen, marked."""
from __future__ import annotations

import pytest
from tui_helpers import FixedClock, send, wait_for, wait_ready

from memra_engine.generate import Engine
from memra_engine.model.synthetic import write_synthetic_gguf
from memra_engine.sampling import SamplingParams
from memra_tui.app import MemraApp
from memra_tui.chats import Chat, ChatMessage, ChatStore
from memra_tui.context_fit import fit_to_context, reply_room
from memra_tui.screens.chat import ChatScreen
from memra_tui.screens.text_prompt import ConfirmScreen
from memra_tui.scripted_engine import Script, ScriptedEngine
from memra_tui.settings import save_sampling_defaults
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.fit_text import WrappedText
from memra_tui.widgets.message_view import MessageView

pytestmark = pytest.mark.anyio

REPLY = "a b c d e f g h i j"  # 10 scripted tokens
QUESTION = "one two three four five"


def small_context() -> Script:
    return Script(replies=[REPLY], n_ctx=64, tokens_per_s=3000)


async def chat_until_it_overflows(pilot) -> int:
    """Send questions until a reply is refused for a prompt that does not fit; the number sent."""
    app = pilot.app
    for n in range(1, 8):
        await send(pilot, f"{QUESTION} {n}", wait_done=False)
        await wait_for(pilot, lambda: app.engine.jobs[-1].done_reason)
        if app.engine.jobs[-1].done_reason == "error":
            return n
        await wait_for(pilot, lambda: not app.screen.streaming)
    raise AssertionError("the chat never outgrew the context")


async def test_an_outgrown_chat_is_said_and_the_oldest_turns_dropped_only_when_the_user_says_yes(make_app, paths):
    app = make_app(small_context())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        n_sent = await chat_until_it_overflows(pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        question = app.screen.question
        chat = app.screen_stack[-2].chat
        assert chat.context_start == 0 and len(chat.messages) == 2 * n_sent - 1  # nothing dropped yet
        drop = fit_to_context(chat, app.engine.count_tokens, 64, reply_room(64, app.sampling.max_tokens)).start
        assert drop >= 2 and drop % 2 == 0  # whole turns
        assert question.startswith("This chat has outgrown the context: ") and "the model holds 64" in question
        assert f"Drop the oldest {drop} messages" in question and "They stay in the chat and on screen" in question
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and not app.screen.streaming
                       and app.screen.chat.messages[-1].role == "assistant")
        assert chat.context_start == drop and chat.messages[-1].content == REPLY
        sent = app.engine.jobs[-1].messages
        assert sent[0]["content"] == f"{QUESTION} {drop // 2 + 1}" and len(sent) == 2 * n_sent - 1 - drop
        assert any(f"the oldest {drop} messages are no longer sent to the model" in n.message for n in app._notifications)
        views = list(app.screen.query(MessageView))
        assert len(views) == 2 * n_sent
        assert [v.has_class("-dropped") for v in views] == [i < drop for i in range(2 * n_sent)]
        note = app.screen.query_one(".dropped-note", WrappedText)
        assert note.text.startswith(f"▲ the {drop} messages above are kept here but no longer sent to the model")
    saved = Chat.from_json(next(paths.chats_dir.glob("*.json")).read_text())
    assert saved.context_start == drop and len(saved.messages) == 2 * n_sent  # every message kept
    assert saved.messages[0].content == f"{QUESTION} 1"


async def test_saying_no_keeps_every_message_and_says_how_to_go_on(make_app):
    app = make_app(small_context())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        n_sent = await chat_until_it_overflows(pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        assert app.screen.chat.context_start == 0 and len(app.screen.chat.messages) == 2 * n_sent - 1
        assert any("kept every message: the model cannot reply until the chat fits" in n.message
                   for n in app._notifications)
        await pilot.press("ctrl+r")  # tries again: asked again
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))


async def test_a_last_message_too_long_for_the_context_is_said_and_nothing_is_offered(make_app):
    app = make_app(small_context())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "word " * 70, wait_done=False)
        await wait_for(pilot, lambda: any("your last message does not fit the 64-token context" in n.message
                                          for n in app._notifications))
        assert isinstance(app.screen, ChatScreen)


async def test_a_resumed_chat_shows_what_was_dropped_and_sends_the_rest(make_app, paths):
    store = ChatStore(paths.chats_dir, paths.exports_dir)
    chat = store.new_chat("m.gguf", {})
    chat.messages = [ChatMessage("user", "old question"), ChatMessage("assistant", "old answer"),
                     ChatMessage("user", "new question"), ChatMessage("assistant", "new answer")]
    chat.context_start = 2
    store.save(chat)
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.query(".dropped-note")
        await send(pilot, "and now?")
        assert [m["content"] for m in app.engine.jobs[-1].messages] == ["new question", "new answer", "and now?"]
        assert "The 2 messages above were dropped" in app.screen.chat.to_markdown()


def test_fit_drops_whole_turns_keeps_the_system_prompt_and_the_last_message():
    engine = ScriptedEngine(Script(n_ctx=64))
    chat = Chat(id="x", system_prompt="be brief", messages=[
        ChatMessage("user", "w " * 10), ChatMessage("assistant", "w " * 10),
        ChatMessage("user", "w " * 10), ChatMessage("assistant", "w " * 10), ChatMessage("user", "w " * 10)])
    fit = fit_to_context(chat, engine.count_tokens, 64, reply_room(64, 512))
    assert reply_room(64, 512) == 16 and reply_room(4096, 200) == 200
    assert fit.start == 2 and fit.tokens_after + 16 <= 64 < fit.tokens + 16
    kept = chat.engine_messages(fit.start)
    assert kept[0] == {"role": "system", "content": "be brief"} and len(kept) == 4
    chat.messages[-1].content = "w " * 60
    assert fit_to_context(chat, engine.count_tokens, 64, 16).start is None
    engine.close()


async def test_with_the_real_engine_the_dropped_chat_fits_and_the_reply_comes(tmp_path, paths):
    model = write_synthetic_gguf(tmp_path / "tiny-llama.gguf", preset="tiny-llama", seed=7)  # a 256-token context
    save_sampling_defaults(paths, SamplingParams(seed=11, max_tokens=8))
    app = MemraApp(str(model), "cpu", 256, True, paths=paths, load_engine=Engine.load, clock=FixedClock())
    chat = app.store.new_chat(str(model), {})
    for n in range(6):
        chat.messages += [ChatMessage("user", f"question {n}: " + "tell me more " * 4),
                          ChatMessage("assistant", f"answer {n}: " + "here is more " * 4)]
    app.store.save(chat)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        app.screen.query_one(Composer).text = "and the last one?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=30)
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and not app.screen.streaming
                       and app.screen.chat.messages[-1].role == "assistant", timeout=60)
        reply = app.screen.chat.messages[-1]
        assert reply.status in ("done", "length", "context") and app.screen.chat.context_start > 0
        assert app.engine.stats().n_prompt_tokens + 8 <= 256
