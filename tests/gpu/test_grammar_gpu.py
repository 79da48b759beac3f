"""Grammar masks on the cuda backend: the masked step pair (forward graph, then the sampler graph
after the mask upload, with the next forward queued before the host waits) against the one-graph
decode_sample, the device mask against the CPU constraint's at every step of a reply, and
constrained replies on both backends."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from memra_engine.events import DoneEvent, TokenEvent
from memra_engine.generate import Engine
from memra_engine.grammar import Grammar, GrammarTokenizer
from memra_engine.model.gguf_file import open_gguf
from memra_engine.sampling import SamplingParams
from memra_engine.tokenizer import load_tokenizer

pytestmark = pytest.mark.gpu
CHAT = [{"role": "user", "content": "Tell me about a fox."}]
COLORS = "(red|green|blue|black|white)( (red|green|blue|black|white)){3}"
SCHEMA = {"type": "object", "properties": {"animal": {"enum": ["fox", "cat", "owl"]},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                                           "name": {"type": "string", "maxLength": 8}},
          "required": ["animal", "legs", "name"], "additionalProperties": False,
          # compact separators: a random-weight model otherwise fills the flexible whitespace until max_tokens
          "x-guidance": {"whitespace_flexible": False}}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from memra_engine.model.synthetic import write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", preset="tiny-llama",
                                head_dim=64, n_head=4, n_kv_head=2, d_model=256)


@pytest.fixture(scope="module")
def gpu(tiny_path):
    from memra_engine.gpu.backend import CudaBackend

    backend = CudaBackend(open_gguf(tiny_path), n_ctx=512)
    yield backend
    backend.close()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),   # Gumbel-max over the vocabulary
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.2),  # filtered
])
def test_masked_step_pair_with_a_full_mask_equals_decode_sample(gpu, params):
    """Same tokens and logprobs bit for bit: the pair is the one-graph step cut in two. Also across
    a fed token other than the one returned, a truncate, and with the next forward not queued."""
    prompt = list(range(20, 45))

    def script(masked: bool, ahead: bool):
        gpu.run_ahead = ahead
        gpu.truncate(0)
        gpu.prefill(prompt)
        gpu.set_sampling(params, seed=21, use_mask=masked)
        out, tok = [], 7
        for i in range(40):
            if i == 9:
                tok = 3
            if i == 15:
                gpu.truncate(gpu.n_past - 3)
            if masked:
                buf = gpu.begin_masked_step(tok)
                buf[:] = 0xFFFFFFFF
                out.append(gpu.finish_masked_step())
            else:
                out.append(gpu.decode_sample(tok))
            tok = out[-1][0]
        return out, gpu.n_past

    try:
        reference = script(masked=False, ahead=True)
        assert script(masked=True, ahead=True) == reference
        assert script(masked=True, ahead=False) == reference
    finally:
        gpu.run_ahead = True


def test_masked_step_pair_draws_only_allowed_tokens(gpu):
    rng = np.random.default_rng(5)
    vocab = gpu.config.vocab_size
    gpu.truncate(0)
    gpu.prefill(list(range(10, 30)))
    gpu.set_sampling(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0), seed=3, use_mask=True)
    tok = 5
    for _ in range(64):
        allowed = rng.random(vocab) < 0.02
        allowed[rng.integers(vocab)] = True
        buf = gpu.begin_masked_step(tok)
        bits = np.packbits(allowed.astype(np.uint8), bitorder="little")
        words = np.zeros(buf.size * 4, np.uint8)
        words[: bits.size] = bits
        buf[:] = words.view(np.uint32)
        tok, logprob = gpu.finish_masked_step()
        assert allowed[tok] and logprob <= 0.0


class MaskRecorder:
    """Wraps the cuda backend: after each masked step, reads the mask back from device memory."""

    def __init__(self, inner):
        self.inner = inner
        self.device_masks: list[np.ndarray] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def finish_masked_step(self, ahead=True):
        out = self.inner.finish_masked_step(ahead)
        sampler = self.inner.sampler
        self.device_masks.append(self.inner.rt.download(sampler.mask_ptr, (sampler.mask_words,), np.uint32))
        return out


def test_device_mask_equals_the_cpu_constraints_mask_at_every_step(tiny_path):
    from fake_engine import wrapped_engine

    grammar = Grammar.json_schema(SCHEMA)
    eng, recorders = wrapped_engine(tiny_path, "cuda", 512, MaskRecorder)
    with eng:
        result = eng.chat(CHAT, SamplingParams(temperature=1.2, seed=9, max_tokens=120), grammar=grammar).collect()
    assert result.done.reason == "eos", result
    json.loads(result.text)
    masks = recorders[0].device_masks
    g = open_gguf(tiny_path)
    constraint = GrammarTokenizer(load_tokenizer(g), recorders[0].config.vocab_size).constraint(grammar)
    assert len(masks) == len(result.token_ids)
    for step, (token, device) in enumerate(zip(result.token_ids, masks)):
        assert np.array_equal(device, constraint.mask()), f"step {step}"
        constraint.accept(token)


@pytest.mark.parametrize("grammar, check", [
    (Grammar.regex(COLORS), lambda text: re.fullmatch(COLORS, text)),
    (Grammar.json_schema(SCHEMA), lambda text: json.loads(text)["animal"] in ("fox", "cat", "owl")),
])
def test_constrained_greedy_reply_is_the_same_on_both_backends(tiny_path, grammar, check):
    texts = {}
    for backend in ("cpu", "cuda"):
        with Engine.load(tiny_path, backend=backend, n_ctx=512) as eng:
            job = eng.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=100), grammar=grammar)
            events = list(job)
        assert isinstance(events[-1], DoneEvent) and events[-1].reason == "eos", events[-1]
        texts[backend] = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert texts["cpu"] == texts["cuda"] and check(texts["cuda"]), texts


def test_constrained_sampled_replies_parse_on_the_gpu(tiny_path):
    grammar = Grammar.json_schema(SCHEMA)
    with Engine.load(tiny_path, backend="cuda", n_ctx=512) as eng:
        for seed in range(20):
            result = eng.chat(CHAT, SamplingParams(temperature=1.5, seed=seed, max_tokens=120), grammar=grammar).collect()
            assert result.done.reason == "eos", (seed, result.text)
            value = json.loads(result.text)
            assert set(value) == {"animal", "legs", "name"} and 0 <= value["legs"] <= 8 and len(value["name"]) <= 8


class PrefillSizes:
    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, tokens, all_logits=False):
        self.sizes.append(len(tokens))
        return self.inner.prefill(tokens, all_logits)


def test_cuda_engine_names_the_gpu_and_prefills_in_512_token_chunks(tiny_path):
    """Both were wrong while generate.py probed backends with getattr: the header named the CPU,
    and prompts went in 128-token chunks."""
    import pycuda.driver as cuda

    from fake_engine import wrapped_engine

    eng, spies = wrapped_engine(tiny_path, "cuda", 4096, PrefillSizes)
    with eng:
        name = eng.info.device_name
        result = eng.complete("fox " * 600, SamplingParams(temperature=0.0, max_tokens=2)).collect()
    assert result.done.reason in ("eos", "length")
    assert name == cuda.Device(0).name()
    assert spies[0].sizes[:2] == [512, 512]
