"""MoE models (qwen3moe, mixtral, olmoe) on the numpy backend, against transformers.

Each test model is built in transformers with random weights and written to F32 GGUF by
tests/moe_oracle.py, so both sides hold the same float32 weights and differ only in summation
order: ~1e-6 relative on the logits (measured 6e-7..1e-6). REL_L2_BOUND = 2e-4, as in
test_oracle.py, leaves >100x margin; a wrong router rule (renormalizing olmoe's top-k, say)
is off by far more, and a test below checks that it is caught.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memra_engine.cpu.backend import CpuBackend
from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.model.config import config_from_gguf
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf
from moe_oracle import ARCHS, SHAPE, build_hf_model, write_gguf

REL_L2_BOUND = 2e-4
N_PROMPT, N_GREEDY = 48, 16


def relative_l2(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


@pytest.fixture(scope="module", params=ARCHS)
def oracle(request, tmp_path_factory):
    """(arch, GGUF path, prompt ids, transformers' logits [T, vocab], its greedy continuation)."""
    import torch

    arch = request.param
    model = build_hf_model(arch, seed=7)
    path = write_gguf(model, arch, tmp_path_factory.mktemp(arch) / f"{arch}.gguf")
    ids = np.random.default_rng(8).integers(3, SHAPE["vocab"], N_PROMPT).tolist()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        out = model.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, min_new_tokens=N_GREEDY,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return arch, path, ids, logits, out[0, N_PROMPT:].tolist()


def test_config_reads_each_router_rule(oracle):
    arch, path, *_ = oracle
    cfg = config_from_gguf(open_gguf(path))
    assert (cfg.arch, cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert) == (arch, 8, 2, SHAPE["ff"])
    assert cfg.expert_weights_norm == (arch != "olmoe")
    assert cfg.rope_neox == (arch != "mixtral")


def test_logits_match_transformers_at_every_position(oracle):
    arch, path, ids, ref, _ = oracle
    ours = CpuBackend(open_gguf(path), n_ctx=128).prefill(ids, all_logits=True)
    err = relative_l2(ours, ref)
    mismatched = np.flatnonzero(ours.argmax(-1) != ref.argmax(-1))
    assert mismatched.size == 0, f"{arch}: top-1 differs at positions {mismatched.tolist()}"
    assert err.max() < REL_L2_BOUND, f"{arch}: relative L2 error {err.max():.2e} at position {err.argmax()}"


def test_greedy_continuation_matches_transformers(oracle):
    arch, path, ids, _, greedy = oracle
    backend = CpuBackend(open_gguf(path), n_ctx=128)
    token = int(np.argmax(backend.prefill(ids)))
    out = [token]
    while len(out) < N_GREEDY:
        token = int(np.argmax(backend.decode(token)))
        out.append(token)
    assert out == greedy


def test_the_other_renormalization_rule_is_caught(oracle):
    """The oracle test is sensitive to the router rule: flipping it moves the logits far past the bound."""
    arch, path, ids, ref, _ = oracle
    backend = CpuBackend(open_gguf(path), n_ctx=128)
    backend.config = dataclasses.replace(backend.config, expert_weights_norm=not backend.config.expert_weights_norm)
    assert relative_l2(backend.prefill(ids, all_logits=True), ref).max() > 100 * REL_L2_BOUND


def test_decode_rows_equal_prefill_rows_and_routing_is_counted(oracle):
    arch, path, ids, ref, _ = oracle
    backend = CpuBackend(open_gguf(path), n_ctx=128)
    head = backend.prefill(ids[:40], all_logits=True)
    tail = np.stack([backend.decode(t) for t in ids[40:]])
    assert relative_l2(np.concatenate([head, tail]), ref).max() < REL_L2_BOUND
    m = backend.moe_stats()
    assert m.total_hits == N_PROMPT * SHAPE["n_layer"] * SHAPE["top_k"] and m.misses == 0
    assert m.resident_experts == m.total_experts == SHAPE["n_layer"] * SHAPE["n_expert"]


def test_quantized_experts_left_in_the_file_give_the_same_logits(tmp_path):
    """Past the float32 budget the experts stay quantized and are dequantized per routed expert."""
    path = write_synthetic_gguf(tmp_path / "m.gguf", preset="tiny-qwen3moe", quant="Q4_K_M", seed=2)
    ids = list(range(5, 37))
    resident = CpuBackend(open_gguf(path), n_ctx=64)
    lean = CpuBackend(open_gguf(path), n_ctx=64, weight_budget_bytes=64 << 10)
    assert resident.weights.all_resident and not lean.weights.all_resident
    np.testing.assert_allclose(lean.prefill(ids, all_logits=True), resident.prefill(ids, all_logits=True),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("preset", ["tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe"])
def test_synthetic_moe_models_chat_and_report_the_cache(preset, tmp_path):
    from memra_engine.generate import Engine
    from memra_engine.sampling import SamplingParams

    path = write_synthetic_gguf(tmp_path / f"{preset}.gguf", preset=preset, seed=1)
    engine = Engine.load(path, backend="cpu", n_ctx=128)
    try:
        assert engine.info.arch == config_from_gguf(open_gguf(path)).arch
        cfg = config_from_gguf(open_gguf(path))
        per_token = cfg.n_layer * cfg.n_expert_used
        replies = []
        for text in ("hello there", "and now something else"):
            result = engine.chat([{"role": "user", "content": text}], SamplingParams(max_tokens=8, seed=3)).collect()
            assert result.done.reason == "length" and len(result.token_ids) == 8 == result.stats.n_generated
            replies.append(result.stats)
        first, second = replies
        # every prompt token and every generated token but the last went through the layers
        assert first.moe.hits == (first.n_prompt_tokens + first.n_generated - 1) * per_token
        # the second reply reuses the cached prefix: its counters count only what it ran
        assert 0 < second.moe.hits < (second.n_prompt_tokens + 7) * per_token and second.moe.hits % per_token == 0
        assert second.moe.total_hits == first.moe.total_hits + second.moe.hits
    finally:
        engine.close()


# --- bad input: one line, the problem named ---------------------------------------------------

@pytest.fixture(scope="module")
def qwen3moe_model():
    return build_hf_model("qwen3moe", seed=1)


@pytest.mark.parametrize("metadata, message", [
    ({"expert_count": 16}, "has shape"),                     # the tensors hold 8 experts
    ({"expert_used_count": 9}, "expert_used_count 9 is more than expert_count 8"),
    ({"expert_count": None}, "missing metadata 'qwen3moe.expert_count'"),
    ({"expert_feed_forward_length": 64}, "has shape"),
    ({"expert_used_count": 0}, "is absurd"),
])
def test_expert_metadata_that_does_not_match_is_one_line(metadata, message, qwen3moe_model, tmp_path):
    path = write_gguf(qwen3moe_model, "qwen3moe", tmp_path / "bad.gguf", metadata)
    with pytest.raises(ModelFormatError) as err:
        config_from_gguf(open_gguf(path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_experts_in_a_dense_architecture_are_refused(tmp_path):
    import gguf

    path = write_synthetic_gguf(tmp_path / "q.gguf", preset="tiny-qwen3", seed=1)
    g = open_gguf(path)
    g.metadata["qwen3.expert_count"] = 4
    with pytest.raises(UnsupportedModelError, match="experts in a 'qwen3' model are not supported"):
        config_from_gguf(g)
