"""open_gguf on the real models, checked against gguf.GGUFReader as an independent parser."""
from __future__ import annotations

import time
from collections import Counter

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.model.gguf_file import dequantize, open_gguf


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return open_gguf(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_path):
    return gguf.GGUFReader(smollm2_path)   # ~2 s: the slow, trusted reference parser


def test_smollm2_metadata(smollm2):
    m = smollm2.metadata
    assert m["general.architecture"] == "llama"
    assert (m["llama.block_count"], m["llama.embedding_length"], m["llama.feed_forward_length"]) == (30, 576, 1536)
    assert (m["llama.attention.head_count"], m["llama.attention.head_count_kv"]) == (9, 3)
    assert m["llama.rope.freq_base"] == 100000.0
    assert m["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "smollm"
    tokens = m["tokenizer.ggml.tokens"]
    assert len(tokens) == 49152 and tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert m["tokenizer.ggml.token_type"][:3] == [3, 3, 3]
    assert m["tokenizer.ggml.merges"][0] == "Ġ t"
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert m["tokenizer.ggml.add_bos_token"] is False
    assert "<|im_start|>" in m["tokenizer.chat_template"]
    assert smollm2.metadata_types["tokenizer.ggml.token_type"] == (
        gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)


def test_smollm2_metadata_matches_gguf_reader(smollm2, smollm2_reader):
    expected = {name: field.contents() for name, field in smollm2_reader.fields.items()
                if not name.startswith("GGUF.")}
    assert smollm2.metadata.keys() == expected.keys()
    for key, value in expected.items():
        got = smollm2.metadata[key]
        if isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-7), key
        else:
            assert got == value, key


def test_smollm2_tensor_shapes_are_numpy_order(smollm2):
    t = smollm2.tensors
    assert len(t) == 272 and "output.weight" not in t   # tied embeddings
    assert Counter(x.ggml_type for x in t.values()) == {QT.Q4_1: 210, QT.F32: 61, QT.Q8_0: 1}
    assert t["token_embd.weight"].shape == (49152, 576) and t["token_embd.weight"].ggml_type == QT.Q8_0
    assert t["blk.0.attn_q.weight"].shape == (576, 576)
    assert t["blk.0.attn_k.weight"].shape == (192, 576)        # 3 kv heads x 64 rows, 576 columns
    assert t["blk.0.ffn_up.weight"].shape == (1536, 576)
    assert t["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert t["blk.29.ffn_norm.weight"].shape == (576,) and t["blk.29.ffn_norm.weight"].ggml_type == QT.F32


def test_smollm2_tensor_table_matches_gguf_reader(smollm2, smollm2_reader):
    assert len(smollm2.tensors) == len(smollm2_reader.tensors)
    for rt in smollm2_reader.tensors:
        ours = smollm2.tensors[rt.name]
        assert ours.shape == tuple(reversed(rt.shape.tolist())), rt.name   # reader's shape is ggml ne
        assert ours.ggml_type == rt.tensor_type
        assert ours.offset == rt.data_offset and ours.n_bytes == rt.n_bytes
        assert ours.data.shape == rt.data.shape and ours.data.dtype == rt.data.dtype


def test_tensor_data_is_a_read_only_view_of_one_mmap(smollm2):
    assert isinstance(smollm2.mmap, np.memmap) and smollm2.mmap.size == smollm2.file_size
    for t in smollm2.tensors.values():
        assert np.shares_memory(t.data, smollm2.mmap), t.name
        assert not t.data.flags.writeable, t.name
    embd = smollm2.tensors["token_embd.weight"]
    start = embd.offset
    assert np.array_equal(embd.data.reshape(-1)[:64], smollm2.mmap[start:start + 64])


def test_open_is_fast_and_reads_no_weights(smollm2_path):
    started = time.perf_counter()
    g = open_gguf(smollm2_path)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"open took {elapsed:.2f} s"
    assert g.data_offset % g.alignment == 0 and g.version == 3


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.7.ffn_down.weight",
                                  "blk.0.attn_norm.weight", "output_norm.weight"])
def test_dequantize_agrees_with_gguf(name, smollm2, smollm2_reader):
    rt = next(t for t in smollm2_reader.tensors if t.name == name)
    expected = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(smollm2.tensors[name].shape)
    got = dequantize(smollm2.tensors[name])
    assert got.dtype == np.float32 and got.shape == smollm2.tensors[name].shape
    assert np.array_equal(got, expected)
    assert np.isfinite(got).all() and got.std() > 0


def test_gemma3_mixed_quants(gemma3_path):
    started = time.perf_counter()
    g = open_gguf(gemma3_path)
    assert time.perf_counter() - started < 1.0
    m = g.metadata
    assert m["general.architecture"] == "gemma3" and m["gemma3.block_count"] == 18
    assert m["gemma3.attention.key_length"] == 256 and m["gemma3.attention.sliding_window"] == 512
    assert m["tokenizer.ggml.model"] == "llama" and len(m["tokenizer.ggml.tokens"]) == 262144
    assert len(m["tokenizer.ggml.scores"]) == 262144
    assert Counter(t.ggml_type for t in g.tensors.values()) == {
        QT.F32: 109, QT.Q5_0: 81, QT.Q4_K: 27, QT.Q8_0: 10, QT.Q6_K: 9}
    assert g.tensors["token_embd.weight"].shape == (262144, 640)
    assert g.tensors["blk.0.attn_q.weight"].shape == (1024, 640)     # 4 heads x 256 > d_model
    assert g.tensors["blk.0.attn_output.weight"].shape == (640, 1024)
    for name in ("blk.0.attn_output.weight", "blk.0.ffn_down.weight"):   # Q4_K, Q6_K
        t = g.tensors[name]
        assert t.data.shape == (t.shape[0], t.shape[1] // 256 * gguf.GGML_QUANT_SIZES[t.ggml_type][1])
        w = dequantize(t)
        assert np.isfinite(w).all() and 0.005 < w.std() < 0.2, name
