"""Saved chats: byte-for-byte across restarts, corrupt files reported and kept aside, the chat list,
and the store itself (atomic writes, deterministic JSON)."""
from __future__ import annotations

import os

import pytest
from textual.widgets import DataTable
from tui_helpers import FixedClock, send, wait_for, wait_ready

from memra_tui.chats import Chat, ChatMessage, ChatStore
from memra_tui.screens.chat_list import ChatListScreen
from memra_tui.scripted_engine import DEFAULT_REPLIES, Script
from memra_tui.settings import atomic_write_text
from memra_tui.widgets.transcript import Transcript

pytestmark = pytest.mark.anyio


def transcript_texts(app) -> list[str]:
    return [v.text for v in app.screen.query_one(Transcript).message_views]


async def test_a_chat_survives_a_restart_byte_for_byte(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first question")
        await send(pilot, "second question")
        chat_id = app.screen.chat.id
    files = list(paths.chats_dir.glob("*.json"))
    assert [f.stem for f in files] == [chat_id]
    before = files[0].read_bytes()
    assert Chat.from_json(before.decode()).to_json().encode() == before

    app2 = make_app(Script(tokens_per_s=3000), resume=True, clock=FixedClock(start=2_000_000_000))
    async with app2.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app2.screen.chat.id == chat_id
        assert transcript_texts(app2) == ["first question", DEFAULT_REPLIES[0], "second question", DEFAULT_REPLIES[1]]
        await pilot.press("ctrl+q")
    assert files[0].read_bytes() == before  # opening and quitting does not rewrite it


async def test_a_corrupt_chat_file_is_skipped_with_a_notice_and_kept_aside(make_app, paths):
    store = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock())
    good = store.new_chat("m.gguf", {})
    good.messages = [ChatMessage("user", "kept"), ChatMessage("assistant", "yes")]
    store.save(good)
    corrupt = paths.chats_dir / "29991231-235959.json"  # sorts newest by name
    corrupt.write_bytes(b'{"version": 1, "id": "29991231-235959", "messages": [tru')
    truncated = paths.chats_dir / "29991231-235958.json"
    truncated.write_bytes(b"")
    corrupt_bytes = corrupt.read_bytes()

    app = make_app(Script(tokens_per_s=3000), resume=True, clock=FixedClock(start=32_503_680_000))  # year 3000
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.chat.id == good.id
        notices = [n.message for n in app._notifications]
        assert any("skipped corrupt chat file 29991231-235959.json" in n
                   and "kept aside as 29991231-235959.json.corrupt-30000101-0000" in n for n in notices)
        assert any("skipped corrupt chat file 29991231-235958.json" in n for n in notices)
        assert all("\n" not in n for n in notices)
        await pilot.press("ctrl+n")
        await send(pilot, "a new chat after the corrupt ones")
        await pilot.press("f4")
        await pilot.pause()
        assert isinstance(app.screen, ChatListScreen)
        assert len(app.screen.chats) == 2  # the two good ones, not the corrupt ones
        # kept aside: the chat list does not report them again
        assert len([n for n in app._notifications if "29991231-235959.json" in n.message]) == 1
    assert not corrupt.exists() and not truncated.exists()
    [aside] = paths.chats_dir.glob("29991231-235959.json.corrupt-30000101-0000*")
    assert aside.read_bytes() == corrupt_bytes
    [aside] = paths.chats_dir.glob("29991231-235958.json.corrupt-30000101-0000*")
    assert aside.read_bytes() == b""
    assert len(list(paths.chats_dir.glob("*.json"))) == 2
    assert len(list(paths.chats_dir.glob("*.corrupt-*"))) == 2


WRONG_TYPES = {
    "messages is text": '{"version": 1, "id": "ID", "messages": "hello"}',
    "a message is a number": '{"version": 1, "id": "ID", "messages": [7]}',
    "sampling is text": '{"version": 1, "id": "ID", "sampling": "hot"}',
    "created is text": '{"version": 1, "id": "ID", "created": "yesterday"}',
    "updated is NaN": '{"version": 1, "id": "ID", "updated": NaN}',
    "updated past year 9999": '{"version": 1, "id": "ID", "updated": 1e300}',
    "title is a list": '{"version": 1, "id": "ID", "title": ["a"]}',
    "id is a number": '{"version": 1, "id": 5}',
    "message status is a list": '{"version": 1, "id": "ID", "messages": [{"role": "user", "content": "x", "status": []}]}',
    "message grammar is text": '{"version": 1, "id": "ID", "messages": [{"role": "assistant", "content": "x", "grammar": "json"}]}',
    "context_start past the messages": '{"version": 1, "id": "ID", "context_start": 3}',
    "the whole file is a list": '[1, 2]',
    "nested too deeply": "[" * 100_000,
    "truncated": '{"version": 1, "id": "ID", "mess',
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_chat_file_with_wrong_types_is_reported_in_one_line_and_kept_aside(paths, case):
    store = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock())
    paths.chats_dir.mkdir(parents=True)
    bad = paths.chats_dir / "ID.json"
    bad.write_text(WRONG_TYPES[case].replace("ID", "20200101-000000"))
    before = bad.read_bytes()
    chats, problems = store.list()
    assert chats == [] and len(problems) == 1 and "\n" not in problems[0], problems
    assert problems[0].startswith("skipped corrupt chat file ID.json: ") and "kept aside as ID.json.corrupt-" in problems[0]
    assert not bad.exists()
    [aside] = paths.chats_dir.glob("ID.json.corrupt-*")
    assert aside.read_bytes() == before
    assert store.list() == ([], [])  # reported once


def test_a_set_aside_file_is_never_overwritten_and_a_newer_format_is_left_alone(paths):
    clock = FixedClock()
    store = ChatStore(paths.chats_dir, paths.exports_dir, clock)
    paths.chats_dir.mkdir(parents=True)
    taken = store.new_chat("m.gguf", {}).id  # the name the next new chat would take
    (paths.chats_dir / f"{taken}.json").write_bytes(b"\xff\xfe not utf-8")
    newer = paths.chats_dir / "20200101-000000.json"
    newer.write_text('{"version": 2, "id": "20200101-000000", "whatever": []}')
    store.clock = FixedClock(clock.start)  # a new chat now would take `taken` again
    _, problems = store.list()
    assert any("not UTF-8" in p and "kept aside" in p for p in problems)
    assert any("written by a newer memra; left as it is" in p for p in problems)
    assert newer.exists()
    chat = store.new_chat("m.gguf", {})
    store.save(chat)
    [aside] = paths.chats_dir.glob("*.corrupt-*")
    assert aside.read_bytes() == b"\xff\xfe not utf-8"
    # a second corrupt file of the same name in the same second goes beside the first, not over it
    (paths.chats_dir / f"{taken}.json").write_bytes(b"{")
    store.clock = lambda: clock.start
    store.set_aside(paths.chats_dir / f"{taken}.json", "x")
    store.clock = lambda: clock.start
    (paths.chats_dir / f"{taken}.json").write_bytes(b"[")
    store.set_aside(paths.chats_dir / f"{taken}.json", "x")
    assert len(list(paths.chats_dir.glob("*.corrupt-*"))) == 3


async def test_resume_with_only_a_chat_of_wrong_types_opens_a_new_chat(make_app, paths):
    paths.chats_dir.mkdir(parents=True)
    bad = paths.chats_dir / "20200101-000000.json"
    bad.write_text('{"version": 1, "id": "20200101-000000", "messages": "hello"}')
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        notices = [n.message for n in app._notifications]
        assert any("skipped corrupt chat file 20200101-000000.json: messages is a str, not a list; kept aside" in n
                   for n in notices), notices
        assert app.screen.chat.messages == []
        await send(pilot, "still works")
    assert len(list(paths.chats_dir.glob("*.corrupt-*"))) == 1


async def test_chat_list_opens_renames_exports_and_deletes(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "chat one")
        first_id = app.screen.chat.id
        await pilot.press("ctrl+n")
        await send(pilot, "chat two")
        second_id = app.screen.chat.id

        await pilot.press("f4")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert [c.id for c in app.screen.chats] == [second_id, first_id]  # newest first
        table.move_cursor(row=1)
        await pilot.press("r")
        await pilot.pause()
        rename_input = app.screen.query_one("#prompt-text")
        rename_input.value = ""
        await pilot.press(*"Renamed", "enter")
        await pilot.pause()
        assert app.store.load(first_id).title == "Renamed"

        table = app.screen.query_one(DataTable)
        table.move_cursor(row=[c.id for c in app.screen.chats].index(first_id))
        await pilot.press("e")
        exported = paths.exports_dir / f"{first_id}.md"
        markdown = exported.read_text()
        assert markdown.startswith("# Renamed") and "chat one" in markdown and DEFAULT_REPLIES[0] in markdown

        await pilot.press("enter")  # open it
        await pilot.pause()
        assert app.screen.chat.id == first_id
        assert transcript_texts(app) == ["chat one", DEFAULT_REPLIES[0]]

        await pilot.press("f4")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        table.move_cursor(row=[c.id for c in app.screen.chats].index(second_id))
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert not app.store.path_of(second_id).exists()
        assert [c.id for c in app.screen.chats] == [first_id]


async def test_resume_with_no_chats_starts_a_new_one(make_app):
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.chat.messages == []
        assert any("no saved chat to resume" in n.message for n in app._notifications)


async def test_load_error_shows_one_line_and_another_file_can_be_picked(make_app):
    script = Script(fail_paths={"bad.gguf": "bad.gguf: not a GGUF file (bad magic b'not ')"})
    app = make_app(script, model="bad.gguf")
    async with app.run_test(size=(120, 40)) as pilot:
        from memra_tui.screens.load_error import LoadErrorScreen

        # the screen's widgets mount after it is pushed: wait for them, not just the screen
        await wait_for(pilot, lambda: isinstance(app.screen, LoadErrorScreen) and app.screen.query("#model-path"))
        assert str(app.screen.query_one("#load-error").render()) == "bad.gguf: not a GGUF file (bad magic b'not ')"
        path_input = app.screen.query_one("#model-path")
        path_input.value = "good.gguf"
        await pilot.press("enter")
        await wait_ready(pilot)
        assert app.engine.info.model_name == "good"


def test_store_writes_atomically_and_never_reuses_a_name(tmp_path):
    store = ChatStore(tmp_path / "chats", tmp_path / "exports", FixedClock())
    chat = store.new_chat("m.gguf", {"temperature": 0.5})
    chat.messages.append(ChatMessage("user", "héllo ```code```"))
    store.save(chat)
    text = store.path_of(chat.id).read_text()
    assert Chat.from_json(text).to_json() == text
    assert [p.name for p in (tmp_path / "chats").iterdir()] == [f"{chat.id}.json"]  # no temp file left
    # A second chat in the same second gets its own file instead of overwriting the first.
    (tmp_path / "chats" / "20251129-070642.json").write_text("garbage")
    store2 = ChatStore(tmp_path / "chats", tmp_path / "exports", lambda: 1_764_400_002.0)
    assert store2.new_chat("m.gguf", {}).id == "20251129-070642-2"


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "chat.json"
    target.write_text("old")

    class Boom:
        def __str__(self):
            raise RuntimeError("disk full")

    with pytest.raises(TypeError):
        atomic_write_text(target, Boom())  # fails inside the write
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["chat.json"]


async def test_loading_screen_shows_the_engine_progress(make_app):
    from memra_tui.screens.loading import LoadingScreen

    app = make_app(Script(load_delay_s=1.5))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and len(app.screen.steps) >= 2)
        lines = app.screen.steps
        assert lines[0].startswith("fetch:") and lines[1].startswith("kernel build:")
        await wait_ready(pilot)
