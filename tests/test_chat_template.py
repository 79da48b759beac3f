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


# ---------------------------------------------------------------------------------------- hostile corpus
# tests/hostile_templates/*.jinja: one template each, its first line `{#- expect: REGEX -#}` the
# one-line error it must end in. Every one must stop within the time bound, with bounded memory,
# and leave the thread able to render a sane template right after.

import re  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from memra_engine import chat_template as chat_template_module  # noqa: E402
from memra_engine.errors import MemraError  # noqa: E402

CORPUS = sorted((Path(__file__).parent / "hostile_templates").glob("*.jinja"))
# RENDER_SECONDS plus slack for a loaded 2-core machine (the corpus sources are small: they
# compile in milliseconds; the compile deadline has its own test)
TIME_BOUND = chat_template_module.RENDER_SECONDS + 1.5
MEMORY_BOUND = 512 << 20   # growth of the process's peak RSS during one hostile template
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _expected(path: Path) -> str:
    m = re.match(r"\{#- expect: (.*?) -#\}", path.read_text())
    assert m, f"{path.name} has no expect line"
    return m.group(1)


def _reset_peak_rss() -> int:
    """The process's peak RSS in bytes, after resetting the high-water mark to the current RSS
    (clear_refs 5), so that growth is measured from now: a peak left by an earlier test in the
    same process (torch, the oracle models) would otherwise hide any growth below it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _hwm()


def _hwm() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))   # kB


def _sane_render_works() -> None:
    assert ChatTemplate(CHATML).render(CONVERSATION[1:2]) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_corpus_is_large_and_covers_every_kind():
    names = [p.stem for p in CORPUS]
    assert len(names) >= 60
    for kind in ("escape_", "loop_", "big_", "recursion_", "syntax_", "undefined_", "raise_exception"):
        assert any(n.startswith(kind) for n in names), kind


@pytest.fixture
def address_space_cap():
    """While a hostile template runs, the process may not grow by more than 2 GiB of address space:
    should a bound regress, the test fails with MemoryError instead of thrashing a shared machine."""
    with open("/proc/self/status") as f:
        vm_size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm_size + (2 << 30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_hostile_template_stops_with_one_line_error(path, address_space_cap):
    trace_before, recursion_before, rss_before = sys.gettrace(), sys.getrecursionlimit(), _reset_peak_rss()
    start = time.monotonic()
    with pytest.raises(TemplateError) as err:
        ChatTemplate(path.read_text()).render(CONVERSATION)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert isinstance(err.value, MemraError)
    assert re.search(_expected(path), message), message
    assert message.startswith("chat template") and "\n" not in message and len(message) < 400
    assert elapsed < TIME_BOUND, f"took {elapsed:.2f} s"
    assert _hwm() - rss_before < MEMORY_BOUND
    # the thread is healthy: our trace function is gone, the recursion limit as it was, and a
    # sane template renders
    assert sys.gettrace() is trace_before and sys.getrecursionlimit() == recursion_before
    _sane_render_works()


def test_escape_side_effect_did_not_happen():
    assert not Path("/tmp/memra_pwned").exists()


def test_same_template_renders_the_next_turn_after_a_failure():
    source = ("{% if messages[-1].content == 'boom' %}{{ 'x' * 10**10 }}{% endif %}"
              "{% if messages[-1].content == 'spin' %}{% for i in range(99999) %}{% for j in range(99999) %}"
              "{% endfor %}{% endfor %}{% endif %}" + CHATML)
    template = ChatTemplate(source)
    with pytest.raises(TemplateError, match="over the limit"):
        template.render([{"role": "user", "content": "boom"}])
    with pytest.raises(TemplateError, match="ran longer than"):
        template.render([{"role": "user", "content": "spin"}])
    assert template.render([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_recursion_on_another_thread_like_the_engine_thread():
    source = "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}"
    results = []

    def work():
        for _ in range(3):
            try:
                ChatTemplate(source).render(CONVERSATION)
            except TemplateError as e:
                results.append(str(e))
        results.append(ChatTemplate(CHATML).render(CONVERSATION[1:2]))

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    assert results[:3] == ["chat template stopped: it recursed too deeply"] * 3
    assert results[3].startswith("<|im_start|>user\nWhat is 2+2?")


def test_the_callers_trace_function_comes_back():
    calls = []

    def tracer(frame, event, arg):
        calls.append(event)
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        ChatTemplate(CHATML).render(CONVERSATION)
        with pytest.raises(TemplateError):
            ChatTemplate("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}").render([])
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)


def test_compile_is_stopped_at_its_deadline(monkeypatch):
    monkeypatch.setattr(chat_template_module, "COMPILE_SECONDS", 0.2)
    start = time.monotonic()
    with pytest.raises(TemplateError, match=r"^chat template stopped: it ran longer than 0.2 s$"):
        ChatTemplate("{{ messages[0].content|trim }}" * 8000)   # 240 KiB: seconds of jinja2 compiling
    assert time.monotonic() - start < 0.2 + 1.5
    _sane_render_works()


class _EventClock:
    """A clock for template_sandbox that moves 1 ms each time it is read, so a deadline of N ms
    passes at the Nth trace event of a render: deterministic, whatever the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 0.001
        return self.now


def test_the_deadline_holds_wherever_in_a_loop_it_passes(monkeypatch):
    """The deadline passing on any trace event, one after another over the first 600 of a render
    of loops over jinja2's LoopContext, still stops the render. It once passed on the 'exception'
    event of the StopIteration that ends such a loop: CPython clears that error after tracing it,
    so the OutOfTime vanished with the trace function, and the render ran on without a deadline
    (CI hung 80 minutes on loop_recursive_fanout)."""
    from memra_engine import template_sandbox
    templates = [ChatTemplate(source) for source in (
        (Path(__file__).parent / "hostile_templates" / "loop_recursive_fanout.jinja").read_text(),
        "{% for i in range(100000) %}{% for j in [1, 2] %}{{ loop.index }}{% endfor %}{% endfor %}")]
    monkeypatch.setattr(template_sandbox, "time", _EventClock())
    for n in range(1, 600):
        monkeypatch.setattr(chat_template_module, "RENDER_SECONDS", n / 1000)
        for template in templates:
            errors = []

            def render():
                try:
                    template.render(CONVERSATION)
                except TemplateError as e:
                    errors.append(str(e))

            worker = threading.Thread(target=render, daemon=True)
            worker.start()
            worker.join(timeout=10)
            assert not worker.is_alive(), f"a deadline at trace event {n} did not stop the render"
            assert errors and "ran longer than" in errors[0], (n, errors)


def test_a_stop_swallowed_in_a_finalizer_is_sent_again(monkeypatch):
    """CPython swallows an exception raised in a finalizer and drops the trace function that
    raised it, so the trace alone would leave the block without a deadline (stop 24's CI: the
    compile deadline test compiled to the end). The watchdog raises OutOfTime in the block
    after the grace period, and once the block is over nothing more arrives."""
    from memra_engine.template_sandbox import Bounded, Bounds, OutOfTime, _Watchdog

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_type))

    class Finalized:
        def __del__(self):
            pass   # a Python call: the trace function's first event after the deadline

    trace_before = sys.gettrace()
    start = time.monotonic()
    with pytest.raises(OutOfTime):
        with Bounded(Bounds(chat_template_module.MIN_SIZE_LIMIT, 0.05)):
            time.sleep(0.1)   # the deadline passes inside a C call: no trace event
            Finalized()       # OutOfTime raised in __del__, and swallowed there
            while time.monotonic() - start < 10:   # a loop no trace function sees any more
                pass
    stopped = time.monotonic() - start
    assert unraisable == [OutOfTime]
    assert stopped < 0.05 + _Watchdog.GRACE_S + 0.5, f"stopped after {stopped:.2f} s"
    assert sys.gettrace() is trace_before
    quiet = time.monotonic()
    while time.monotonic() - quiet < 3 * _Watchdog.RETRY_S:   # no OutOfTime left on its way
        pass


def test_template_source_too_large_is_refused():
    with pytest.raises(TemplateError, match="over the limit"):
        ChatTemplate("x" * (chat_template_module.MAX_SOURCE + 1))


def test_from_gguf_with_a_broken_template_loads_and_fails_each_render():
    template = ChatTemplate.from_gguf({"tokenizer.chat_template": "{% for m in messages %}\n{{ m }"})
    assert template is not None and template.error is not None
    for _ in range(2):
        with pytest.raises(TemplateError, match="syntax error at line 2") as err:
            template.render(CONVERSATION)
        assert "\n" not in str(err.value)
    assert ChatTemplate.from_gguf({"tokenizer.chat_template": CHATML}).error is None


# ---------------------------------------------------------------------------------------- the bounds do not get in the way


def test_long_conversation_renders_within_the_bound():
    messages = [{"role": "user" if i % 2 else "assistant", "content": "hello there " * 20} for i in range(4000)]
    start = time.monotonic()
    rendered = ChatTemplate(CHATML).render(messages)
    assert time.monotonic() - start < chat_template_module.RENDER_SECONDS
    assert len(rendered) > chat_template_module.MIN_SIZE_LIMIT   # past the floor: the limit scales with the input


def test_one_huge_message_is_not_refused():
    content = "word " * (3 << 20)   # 15 MiB: far past the floor
    rendered = ChatTemplate(CHATML + "{{ messages[0].content|trim|length }}").render(
        [{"role": "user", "content": content}])
    assert rendered.endswith(str(len(content.strip())))


def test_the_limit_counts_the_input_not_only_the_floor():
    # a template may repeat its input a few times (here 4) even when that is far past 1 MiB
    content = "y" * (2 << 20)
    source = "{% for m in messages %}{{ m.content }}{{ m.content }}{{ m.content ~ m.content }}{% endfor %}"
    assert len(ChatTemplate(source).render([{"role": "user", "content": content}])) == 4 * len(content)


def test_building_the_prompt_up_in_a_namespace_is_allowed():
    # each step copies the text so far (quadratic), but only the latest string is alive
    messages = [{"role": "user", "content": "z" * 2000} for _ in range(1000)]
    source = ("{% set ns = namespace(text='') %}{% for m in messages %}{% set ns.text = ns.text ~ m.role ~ ':' ~ m.content"
              " ~ '\n' %}{% endfor %}{{ ns.text }}")
    assert len(ChatTemplate(source).render(messages)) == 1000 * (5 + 2000 + 1)


REAL_WORLD_TEMPLATES = {
    # shapes of templates that ship in GGUF files (Llama 3.1, Qwen 2.5, Mistral, Gemma): namespace,
    # tools|tojson, strftime_now, raise_exception, slicing, selectattr, string + and ~, loop.last
    "llama3_tools": (
        "{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}"
        "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
        "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
        "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
        "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}"
        "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
        "{%- if tools is not none %}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}{%- endif %}"
        "{{- system_message }}{{- '<|eot_id|>' }}"
        "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
        "+ message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
    "qwen25_tools": (
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
        "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
        "{{- '\\n\\n# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
        "{%- set ns = namespace(last_user=0) %}"
        "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
        "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
        "{%- elif message.role == 'system' and not tools %}{{- '<|im_start|>system\\n' ~ message.content ~ '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
        "{{- '' if ns.last_user >= 0 else '' }}"
    ),
    "mistral_alternation": (
        "{{- bos_token }}{%- for message in messages %}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
        "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
        "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}"
        "{%- endfor %}"
    ),
    "gemma_like": (
        "{{ bos_token }}{% set sys = messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | list %}"
        "{% for message in messages | rejectattr('role', 'equalto', 'system') %}"
        "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' ~ role ~ '\\n' ~ (sys | join('\\n\\n') ~ '\\n\\n' if loop.first and sys else '')"
        " ~ message['content'] | trim ~ '<end_of_turn>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
        "{{ '%d turns, %s' % (messages|length, 'ok') }}{{ '{:>6}|{}'.format('r', messages|length) }}"
        "{{ (messages|map(attribute='role')|unique|sort|join(',')).center(20).upper() }}"
    ),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{% set inner = 1 %}"
        "<a>{{ m.content }}</a>\n{% endgeneration %}{% else %}<{{ m.role }}>{{ m.content }}\n{% endif %}{% endfor %}"
        "{{ inner is defined }}"
    ),
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize("name", sorted(REAL_WORLD_TEMPLATES))
def test_real_world_templates_render_as_transformers_does(name):
    transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    source = REAL_WORLD_TEMPLATES[name]
    conversations = [CONVERSATION, CONVERSATION[1:]] if name != "mistral_alternation" else [CONVERSATION[1:]]
    for messages in conversations:
        for tools in (None, TOOLS):
            variables = dict(messages=messages, tools=tools, add_generation_prompt=True, bos_token="<s>",
                             eos_token="</s>", date_string="01 Dec 2026")
            expected = transformers_utils._compile_jinja_template(source).render(**variables)
            got = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
                messages, tools=tools, date_string="01 Dec 2026")
            assert got == expected
            assert len(got) > 20


def test_real_world_raise_exception_message_is_the_templates_own():
    with pytest.raises(TemplateError) as err:
        ChatTemplate(REAL_WORLD_TEMPLATES["mistral_alternation"]).render(CONVERSATION)   # starts with system
    assert str(err.value) == "chat template error: Conversation roles must alternate user/assistant/user/assistant/..."


# ---------------------------------------------------------------------------------------- through the engine


def _engine_with_template(source: str):
    from fake_engine import CharTokenizer, ScriptedBackend
    from memra_engine.events import EngineInfo
    from memra_engine.generate import Engine, LoadedModel

    backend = ScriptedBackend(n_ctx=512, script=[ord(c) for c in "ok"] + [0])
    info = EngineInfo("fake", "fake", 0, "", backend.n_ctx, "cpu", "none", has_chat_template=True)
    return Engine.start(lambda: (LoadedModel(None, CharTokenizer(), ChatTemplate(source), backend), info))


@pytest.mark.parametrize("trigger, expect", [
    ("huge", "chat template stopped: repeating a str"),
    ("spin", "chat template stopped: it ran longer than"),
    ("deep", "chat template stopped: it recursed too deeply"),
    ("escape", "chat template refused"),
    ("raise", "chat template error: no such role"),
])
def test_engine_reports_the_error_as_a_done_event_and_serves_the_next_turn(trigger, expect):
    from memra_engine.events import DoneEvent
    from memra_engine.sampling import SamplingParams

    source = ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}"
              "{% set last = messages[-1].content %}"
              "{% if last == 'huge' %}{{ 'x' * 10**10 }}"
              "{% elif last == 'spin' %}{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
              "{% elif last == 'deep' %}{{ r(0) }}"
              "{% elif last == 'escape' %}{{ cycler.__init__.__globals__ }}"
              "{% elif last == 'raise' %}{{ raise_exception('no such role') }}{% endif %}" + CHATML)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with _engine_with_template(source) as eng:
        start = time.monotonic()
        result = eng.chat([{"role": "user", "content": trigger}], greedy).collect()
        assert time.monotonic() - start < TIME_BOUND
        assert result.done.reason == "error" and result.done.error.startswith(expect), result.done
        assert "\n" not in result.done.error
        again = eng.chat([{"role": "user", "content": "hello"}], greedy).collect()
        assert again.done == DoneEvent("eos") and again.text == "ok"
