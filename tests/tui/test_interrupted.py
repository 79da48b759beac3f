"""A reply in flight when the app is killed or its terminal closes (issue 17 §4): the partial reply
is saved, marked "interrupted". SIGTERM and SIGHUP save and exit 128 + the signal; a kill -9 leaves
the last checkpoint (at most CHECKPOINT_S old). The app runs in a real pty, as a user's terminal."""
from __future__ import annotations

import json
import os
import pty
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from tui_helpers import send, wait_for, wait_ready

from memra_tui.chats import Chat, ChatMessage, ChatStore
from memra_tui.scripted_engine import DEFAULT_REPLIES, Script, split_tokens
from memra_tui.widgets.message_view import MessageView

DRIVER = Path(__file__).with_name("signal_app.py")
REPO = Path(__file__).resolve().parents[2]
HELD = "".join(split_tokens(DEFAULT_REPLIES[0])[:5])  # the scripted reply holds after 5 tokens


class AppInPty:
    """signal_app.py on the slave side of a pty (its controlling terminal); the output is drained
    on a thread, so the app never blocks writing to the terminal."""

    def __init__(self, data: Path, checkpoint_s: float) -> None:
        self.data = data
        env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40", PYTHONPATH=str(REPO))
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: a new session whose controlling terminal is the pty
            os.execve(sys.executable, [sys.executable, str(DRIVER), str(data), str(checkpoint_s)], env)
        self.output = bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output += chunk

    def wait(self, condition, timeout: float = 20.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"timed out waiting for {what}; the app wrote: {bytes(self.output[-600:])!r}")
            time.sleep(0.05)

    def chat_files(self) -> list[Path]:
        return sorted((self.data / "data" / "chats").glob("*.json"))

    def saved(self) -> dict:
        [path] = self.chat_files()
        return json.loads(path.read_text())

    def type_message(self, text: str) -> None:
        self.wait(lambda: b"Type a message" in self.output, what="the chat screen")
        os.write(self.fd, text.encode() + b"\r")
        self.wait(lambda: self.chat_files() and self.saved()["messages"], what="the message saved")

    def exit_code(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        self.kill()
        raise AssertionError("the app did not exit")

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close_terminal(self) -> None:
        os.close(self.fd)


def partial_reply(saved: dict) -> dict:
    user, reply = saved["messages"]
    assert user == dict(user, role="user", content="hello")
    assert reply["role"] == "assistant"
    return reply


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP"])
def test_a_signal_mid_reply_saves_the_partial_reply_marked_interrupted_and_exits(tmp_path, how):
    app = AppInPty(tmp_path, checkpoint_s=3600)  # no checkpoint: what is saved is the signal's doing
    app.type_message("hello")
    time.sleep(0.5)  # the 5 tokens arrive within milliseconds, then the reply holds
    assert len(app.saved()["messages"]) == 1
    if how == "SIGTERM":
        os.kill(app.pid, signal.SIGTERM)
    else:
        app.close_terminal()  # the kernel hangs up the session: SIGHUP
    code = app.exit_code()
    reply = partial_reply(app.saved())
    assert reply["status"] == "interrupted" and reply["content"] == HELD
    assert code == 128 + getattr(signal, how)
    log = (tmp_path / "data" / "memra-chat.log").read_text()
    assert f"{how}: saving the chat and exiting" in log and "Traceback" not in log, log
    assert b"Traceback" not in app.output


def test_a_kill_9_mid_reply_leaves_the_last_checkpoint_marked_interrupted(tmp_path):
    app = AppInPty(tmp_path, checkpoint_s=0.2)
    app.type_message("hello")
    # a checkpoint taken before the 5th token (a slow start) holds less: wait for the one after it
    app.wait(lambda: [m["content"] for m in app.saved()["messages"]][1:] == [HELD], what="a checkpoint of the reply")
    os.kill(app.pid, signal.SIGKILL)
    app.exit_code()
    reply = partial_reply(app.saved())
    assert reply["status"] == "interrupted" and reply["content"] == HELD


@pytest.mark.anyio
async def test_a_resumed_chat_shows_the_interrupted_mark_and_the_reply_can_be_regenerated(make_app, paths):
    store = ChatStore(paths.chats_dir, paths.exports_dir)
    chat = store.new_chat("m.gguf", {})
    chat.messages = [ChatMessage("user", "hello"), ChatMessage("assistant", HELD, status="interrupted")]
    store.save(chat)
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        views = list(app.screen.query(MessageView))
        status = str(views[-1].query_one(".status").render())
        assert views[-1].text == HELD and status.startswith("■ interrupted"), status
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.screen.chat.messages[-1].status == "done" and not app.screen.streaming)
    assert Chat.from_json(store.path_of(chat.id).read_text()).messages[-1].content == DEFAULT_REPLIES[0]


@pytest.mark.anyio
async def test_exit_on_signal_saves_the_reply_in_flight(make_app, paths):
    app = make_app(Script(pause_after=5))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello", wait_done=False)
        await wait_for(pilot, lambda: app.engine.jobs[-1].emitted_text == HELD)
        app.exit_on_signal(signal.SIGTERM)
        await pilot.pause()
    assert app.return_value == 128 + signal.SIGTERM
    [path] = paths.chats_dir.glob("*.json")
    reply = Chat.from_json(path.read_text()).messages[-1]
    assert (reply.role, reply.content, reply.status) == ("assistant", HELD, "interrupted")
