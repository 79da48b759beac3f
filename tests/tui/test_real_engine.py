"""End to end with the real CPU engine on a tiny synthetic model: send, stream, done, saved."""
from __future__ import annotations

import pytest
from tui_helpers import FixedClock, wait_for, wait_ready

from memra_engine.generate import Engine
from memra_engine.model.synthetic import write_synthetic_gguf
from memra_engine.sampling import SamplingParams
from memra_tui.app import MemraApp
from memra_tui.settings import save_sampling_defaults
from memra_tui.widgets.composer import Composer
from memra_tui.widgets.engine_panes import EnginePanes
from memra_tui.widgets.transcript import Transcript

pytestmark = pytest.mark.anyio


async def test_chat_with_the_real_cpu_engine(tmp_path, paths):
    model = write_synthetic_gguf(tmp_path / "tiny-llama.gguf", preset="tiny-llama", seed=7)
    save_sampling_defaults(paths, SamplingParams(seed=11, max_tokens=24))
    app = MemraApp(str(model), "cpu", 256, False, paths=paths, load_engine=Engine.load, clock=FixedClock())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.engine.info.backend == "cpu" and app.engine.info.arch == "llama"
        composer = app.screen.query_one(Composer)
        composer.text = "Hello there"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.screen.chat.messages) == 2 and not app.screen.streaming, timeout=60)
        await pilot.pause(0.1)
        user, reply = app.screen.query_one(Transcript).message_views
        saved = app.screen.chat.messages
        assert user.text == "Hello there" and saved[0].content == "Hello there"
        assert saved[1].role == "assistant" and saved[1].status in ("done", "length")
        assert reply.text == saved[1].content and reply.markdown_source == reply.text and reply.text.strip()
        stats = app.screen.query_one(EnginePanes).stats
        assert stats.decode_tok_s > 0 and 0 < stats.n_generated <= 24 and stats.vram.process_rss > 0
        engine, chat_id = app.engine, app.screen.chat.id
    assert not engine._thread.is_alive()
    on_disk = app.store.load(chat_id)
    assert [m.content for m in on_disk.messages] == [m.content for m in saved]
    assert on_disk.model_path == str(model) and on_disk.sampling["seed"] == 11


async def test_resume_counts_the_conversation_with_the_model_s_tokenizer(tmp_path, paths):
    """Engine.count_tokens builds the conversation as a reply builds its prompt (checked against
    the engine's own n_prompt_tokens for the next reply, whose prompt adds the new turn)."""
    from memra_tui.chats import ChatMessage
    from memra_tui.widgets.context_usage import ContextPane

    model = write_synthetic_gguf(tmp_path / "tiny-llama.gguf", preset="tiny-llama", seed=7)
    save_sampling_defaults(paths, SamplingParams(seed=11, max_tokens=4))
    app = MemraApp(str(model), "cpu", 256, False, paths=paths, load_engine=Engine.load, clock=FixedClock())
    chat = app.store.new_chat(str(model), {})
    chat.messages = [ChatMessage("user", "Hello there"), ChatMessage("assistant", "Hi! How can I help?")]
    app.store.save(chat)
    app.resume = True
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        pane = app.screen.query_one(ContextPane)
        await wait_for(pilot, lambda: pane.used > 0, timeout=30)
        assert pane.used == app.engine.count_tokens(app.screen.chat.engine_messages()) > 0
        pane_before = pane.used
        messages = app.screen.chat.engine_messages() + [{"role": "user", "content": "More"}]
        app.screen.query_one(Composer).text = "More"
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.screen.chat.messages) == 4 and not app.screen.streaming, timeout=60)
        # the reply's prompt is the resumed conversation, the new turn and the generation prompt
        assert app.engine.stats().n_prompt_tokens > app.engine.count_tokens(messages) > pane_before
