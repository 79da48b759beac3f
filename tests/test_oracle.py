"""The numpy reference backend against transformers on torch CPU, loading the same GGUF files.

transformers dequantizes the GGUF with the same gguf.quants code we use, so both sides hold
bit-identical float32 weights and differ only in how float32 sums are ordered (BLAS blocking,
fused vs separate q/k/v, softmax and norm reductions). That is ~2^-24 per operation, growing
to ~1e-5 relative on the logits after 18-30 layers; we measured at most 8.5e-6 on SmolLM2 and
3.8e-6 on Gemma 3 over the prompts below (1.2e-5 on other SmolLM2 text). REL_L2_BOUND = 2e-4
leaves >10x margin for other BLAS builds and thread counts. Real mistakes are far larger: a
local layer using the global rope base, or a dropped qkv bias, fails the tiny-model test below.

Each transformers model is loaded once (only this module uses it), run on every prompt, and
deleted at once: the fixtures keep only its outputs. Module scope frees those outputs (~0.5 GB
of Gemma logits) and our two backends when this file is done, not at the end of the session.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memra_engine.cpu.backend import CpuBackend
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf

pytestmark = pytest.mark.slow

REL_L2_BOUND = 2e-4
N_GREEDY = 32

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Spain is "
    "Madrid. The capital of Italy is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef main():\n    for i in range(10):\n"
    "        print(i, fibonacci(i))\n",
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light "
    "energy into chemical energy. During this process, carbon dioxide and water are combined, "
    "using the energy of sunlight, to produce glucose and oxygen. The reaction takes place mainly "
    "in the chloroplasts of leaf cells, where the pigment chlorophyll absorbs red and blue light.",
    "Zürich, São Paulo and Kraków are cities with names that use letters outside ASCII — and "
    "some people write them with emoji too: 🏙️ 🌆 🌃. Meanwhile, in Tokyo (東京) the trains run "
    "on time, and in Moscow (Москва) the winters are long. Numbers like 3.14159, 2,718 and "
    "1e-10 appear in tables; so do symbols such as <, >, &, %, $ and #. Tabs\tand  double  "
    "spaces, CamelCaseWords, snake_case_names and URLs like https://example.org/a?b=c#d also "
    "show up in real text.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker named Elias. Every morning he opened the shutters of his workshop, lit the stove, "
    "and sat down at his bench to repair the watches and clocks that the villagers brought him. "
    "One winter evening, a stranger in a grey cloak knocked on the door. She carried a small "
    "wooden box wrapped in cloth, and she asked Elias whether he could mend something that had "
    "not ticked in a hundred years. Elias lifted the lid and saw",
]


@dataclass
class OracleRun:
    prompt_ids: list[list[int]]
    logits: list[np.ndarray]        # transformers' float32 logits [T, vocab] per prompt
    greedy: list[int]               # transformers' greedy continuation of the last prompt


def run_transformers(path: Path) -> OracleRun:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    try:
        prompt_ids = [tokenizer(text)["input_ids"] for text in PROMPTS]
        with torch.no_grad():
            logits = [model(torch.tensor([ids])).logits[0].float().numpy() for ids in prompt_ids]
            # No eos: both sides must produce all N_GREEDY tokens, whatever they are.
            out = model.generate(torch.tensor([prompt_ids[-1]]), max_new_tokens=N_GREEDY,
                                 min_new_tokens=N_GREEDY, do_sample=False, eos_token_id=None)
        greedy = out[0, len(prompt_ids[-1]):].tolist()
        return OracleRun(prompt_ids, logits, greedy)
    finally:
        del model
        gc.collect()


def greedy_continuation(backend: CpuBackend, prompt: list[int], n: int) -> list[int]:
    backend.truncate(0)
    token = int(np.argmax(backend.prefill(prompt)))
    out = [token]
    while len(out) < n:
        token = int(np.argmax(backend.decode(token)))
        out.append(token)
    return out


def relative_l2(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


@pytest.fixture(scope="module")
def smollm2_oracle(smollm2_path) -> OracleRun:
    return run_transformers(smollm2_path)


@pytest.fixture(scope="module")
def gemma3_oracle(gemma3_path) -> OracleRun:
    return run_transformers(gemma3_path)


@pytest.fixture(scope="module")
def smollm2_backend(smollm2_path):
    backend = CpuBackend(open_gguf(smollm2_path), n_ctx=512)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def gemma3_backend(gemma3_path):
    backend = CpuBackend(open_gguf(gemma3_path), n_ctx=512)
    yield backend
    backend.close()


MODELS = ["smollm2", "gemma3"]


@pytest.fixture(params=MODELS)
def model(request):
    """(oracle run, our backend) for one real model."""
    name = request.param
    return request.getfixturevalue(f"{name}_oracle"), request.getfixturevalue(f"{name}_backend")


def test_real_model_configs(smollm2_path, gemma3_path):
    """The figures docs/design.md §6 gives for the two real models, read from their metadata."""
    from memra_engine.model.config import config_from_gguf

    s = config_from_gguf(open_gguf(smollm2_path))
    assert (s.arch, s.n_layer, s.d_model, s.n_head, s.n_kv_head, s.head_dim, s.vocab_size) == \
        ("llama", 30, 576, 9, 3, 64, 49152)
    assert s.tied_embeddings and not s.rope_neox and s.sliding_window == 0
    g = config_from_gguf(open_gguf(gemma3_path))
    assert (g.arch, g.n_layer, g.d_model, g.n_head, g.n_kv_head, g.head_dim, g.vocab_size) == \
        ("gemma3", 18, 640, 4, 1, 256, 262144)
    assert g.head_dim != g.d_model // g.n_head and g.tied_embeddings and g.rope_neox
    assert (g.sliding_window, g.rope_base_local, g.rope_base) == (512, 10000.0, 1e6)
    assert [i for i in range(18) if not g.is_sliding(i)] == [5, 11, 17]
    assert g.embed_scale == pytest.approx(640 ** 0.5) and g.attn_scale == 1 / 16


def test_logits_match_transformers_at_every_position(model):
    oracle, backend = model
    worst = []
    for ids, ref in zip(oracle.prompt_ids, oracle.logits):
        assert 20 <= len(ids) <= 200, len(ids)
        backend.truncate(0)
        ours = backend.prefill(ids, all_logits=True)
        assert ours.shape == ref.shape
        err = relative_l2(ours, ref)
        worst.append(float(err.max()))
        mismatched = np.flatnonzero(ours.argmax(-1) != ref.argmax(-1))
        assert mismatched.size == 0, f"top-1 differs at positions {mismatched.tolist()}"
        assert err.max() < REL_L2_BOUND, f"relative L2 error {err.max():.2e} at position {err.argmax()}"
    print(f"max relative L2 error per prompt: {', '.join(f'{e:.1e}' for e in worst)}")


def test_greedy_continuation_matches_transformers(model):
    oracle, backend = model
    assert len(oracle.greedy) == N_GREEDY
    assert greedy_continuation(backend, oracle.prompt_ids[-1], N_GREEDY) == oracle.greedy


def test_prefill_then_decode_equals_one_prefill(model):
    """The KV cache written by a prefill is what decode reads: splitting the prompt changes nothing."""
    oracle, backend = model
    ids = oracle.prompt_ids[2]
    backend.truncate(0)
    whole = backend.prefill(ids, all_logits=True)
    cut = len(ids) - 12
    backend.truncate(0)
    head = backend.prefill(ids[:cut], all_logits=True)
    tail = np.stack([backend.decode(t) for t in ids[cut:]])
    # gemv (decode) and gemm (prefill) round differently: ~1e-6 relative, as for the oracle.
    assert relative_l2(np.concatenate([head, tail]), whole).max() < REL_L2_BOUND
    assert relative_l2(tail, oracle.logits[2][cut:]).max() < REL_L2_BOUND


def test_verify_rows_equal_decode(model):
    oracle, backend = model
    ids = oracle.prompt_ids[0]
    draft = oracle.greedy[:5]
    backend.truncate(0)
    backend.prefill(ids)
    decoded = np.stack([backend.decode(t) for t in draft])
    backend.truncate(len(ids))
    np.testing.assert_array_equal(backend.verify(draft), decoded)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_tiny_models_of_every_arch_match_transformers(preset, tmp_path):
    """qwen2 and qwen3 have no real model in the tests: random-weight ones cover their math
    (biases, per-head q/k norms). 60 tokens cross tiny-gemma3's 16-token window."""
    import torch
    from transformers import AutoModelForCausalLM

    path = write_synthetic_gguf(tmp_path / f"{preset}.gguf", preset=preset, seed=3)
    ids = np.random.default_rng(4).integers(3, 384, 60).tolist()
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    ours = CpuBackend(open_gguf(path), n_ctx=64).prefill(ids, all_logits=True)
    assert relative_l2(ours, ref).max() < REL_L2_BOUND
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
