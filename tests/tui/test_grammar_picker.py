"""The grammar selector: each kind reaches the engine, an invalid grammar is refused at once and
the old one kept, the header names the active one, a chat keeps its grammar across a restart, a
reply cut short under a grammar says it is incomplete, and the command line's grammar is active."""
from __future__ import annotations

import json

import pytest
from textual.widgets import Input, OptionList, Select, Static
from tui_helpers import FixedClock, send, wait_for, wait_ready

from memra_engine.errors import GrammarError
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_tui.chats import Chat, ChatMessage, ChatStore
from memra_tui.screens.chat import ChatScreen
from memra_tui.screens.grammar_pick import GrammarPickScreen, example_grammars
from memra_tui.scripted_engine import Script
from memra_tui.settings import save_sampling_defaults
from memra_tui.widgets.engine_header import EngineHeader
from memra_tui.widgets.message_view import MessageView
from memra_tui.widgets.transcript import Transcript

pytestmark = pytest.mark.anyio


def example(name: str):
    (path,) = [p for kind in ("json_schema", "regex", "lark", "gbnf") for p in example_grammars(kind) if p.name == name]
    return path


def header_text(app) -> str:
    return str(app.screen.query_one(EngineHeader).render())


async def choose_kind(pilot, kind: str) -> None:
    """Pick a kind in the knobs pane's grammar selector (what choosing it in the list does)."""
    await pilot.press("f3")
    pilot.app.screen.query_one("#knob-grammar", Select).value = kind
    await pilot.pause()


async def pick_example(pilot, name: str) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, GrammarPickScreen))
    examples = pilot.app.screen.query_one(OptionList)
    examples.focus()
    examples.highlighted = [p.name for p in pilot.app.screen.examples].index(name)
    await pilot.press("enter")
    await pilot.pause()


async def type_in_picker(pilot, text: str) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, GrammarPickScreen) and pilot.app.focused is not None)
    field = pilot.app.screen.query_one("#grammar-text", Input)
    field.focus()  # after the picker's own focus on mount, which would take it back
    await wait_for(pilot, lambda: field.has_focus)
    field.value = text
    await pilot.press("enter")
    await pilot.pause()


def picker_error(app) -> str:
    error = app.screen.query_one("#grammar-error", Static)
    return str(error.render()) if error.has_class("-shown") else ""


def test_the_shipped_examples_are_offered_by_kind():
    assert [p.name for p in example_grammars("json_schema")] == ["person.json"]
    assert [p.name for p in example_grammars("regex")] == ["iso_date.regex"]
    assert [p.name for p in example_grammars("lark")] == ["arithmetic.lark"]
    assert [p.name for p in example_grammars("gbnf")] == ["shopping_list.gbnf"]


@pytest.mark.parametrize("kind, example_name, label", [
    ("json_schema", "person.json", "JSON schema person.json"),
    ("lark", "arithmetic.lark", "Lark arithmetic.lark"),
    ("gbnf", "shopping_list.gbnf", "GBNF shopping_list.gbnf"),
    ("regex", "iso_date.regex", "regex iso_date.regex"),
])
async def test_a_shipped_example_reaches_the_engine_and_the_header(make_app, kind, example_name, label):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert "grammar" not in header_text(app)
        await choose_kind(pilot, kind)
        await pick_example(pilot, example_name)
        assert isinstance(app.screen, ChatScreen)
        expected = Grammar.from_file(example(example_name), kind=kind)
        assert app.screen.grammar == expected and expected.label == label
        assert f"grammar {label}" in header_text(app)
        assert app.screen.query_one("#knob-grammar", Select).value == kind
        assert str(app.screen.query_one("#grammar-source", Static).render()) == example_name
        await send(pilot, "hi")
        assert app.engine.jobs[0].grammar == expected


async def test_json_and_off_reach_the_engine(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await choose_kind(pilot, "json")
        assert isinstance(app.screen, ChatScreen)  # nothing to ask
        assert "grammar JSON │" in header_text(app)
        await send(pilot, "one")
        await choose_kind(pilot, "off")
        assert "grammar" not in header_text(app)
        await send(pilot, "two")
        assert [job.grammar for job in app.engine.jobs] == [Grammar.json(), None]


async def test_a_regex_typed_with_the_keyboard_reaches_the_engine(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        app.screen.query_one("#knob-grammar", Select).focus()
        await pilot.press("enter", "down", "down", "down", "enter")  # off, JSON, JSON schema file…, regex…
        await wait_for(pilot, lambda: isinstance(app.screen, GrammarPickScreen))
        assert app.screen.query_one("#grammar-text", Input).has_focus
        await pilot.press(*"[0-9]+ kg", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        assert "grammar regex /[0-9]+ kg/" in header_text(app)  # brackets shown, not taken as markup
        assert str(app.screen.query_one("#grammar-source", Static).render()) == "/[0-9]+ kg/"
        await send(pilot, "weight?")
        assert app.engine.jobs[0].grammar == Grammar.regex("[0-9]+ kg")


async def test_change_picks_another_grammar_of_the_same_kind(make_app):
    app = make_app(Script(tokens_per_s=3000), grammar=Grammar.regex("[a-z]+"))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f3")
        await pilot.click("#grammar-change")
        await wait_for(pilot, lambda: isinstance(app.screen, GrammarPickScreen))
        assert app.screen.query_one("#grammar-text", Input).value == "[a-z]+"  # the pattern comes back to edit
        await type_in_picker(pilot, "[a-z]+!")
        await send(pilot, "hi")
        assert app.engine.jobs[0].grammar == Grammar.regex("[a-z]+!")


def engine_error(build) -> str:
    with pytest.raises(GrammarError) as caught:
        build()
    return str(caught.value)


@pytest.mark.parametrize("kind, text, names", [
    ("regex", "[0-9", "[0-9"),
    ("json_schema", "{missing}/nope.json", "nope.json"),
    ("json_schema", "{bad}", "bad.json"),
    ("lark", "{bad}", "bad.json"),
    ("gbnf", "", "type a path or pick an example"),
])
async def test_an_invalid_grammar_is_refused_at_once_and_the_old_one_kept(make_app, tmp_path, kind, text, names):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object",')
    text = text.format(missing=tmp_path / "missing", bad=bad)
    if kind == "regex":
        expected = engine_error(lambda: Grammar.regex(text))
    elif text:
        expected = engine_error(lambda: Grammar.from_file(text, kind=kind))
    else:
        expected = "type a path or pick an example"
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await choose_kind(pilot, "json")
        await choose_kind(pilot, kind)
        await type_in_picker(pilot, text)
        assert isinstance(app.screen, GrammarPickScreen)  # still open, to fix it
        error = picker_error(app)
        assert error == f"✗ {expected}" and names in error and "\n" not in error  # the engine's one line
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        assert app.screen.grammar == Grammar.json()
        assert app.screen.query_one("#knob-grammar", Select).value == "json"  # the selector shows it again
        await send(pilot, "hi")
        assert app.engine.jobs[0].grammar == Grammar.json()


async def test_a_grammar_that_fails_in_the_pane_is_shown_there_and_the_old_one_kept(make_app, monkeypatch):
    def no_json(cls):
        raise GrammarError("grammars need the llguidance package (pip install llguidance)")

    app = make_app(Script(tokens_per_s=3000), grammar=Grammar.regex("[0-9]+"))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        monkeypatch.setattr(Grammar, "json", classmethod(no_json))
        await choose_kind(pilot, "json")
        error = app.screen.query_one("#error-grammar", Static)
        assert error.has_class("-shown")
        assert str(error.render()) == "✗ grammars need the llguidance package (pip install llguidance) (not applied)"
        assert app.screen.grammar == Grammar.regex("[0-9]+")
        assert app.screen.query_one("#knob-grammar", Select).value == "regex"
        await choose_kind(pilot, "off")  # a choice that works clears the error
        assert not error.has_class("-shown") and app.screen.grammar is None


async def test_the_chat_saves_and_restores_its_grammar(make_app, paths):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first chat, no grammar")
        plain_id = app.screen.chat.id
        await pilot.press("ctrl+n")
        await choose_kind(pilot, "json_schema")
        await pick_example(pilot, "person.json")
        await send(pilot, "who?")
        schema_id = app.screen.chat.id
    person = Grammar.from_file(example("person.json"), kind="json_schema")
    saved = json.loads(app.store.path_of(schema_id).read_text())
    assert saved["grammar"] == person.to_dict()
    assert saved["messages"][1]["grammar"] == person.to_dict()  # the reply records what constrained it

    app2 = make_app(Script(tokens_per_s=3000), resume=True, clock=FixedClock(start=2_000_000_000))
    async with app2.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert app2.screen.chat.id == schema_id
        assert app2.screen.grammar == person and "grammar JSON schema person.json" in header_text(app2)
        assert app2.screen.query_one("#knob-grammar", Select).value == "json_schema"
        await send(pilot, "again")
        assert app2.engine.jobs[0].grammar == person

        await pilot.press("f4")  # the other chat has none: opening it turns the grammar off
        await pilot.pause()
        app2.screen.query_one("DataTable").move_cursor(row=[c.id for c in app2.screen.chats].index(plain_id))
        await pilot.press("enter")
        await pilot.pause()
        assert app2.screen.chat.id == plain_id and app2.screen.grammar is None
        assert "grammar" not in header_text(app2)
        assert app2.screen.query_one("#knob-grammar", Select).value == "off"
        await send(pilot, "plain again")
        assert app2.engine.jobs[1].grammar is None


async def test_an_unreadable_saved_grammar_keeps_the_chat_and_turns_the_grammar_off(make_app, paths):
    store = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock())
    chat = store.new_chat("m.gguf", {}, grammar={"kind": "regex", "source": "[0-9", "name": ""})
    chat.messages = [ChatMessage("user", "kept"), ChatMessage("assistant", "yes")]
    store.save(chat)
    app = make_app(Script(tokens_per_s=3000), resume=True, clock=FixedClock(start=2_000_000_000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.chat.id == chat.id
        assert [v.text for v in app.screen.query_one(Transcript).message_views] == ["kept", "yes"]
        notices = [n.message for n in app._notifications if "saved grammar" in n.message]
        reason = engine_error(lambda: Grammar.regex("[0-9"))
        assert notices == [f"this chat's saved grammar could not be used ({reason}); grammar off"]
        assert "\n" not in notices[0]
        assert app.screen.grammar is None and "grammar" not in header_text(app)
        await send(pilot, "still works")
        assert app.engine.jobs[0].grammar is None


async def test_an_old_chat_file_without_a_grammar_loads(make_app, paths):
    old = Chat(id="20250101-000000", title="old", messages=[ChatMessage("user", "hi"), ChatMessage("assistant", "yo")])
    data = json.loads(old.to_json())
    del data["grammar"]
    for m in data["messages"]:
        del m["grammar"]
    paths.chats_dir.mkdir(parents=True)
    (paths.chats_dir / "20250101-000000.json").write_text(json.dumps(data))
    app = make_app(Script(tokens_per_s=3000), resume=True)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.chat.id == old.id and app.screen.grammar is None
        assert not [n for n in app._notifications if "grammar" in n.message]


async def test_a_reply_cut_by_max_tokens_under_a_grammar_says_it_is_incomplete(make_app, paths):
    save_sampling_defaults(paths, SamplingParams(max_tokens=3))
    app = make_app(Script(tokens_per_s=3000), grammar=Grammar.json())
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "structured")
        await choose_kind(pilot, "off")
        await send(pilot, "plain")
        structured, plain = [v for v in app.screen.query_one(Transcript).message_views if v.role == "assistant"]
        assert str(structured.query_one(".status").render()) == "… cut at max tokens · structured reply incomplete"
        assert str(plain.query_one(".status").render()) == "… cut at max tokens"
        assert [m.status for m in app.screen.chat.messages if m.role == "assistant"] == ["length", "length"]
        chat_id = app.screen.chat.id
    assert "## Assistant (length, structured reply incomplete)" in app.store.load(chat_id).to_markdown()

    app2 = make_app(Script(tokens_per_s=3000), resume=True, clock=FixedClock(start=2_000_000_000))
    async with app2.run_test(size=(140, 40)) as pilot:  # reopened, the reply still says so
        await wait_ready(pilot)
        views = app2.screen.query(MessageView).results(MessageView)
        statuses = [str(v.query_one(".status").render()) for v in views if v.role == "assistant"]
        assert statuses == ["… cut at max tokens · structured reply incomplete", "… cut at max tokens"]


async def test_the_command_line_grammar_is_active(make_app, paths):
    digits = Grammar.regex("[0-9]+")
    app = make_app(Script(tokens_per_s=3000), grammar=digits)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert app.screen.grammar == digits and "grammar regex /[0-9]+/" in header_text(app)
        assert app.screen.query_one("#knob-grammar", Select).value == "regex"
        await send(pilot, "a number")
        await pilot.press("ctrl+n")  # a new chat starts with it too
        await send(pilot, "another")
        assert [job.grammar for job in app.engine.jobs] == [digits, digits]
        first = app.store.list()[0][-1]
        await choose_kind(pilot, "off")
        await send(pilot, "free text")
        assert app.engine.jobs[-1].grammar is None
    assert first.grammar == digits.to_dict()

    # --resume with a grammar flag: the flag wins over the resumed chat's own
    app2 = make_app(Script(tokens_per_s=3000), resume=True, grammar=Grammar.json(),
                    clock=FixedClock(start=2_000_000_000))
    async with app2.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        assert app2.screen.grammar == Grammar.json()


def test_the_cli_flag_reaches_the_app(monkeypatch, paths):
    from memra_tui import app as app_module
    from memra_tui.cli import main
    from memra_tui.settings import AppPaths

    seen = []
    monkeypatch.setattr(AppPaths, "default", classmethod(lambda cls: paths))
    monkeypatch.setattr(app_module, "setup_logging", lambda log_file: None)
    monkeypatch.setattr(app_module.MemraApp, "run", lambda self: seen.append(self.initial_grammar) or 0)
    assert main(["--regex", "[0-9]{4}"]) == 0
    assert seen == [Grammar.regex("[0-9]{4}")]


async def test_the_command_palette_goes_to_the_grammar_selector(make_app):
    app = make_app(Script(tokens_per_s=3000))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Grammar")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.focused, Select) and app.focused.id == "knob-grammar")
