"""The sampling knobs, the grammar and speculative decoding. Each field is validated as it is
typed, using SamplingParams.validate() (SpecConfig.validate() for the draft length), so the pane and
the engine agree on what is allowed; an invalid value is refused with the reason. The grammar is the
chat screen's: the pane shows it and asks for a new one (GrammarChosen); a grammar that does not
build is refused where it is chosen. The spec mode offers a draft model only when one is loaded.
A knob the engine does not apply as given (the remote engine's extra fields,
EngineInfo.knob_notes) has a note under it saying what is sent, or that it is not sent."""
from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.validation import ValidationResult, Validator
from textual.widgets import Button, Input, Label, Select, Static

from memra_engine.errors import GrammarError
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams
from memra_engine.speculative import MAX_DRAFT, SpecConfig
from memra_tui.screens.grammar_pick import GrammarPickScreen
from memra_tui.settings import PRESETS

# (field, label, parser); the parser turns the field text into the SamplingParams value.
KNOBS = [
    ("temperature", "temperature", float),
    ("top_k", "top-k", int),
    ("top_p", "top-p", float),
    ("min_p", "min-p", float),
    ("repeat_penalty", "repeat penalty", float),
    ("repeat_last_n", "penalty last-n", int),
    ("presence_penalty", "presence pen.", float),
    ("frequency_penalty", "frequency pen.", float),
    ("seed", "seed", "seed"),
    ("max_tokens", "max tokens", int),
]
KNOB_KINDS = {field: kind for field, _, kind in KNOBS} | {"draft_max": int}  # draft_max is the SpecConfig's
GRAMMAR_CHOICES = [("off", "off"), ("JSON", "json"), ("JSON schema file…", "json_schema"), ("regex…", "regex"),
                   ("Lark file…", "lark"), ("GBNF file…", "gbnf")]
PICKED_KINDS = ("json_schema", "regex", "lark", "gbnf")  # these ask which file or pattern


def spec_choices(draft_model: str, remote: bool = False) -> list[tuple[str, str]]:
    """The spec modes this engine can run: a draft model only when one was loaded; on a remote
    server, none (speculative decoding is the server's)."""
    if remote:
        return [("off (server's)", "off")]
    choices = [("off", "off"), ("prompt lookup", "lookup")]
    return choices + [(f"draft: {draft_model}", "draft")] if draft_model else choices


def grammar_choice(grammar: Grammar | None) -> str:
    return "off" if grammar is None else grammar.kind


def grammar_detail(grammar: Grammar | None) -> str:
    """What the kind alone does not say: the file's name, or the pattern."""
    if grammar is None:
        return ""
    return grammar.name or (f"/{grammar.source}/" if grammar.kind == "regex" else "")


def parse_knob(kind, text: str):
    text = text.strip()
    if kind == "seed":
        return None if text in ("", "random") else int(text)
    return kind(text)


def show_knob(value) -> str:
    return "random" if value is None else str(value)


class KnobValidator(Validator):
    """Checks a field by putting it into the pane's current `target` ("params" or "spec") and
    asking that object's validate(): the engine's own rule and one-line message."""

    def __init__(self, pane: "KnobsPane", field: str, kind, target: str = "params") -> None:
        super().__init__()
        self.pane, self.field, self.kind, self.target = pane, field, kind, target

    def validate(self, value: str) -> ValidationResult:
        try:
            parsed = parse_knob(self.kind, value)
        except ValueError:
            expected = "an integer or 'random'" if self.kind == "seed" else f"a{'n integer' if self.kind is int else ' number'}"
            return self.failure(f"{self.field} must be {expected}")
        try:
            replace(getattr(self.pane, self.target), **{self.field: parsed}).validate()
        except ValueError as e:
            return self.failure(str(e))
        return self.success()


class KnobsPane(VerticalScroll):
    DEFAULT_CSS = """
    KnobsPane { height: 1fr; padding: 0 1; }
    KnobsPane .knob { height: 1; margin: 0 0 0 0; }
    KnobsPane .knob > Label { width: 16; color: $text-muted; }
    KnobsPane .knob > Input { width: 1fr; height: 1; border: none; padding: 0 1; background: $boost; }
    KnobsPane .knob > Input:focus { background: $accent 30%; }
    KnobsPane .knob > Input.-invalid { background: $error 35%; }
    KnobsPane .knob-error { color: $error; height: auto; display: none; }
    KnobsPane .knob-error.-shown { display: block; }
    KnobsPane .knob-note { color: $text-muted; height: auto; padding: 0 0 0 2; }
    KnobsPane .knob-note.-not-sent { color: $warning; }
    KnobsPane #presets { height: 1; margin: 1 0 0 0; }
    KnobsPane #presets > Button { min-width: 0; width: 1fr; height: 1; border: none; margin: 0 1 0 0; }
    KnobsPane .knob > Select { width: 1fr; }
    KnobsPane #knob-grammar, KnobsPane #knob-spec { height: 1; }
    KnobsPane SelectCurrent { border: none; height: 1; padding: 0 1; }
    KnobsPane #grammar-detail { display: none; }
    KnobsPane #grammar-detail.-shown { display: block; }
    KnobsPane #grammar-source { width: 1fr; height: 1; padding: 0 0 0 2; color: $text-muted;
                                text-wrap: nowrap; text-overflow: ellipsis; }
    KnobsPane #grammar-change { min-width: 0; width: auto; height: 1; border: none; margin: 0 0 0 1; }
    """

    params: reactive[SamplingParams] = reactive(SamplingParams, init=False)
    grammar: reactive[Grammar | None] = reactive(None, init=False)  # bound to the chat screen's
    spec: reactive[SpecConfig] = reactive(SpecConfig, init=False)

    class Changed(Message):
        """The knobs now hold a new, valid set of parameters."""

        def __init__(self, params: SamplingParams) -> None:
            super().__init__()
            self.params = params

    class GrammarChosen(Message):
        """The user chose a grammar that builds (None: off), for the replies from the next one on."""

        def __init__(self, grammar: Grammar | None) -> None:
            super().__init__()
            self.grammar = grammar

    class SpecChanged(Message):
        """The spec mode or draft length changed to a new, valid SpecConfig."""

        def __init__(self, spec: SpecConfig) -> None:
            super().__init__()
            self.spec = spec

    def __init__(self, params: SamplingParams, grammar: Grammar | None = None, spec: SpecConfig | None = None,
                 draft_model: str = "", knob_notes: dict[str, str] | None = None, remote: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.set_reactive(KnobsPane.params, params)
        self.set_reactive(KnobsPane.grammar, grammar)
        self.set_reactive(KnobsPane.spec, spec or SpecConfig())
        self.draft_model = draft_model  # the loaded draft model's name, "" for none
        self.knob_notes = knob_notes or {}  # knob -> what the engine does with it (EngineInfo.knob_notes)
        self.remote = remote

    def compose(self) -> ComposeResult:
        with Horizontal(id="presets"):
            for name in PRESETS:
                yield Button(name, id=f"preset-{name}", compact=True)
        for field, label, kind in KNOBS:
            with Horizontal(classes="knob"):
                yield Label(label)
                yield Input(show_knob(getattr(self.params, field)), id=f"knob-{field}", compact=True,
                            validators=[KnobValidator(self, field, kind)], validate_on=["changed", "submitted"])
            yield Static("", id=f"error-{field}", classes="knob-error")
            if note := self.knob_notes.get(field):
                yield Static(note, id=f"note-{field}", markup=False,
                             classes="knob-note -not-sent" if note.startswith("✗") else "knob-note")
        with Horizontal(classes="knob"):
            yield Label("grammar")
            yield Select(GRAMMAR_CHOICES, value=grammar_choice(self.grammar), allow_blank=False, id="knob-grammar",
                         compact=True)
        with Horizontal(classes="knob", id="grammar-detail"):
            yield Static("", id="grammar-source", markup=False)
            yield Button("change…", id="grammar-change", compact=True)
        yield Static("", id="error-grammar", classes="knob-error", markup=False)
        with Horizontal(classes="knob"):
            yield Label("speculative")
            yield Select(spec_choices(self.draft_model, self.remote), value=self.spec.mode, allow_blank=False,
                         id="knob-spec", compact=True)
        with Horizontal(classes="knob"):
            yield Label("draft max")
            yield Input(str(self.spec.draft_max), id="knob-draft_max", compact=True,
                        validators=[KnobValidator(self, "draft_max", int, "spec")],
                        validate_on=["changed", "submitted"], tooltip=f"most tokens drafted per round, 1 to {MAX_DRAFT}")
        yield Static("", id="error-draft_max", classes="knob-error")

    def on_mount(self) -> None:
        self._show_grammar(self.grammar)

    def _field_of(self, field_input: Input):
        field = (field_input.id or "").removeprefix("knob-")
        kind = KNOB_KINDS.get(field)
        return (field, kind) if kind is not None else (None, None)

    @on(Input.Changed)
    def _field_edited(self, event: Input.Changed) -> None:
        """Say at once whether the text is acceptable; apply it only when the user is done."""
        field, _ = self._field_of(event.input)
        if field is None:
            return
        event.stop()
        error = self.query_one(f"#error-{field}", Static)
        result = event.validation_result
        if result is not None and not result.is_valid:
            error.update("✗ " + "; ".join(result.failure_descriptions) + " (not applied)")
            error.add_class("-shown")
        else:
            error.remove_class("-shown")

    @on(Input.Submitted)
    @on(Input.Blurred)
    def _field_done(self, event: Input.Submitted | Input.Blurred) -> None:
        # Applying on each keystroke would apply "1" on the way to typing "1.7"; so a value applies
        # on Enter or when the field loses focus, and only if it is valid.
        field, kind = self._field_of(event.input)
        if field is None:
            return
        event.stop()
        result = event.input.validate(event.input.value)
        if result is not None and not result.is_valid:
            return
        value = parse_knob(kind, event.input.value)
        if field == "draft_max":
            if value != self.spec.draft_max:
                self.spec = replace(self.spec, draft_max=value)
            return
        new = replace(self.params, **{field: value})
        if new != self.params:
            self.params = new

    def watch_params(self, params: SamplingParams) -> None:
        self.post_message(self.Changed(params))

    @on(Button.Pressed)
    def _preset_pressed(self, event: Button.Pressed) -> None:
        name = (event.button.id or "").removeprefix("preset-")
        if name in PRESETS:
            event.stop()
            self.apply(PRESETS[name])
            self.notify(f"preset {name}", timeout=2)

    def apply(self, params: SamplingParams) -> None:
        """Show `params` in every field and make them current."""
        self.params = params
        for field, _, _ in KNOBS:
            self.query_one(f"#knob-{field}", Input).value = show_knob(getattr(params, field))

    # -- grammar ---------------------------------------------------------------------------------
    def watch_grammar(self, grammar: Grammar | None) -> None:
        self._show_grammar(grammar)

    def _show_grammar(self, grammar: Grammar | None) -> None:
        with self.prevent(Select.Changed):  # showing the grammar is not choosing one
            self.query_one("#knob-grammar", Select).value = grammar_choice(grammar)
        self.query_one("#grammar-source", Static).update(grammar_detail(grammar))
        self.query_one("#grammar-detail").set_class(grammar is not None and grammar.kind in PICKED_KINDS, "-shown")

    @on(Select.Changed, "#knob-grammar")
    def _grammar_kind_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if event.value == grammar_choice(self.grammar):
            return  # the Select was set to what is already active (on mount)
        self.query_one("#error-grammar", Static).remove_class("-shown")
        if event.value in PICKED_KINDS:
            self._pick_grammar(str(event.value))
            return
        try:
            grammar = Grammar.json() if event.value == "json" else None
        except GrammarError as e:
            self._refuse_grammar(str(e))
            return
        self.post_message(self.GrammarChosen(grammar))

    @on(Button.Pressed, "#grammar-change")
    def _change_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if self.grammar is not None:
            self._pick_grammar(self.grammar.kind)

    def _pick_grammar(self, kind: str) -> None:
        def picked(grammar: Grammar | None) -> None:
            if grammar is None:  # cancelled: the grammar stays as it was
                self._show_grammar(self.grammar)
            else:
                self.post_message(self.GrammarChosen(grammar))

        self.app.push_screen(GrammarPickScreen(kind, self.grammar), picked)

    def _refuse_grammar(self, message: str) -> None:
        error = self.query_one("#error-grammar", Static)
        error.update(f"✗ {message} (not applied)")
        error.add_class("-shown")
        self._show_grammar(self.grammar)

    # -- speculative decoding --------------------------------------------------------------------
    def watch_spec(self, spec: SpecConfig) -> None:
        self.post_message(self.SpecChanged(spec))

    @on(Select.Changed, "#knob-spec")
    def _spec_mode_chosen(self, event: Select.Changed) -> None:
        event.stop()
        if event.value != self.spec.mode:  # not the Select being set to the current mode (on mount)
            self.spec = replace(self.spec, mode=str(event.value))
