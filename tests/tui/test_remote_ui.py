"""The chat UI on the remote engine (engine/remote.py) against the local stub (tests/remote_stub.py):
a snapshot of a remote chat, the knobs' notes, an error that keeps the chat, and the API key kept
out of every file the app writes."""
from __future__ import annotations

import logging

import pytest
from remote_stub import Stub
from textual.widgets import Static
from tui_helpers import MODELS_DIR, FixedClock, hold_still, wait_for, wait_ready

from memra_engine.remote import RemoteEngine
from memra_tui.app import MemraApp
from memra_tui.chats import ChatStore
from memra_tui.widgets.composer import Composer

SNAPSHOT_PORT = 38417  # fixed: the header shows the server's host:port


class StepClock:
    """The engine's clock for timing replies: each reading 10 ms after the last, so the time to
    first token on screen does not depend on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.01
        return self.now


def remote_app(paths, stub: Stub, api_key: str | None = None) -> MemraApp:
    def load(model, progress=None, **_):
        return RemoteEngine.connect(stub.url, api_key=api_key, progress=progress, clock=StepClock())

    return MemraApp(f"{stub.model} at {stub.url}", "cpu", 4096, False, paths=paths, load_engine=load,
                    clock=FixedClock(), picker_root=MODELS_DIR)


def n_replies(stub: Stub) -> int:
    return sum(1 for r in stub.requests if r["path"].endswith("/chat/completions"))


async def send(pilot, stub: Stub, text: str) -> None:
    """Send text and wait until its reply has ended (on screen, saved)."""
    n = n_replies(stub)
    composer = pilot.app.screen.query_one(Composer)
    composer.focus()
    composer.text = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: n_replies(stub) > n and not pilot.app.screen.streaming)
    await pilot.pause()


def test_remote_chat_snapshot(snap_compare, paths):
    """Header: the model and the server; Memory and MoE panes: remote; the rates are the server's."""
    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, stub, "hello")
        await pilot.pause(0.3)  # past the stats throttle
        await hold_still(pilot)

    with Stub(owned_by="vllm", timings=True, port=SNAPSHOT_PORT) as stub:
        assert snap_compare(remote_app(paths, stub), terminal_size=(120, 36), run_before=run_before)


@pytest.mark.anyio
async def test_knobs_pane_says_what_each_extra_knob_becomes(paths):
    with Stub(owned_by="vllm") as stub:
        app = remote_app(paths, stub)
        async with app.run_test(size=(130, 50)) as pilot:
            await wait_ready(pilot)
            await pilot.press("f3")
            note = lambda knob: str(app.screen.query_one(f"#note-{knob}", Static).render())  # noqa: E731
            assert note("top_k") == "→ top_k if not off"
            assert note("repeat_penalty") == "→ repetition_penalty if not off"
            assert note("repeat_last_n") == "✗ not sent (no such field)"
            assert not app.screen.query("#note-temperature")  # a standard field: no note
            await app.action_quit()


@pytest.mark.anyio
async def test_server_error_keeps_the_chat_and_then_replies(paths):
    with Stub() as stub:
        app = remote_app(paths, stub)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_ready(pilot)
            stub.status = 503
            await send(pilot, stub, "first")
            stub.status = 200
            await send(pilot, stub, "second")
            chat = app.screen.chat
            assert [m.role for m in chat.messages] == ["user", "user", "assistant"]
            assert chat.messages[-1].content == "Hello from the stub."
            await app.action_quit()


@pytest.mark.anyio
async def test_broken_stream_keeps_the_partial_reply_marked(paths):
    with Stub() as stub:
        stub.break_after = 3
        app = remote_app(paths, stub)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_ready(pilot)
            await send(pilot, stub, "hi")
            reply = app.screen.chat.messages[-1]
            assert (reply.content, reply.status) == ("Hello from the", "error")
            assert "broke mid-reply" in reply.error and reply.error.endswith("the reply so far is kept, cut here")
            await app.action_quit()


@pytest.mark.anyio
async def test_api_key_is_in_no_file_the_app_writes(paths, caplog):
    caplog.set_level(logging.DEBUG)  # every log record, httpx's and httpcore's included
    key = "sk-remote-secret-4711"
    with Stub(api_key=key) as stub:
        app = remote_app(paths, stub, api_key=key)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_ready(pilot)
            await send(pilot, stub, "hello")
            await app.action_quit()
        assert stub.requests[-1]["headers"]["Authorization"] == f"Bearer {key}"  # it was used
    chats, problems = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock()).list()
    assert not problems and chats[0].messages[-1].content == "Hello from the stub."
    written = [p for d in (paths.config_dir, paths.data_dir) if d.exists() for p in d.rglob("*") if p.is_file()]
    assert any(p.suffix == ".json" and p.parent == paths.chats_dir for p in written)
    for path in written:
        assert key not in path.read_text(errors="replace"), path
    assert "HTTP Request: POST" in caplog.text and key not in caplog.text
