"""The numpy reference backend on tiny synthetic models of every architecture, and its ops.

The real-model comparison with transformers is in test_oracle.py; here we check the backend's
own consistency (batched prefill vs one-token decode, truncate, verify, chunking, lazy weights),
sliding-window semantics, config errors, and each op against a naive reference.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from memra_engine.cpu import backend as cpu_backend
from memra_engine.cpu.backend import CpuBackend
from memra_engine.cpu.kv_cache import KvCache
from memra_engine.cpu.ops import CpuOps
from memra_engine.cpu.weights import QuantizedMatrix
from memra_engine.errors import ContextOverflowError, ModelFormatError, UnsupportedModelError
from memra_engine.model.config import config_from_gguf
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf

PRESETS = ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"]
VOCAB = 384          # the tiny presets' vocabulary
WINDOW = 16          # tiny-gemma3's sliding window

# Batched prefill and one-token decode run different BLAS kernels (gemm vs gemv), so their
# float32 sums round differently: ~1e-6 relative on these logits (std ~2). 1e-4 leaves margin
# while any real bug (a wrong position, a stale cache row) moves logits by O(1).
RTOL = 1e-4


def close(a: np.ndarray, b: np.ndarray, rtol: float = RTOL) -> None:
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(b).max()))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {p: write_synthetic_gguf(root / f"{p}.gguf", preset=p, seed=11) for p in PRESETS}


def random_tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


# --- backend consistency -------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_logits_equal_sequential_decode(preset, tiny):
    tokens = random_tokens(40, seed=1)   # 40 > WINDOW: gemma3's local layers drop old tokens
    batched = CpuBackend(open_gguf(tiny[preset]), n_ctx=64).prefill(tokens, all_logits=True)
    one_by_one = CpuBackend(open_gguf(tiny[preset]), n_ctx=64)
    sequential = np.stack([one_by_one.decode(t) for t in tokens])
    assert batched.shape == (40, VOCAB) and batched.dtype == np.float32
    assert np.abs(batched).max() > 1.0   # not a degenerate all-zero model
    close(batched, sequential)


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_then_decode_equals_one_prefill(preset, tiny):
    tokens = random_tokens(30, seed=2)
    whole = CpuBackend(open_gguf(tiny[preset]), n_ctx=64).prefill(tokens, all_logits=True)
    split = CpuBackend(open_gguf(tiny[preset]), n_ctx=64)
    first = split.prefill(tokens[:20], all_logits=True)
    rest = np.stack([split.decode(t) for t in tokens[20:]])
    close(np.concatenate([first, rest]), whole)
    assert split.n_past == 30


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gemma3"])
def test_truncate_then_redecode_reproduces_logits(preset, tiny):
    backend = CpuBackend(open_gguf(tiny[preset]), n_ctx=64)
    prompt, cont, other = random_tokens(12, seed=3), random_tokens(10, seed=4), random_tokens(10, seed=5)
    backend.prefill(prompt)
    want = np.stack([backend.decode(t) for t in cont])
    backend.truncate(12)
    diverted = np.stack([backend.decode(t) for t in other])   # overwrite the cache rows
    assert not np.allclose(diverted, want)
    backend.truncate(12)
    again = np.stack([backend.decode(t) for t in cont])
    np.testing.assert_array_equal(again, want)   # same code path, same inputs: bit-identical
    assert backend.n_past == 22


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-gemma3"])
def test_verify_rows_equal_decode_exactly(preset, tiny):
    prompt, draft = random_tokens(8, seed=6), random_tokens(5, seed=7)
    a = CpuBackend(open_gguf(tiny[preset]), n_ctx=64)
    a.prefill(prompt)
    rows = a.verify(draft)
    b = CpuBackend(open_gguf(tiny[preset]), n_ctx=64)
    b.prefill(prompt)
    np.testing.assert_array_equal(rows, np.stack([b.decode(t) for t in draft]))
    assert a.n_past == b.n_past == 13


def test_chunked_prefill_equals_unchunked(tiny, monkeypatch):
    tokens = random_tokens(37, seed=8)
    whole = CpuBackend(open_gguf(tiny["tiny-gemma3"]), n_ctx=64)
    want_all = whole.prefill(tokens, all_logits=True)
    monkeypatch.setattr(cpu_backend, "PREFILL_CHUNK", 5)
    chunked = CpuBackend(open_gguf(tiny["tiny-gemma3"]), n_ctx=64)
    close(chunked.prefill(tokens, all_logits=True), want_all)
    chunked.truncate(0)
    close(chunked.prefill(tokens), want_all[-1])


def test_lazy_weights_match_resident_weights(tiny):
    g = open_gguf(tiny["tiny-llama"])
    tokens = random_tokens(20, seed=9)
    resident = CpuBackend(g, n_ctx=32)
    assert resident.weights.all_resident
    # A budget below one layer: layers are dequantized on use, one at a time, and the
    # embedding and LM head stay quantized in the file.
    lazy = CpuBackend(g, n_ctx=32, weight_budget_bytes=1000)
    assert not lazy.weights.all_resident and lazy.weights.max_cached_layers == 1
    assert isinstance(lazy.weights.output, QuantizedMatrix)
    close(lazy.prefill(tokens, all_logits=True), resident.prefill(tokens, all_logits=True), rtol=1e-5)
    assert len(lazy.weights._layers) == 1
    close(lazy.decode(7), resident.decode(7), rtol=1e-5)


def test_context_overflow_is_a_clear_error_and_changes_nothing(tiny):
    backend = CpuBackend(open_gguf(tiny["tiny-llama"]), n_ctx=16)
    backend.prefill(random_tokens(10, seed=10))
    with pytest.raises(ContextOverflowError, match="do not fit: 10 of the 16-token context"):
        backend.prefill(random_tokens(7, seed=11))
    assert backend.n_past == 10
    backend.prefill(random_tokens(6, seed=12))
    with pytest.raises(ContextOverflowError):
        backend.decode(5)
    assert backend.n_past == 16
    with pytest.raises(ValueError):
        backend.truncate(17)


def test_memory_stats_reports_process_rss(tiny):
    stats = CpuBackend(open_gguf(tiny["tiny-llama"]), n_ctx=16).memory_stats()
    assert stats.process_rss > 10 << 20 and stats.device_total == 0


# --- sliding window ------------------------------------------------------------------------------

def logits_for(path, tokens: list[int]) -> np.ndarray:
    return CpuBackend(open_gguf(path), n_ctx=128).prefill(tokens, all_logits=True)


def test_local_layer_ignores_tokens_beyond_the_window(tmp_path):
    """One gemma3 layer (a sliding one): position p sees positions p-15..p and nothing older."""
    path = write_synthetic_gguf(tmp_path / "g1.gguf", preset="tiny-gemma3", n_layer=1, seed=12)
    assert config_from_gguf(open_gguf(path)).is_sliding(0)
    tokens = random_tokens(40, seed=13)
    changed = list(tokens)
    changed[10] = (tokens[10] + 1) % VOCAB
    base, moved = logits_for(path, tokens), logits_for(path, changed)
    delta = np.abs(base - moved).max(axis=-1)
    assert (delta[:10] == 0).all()                      # causal: earlier positions untouched
    assert (delta[10:10 + WINDOW] > 1e-3).all()         # positions 10..25 still see token 10
    assert (delta[10 + WINDOW:] == 0).all()             # position 26 on: out of the window


def test_every_sixth_layer_is_global(tmp_path):
    """5 local layers reach back at most 5 * 15 positions; adding layer 5 (global) reaches all."""
    local_only = write_synthetic_gguf(tmp_path / "g5.gguf", preset="tiny-gemma3", n_layer=5, seed=14)
    with_global = write_synthetic_gguf(tmp_path / "g6.gguf", preset="tiny-gemma3", n_layer=6, seed=14)
    cfg = config_from_gguf(open_gguf(with_global))
    assert [cfg.is_sliding(i) for i in range(6)] == [True] * 5 + [False]
    tokens = random_tokens(100, seed=15)
    changed = [(tokens[0] + 1) % VOCAB] + tokens[1:]
    reach = 5 * (WINDOW - 1)
    local_delta = np.abs(logits_for(local_only, tokens) - logits_for(local_only, changed)).max(axis=-1)
    assert (local_delta[reach + 1:] == 0).all() and local_delta[reach] > 0
    global_delta = np.abs(logits_for(with_global, tokens) - logits_for(with_global, changed)).max(axis=-1)
    assert (global_delta > 1e-4).all()


# --- config errors -------------------------------------------------------------------------------

def patched(path, tmp_path, old: bytes, new: bytes):
    raw = path.read_bytes()
    assert raw.count(old) == 1, old
    out = tmp_path / "patched.gguf"
    out.write_bytes(raw.replace(old, new))
    return open_gguf(out)


def u32_field(key: str, value: int) -> bytes:
    """A GGUF metadata entry with a uint32 value (type 4), as the synthetic writer stores it."""
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<II", 4, value)


def test_unknown_architecture(tiny, tmp_path):
    key = b"general.architecture"
    old = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, 5) + b"llama"
    g = patched(tiny["tiny-llama"], tmp_path, old, old[:-5] + b"xyzzy")
    with pytest.raises(UnsupportedModelError) as err:
        CpuBackend(g, n_ctx=16)
    assert str(err.value) == "unsupported architecture 'xyzzy' (supported: llama, qwen2, qwen3, gemma3, qwen3moe, olmoe)"


def test_missing_tensor_is_named(tiny, tmp_path):
    g = patched(tiny["tiny-qwen3"], tmp_path, b"blk.1.attn_k_norm.weight", b"blk.1.attn_k_xxxx.weight")
    with pytest.raises(ModelFormatError, match="missing tensor 'blk.1.attn_k_norm.weight'"):
        config_from_gguf(g)


TINY_LLAMA_FIELDS = {"llama.embedding_length": 64, "llama.attention.head_count": 4, "llama.block_count": 2,
                     "llama.attention.key_length": 16, "llama.attention.value_length": 16,
                     "llama.attention.head_count_kv": 2, "llama.rope.dimension_count": 16}


@pytest.mark.parametrize("changes, message", [
    ({"llama.embedding_length": 2**31}, "'llama.embedding_length' = 2147483648 is absurd"),
    ({"llama.attention.head_count": 0}, "'llama.attention.head_count' = 0 is absurd"),
    ({"llama.block_count": 100_000}, "'llama.block_count' = 100000 is absurd"),
    ({"llama.attention.head_count_kv": 3}, "head_count 4 is not a multiple of head_count_kv 3"),
    # Heads that do not fit the stored [64, 64] attn_q tensor: caught before any allocation.
    ({"llama.attention.head_count": 8}, "tensor 'blk.0.attn_q.weight' has shape [64, 64], the metadata implies [128, 64]"),
    ({"llama.attention.key_length": 32, "llama.attention.value_length": 32, "llama.rope.dimension_count": 32},
     "tensor 'blk.0.attn_q.weight' has shape [64, 64], the metadata implies [128, 64]"),
])
def test_absurd_or_inconsistent_dimensions(tiny, tmp_path, changes, message):
    raw = tiny["tiny-llama"].read_bytes()
    for key, value in changes.items():
        old = u32_field(key, TINY_LLAMA_FIELDS[key])
        assert raw.count(old) == 1, key
        raw = raw.replace(old, u32_field(key, value))
    path = tmp_path / "patched.gguf"
    path.write_bytes(raw)
    with pytest.raises(ModelFormatError) as err:
        CpuBackend(open_gguf(path), n_ctx=16)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- ops against naive references ----------------------------------------------------------------

def naive_attention(q, keys, values, positions, scale, window, softcap):
    """Loop over rows and heads: softmax over the visible cache positions."""
    n_tok, n_head, hd = q.shape
    group = n_head // keys.shape[1]
    out = np.zeros((n_tok, n_head, hd))
    for t in range(n_tok):
        p = positions[t]
        lo = max(0, p - window + 1) if window else 0
        for h in range(n_head):
            k, v = keys[lo:p + 1, h // group], values[lo:p + 1, h // group]
            s = (k.astype(np.float64) @ q[t, h]) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ v
    return out.reshape(n_tok, n_head * hd)


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (5, 0.0), (0, 3.0)])
def test_attention_op_matches_naive_loop(window, softcap):
    rng = np.random.default_rng(20)
    n_head, n_kv, hd, n_past, n_tok = 6, 2, 8, 9, 7
    ops = CpuOps(KvCache(n_layer=2, n_kv_head=n_kv, n_ctx=32, head_dim=hd))
    keys = rng.standard_normal((n_past + n_tok, n_kv, hd)).astype(np.float32)
    values = rng.standard_normal((n_past + n_tok, n_kv, hd)).astype(np.float32)
    q = rng.standard_normal((n_tok, n_head, hd)).astype(np.float32)
    ops.kv.write(1, 0, keys[:n_past], values[:n_past])   # the past, as earlier steps left it
    positions = np.arange(n_past, n_past + n_tok, dtype=np.int32)
    got = ops.attention(1, q, keys[n_past:], values[n_past:], positions, 0.3, window, softcap)
    want = naive_attention(q, keys, values, positions, 0.3, window, softcap)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
def test_rope_is_a_rotation_by_relative_position(neox):
    """q.k after rope depends only on the distance between the positions, and norms are kept."""
    rng = np.random.default_rng(21)
    ops = CpuOps(KvCache(1, 1, 64, 16))
    q = rng.standard_normal((1, 2, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 16)).astype(np.float32)

    def dot_at(m: int, n: int) -> np.ndarray:
        rq = ops.rope(q, np.array([m]), 10000.0, neox)
        rk = ops.rope(k, np.array([n]), 10000.0, neox)
        return (rq * rk).sum(-1)

    np.testing.assert_allclose(dot_at(7, 3), dot_at(40, 36), rtol=1e-4)
    assert not np.allclose(dot_at(7, 3), dot_at(7, 4), rtol=1e-3)
    np.testing.assert_array_equal(ops.rope(q, np.array([0]), 10000.0, neox), q)
    rotated = ops.rope(q, np.array([13]), 10000.0, neox)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)


def test_rope_frequency_divisors_and_linear_scaling():
    """llama 3.1's rope_freqs divide each frequency; linear scaling multiplies all of them."""
    rng = np.random.default_rng(24)
    ops = CpuOps(KvCache(1, 1, 64, 8))
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    positions = np.array([9, 10])
    halved = ops.rope(x, positions, 10000.0, neox=True, scale=0.5)
    divided = ops.rope(x, positions, 10000.0, neox=True, freq_factors=np.full(4, 2.0, np.float32))
    np.testing.assert_allclose(divided, halved, rtol=1e-6, atol=1e-6)
    # Only the frequency with divisor != 1 changes: pair (i, i + 4) for i = 3.
    ff = np.array([1, 1, 1, 8], np.float32)
    mixed = ops.rope(x, positions, 10000.0, neox=True, freq_factors=ff)
    plain = ops.rope(x, positions, 10000.0, neox=True)
    same = [0, 1, 2, 4, 5, 6]
    np.testing.assert_array_equal(mixed[..., same], plain[..., same])
    assert not np.allclose(mixed[..., [3, 7]], plain[..., [3, 7]])


def test_rope_pair_layouts_are_the_same_rotation_up_to_a_permutation():
    """llama GGUFs interleave each head's halves (llama.cpp permutes q/k rows): rope on adjacent
    pairs of the permuted vector equals NeoX rope on the original, permuted."""
    rng = np.random.default_rng(22)
    ops = CpuOps(KvCache(1, 1, 64, 8))
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    interleave = np.stack([np.arange(4), np.arange(4, 8)], axis=-1).reshape(-1)   # 0,4,1,5,...
    positions = np.array([5, 6, 7])
    neox = ops.rope(x, positions, 500.0, neox=True)
    pairs = ops.rope(x[..., interleave], positions, 500.0, neox=False)
    np.testing.assert_allclose(pairs, neox[..., interleave], rtol=1e-6, atol=1e-6)


def test_elementwise_ops_match_their_formulas():
    rng = np.random.default_rng(23)
    ops = CpuOps(KvCache(1, 1, 4, 2))
    g = (rng.standard_normal((3, 10)) * 4).astype(np.float32)
    u = rng.standard_normal((3, 10)).astype(np.float32)
    g64 = g.astype(np.float64)
    np.testing.assert_allclose(ops.swiglu(g, u), g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)
    gelu = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    np.testing.assert_allclose(ops.gelu_mul(g, u), gelu * u, rtol=1e-5, atol=1e-6)
    w = rng.standard_normal(10).astype(np.float32)
    rms = g64 / np.sqrt((g64**2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(g, w, 1e-6), rms, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ops.softcap(g, 2.0), 2 * np.tanh(g64 / 2), rtol=1e-6, atol=1e-6)
    a, b, c = ops.split(g, (2, 3, 5))
    assert (a.shape, b.shape, c.shape) == ((3, 2), (3, 3), (3, 5))
    np.testing.assert_array_equal(np.concatenate([a, b, c], -1), g)


def test_kv_cache_memory_is_touched_only_as_it_fills():
    """A 377 MiB cache (the default model's shape at --ctx 8192) costs memory only for what is
    written: one position in every layer and kv head touches a few pages, not the whole slices
    (with huge pages each first write zeroed 2 MiB: the first prefill paid for the whole cache),
    and the values read back."""
    import psutil

    proc = psutil.Process()
    cache = KvCache(30, 3, 8192, 64)
    before = proc.memory_info().rss
    rng = np.random.default_rng(0)
    k, v = rng.standard_normal((2, 1, 3, 64)).astype(np.float32)
    for layer in range(30):
        keys, values = cache.write(layer, 0, k, v)
    grown = proc.memory_info().rss - before
    assert cache.nbytes == 2 * 30 * 3 * 8192 * 64 * 4
    assert grown < 8 << 20, f"{grown / 2**20:.0f} MiB touched for 180 rows of 256 bytes"
    np.testing.assert_array_equal(keys[:, 0], k[0])
    np.testing.assert_array_equal(values[:, 0], v[0])
    assert not cache.k[:, :, 1:].any()
