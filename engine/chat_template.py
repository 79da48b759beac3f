"""Render the model's own chat template (tokenizer.chat_template, Jinja) into a prompt string.

A template comes from the model file, so it is untrusted code. It runs in jinja2's
ImmutableSandboxedEnvironment with the helpers transformers gives templates (raise_exception,
strftime_now, a tojson that does not HTML-escape, the {% generation %} tag), and the same
trim_blocks / lstrip_blocks whitespace rules, so a template renders here exactly as it does in
transformers. Any failure — a syntax error, a refused attribute, raise_exception, a type error
inside the template, a bound (engine/template_sandbox.py) — becomes one TemplateError with a one-line message, raised by
render(); the same ChatTemplate renders the next turn as if nothing happened.

The sandbox and its bounds are in engine/template_sandbox.py.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping

from memra_engine.errors import TemplateError
from memra_engine.template_sandbox import (COMPILE_SECONDS, INPUT_SIZE_FACTOR, MADE_FACTOR, MAX_SOURCE,
                                           MIN_SIZE_LIMIT, RENDER_SECONDS, Bounded, Bounds, OutOfTime,
                                           TooLarge, count_text, failure, make_environment)

__all__ = ["ChatTemplate", "RENDER_SECONDS", "COMPILE_SECONDS", "MAX_SOURCE", "MIN_SIZE_LIMIT"]


class ChatTemplate:
    """One model's chat template, compiled once."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        """Raises TemplateError when the source does not compile (within COMPILE_SECONDS)."""
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._error: TemplateError | None = None
        if len(source) > MAX_SOURCE:
            raise TemplateError(f"chat template is {count_text(len(source))} characters, over the limit of {count_text(MAX_SOURCE)}")
        try:
            with Bounded(Bounds(MIN_SIZE_LIMIT, COMPILE_SECONDS)):
                self._template = make_environment().from_string(source)
        except (Exception, OutOfTime) as e:
            raise failure(e, COMPILE_SECONDS) from None

    @classmethod
    def from_gguf(cls, g_or_metadata: Any) -> ChatTemplate | None:
        """The template of a GGUF (an open GGUFFile or its metadata mapping); None when the model has
        none, which means completion mode. A template that does not compile still loads: each
        render then raises its TemplateError, so the model stays usable with plain prompts."""
        metadata: Mapping[str, Any] = getattr(g_or_metadata, "metadata", g_or_metadata)
        source = metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            return None
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def token(key: str) -> str:
            token_id = metadata.get(f"tokenizer.ggml.{key}")
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else ""

        try:
            return cls(source, bos_token=token("bos_token_id"), eos_token=token("eos_token_id"))
        except TemplateError as e:
            broken = cls.__new__(cls)
            broken.source, broken.bos_token, broken.eos_token = source, token("bos_token_id"), token("eos_token_id")
            broken._error = e
            return broken

    @property
    def error(self) -> TemplateError | None:
        """Why this template cannot render anything (it did not compile), or None."""
        return self._error

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for a conversation. messages: [{"role": ..., "content": ...}, ...].
        extra: further template variables some templates read (tools, documents, ...).
        Raises TemplateError (one line) for anything the template does wrong, within
        RENDER_SECONDS and the size limit; the same template can render the next turn."""
        if self._error is not None:
            raise TemplateError(str(self._error))
        variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        bounds = Bounds(MIN_SIZE_LIMIT, RENDER_SECONDS)
        bounds.limit = MIN_SIZE_LIMIT + INPUT_SIZE_FACTOR * bounds.size(variables, sys.maxsize)
        bounds.made_limit = bounds.limit * MADE_FACTOR
        pieces: list[str] = []
        total = 0
        gen = None
        try:
            with Bounded(bounds):
                gen = self._template.generate(**variables)
                for piece in gen:
                    total += len(piece)
                    if total > bounds.limit:
                        raise TooLarge(f"the prompt would be over {count_text(bounds.limit)} characters")
                    pieces.append(piece)
                    bounds.tick()
        except (Exception, OutOfTime) as e:
            raise failure(e, RENDER_SECONDS) from None
        finally:
            if gen is not None:
                gen.close()
        return "".join(pieces)
