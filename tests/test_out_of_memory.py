"""Out of memory on the CPU side (issue 17 §4): a huge --ctx, an allocation that fails while the
model loads, and one that fails in a reply are each a one-line error that names a smaller --ctx;
after a failed reply the engine goes on, and its next reply equals a fresh engine's. (The VRAM
pool's own messages are tested on the device: tests/gpu/test_runtime.py, test_backend.py.)"""
from __future__ import annotations

import pytest
from fake_engine import wrapped_engine
from tiny_models import tiny_llama_path  # noqa: F401  (fixture)

from memra_engine.errors import HostOutOfMemory, OutOfMemory
from memra_engine.generate import Engine
from memra_engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
CHAT = [{"role": "user", "content": "Say something about cats."}]
NUMPY_OOM = "Unable to allocate 64.0 GiB for an array with shape (2, 1073741824, 8) and data type float32"


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text and len(text) < 300


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """Trained for 16M tokens, with 256 layers: that context needs ~550 GB of KV cache."""
    from memra_engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "long.gguf", preset="tiny-llama", seed=7,
                                ctx=1 << 24, n_layer=256)


def test_a_huge_ctx_on_the_cpu_is_a_one_line_out_of_memory_error(long_context_model):
    with pytest.raises(OutOfMemory) as err:
        Engine.load(long_context_model, backend="cpu", n_ctx=1 << 24)
    assert one_line(str(err.value)) and "needs" in str(err.value) and str(err.value).endswith("try a smaller --ctx")


def test_an_allocation_that_fails_at_load_is_a_one_line_error(tiny_llama_path, monkeypatch):
    from memra_engine.cpu.kv_cache import KvCache

    def fail(*args, **kwargs):
        raise MemoryError(NUMPY_OOM)

    monkeypatch.setattr(KvCache, "__init__", fail)
    with pytest.raises(HostOutOfMemory) as err:
        Engine.load(tiny_llama_path, backend="cpu", n_ctx=256)
    message = str(err.value)
    assert one_line(message), message
    assert message.startswith("out of host memory while loading the model (Unable to allocate 64.0 GiB")
    assert message.endswith("; try a smaller --ctx or a smaller model")


class FailingPrefill:
    """The CPU backend, whose prefill runs out of memory while `failures` lasts."""

    def __init__(self, backend, failures: int = 1):
        self._backend, self.failures = backend, failures

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def prefill(self, tokens, all_logits: bool = False):
        if self.failures:
            self.failures -= 1
            raise MemoryError(NUMPY_OOM)
        return self._backend.prefill(tokens, all_logits)


def test_an_allocation_that_fails_in_a_reply_ends_it_with_one_line_and_the_engine_goes_on(tiny_llama_path):
    eng, made = wrapped_engine(tiny_llama_path, "cpu", 256, FailingPrefill)
    with eng:
        first = eng.chat(CHAT, GREEDY).collect()
        assert first.done.reason == "error" and first.done.error_kind == "out_of_memory"
        assert one_line(first.done.error) and first.done.error.startswith("out of host memory during the reply")
        assert first.done.error.endswith("try a smaller --ctx or a smaller model")
        after = eng.chat(CHAT, GREEDY).collect()
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=256) as fresh:
        want = fresh.chat(CHAT, GREEDY).collect()
    assert made[0].failures == 0
    assert after.token_ids == want.token_ids and after.done == want.done


def test_a_prompt_that_does_not_fit_is_labelled_for_the_ui(tiny_llama_path):
    with Engine.load(tiny_llama_path, backend="cpu", n_ctx=32) as eng:
        done = eng.chat([{"role": "user", "content": "the cat sat on the mat " * 20}], GREEDY).collect().done
    assert done.reason == "error" and done.error_kind == "prompt_too_long" and done.error.endswith("(use --ctx)")


def test_the_cli_says_out_of_memory_in_one_line_and_exits_1(long_context_model, capsys):
    from memra_tui.cli import main

    code = main([str(long_context_model), "--backend", "cpu", "--ctx", str(1 << 24), "--prompt", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("memra-chat: error: a 16777216-token context needs ")
    assert err[-1].endswith("try a smaller --ctx") and not any("Traceback" in line for line in err)
