"""Before an A/B run: reply A takes the chat's knobs, and this dialog shows B's as editable fields,
prefilled with A's and a new seed. Each field is checked as it is typed by the knobs pane's own
validator (SamplingParams.validate). Dismisses with B's SamplingParams, or None (Esc)."""
from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from memra_engine.sampling import SamplingParams
from memra_tui.widgets.fit_text import OneLine
from memra_tui.widgets.knobs import KNOBS, KnobValidator, parse_knob, show_knob


class ABKnobsScreen(ModalScreen[SamplingParams | None]):
    DEFAULT_CSS = """
    ABKnobsScreen { align: center middle; }
    ABKnobsScreen > Vertical { width: 64; max-width: 100%; height: auto; border: round $accent; padding: 0 1; }
    ABKnobsScreen .ab-a { color: $text-muted; }
    ABKnobsScreen .knob { height: 1; }
    ABKnobsScreen .knob > Label { width: 16; color: $text-muted; }
    ABKnobsScreen .knob > Label.-differs { color: $accent; text-style: bold; }
    ABKnobsScreen .knob > Input { width: 1fr; height: 1; border: none; padding: 0 1; background: $boost; }
    ABKnobsScreen .knob > Input:focus { background: $accent 30%; }
    ABKnobsScreen .knob > Input.-invalid { background: $error 35%; }
    ABKnobsScreen #ab-error { color: $error; height: auto; display: none; }
    ABKnobsScreen #ab-error.-shown { display: block; }
    ABKnobsScreen Horizontal.buttons { height: auto; align-horizontal: right; margin: 1 0 0 0; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "send", "Send A/B")]

    def __init__(self, a: SamplingParams, b: SamplingParams, a_summary: str) -> None:
        super().__init__()
        self.a = a
        self.params = b  # KnobValidator checks a field by putting it into this
        self.a_summary = a_summary

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("[b]A/B send[/b]: reply A takes your knobs, reply B these")
            yield OneLine(f"A: {self.a_summary}", separator="·", classes="ab-a")
            yield Label("B: (a name in colour differs from A)", classes="ab-a")
            for field, label, kind in KNOBS:
                with Horizontal(classes="knob"):
                    yield Label(label, id=f"ab-label-{field}")
                    yield Input(show_knob(getattr(self.params, field)), id=f"ab-knob-{field}", compact=True,
                                validators=[KnobValidator(self, field, kind)], validate_on=["changed", "submitted"])
            yield Static("", id="ab-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Send A/B (enter)", id="send", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self._mark_differences(self.params)
        self.query_one("#ab-knob-seed", Input).focus()

    def _read(self) -> tuple[SamplingParams | None, str, str]:
        """B's knobs from the fields; (None, field, reason) at the first that is not valid."""
        values = {}
        for field, _, kind in KNOBS:
            field_input = self.query_one(f"#ab-knob-{field}", Input)
            result = field_input.validate(field_input.value)
            if result is not None and not result.is_valid:
                return None, field, "; ".join(result.failure_descriptions)
            values[field] = parse_knob(kind, field_input.value)
        params = replace(self.params, **values)
        try:
            params.validate()
        except ValueError as e:
            return None, "", str(e)
        return params, "", ""

    def _mark_differences(self, b: SamplingParams) -> None:
        for field, _, _ in KNOBS:
            self.query_one(f"#ab-label-{field}", Label).set_class(getattr(b, field) != getattr(self.a, field),
                                                                 "-differs")

    def _show_error(self, reason: str) -> None:
        error = self.query_one("#ab-error", Static)
        error.update(f"✗ {reason} (not sent)" if reason else "")
        error.set_class(bool(reason), "-shown")

    @on(Input.Changed)
    def _edited(self, event: Input.Changed) -> None:
        event.stop()
        params, _, reason = self._read()
        self._show_error(reason)
        if params is not None:
            self.params = params
            self._mark_differences(params)

    @on(Input.Submitted)
    @on(Button.Pressed, "#send")
    def action_send(self) -> None:
        params, field, reason = self._read()
        if params is None:
            self._show_error(reason)
            if field:
                self.query_one(f"#ab-knob-{field}", Input).focus()
            return
        self.dismiss(params)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
