"""How many tokens a conversation takes in the context, for the Context pane before any reply
(say, after --resume, when the engine has not reported a prompt yet).

The engine has no public call for this (its tokenizer and template live on its own thread), so
an engine that offers `count_tokens(messages) -> int` is asked, and otherwise the conversation is
counted here as the engine builds a prompt (engine/generate.py Generation.prompt_tokens): the
model's chat template over the messages (without a generation prompt: the conversation as it sits
in the context after its last turn), or in completion mode the turns joined by blank lines,
encoded with the model's own tokenizer read from the same GGUF file.
"""
from __future__ import annotations

from pathlib import Path


class PromptCounter:
    """The tokenizer and chat template of one GGUF file, read once."""

    def __init__(self, path: str | Path) -> None:
        from memra_engine.chat_template import ChatTemplate
        from memra_engine.model.gguf_file import open_gguf
        from memra_engine.tokenizer import load_tokenizer

        g = open_gguf(Path(path))
        self.tokenizer = load_tokenizer(g)
        self.template = ChatTemplate.from_gguf(g)

    def count(self, messages: list[dict], add_generation_prompt: bool = False) -> int:
        """add_generation_prompt: True counts the prompt of a reply to `messages`, as the engine does."""
        if not messages:
            return 0
        if self.template is not None:
            text = self.template.render(messages, add_generation_prompt=add_generation_prompt)
        else:
            text = "\n\n".join(str(m.get("content", "")) for m in messages)
        ids = self.tokenizer.encode(text, add_special=True)
        bos = self.tokenizer.bos_id
        if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]  # the template wrote BOS itself and the tokenizer added another
        return len(ids)


def model_file(model: str | None) -> Path:
    """The GGUF the engine loaded for `model` (None: the default model, already in the cache)."""
    if model:
        return Path(model)
    from memra_engine.default_model import ensure_default_model

    return Path(ensure_default_model(lambda msg: None))


_counters: dict[Path, PromptCounter] = {}  # the last model's, so reopening a chat does not read it again


def count_tokens(engine, model: str | None, messages: list[dict]) -> int:
    """Tokens the conversation `messages` takes in the context."""
    ask = getattr(engine, "count_tokens", None)
    if callable(ask):
        return int(ask(messages))
    path = model_file(model).resolve()
    counter = _counters.get(path)
    if counter is None:
        counter = PromptCounter(path)
        _counters.clear()
        _counters[path] = counter
    return counter.count(messages)
