"""Chat templates: SmolLM2's own template rendered exactly, the helpers templates expect, and
templates that misbehave (hostile or raising) refused with a one-line TemplateError."""
from __future__ import annotations

import json
from datetime import datetime

import pytest

from memra_engine.chat_template import ChatTemplate
from memra_engine.errors import TemplateError
from memra_engine.model.gguf_file import open_gguf

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(scope="session")
def smollm2_template(smollm2_path):
    template = ChatTemplate.from_gguf(open_gguf(smollm2_path))
    assert template is not None
    return template


def test_smollm2_renders_system_user_assistant_turns(smollm2_template):
    assert smollm2_template.render(CONVERSATION, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    )


def test_smollm2_generation_prompt_opens_the_assistant_turn(smollm2_template):
    with_prompt = smollm2_template.render(CONVERSATION, add_generation_prompt=True)
    without = smollm2_template.render(CONVERSATION, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert smollm2_template.render(CONVERSATION) == with_prompt   # the default: we are about to generate


def test_smollm2_adds_its_default_system_prompt(smollm2_template):
    rendered = smollm2_template.render([{"role": "user", "content": "Hi"}])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_special_tokens_come_from_the_vocabulary(smollm2_template):
    assert smollm2_template.bos_token == "<|im_start|>"
    assert smollm2_template.eos_token == "<|im_end|>"


def test_model_without_template_is_completion_mode(gemma3_path):
    assert ChatTemplate.from_gguf(open_gguf(gemma3_path)) is None
    assert ChatTemplate.from_gguf({"tokenizer.chat_template": "  "}) is None
    assert ChatTemplate.from_gguf({}) is None


def test_bos_eos_and_helpers_are_available():
    metadata = {
        "tokenizer.ggml.tokens": ["<s>", "</s>", "x"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.chat_template": (
            "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}"
            "|{{ strftime_now('%Y') }}|{{ eos_token }}"
        ),
    }
    rendered = ChatTemplate.from_gguf(metadata).render([{"role": "user", "content": "<a & \"b\"> é"}])
    # tojson keeps <, & and non-ASCII as they are (jinja's own filter would HTML-escape them)
    assert rendered == "<s>" + json.dumps("<a & \"b\"> é", ensure_ascii=False) + f"|{datetime.now().year}|</s>"


def test_trim_blocks_and_loop_controls_match_transformers():
    source = (
        "{% for m in messages %}\n"
        "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "    {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "[{{ m.role }}]\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}GO{% endif %}"
    )
    messages = [{"role": "a"}, {"role": "skip"}, {"role": "c"}]
    assert ChatTemplate(source).render(messages) == "[a]\nGO"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__['os'] }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages.append({'role': 'user'}) }}",
    "{% import 'os' as os %}{{ os.system('true') }}",
    "{% from 'subprocess' import run %}",
    "{% include '/etc/passwd' %}",
    "{% extends 'base.html' %}",
])
def test_hostile_template_is_refused(source):
    with pytest.raises(TemplateError, match="refused") as err:
        ChatTemplate(source).render(CONVERSATION)
    assert "\n" not in str(err.value)


def test_raise_exception_gives_its_message():
    source = (
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="System role not supported"):
        ChatTemplate(source).render(CONVERSATION)
    assert ChatTemplate(source).render(CONVERSATION[1:]) == ""


def test_syntax_error_is_one_line():
    with pytest.raises(TemplateError, match="syntax error at line 3") as err:
        ChatTemplate("ok\n{% for m in messages %}\n{{ m }")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("source", ["{{ undefined_name + 1 }}", "{{ 1 / 0 }}", "{{ messages[0].content + 1 }}"])
def test_template_runtime_failure_is_one_line(source):
    with pytest.raises(TemplateError, match="chat template failed") as err:
        ChatTemplate(source).render(CONVERSATION)
    assert "\n" not in str(err.value)
