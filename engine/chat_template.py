"""Render the model's own chat template (tokenizer.chat_template, Jinja) into a prompt string.

A template comes from the model file, so it is untrusted code. It runs in jinja2's
ImmutableSandboxedEnvironment with the helpers transformers gives templates (raise_exception,
strftime_now, a tojson that does not HTML-escape), and the same trim_blocks / lstrip_blocks
whitespace rules, so a template renders here exactly as it does in transformers. Any failure —
a syntax error, a refused attribute, raise_exception, a type error inside the template — becomes
one TemplateError with a one-line message.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from memra_engine.errors import TemplateError


class _RaisedByTemplate(Exception):
    """raise_exception() was called: the template itself rejected the conversation."""


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The stock sandbox answers `x.__class__` with an undefined value that only fails when used,
    so `{{ x.__class__ }}` would quietly print nothing. Refuse the access itself instead."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed")


class _NoImports(jinja2.BaseLoader):
    """{% import %}, {% include %} and {% extends %} would reach outside the one template string."""

    def get_source(self, environment: jinja2.Environment, template: str):
        raise SecurityError(f"templates may not import, include or extend {template!r}")


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes <, > and &, which would corrupt prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _make_environment() -> jinja2.Environment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                         loader=_NoImports())
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One model's chat template, compiled once."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template has a syntax error at line {e.lineno}: {_one_line(e.message)}") from None
        except Exception as e:
            raise TemplateError(f"chat template cannot be compiled: {_one_line(e)}") from None

    @classmethod
    def from_gguf(cls, g_or_metadata: Any) -> ChatTemplate | None:
        """The template of a GGUF (an open GGUFFile or its metadata mapping); None when the model has
        none, which means completion mode. Raises TemplateError if the template does not compile."""
        metadata: Mapping[str, Any] = getattr(g_or_metadata, "metadata", g_or_metadata)
        source = metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            return None
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def token(key: str) -> str:
            token_id = metadata.get(f"tokenizer.ggml.{key}")
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else ""

        return cls(source, bos_token=token("bos_token_id"), eos_token=token("eos_token_id"))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for a conversation. messages: [{"role": ..., "content": ...}, ...].
        extra: further template variables some templates read (tools, documents, ...)."""
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except _RaisedByTemplate as e:
            raise TemplateError(f"chat template error: {_one_line(e)}") from None
        except SecurityError as e:
            raise TemplateError(f"chat template refused: {_one_line(e)}") from None
        except Exception as e:  # whatever the template's own code trips over (Undefined, TypeError, ...)
            raise TemplateError(f"chat template failed: {type(e).__name__}: {_one_line(e)}") from None
