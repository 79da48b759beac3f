"""How memra's knobs and grammars become fields of an OpenAI-compatible request (engine/remote.py).

temperature, top_p, seed, max_tokens, presence_penalty and frequency_penalty are standard fields.
top_k, min_p and the repeat penalty are not: llama-server, vLLM and SGLang accept them as extra
fields, under their own names. What each server kind gets:

| knob | llama.cpp | vLLM, SGLang | another server |
|---|---|---|---|
| top_k, min_p | top_k, min_p, always | top_k, min_p, when not off | the same, when not off (it may ignore them) |
| repeat_penalty | repeat_penalty, always | repetition_penalty, when not off | repetition_penalty, when not off |
| repeat_last_n | repeat_last_n, always | not sent (the penalties see the whole text) | not sent |

llama-server applies its own defaults (top_k 40, min_p 0.05, a 64-token window) to a field that
is missing, so it is sent every knob; to the others an "off" knob is left out, which is their
default, and a strict server then never sees a field it might refuse. Each non-standard knob
has a note for the knobs pane: the field it goes in ("→ top_k"), or that it is not sent ("✗").
"""
from __future__ import annotations

import json

from memra_engine.errors import GrammarError
from memra_engine.grammar import Grammar
from memra_engine.sampling import SamplingParams

LLAMA_CPP, VLLM, SGLANG, OTHER = "llama.cpp", "vLLM", "SGLang", "OpenAI-compatible"
OWNERS = {"llamacpp": LLAMA_CPP, "llama.cpp": LLAMA_CPP, "vllm": VLLM, "sglang": SGLANG}

STANDARD = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "max_tokens")
OFF = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}


def server_kind(owned_by: str) -> str:
    """The server kind from /v1/models' `owned_by` ("llamacpp", "vllm", "sglang"; else OTHER)."""
    return OWNERS.get(owned_by.strip().lower(), OTHER)


def extra_names(kind: str) -> dict[str, str | None]:
    """knob -> the field it is sent as on this kind of server (None: not sent)."""
    if kind == LLAMA_CPP:
        return {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n"}
    return {"top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repetition_penalty", "repeat_last_n": None}


def knob_notes(kind: str) -> tuple[tuple[str, str], ...]:
    """(knob, note) for every knob that is not a standard field: what this server kind is sent."""
    notes = []
    for knob, name in extra_names(kind).items():
        if name is None:  # vLLM's and SGLang's penalties see the whole text
            notes.append((knob, "✗ not sent (no such field)"))
        elif kind == LLAMA_CPP:
            notes.append((knob, f"→ {name} (llama-server)"))
        elif kind in (VLLM, SGLANG):
            notes.append((knob, f"→ {name} if not off"))
        else:
            notes.append((knob, f"→ {name} if not off; may be ignored"))
    return tuple(notes)


def sampling_fields(params: SamplingParams, kind: str) -> dict:
    """The request fields for these knobs on this kind of server."""
    body = {"temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_tokens,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty}
    if params.seed is not None:
        body["seed"] = params.seed
    for knob, name in extra_names(kind).items():
        value = getattr(params, knob)
        if name is None or (kind != LLAMA_CPP and value == OFF.get(knob)):
            continue
        body[name] = value
    return body


def grammar_fields(grammar: Grammar | None, kind: str) -> dict:
    """response_format for JSON and JSON schemas; llama-server's own `grammar` field for GBNF.
    GrammarError with one line when this server cannot take the grammar."""
    if grammar is None:
        return {}
    if grammar.kind == "json":
        return {"response_format": {"type": "json_object"}}
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source)
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "reply", "schema": schema, "strict": True}}}
    if grammar.kind == "gbnf" and kind == LLAMA_CPP:
        return {"grammar": grammar.source}
    can = "JSON, JSON schemas and GBNF" if kind == LLAMA_CPP else "JSON and JSON schemas"
    raise GrammarError(f"a {grammar.label} grammar cannot be sent to this {kind} server ({can} can)")
