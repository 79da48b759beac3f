"""Every grammar kind on the default model (SmolLM2-135M-Instruct) at temperature 1.5, 20 seeds each:
every reply ends because the grammar is complete, and parses by a tool other than llguidance
(json.loads, the jsonschema package, re.fullmatch, the lark package). The grammars are the ones
the app ships in assets/grammars."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import lark
import pytest

from memra_engine.generate import Engine
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams

pytestmark = pytest.mark.slow

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "grammars"
SEEDS = range(20)
# temperature 1.5 with the default filters (what a user gets by turning up one knob): the draw
# leaves the model's favourite often, which is what a mask has to survive. (With no filters at
# all, a 135M model at 1.5 fills an unbounded JSON string with noise until max_tokens.)
HOT = dict(temperature=1.5)
# shopping_list.gbnf, written as a regex for an independent check
SHOPPING_LIST = r"(- [a-z]+( [a-z]+)?( [a-z]+)?\n){1,8}"


@pytest.fixture(scope="module")
def engine(smollm2_path):
    with Engine.load(smollm2_path, backend="cpu", n_ctx=1024) as eng:
        yield eng


def replies(engine, grammar, prompt, max_tokens):
    out = []
    for seed in SEEDS:
        result = engine.chat([{"role": "user", "content": prompt}],
                             SamplingParams(**HOT, seed=seed, max_tokens=max_tokens), grammar=grammar).collect()
        assert result.done.reason == "eos", (seed, result.done, result.text)
        out.append(result.text)
    return out


def test_any_json(engine):
    # JSON whitespace is llguidance's flexible kind, which is unbounded: on some prompts a seed
    # at 1.5 fills it with tabs until max_tokens (the reply is then cut, not invalid). On this one
    # all 20 replies close; two take 270-340 tokens.
    prompt = 'Reply with a short JSON object: {"answer": ...}. What color is the sky?'
    for text in replies(engine, Grammar.json(), prompt, 500):
        assert isinstance(json.loads(text), dict), text


def test_json_schema(engine):
    schema = json.loads((ASSETS / "person.json").read_text())
    for text in replies(engine, Grammar.from_file(ASSETS / "person.json"), "Invent a person. Reply in JSON.", 200):
        jsonschema.validate(json.loads(text), schema)


def test_regex(engine):
    pattern = (ASSETS / "iso_date.regex").read_text().strip()
    for text in replies(engine, Grammar.from_file(ASSETS / "iso_date.regex"), "When did the Berlin wall fall?", 20):
        assert re.fullmatch(pattern, text), text


def test_lark(engine):
    parser = lark.Lark((ASSETS / "arithmetic.lark").read_text(), start="start")
    for text in replies(engine, Grammar.from_file(ASSETS / "arithmetic.lark"), "Write a sum.", 60):
        parser.parse(text)  # raises on text outside the grammar


def test_gbnf(engine):
    for text in replies(engine, Grammar.from_file(ASSETS / "shopping_list.gbnf"), "What do I buy for a cake?", 100):
        assert re.fullmatch(SHOPPING_LIST, text), text
