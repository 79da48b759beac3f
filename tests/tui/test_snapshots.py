"""Snapshot tests (pytest-textual-snapshot): the app's main states, drawn with the scripted engine.

Regenerate with `pytest tests/tui --snapshot-update` and look at the SVGs before committing them.
"""
from __future__ import annotations

from textual.widgets import Input
from tui_helpers import EPOCH, FixedClock, hold_still, send, wait_for, wait_ready

from memra_engine.speculative import SpecConfig
from memra_tui.chats import ChatMessage, ChatStore
from memra_tui.scripted_engine import Script

DRAFT = "models/smol-draft.gguf"


async def _chat_mid_stream(pilot) -> None:
    """Two finished replies, then a third held after four tokens, panes showing its numbers."""
    app = pilot.app
    await wait_ready(pilot)
    await send(pilot, "hello")
    await send(pilot, "list three things")
    await send(pilot, "and a short one", wait_done=False)
    await wait_for(pilot, lambda: len(app.engine.jobs[2].emitted) == 4)
    await wait_for(pilot, lambda: app.screen.query_one("#context-numbers").render() is not None)
    await pilot.pause(0.3)  # past the stats throttle, so the panes show the held job's numbers
    await hold_still(pilot)


def mid_stream_app(make_app):
    """A GPU, an MoE model and a draft model drafting: every pane has numbers. Stats only at a
    reply's end (and at the hold): how many updates the panes see mid-reply depends on timing, and
    the MoE pane's sparkline has a point per update."""
    return make_app(Script(tokens_per_s=3000, backend="cuda", moe=True, pause_at={2: 4}, stats_every=1000),
                    draft=DRAFT, spec=SpecConfig("draft"))


def test_idle_chat(snap_compare, make_app):
    async def run_before(pilot):
        await wait_ready(pilot)
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(120, 36), run_before=run_before)


def test_reply_mid_stream_with_panes(snap_compare, make_app):
    assert snap_compare(mid_stream_app(make_app), terminal_size=(130, 44), run_before=_chat_mid_stream)


def test_speculative_pane_after_many_rounds(snap_compare, make_app):
    """A draft model well into a long reply: acceptance falls with the draft position."""
    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, "a long one", wait_done=False)
        await wait_for(pilot, lambda: len(pilot.app.engine.jobs[0].emitted) == 150)
        await pilot.pause(0.3)  # past the stats throttle
        await hold_still(pilot)

    script = Script(tokens_per_s=3000, backend="cuda", n_tokens=200, pause_at={0: 150})
    app = make_app(script, draft=DRAFT, spec=SpecConfig("draft", draft_max=6))
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_cpu_backend_panes_show_process_memory(snap_compare, make_app):
    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, "hello")
        await pilot.pause(0.3)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(120, 36), run_before=run_before)


def test_knobs_invalid_value_refused(snap_compare, make_app):
    async def run_before(pilot):
        await wait_ready(pilot)
        await pilot.press("f3")
        top_p = pilot.app.screen.query_one("#knob-top_p", Input)
        top_p.focus()
        top_p.value = ""
        await pilot.press("1", ".", "7")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(120, 36), run_before=run_before)


def test_chat_list(snap_compare, make_app, paths):
    store = ChatStore(paths.chats_dir, paths.exports_dir, FixedClock(EPOCH - 86_400))
    for title, n in (("Rust lifetimes", 6), ("Dinner ideas", 2), ("Fix the CUDA graph bug", 12)):
        chat = store.new_chat("/models/SmolLM2-135M-Instruct.Q4_1.gguf", {})
        chat.title = title
        chat.messages = [ChatMessage("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]
        store.save(chat)

    async def run_before(pilot):
        await wait_ready(pilot)
        await pilot.press("f4")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(120, 30), run_before=run_before)


def test_help_screen(snap_compare, make_app):
    async def run_before(pilot):
        await wait_ready(pilot)
        await pilot.press("f1")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(100, 44), run_before=run_before)


def test_load_error_screen(snap_compare, make_app):
    script = Script(fail_paths={"models/broken.gguf": "models/broken.gguf: not a GGUF file (bad magic b'not ')"})

    async def run_before(pilot):
        from memra_tui.screens.load_error import LoadErrorScreen

        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LoadErrorScreen))
        await pilot.pause(0.3)
        await hold_still(pilot)

    app = make_app(script, model="models/broken.gguf")
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_layout_80x24(snap_compare, make_app):
    assert snap_compare(mid_stream_app(make_app), terminal_size=(80, 24), run_before=_chat_mid_stream)


def test_layout_80x24_with_panes(snap_compare, make_app):
    async def run_before(pilot):
        await _chat_mid_stream(pilot)
        await pilot.press("f2")
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(mid_stream_app(make_app), terminal_size=(80, 24), run_before=run_before)


def test_structured_reply_cut_short(snap_compare, make_app, paths):
    """A JSON schema from the command line: the header names it, the knobs pane shows it, and a
    reply cut at max tokens says the structured reply is incomplete."""
    from memra_engine.grammar import Grammar
    from memra_engine.sampling import SamplingParams
    from memra_tui.screens.grammar_pick import example_grammars
    from memra_tui.settings import save_sampling_defaults

    save_sampling_defaults(paths, SamplingParams(max_tokens=6))
    (person,) = example_grammars("json_schema")

    async def run_before(pilot):
        await wait_ready(pilot)
        await send(pilot, "who are you?")
        await pilot.press("f3")
        await pilot.pause(0.2)
        await hold_still(pilot)

    app = make_app(Script(tokens_per_s=3000), grammar=Grammar.from_file(person, kind="json_schema"))
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_grammar_picker_offers_the_examples(snap_compare, make_app):
    async def run_before(pilot):
        from textual.widgets import Select

        await wait_ready(pilot)
        await pilot.press("f3")
        pilot.app.screen.query_one("#knob-grammar", Select).value = "json_schema"
        # the picker focuses its examples when it mounts: only then move to the text field
        await wait_for(pilot, lambda: pilot.app.screen.query("#grammar-examples") and pilot.app.screen.query_one(
            "#grammar-examples").has_focus)
        field = pilot.app.screen.query_one("#grammar-text")
        field.focus()
        await wait_for(pilot, lambda: field.has_focus)
        await pilot.press("enter")  # nothing typed: the screen says what it needs
        await pilot.pause(0.2)
        await hold_still(pilot)

    assert snap_compare(make_app(Script(tokens_per_s=3000)), terminal_size=(100, 30), run_before=run_before)
