"""The synthetic GGUF generator: encoder round trips, tiny presets, determinism, quant mixes, CLI."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize

from memra_engine.model.gguf_file import dequantize, open_gguf
from memra_engine.model.kquants import ENCODABLE_TYPES, quantize
from memra_engine.model.synthetic import (
    BOS_ID, EOS_ID, PRESETS, SPECIAL_TOKENS, main, plan_tensors, synthetic_spec, write_synthetic_gguf,
)

# Relative RMS error bounds for N(0, 1) data, each about 1.3-1.5x the figure theory gives.
# A uniform rounding error of step s has RMS s/sqrt(12). With the block extremes of 32 (16 for
# Q6_K) normal samples at about +-2.1 sigma (+-1.8 for 16):
#   Q8_0  s = 2.1/127          -> 0.5%      Q4_0  s = 2.1/8   -> 7.6%    Q4_1  s = 4.2/15 -> 8.1%
#   Q5_0  s = 2.1/16           -> 3.8%      Q5_1  s = 4.2/31  -> 3.9%
#   Q4_K  as Q4_1, plus 6-bit sub-block scales rounded up: 8-9%   Q5_K as Q5_1: ~4%
#   Q6_K  s = 1.8/32 over 16 weights -> 1.6%, plus 8-bit sub-block scales: ~2%
#   Q2_K  4 levels over the range of 16 weights, s = 3.5/3 -> 34% (measured 34.5%)
#   Q3_K  s = 1.8/4 over 16 weights -> 13%, plus the clipped +4 level: ~15.5% measured
#   IQ4_XS  16 non-uniform levels, extreme of 32 at -127: spacing 0.19-0.38 sigma -> ~8%
#   F16 / BF16: relative rounding <= 2^-11 / 2^-8 per element.
ROUND_TRIP_BOUNDS = {
    QT.F32: 0.0,
    QT.F16: 2.0**-11,
    QT.BF16: 2.0**-8,
    QT.Q8_0: 0.01,
    QT.Q4_0: 0.12,
    QT.Q4_1: 0.12,
    QT.Q5_0: 0.06,
    QT.Q5_1: 0.06,
    QT.Q4_K: 0.12,
    QT.Q5_K: 0.06,
    QT.Q6_K: 0.03,
    QT.Q2_K: 0.45,
    QT.Q3_K: 0.20,
    QT.IQ4_XS: 0.11,
}


def relative_rms(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact**2)))


def test_every_encodable_type_has_a_bound():
    assert set(ROUND_TRIP_BOUNDS) == set(ENCODABLE_TYPES)


@pytest.mark.parametrize("qtype", ENCODABLE_TYPES, ids=lambda t: t.name)
def test_round_trip_error_within_bound(qtype):
    x = np.random.default_rng(1).standard_normal((64, 1024), dtype=np.float32)
    encoded = quantize(x, qtype)
    decoded = np.asarray(gguf_dequantize(encoded, qtype), dtype=np.float32).reshape(x.shape)
    err = relative_rms(decoded, x)
    assert err <= ROUND_TRIP_BOUNDS[qtype], f"{qtype.name}: relative RMS {err:.4f}"
    if qtype != QT.F32:
        assert err > 0  # the check can fail: a lossy type that round-trips exactly would be suspicious


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS], ids=lambda t: t.name)
def test_k_quant_blocks_with_mixed_scales_and_flat_sub_blocks(qtype):
    """Sub-blocks whose scales span 1000x, plus one constant and one all-zero sub-block, in one
    super-block: the encoder must keep every value finite and each sub-block's error proportional
    to its own scale (except the tiny ones, which sit below the 6/8-bit sub-scale resolution)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 256), dtype=np.float32)
    x *= np.repeat(np.logspace(-3, 0, 8, dtype=np.float32), 32)[None, :]
    x[0, 64:96] = 0.25
    x[1, 0:32] = 0.0
    decoded = np.asarray(gguf_dequantize(quantize(x, qtype), qtype), dtype=np.float32).reshape(x.shape)
    assert np.isfinite(decoded).all()
    assert np.all(decoded[1, 0:32] == 0.0) or qtype != QT.Q6_K   # symmetric Q6_K keeps zeros exact
    largest = slice(224, 256)   # the sub-block with scale 1
    assert relative_rms(decoded[:, largest], x[:, largest]) <= ROUND_TRIP_BOUNDS[qtype]
    assert relative_rms(decoded, x) <= ROUND_TRIP_BOUNDS[qtype]


def test_k_quant_rejects_rows_that_are_not_whole_super_blocks():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(np.ones((2, 64), dtype=np.float32), QT.Q4_K)


TINY_PRESETS = [name for name in PRESETS if name.startswith("tiny-")]


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return {name: write_synthetic_gguf(out / f"{name}.gguf", preset=name) for name in TINY_PRESETS}


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_preset_has_expected_metadata(preset, tiny_files):
    spec = PRESETS[preset]
    g = open_gguf(tiny_files[preset])
    m, a = g.metadata, spec.arch
    assert m["general.architecture"] == a
    assert m[f"{a}.block_count"] == spec.n_layer
    assert m[f"{a}.embedding_length"] == spec.d_model
    # olmoe and Mixtral (llama with experts) store the expert width there, as llama.cpp reads it
    assert m[f"{a}.feed_forward_length"] == (spec.d_ff_expert if spec.n_expert and a != "qwen3moe" else spec.d_ff)
    assert m[f"{a}.attention.head_count"] == spec.n_head
    assert m[f"{a}.attention.head_count_kv"] == spec.n_kv_head
    assert m[f"{a}.attention.key_length"] == m[f"{a}.attention.value_length"] == spec.head_dim
    assert m[f"{a}.context_length"] == spec.ctx
    assert m[f"{a}.rope.freq_base"] == pytest.approx(spec.rope_base)
    assert m[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(spec.rms_eps)
    if a == "gemma3":
        assert m["gemma3.attention.sliding_window"] == spec.sliding_window
        assert m["gemma3.rope.freq_base_swa"] == pytest.approx(spec.rope_base_local)
    if spec.n_expert:
        assert m[f"{a}.expert_count"] == spec.n_expert
        assert m[f"{a}.expert_used_count"] == spec.n_expert_used
    if a == "qwen3moe":
        assert m["qwen3moe.expert_feed_forward_length"] == spec.d_ff_expert
    # Tokenizer: byte-level BPE with ChatML control tokens, padded to the vocab size.
    tokens = m["tokenizer.ggml.tokens"]
    assert m["tokenizer.ggml.model"] == "gpt2"
    assert len(tokens) == len(set(tokens)) == spec.vocab
    assert tokens[:3] == list(SPECIAL_TOKENS)
    assert m["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 1]
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]) == (BOS_ID, EOS_ID)
    for merge in m["tokenizer.ggml.merges"]:
        assert "".join(merge.split(" ")) in tokens
    assert "<|im_start|>" in m["tokenizer.chat_template"]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_preset_has_expected_tensors(preset, tiny_files):
    spec = PRESETS[preset]
    g = open_gguf(tiny_files[preset])
    d, hd = spec.d_model, spec.head_dim
    expected = {"token_embd.weight": (spec.vocab, d), "output_norm.weight": (d,)}
    if not spec.tied:
        expected["output.weight"] = (spec.vocab, d)
    for i in range(spec.n_layer):
        b = f"blk.{i}"
        expected |= {
            f"{b}.attn_norm.weight": (d,), f"{b}.ffn_norm.weight": (d,),
            f"{b}.attn_q.weight": (spec.n_head * hd, d), f"{b}.attn_k.weight": (spec.n_kv_head * hd, d),
            f"{b}.attn_v.weight": (spec.n_kv_head * hd, d), f"{b}.attn_output.weight": (d, spec.n_head * hd),
        }
        if spec.arch == "qwen2":
            expected |= {f"{b}.attn_q.bias": (spec.n_head * hd,), f"{b}.attn_k.bias": (spec.n_kv_head * hd,),
                         f"{b}.attn_v.bias": (spec.n_kv_head * hd,)}
        if spec.arch in ("qwen3", "qwen3moe", "gemma3"):
            expected |= {f"{b}.attn_q_norm.weight": (hd,), f"{b}.attn_k_norm.weight": (hd,)}
        if spec.arch == "olmoe":
            expected |= {f"{b}.attn_q_norm.weight": (spec.n_head * hd,), f"{b}.attn_k_norm.weight": (spec.n_kv_head * hd,)}
        if spec.arch == "gemma3":
            expected |= {f"{b}.post_attention_norm.weight": (d,), f"{b}.post_ffw_norm.weight": (d,)}
        if spec.n_expert:
            e, f = spec.n_expert, spec.d_ff_expert
            expected |= {f"{b}.ffn_gate_inp.weight": (e, d), f"{b}.ffn_gate_exps.weight": (e, f, d),
                         f"{b}.ffn_up_exps.weight": (e, f, d), f"{b}.ffn_down_exps.weight": (e, d, f)}
        else:
            expected |= {f"{b}.ffn_gate.weight": (spec.d_ff, d), f"{b}.ffn_up.weight": (spec.d_ff, d),
                         f"{b}.ffn_down.weight": (d, spec.d_ff)}
    assert {name: t.shape for name, t in g.tensors.items()} == expected
    for name, t in g.tensors.items():
        w = dequantize(t)
        assert np.isfinite(w).all(), name
        if name.endswith(("post_attention_norm.weight", "post_ffw_norm.weight")):
            assert abs(w.mean() - 4.0) < 0.4 and 0.1 < w.std() < 1.0, name
        elif name.endswith("norm.weight"):
            assert abs(w.mean() - 1.0) < 0.1 and 0.03 < w.std() < 0.3, name
        elif name in ("token_embd.weight", "output.weight"):
            # std 2/sqrt(d), so logits spread with std ~2; control tokens' rows near zero
            planned = 2.0 / np.sqrt(d)
            assert 0.85 * planned < w[3:].std() < 1.15 * planned, name
            assert w[:3].std() < 0.1 * planned, name
        elif t.ggml_type != QT.F32 or name.endswith("ffn_gate_inp.weight"):
            planned = 1.0 / np.sqrt(t.shape[-1])     # unit gain per projection
            assert 0.85 * planned < w.std() < 1.15 * planned, name


def test_same_seed_same_bytes_and_thread_count_does_not_matter(tmp_path):
    digests = [
        hashlib.sha256(write_synthetic_gguf(tmp_path / f"{i}.gguf", preset="tiny-qwen3", seed=7,
                                            threads=threads).read_bytes()).hexdigest()
        for i, threads in enumerate((1, 4))
    ]
    other = write_synthetic_gguf(tmp_path / "other.gguf", preset="tiny-qwen3", seed=8).read_bytes()
    assert digests[0] == digests[1]
    assert hashlib.sha256(other).hexdigest() != digests[0]


def test_q4_k_m_mix_follows_llama_cpp_rules(tmp_path):
    """d=256 rows take Q4_K/Q6_K; rows of 320 fall back to Q5_0 (Q6_K to Q8_0) as in llama.cpp."""
    path = write_synthetic_gguf(tmp_path / "mix.gguf", "llama", n_layer=8, d_model=256, n_head=4,
                                n_kv_head=2, head_dim=64, d_ff=320, quant="Q4_K_M")
    types = {name: t.ggml_type for name, t in open_gguf(path).tensors.items()}
    assert types["blk.0.attn_q.weight"] == QT.Q4_K
    assert types["blk.0.attn_v.weight"] == QT.Q6_K      # first eighth of the layers: more bits
    assert types["blk.1.attn_v.weight"] == QT.Q4_K
    assert types["blk.3.attn_v.weight"] == QT.Q6_K      # (3 - 1) % 3 == 2
    assert types["blk.7.attn_v.weight"] == QT.Q6_K      # last eighth
    assert types["blk.0.ffn_down.weight"] == QT.Q8_0    # Q6_K over 320 columns falls back
    assert types["blk.1.ffn_down.weight"] == QT.Q5_0    # Q4_K over 320 columns falls back
    assert types["output.weight"] == QT.Q6_K
    assert types["token_embd.weight"] == QT.Q4_K
    assert types["blk.0.attn_norm.weight"] == QT.F32


@pytest.mark.parametrize("quant", ["Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "Q4_0", "Q5_1", "BF16"])
def test_any_matrix_type_writes_and_reads_back(quant, tmp_path):
    path = write_synthetic_gguf(tmp_path / "m.gguf", "qwen2", d_model=256, d_ff=512, head_dim=64,
                                quant=quant, embed_type="Q8_0")
    g = open_gguf(path)
    assert g.tensors["blk.0.ffn_up.weight"].ggml_type == QT[quant]
    assert g.tensors["token_embd.weight"].ggml_type == QT.Q8_0
    assert np.isfinite(dequantize(g.tensors["blk.1.ffn_down.weight"])).all()


@pytest.mark.parametrize("quant", ["Q2_K", "Q3_K", "IQ4_XS"])
def test_low_bit_model_generates_on_the_cpu_engine(quant, tmp_path):
    """Every matrix, embeddings included, in Q2_K/Q3_K/IQ4_XS: the CPU engine (gguf dequantizes)
    loads the file and a greedy reply comes out, the same tokens twice."""
    from memra_engine.generate import Engine
    from memra_engine.sampling import SamplingParams

    path = write_synthetic_gguf(tmp_path / "m.gguf", "llama", d_model=256, d_ff=512, head_dim=64, quant=quant)
    g = open_gguf(path)
    assert {t.ggml_type for t in g.tensors.values() if len(t.shape) == 2} == {QT[quant]}
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with Engine.load(path, backend="cpu", n_ctx=64) as eng:
        assert eng.info.quant_mix.startswith(f"{quant} x")
        first = eng.complete("the cat sat on", greedy).collect()
        again = eng.complete("the cat sat on", greedy).collect()
    assert first.done.reason in ("eos", "length") and first.token_ids
    assert again.token_ids == first.token_ids


def test_presets_for_benchmarks_plan_the_design_shapes():
    # Planning only (no weights): the §7 shapes and their sizes, within 2% of llama.cpp's files.
    mib = {name: sum(p.n_bytes for p in plan_tensors(PRESETS[name])) / 2**20
           for name in ("smollm2-135m", "gemma3-270m", "llama-8b", "llama-1b", "qwen3-moe")}
    assert mib["llama-8b"] == pytest.approx(4258, rel=0.02)
    assert mib["llama-1b"] == pytest.approx(636, rel=0.02)  # issue 16's llama.cpp-quantized file
    assert mib["qwen3-moe"] == pytest.approx(4570, rel=0.02)
    assert mib["gemma3-270m"] == pytest.approx(235, rel=0.03)
    assert mib["smollm2-135m"] == pytest.approx(92, rel=0.03)
    q8_plan = plan_tensors(synthetic_spec(preset="llama-8b", quant="Q8_0"))
    assert {p.qtype for p in q8_plan} == {QT.Q8_0, QT.F32}
    assert sum(p.n_bytes for p in q8_plan) / 2**20 == pytest.approx(7481, rel=0.02)


def test_tokenizer_from_a_real_model(smollm2_path, tmp_path):
    path = write_synthetic_gguf(tmp_path / "t.gguf", "llama", tokenizer_from=smollm2_path)
    real, synth = open_gguf(smollm2_path), open_gguf(path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                "tokenizer.chat_template", "tokenizer.ggml.bos_token_id"):
        assert synth.metadata[key] == real.metadata[key], key
        assert synth.metadata_types[key] == real.metadata_types[key], key
    assert synth.tensors["token_embd.weight"].shape == (49152, 64)


def test_cli_writes_a_model_and_reports_bad_shapes_in_one_line(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert main([str(out), "--arch", "qwen3", "--layers", "3", "--no-chat-template", "--quiet"]) == 0
    g = open_gguf(out)
    assert g.metadata["qwen3.block_count"] == 3 and "tokenizer.chat_template" not in g.metadata
    assert main([str(tmp_path / "bad.gguf"), "--preset", "tiny-llama", "--vocab", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memra-make-gguf: vocab 10") and "\n" not in err
    assert not (tmp_path / "bad.gguf").exists()


def test_cli_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    from memra_engine.model.synthetic import _parser

    for action in _parser()._actions:
        assert action.help, action.option_strings


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_tiny_preset_runs_end_to_end_on_the_cpu_engine(preset, tiny_files):
    """The generated file is a complete model: the config accepts every tensor shape, the tokenizer
    round-trips text, and a forward pass gives finite logits with the planned spread (std ~2)."""
    from memra_engine.cpu.backend import CpuBackend
    from memra_engine.model.config import config_from_gguf
    from memra_engine.tokenizer import load_tokenizer

    g = open_gguf(tiny_files[preset])
    cfg = config_from_gguf(g)
    assert (cfg.n_layer, cfg.d_model, cfg.head_dim) == (PRESETS[preset].n_layer, 64, PRESETS[preset].head_dim)
    tok = load_tokenizer(tiny_files[preset])
    text = "Hello there, the world and you! ünïcode 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    backend = CpuBackend(g, n_ctx=64)
    logits = backend.prefill(ids)
    assert logits.shape == (PRESETS[preset].vocab,) and np.isfinite(logits).all()
    assert 1.0 < logits.std() < 4.0
    assert int(np.argmax(logits)) not in (0, 1, 2)   # control tokens are kept quiet


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_tiny_preset_means_the_same_to_transformers(preset, tiny_files):
    """transformers reads the synthetic GGUF (its own loader: names, metadata, llama's q/k
    permutation, gemma3's norm offsets) and computes the same logits as our engine: float32 on
    both sides, so agreement to 1e-4 relative L2 per position (measured ~1e-6)."""
    import logging

    import torch
    from transformers import AutoModelForCausalLM

    from memra_engine.cpu.backend import CpuBackend

    path = tiny_files[preset]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    ids = [int(i) for i in np.random.default_rng(5).integers(3, PRESETS[preset].vocab, 40)]
    with torch.no_grad():
        expected = model(torch.tensor([ids], dtype=torch.long)).logits[0].numpy()
    got = CpuBackend(open_gguf(path), n_ctx=64).prefill(ids, all_logits=True)
    rel = np.linalg.norm(got - expected, axis=-1) / np.linalg.norm(expected, axis=-1)
    assert rel.max() < 1e-4, rel
    assert np.array_equal(got.argmax(-1), expected.argmax(-1))
