"""Issue 17 §5, the rough edges a new user hit: each test here failed before its fix."""
from __future__ import annotations

import pytest
from textual.widgets import DataTable, TabbedContent
from tui_helpers import send, wait_for, wait_ready

from memra_tui.scripted_engine import Script
from memra_tui.widgets.engine_header import EngineHeader
from memra_tui.widgets.key_footer import KeyFooter

pytestmark = pytest.mark.anyio


def screen_lines(app) -> list[str]:
    """The terminal's text as the user sees it, one string per row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


# -- §5.3: a key back to the Engine tab after F3 ---------------------------------------------------

async def test_f6_goes_back_to_the_engine_tab_after_f3(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        tabs = app.screen.query_one(TabbedContent)
        await pilot.press("f3")
        await pilot.pause()
        assert tabs.active == "knobs-tab"
        await pilot.press("f6")
        await pilot.pause()
        assert tabs.active == "engine-tab"
        assert app.screen.query_one("#composer").has_focus
        footer = app.screen.query_one(KeyFooter)
        assert "f6 Engine" in screen_lines(app)[-1], screen_lines(app)[-1]
        assert any(k.key == "f6" for k in footer.shown_keys)
        # from the composer too (TextArea's own F6 would select the line)
        await pilot.press("f3")
        await pilot.pause()
        composer = app.screen.query_one("#composer")
        composer.focus()
        await pilot.press("a")
        await pilot.press("f6")
        await pilot.pause()
        assert tabs.active == "engine-tab" and composer.selected_text == "" and composer.text == "a"


async def test_f6_shows_hidden_panes_on_the_engine_tab(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(80, 24)) as pilot:  # narrow: the panes start hidden
        await wait_ready(pilot)
        assert not app.screen.query_one("#sidebar").display
        await pilot.press("f6")
        await pilot.pause()
        assert app.screen.query_one("#sidebar").display
        assert app.screen.query_one(TabbedContent).active == "engine-tab"


# -- §5.4: the chat list keeps the renamed chat selected ------------------------------------------

async def test_rename_keeps_the_selection_on_the_renamed_chat(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "chat one")
        first_id = app.screen.chat.id
        await pilot.press("ctrl+n")
        await send(pilot, "chat two")
        await pilot.press("ctrl+n")
        await send(pilot, "chat three")
        await pilot.press("f4")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        row = [c.id for c in app.screen.chats].index(first_id)
        assert row == 2
        table.move_cursor(row=row)
        await pilot.press("r")
        await pilot.pause()
        app.screen.query_one("#prompt-text").value = ""
        await pilot.press(*"Renamed", "enter")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert app.screen.chats[table.cursor_row].id == first_id
        await pilot.press("e")  # exports the renamed chat, not the top row
        await pilot.pause()
        exports = sorted(p.name for p in paths.exports_dir.iterdir())
        assert exports == [f"{first_id}.md"]


async def test_delete_leaves_the_cursor_on_the_next_row(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
            await pilot.press("ctrl+n")
        await pilot.press("f4")
        await pilot.pause()
        ids = [c.id for c in app.screen.chats]  # the open (empty, unsaved) chat is not listed
        app.screen.query_one(DataTable).move_cursor(row=1)
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        assert [c.id for c in app.screen.chats] == [ids[0], ids[2]]
        assert app.screen.chats[table.cursor_row].id == ids[2]


# -- §5.5: completion mode in the header -----------------------------------------------------------

async def test_a_model_without_a_chat_template_says_completion_mode_in_the_header(make_app):
    app = make_app(Script(tokens_per_s=3000, chat_template=False))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        header = str(app.screen.query_one(EngineHeader).render())
        assert "completion mode" in header
        assert "completion mode" in screen_lines(app)[0]


async def test_a_model_with_a_chat_template_does_not(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        assert "completion mode" not in str(app.screen.query_one(EngineHeader).render())


# -- §5.2: the newline keys, in the README and in the composer ------------------------------------

async def test_backslash_enter_adds_a_line_in_any_terminal(make_app):
    """tmux sends Alt+Enter and Shift+Enter as Enter; `\\` then Enter is plain keys everywhere."""
    from memra_tui.widgets.composer import Composer

    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("a", "backslash", "enter", "b")
        assert app.screen.query_one(Composer).text == "a\nb"
        assert app.engine.jobs == []
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.engine.jobs) == 1 and not app.screen.streaming)
        assert app.engine.jobs[0].messages[-1]["content"] == "a\nb"


def test_readme_says_which_keys_add_a_line_and_where():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    keys = readme[readme.index("## Keys"):]
    rows = [line for line in keys.splitlines() if line.startswith("|") and "new line" in line]
    everywhere = [r for r in rows if "every terminal" in r]
    assert len(everywhere) == 1 and "Ctrl+J" in everywhere[0] and "`\\` then Enter" in everywhere[0]
    assert "tmux" in everywhere[0]
    only_some = [r for r in rows if "Alt+Enter" in r]
    assert len(only_some) == 1 and "tmux" in only_some[0] and "send" in only_some[0]
    assert "Alt+Enter" not in everywhere[0]


# -- §5.1: single line breaks show, in the user's message and in the reply -------------------------

def row_of(lines: list[str], text: str) -> int:
    """The last row that shows text (the first may be the transcript's title, the chat's first words)."""
    return max(i for i, line in enumerate(lines) if text in line)


async def test_single_line_breaks_show_as_typed_and_as_generated(make_app):
    reply = "Roses are red,\nviolets are blue:\n\n- one\n  still one\n- **two**\n\n```\ncode\n```"
    app = make_app(Script(tokens_per_s=3000, replies=[reply]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "line one\nline two\n*not emphasis*")
        lines = screen_lines(app)
        assert row_of(lines, "line two") == row_of(lines, "line one") + 1
        assert row_of(lines, "*not emphasis*") == row_of(lines, "line two") + 1  # as typed: not markdown
        assert row_of(lines, "violets are blue:") == row_of(lines, "Roses are red,") + 1
        assert row_of(lines, "still one") == row_of(lines, "• one") + 1
        assert "**two**" not in "".join(lines) and "two" in lines[row_of(lines, "still one") + 1]  # still markdown
        assert app.screen.chat.messages[-1].content == reply  # the saved text is what came


# -- §5.8: the Context pane after --resume ---------------------------------------------------------

def saved_chat(paths, *turns: str) -> str:
    from memra_tui.chats import ChatMessage, ChatStore
    from tui_helpers import FixedClock

    store = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock())
    chat = store.new_chat("scripted-tiny.gguf", {})
    chat.messages = [ChatMessage("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(turns)]
    store.save(chat)
    return chat.id


async def test_resume_shows_the_conversation_s_tokens_in_the_context_pane(make_app, paths):
    from memra_tui.widgets.context_usage import ContextPane

    saved_chat(paths, "what is a token", "a piece of a word, as the tokenizer cuts text", "and a context?")
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        pane = app.screen.query_one(ContextPane)
        await wait_for(pilot, lambda: pane.used > 0)
        expected = app.engine.count_tokens(app.screen.chat.engine_messages())
        assert pane.used == expected
        assert f"{expected:,} / 4,096 tokens" in str(app.screen.query_one("#context-numbers").render())
        await pilot.press("ctrl+n")  # a new chat: nothing in the context
        await wait_for(pilot, lambda: pane.used == 0)


async def test_a_reply_s_stats_win_over_a_late_count(make_app, paths):
    from memra_tui.widgets.context_usage import ContextPane

    saved_chat(paths, "hello", "hi")
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot)
        app.screen._show_context_count(app.screen._context_epoch - 1, 99_999)  # a count begun before
        assert app.screen.query_one(ContextPane).used != 99_999
        await send(pilot, "more")
        stats = app.engine.stats()
        assert app.screen.query_one(ContextPane).used == stats.n_ctx_used


# -- §5.7: at 120 columns, text is cut at word boundaries or wrapped, never inside a word ----------

LONG_PATH = ("/home/someone/models/very-long-directory-name/"
             "Qwen3-30B-A3B-Instruct-2507-UD-Q4_K_XL-with-a-long-suffix.gguf")
LONG_ERROR = (f"{LONG_PATH}: not a GGUF file (bad magic b'not '); the file may be truncated or is "
              "some other format entirely")


def words_shown_whole(lines: list[str], text: str) -> None:
    """Every word of text (and every component of a path in it) is on one row, uncut."""
    for word in text.replace("/", " ").split():
        assert any(word in line for line in lines), (word, lines)


def cut_at_a_word_boundary(shown: str, full: str) -> None:
    shown = shown.strip()
    if shown == full.strip():
        return
    assert shown.endswith("…"), shown
    head = shown[:-1].rstrip()
    assert full.startswith(head), (head, full)
    after = full[len(head):]
    assert after[:1] in (" ", ",", "/", "·", "│"), f"cut inside a word: {head!r} + {after[:12]!r}"


async def test_the_header_is_ellipsized_at_a_word_boundary_at_120_columns(make_app):
    from memra_engine.grammar import Grammar

    model = "models/SmolLM2-1.7B-Instruct-abliterated-merged-with-extra-long-name.Q4_K_M.gguf"
    app = make_app(Script(tokens_per_s=3000, backend="cuda", chat_template=False), model=model,
                   grammar=Grammar.regex("[0-9]{4}-[0-9]{2}-[0-9]{2}"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        header_row = screen_lines(app)[0]
        assert header_row.strip().endswith("…")
        i = app.engine.info
        untruncated = (f"memra │ {i.model_name} │ completion mode │ grammar {app.screen.grammar.label} │ {i.arch} "
                       f"135M │ {i.backend} · {i.device_name} │ {i.quant_mix}")
        assert len(untruncated) > 118
        cut_at_a_word_boundary(header_row, untruncated)
        assert "completion mode" in header_row and "grammar" in header_row  # the mode and grammar come first


async def test_the_footer_shows_whole_keys_only_at_120_columns(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_ready(pilot)
        await pilot.pause(0.1)
        footer = app.screen.query_one(KeyFooter)
        row = screen_lines(app)[-1]
        shown = footer.shown_keys
        assert len(shown) >= 8
        for key in shown:
            assert f"{key.key_display} {key.description}".strip() in row, (key.key_display, row)
        for key in footer.query("FooterKey"):
            if key not in shown:
                assert f"{key.key_display} " not in row, row  # not even its start
        assert row.rstrip().endswith("^p palette")


async def test_the_loading_screen_wraps_a_long_path_at_its_separators(make_app):
    from memra_tui.screens.loading import LoadingScreen

    app = make_app(Script(load_delay_s=1.5), model=LONG_PATH)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadingScreen) and len(app.screen.steps) >= 1)
        await pilot.pause(0.1)
        lines = screen_lines(app)
        words_shown_whole(lines, f"Loading {LONG_PATH}")
        words_shown_whole(lines, f"fetch: using {LONG_PATH}")
        await wait_ready(pilot)


async def test_the_load_error_screen_wraps_a_long_message_at_word_boundaries(make_app):
    from memra_tui.screens.load_error import LoadErrorScreen

    app = make_app(Script(fail_paths={LONG_PATH: LONG_ERROR}), model=LONG_PATH)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LoadErrorScreen) and app.screen.query("#model-path"))
        await pilot.pause(0.1)
        words_shown_whole(screen_lines(app), LONG_ERROR)


def test_wrap_and_ellipsize_break_only_between_words():
    from memra_tui.widgets.fit_text import ellipsize, wrap_words

    assert wrap_words("a long-word and /a/path/to/file.gguf here", 12) == \
        ["a long-word", "and /a/path/", "to/file.gguf", "here"]
    assert wrap_words("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # no boundary: split, nothing lost
    assert wrap_words("two\nlines", 20) == ["two", "lines"]
    assert ellipsize("memra │ model │ llama 135M", 20).plain == "memra │ model…"
    assert ellipsize("fits", 4).plain == "fits"
    assert ellipsize("T 0.7 · top-k 40 · top-p 0.95", 16).plain == "T 0.7 · top-k…"
    assert ellipsize("T 0.7 · top-k 40 · seed 1234", 26, breaks="·", words=False).plain == "T 0.7 · top-k 40…"


def test_the_status_line_says_context_full():
    from memra_tui.screens.chat import DONE_STATUS
    from memra_tui.widgets.message_view import STATUS_TEXT

    assert DONE_STATUS["context"] == "context" and DONE_STATUS["length"] == "length"
    assert STATUS_TEXT["context"].startswith("… context full") and "max tokens" in STATUS_TEXT["length"]


def test_wrapped_text_before_layout_is_the_whole_text():
    """Before its first layout a WrappedText has width 0: it renders its text whole, not one letter
    per line (CI queried the load error screen's text in that moment)."""
    from memra_tui.widgets.fit_text import WrappedText

    w = WrappedText("bad.gguf: not a GGUF file")
    assert w.content_size.width == 0
    assert str(w.render()) == "bad.gguf: not a GGUF file"
