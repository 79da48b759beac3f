"""`--kv-type q8_0` on the cpu: the reference quantizer against gguf's own Q8_0, the cache and the
backend with it, the flags of memra-chat / memra-bench, and the GPU-side choices that need no GPU
(cache sizes and layout, which write kernel a forward launches). The device kernels are checked
in tests/gpu/test_kv_q8_0_gpu.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from memra_engine.cpu.backend import CpuBackend
from memra_engine.cpu.kv_cache import KvCache, dequantize_q8_0, quantize_q8_0
from memra_engine.errors import MemraError, UnsupportedModelError
from memra_engine.kv_type import check_kv_type
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf
from tiny_models import tiny_llama_path  # noqa: F401  (fixture; head_dim 16: q8_0 is refused there)

Q8_0 = GGMLQuantizationType.Q8_0


def gguf_round_trip(x: np.ndarray) -> np.ndarray:
    return dequantize(quantize(x, Q8_0), Q8_0).reshape(x.shape)


def random_rows(rng, shape) -> np.ndarray:
    """Normal values with a different scale per 32-block (1e-3 .. 1e3), as cached k/v rows vary."""
    x = rng.standard_normal(shape)
    scales = 10.0 ** rng.uniform(-3, 3, shape[:-1] + (shape[-1] // 32, 1))
    return (x.reshape(*shape[:-1], -1, 32) * scales).reshape(shape).astype(np.float32)


@pytest.fixture(scope="module")
def tiny_hd32(tmp_path_factory):
    """A tiny llama with head_dim 32 (the tiny-llama preset's 16 is below a q8_0 block)."""
    return write_synthetic_gguf(tmp_path_factory.mktemp("kvq") / "tiny-llama-hd32.gguf", preset="tiny-llama",
                                head_dim=32, seed=5)


# --- the reference quantizer -------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [32, 64, 256])
def test_quantize_q8_0_equals_gguf_bit_for_bit(head_dim):
    rng = np.random.default_rng(head_dim)
    x = random_rows(rng, (37, 3, head_dim))
    x[0, 0, :32] = 0.0  # an all-zero block: d = 0, id = 0
    qs, d = quantize_q8_0(x)
    assert qs.dtype == np.int8 and qs.shape == x.shape
    assert d.dtype == np.float16 and d.shape == (37, 3, head_dim // 32)
    raw = quantize(x, Q8_0).reshape(-1, 34)  # ggml block: f16 d, then 32 int8
    assert np.array_equal(raw[:, :2].copy().view(np.float16).ravel(), d.ravel())
    assert np.array_equal(raw[:, 2:].copy().view(np.int8), qs.reshape(-1, 32))
    back = dequantize_q8_0(qs, d)
    assert np.array_equal(back.view(np.uint32), gguf_round_trip(x).view(np.uint32))
    assert not np.array_equal(back, x)  # it does quantize


def test_quantize_q8_0_rounds_half_away_from_zero_like_roundf():
    # amax 127 gives d = 1 and id = 1 exactly, so x * id lands on the .5 ties themselves
    x = np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5] + [0.25] * 24, np.float32)
    qs, d = quantize_q8_0(x)
    assert float(d[0]) == 1.0
    assert qs[:8].tolist() == [127, 1, -1, 2, -2, 3, -3, 127]  # numpy's round() would give 0, 0, 2, -2, 2, -2
    assert np.array_equal(dequantize_q8_0(qs, d), gguf_round_trip(x))


# --- the cache and the backend -------------------------------------------------------------------

def test_q8_0_cache_reads_back_what_gguf_q8_0_gives():
    rng = np.random.default_rng(3)
    n_kv, hd = 2, 64
    f16_cache = KvCache(1, n_kv, 16, hd)
    q8_cache = KvCache(1, n_kv, 16, hd, kv_type="q8_0")
    for start, T in ((0, 5), (5, 1), (6, 7)):
        k, v = random_rows(rng, (T, n_kv, hd)), random_rows(rng, (T, n_kv, hd))
        keys, values = q8_cache.write(0, start, k, v)
        assert np.array_equal(keys[:, start:], gguf_round_trip(k).transpose(1, 0, 2))
        assert np.array_equal(values[:, start:], gguf_round_trip(v).transpose(1, 0, 2))
        keys, values = f16_cache.write(0, start, k, v)
        assert np.array_equal(keys[:, start:], k.transpose(1, 0, 2))  # the cpu "f16" cache keeps float32


def test_bad_kv_type_or_head_dim_is_a_one_line_error():
    with pytest.raises(MemraError, match=r"^unknown KV type 'q4_0' \(choose f16 or q8_0\)$"):
        KvCache(1, 1, 8, 32, kv_type="q4_0")
    with pytest.raises(UnsupportedModelError, match="multiple of 32; this model's is 48") as err:
        KvCache(1, 1, 8, 48, kv_type="q8_0")
    assert "\n" not in str(err.value)
    assert check_kv_type("f16", 48) == "f16"  # f16 takes any head_dim


def test_cpu_backend_with_q8_0_stays_close_to_f16(tiny_hd32):
    """Q8_0 keeps each cached value within d/2 = amax/254 of its block: the logits move, but little.
    Bound: ||q8 - f16|| / ||f16|| <= 3e-2 over 48 positions (measured 9e-3), and top-1 agreement
    on >= 90% of them; they must differ at all, or the cache did not quantize."""
    tokens = np.random.default_rng(1).integers(3, 384, 48).tolist()
    ref = CpuBackend(open_gguf(tiny_hd32), n_ctx=64).prefill(tokens, all_logits=True)
    q8 = CpuBackend(open_gguf(tiny_hd32), n_ctx=64, kv_type="q8_0")
    assert q8.kv_type == "q8_0"
    got = q8.prefill(tokens, all_logits=True)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert 0 < err <= 3e-2, err
    assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.9
    # decoding on after the prefill reads the quantized rows back: same as a prefill of one more token
    step = q8.decode(7)
    whole = CpuBackend(open_gguf(tiny_hd32), n_ctx=64, kv_type="q8_0").prefill(tokens + [7], all_logits=True)
    np.testing.assert_allclose(step, whole[-1], rtol=1e-4, atol=1e-4 * float(np.abs(whole[-1]).max()))


def test_cpu_backend_refuses_q8_0_below_a_block(tiny_llama_path):
    with pytest.raises(UnsupportedModelError, match="multiple of 32"):
        CpuBackend(open_gguf(tiny_llama_path), n_ctx=16, kv_type="q8_0")


def test_engine_generates_with_q8_0(tiny_hd32):
    from memra_engine.generate import Engine
    from memra_engine.sampling import SamplingParams

    with Engine.load(tiny_hd32, backend="cpu", n_ctx=128, kv_type="q8_0") as eng:
        assert eng.info.kv_type == "q8_0"
        result = eng.chat([{"role": "user", "content": "hello there"}], SamplingParams(seed=3, max_tokens=8)).collect()
    assert result.done.reason in ("length", "eos", "stop") and len(result.token_ids) > 0
    with pytest.raises(MemraError, match="unknown KV type"):
        Engine.load(tiny_hd32, backend="cpu", kv_type="int4")


# --- the flags -------------------------------------------------------------------------------------

def test_memra_chat_kv_type_flag(tiny_hd32, tiny_llama_path, capsys):
    from memra_tui import cli

    assert cli.build_parser().parse_args([]).kv_type == "f16"
    assert cli.main([str(tiny_hd32), "--backend", "cpu", "--kv-type", "bogus", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["memra-chat: error: unknown KV type 'bogus' (choose f16 or q8_0)"]
    assert cli.main([str(tiny_llama_path), "--backend", "cpu", "--kv-type", "q8_0", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("memra-chat: error: --kv-type q8_0 needs a head dimension that is a multiple of 32")
    assert cli.main([str(tiny_hd32), "--backend", "cpu", "--kv-type", "q8_0", "--prompt", "hi", "-n", "4",
                     "--seed", "1", "--ctx", "64"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() and "error" not in out.err


def test_memra_chat_ui_gets_the_kv_type(monkeypatch, capsys):
    import memra_tui.app
    from memra_tui import cli

    calls = []
    monkeypatch.setattr(memra_tui.app, "run_app", lambda *args, **options: calls.append(args) or 0)
    assert cli.main(["model.gguf", "--kv-type", "q8_0"]) == 0
    assert calls == [("model.gguf", "auto", 4096, False, "q8_0")]
    assert cli.main(["model.gguf", "--kv-type", "f32"]) == 1  # refused before the UI opens
    assert calls == [("model.gguf", "auto", 4096, False, "q8_0")]
    assert capsys.readouterr().err.strip() == "memra-chat: error: unknown KV type 'f32' (choose f16 or q8_0)"


def test_memra_bench_kv_type_flag(tiny_hd32, capsys):
    from memra_engine import bench

    args = ["--backend", "cpu", "--runs", "1", "--n-prompt", "16", "--n-gen", "4"]
    assert bench.main([str(tiny_hd32), *args, "--kv-type", "q8_0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_type"] == "q8_0"
    assert bench.main([str(tiny_hd32), *args, "--kv-type", "q5"]) == 1
    assert capsys.readouterr().err.strip() == "memra-bench: error: unknown KV type 'q5' (choose f16 or q8_0)"


def test_header_names_a_non_default_kv_type():
    from dataclasses import replace

    from memra_engine.events import EngineInfo
    from memra_tui.widgets.engine_header import EngineHeader

    info = EngineInfo("m", "llama", 135_000_000, "Q8_0 x1", 4096, "cuda", "GPU", True)
    assert "KV" not in EngineHeader(info).render().plain
    assert "cuda · GPU · KV q8_0 │" in EngineHeader(replace(info, kv_type="q8_0")).render().plain


# --- the GPU side, without a GPU -------------------------------------------------------------------

def test_gpu_cache_layout_and_sizes():
    from memra_engine.gpu.kv_cache import GpuKvCache, buffer_layout

    n_layer, n_kv, n_ctx, hd = 3, 3, 37, 64
    values = n_kv * n_ctx * hd  # 7104 bytes of int8: the scales start at the next 256 boundary, 7168
    assert buffer_layout(n_kv, n_ctx, hd, "q8_0") == (7168 + 2 * values // 32, 7168)
    assert buffer_layout(n_kv, n_ctx, hd, "f16") == (2 * values, 0)
    f16 = GpuKvCache.bytes_needed(n_layer, n_kv, n_ctx, hd)
    q8 = GpuKvCache.bytes_needed(n_layer, n_kv, n_ctx, hd, "q8_0")
    assert f16 == n_layer * 2 * 14336 and q8 == n_layer * 2 * 7680

    class Pool:  # a bump allocator like VramPool's, recording what the cache asks for
        def __init__(self):
            self.used, self.sizes = 0, []

        def alloc(self, region, nbytes, name=""):
            assert region == "kv"
            ptr, self.used = 1 << 32 | self.used, self.used + -(-nbytes // 256) * 256
            self.sizes.append(nbytes)
            return type("Buf", (), {"ptr": ptr})()

    pool = Pool()
    kv = GpuKvCache(pool, n_layer, n_kv, n_ctx, hd, kv_type="q8_0")
    assert kv.kv_type == "q8_0" and pool.used == q8 and set(pool.sizes) == {kv.layer_bytes}
    k, v = kv.layer_ptrs(1)
    assert kv.layer_scale_ptrs(1) == (k + 7168, v + 7168)
    assert kv.write_args(1) == (k, v, k + 7168, v + 7168)
    f16_kv = GpuKvCache(Pool(), n_layer, n_kv, n_ctx, hd)
    assert f16_kv.kv_type == "f16" and f16_kv.layer_scale_ptrs(0) == (0, 0)
    assert f16_kv.write_args(0) == f16_kv.layer_ptrs(0)
    with pytest.raises(UnsupportedModelError):
        GpuKvCache.bytes_needed(1, 1, 8, 80, "q8_0")


def test_q8_0_oom_hint_does_not_suggest_q8_0():
    from memra_engine.gpu.memory import OOM_HINT, OOM_HINT_Q8_0

    assert "--kv-type q8_0" in OOM_HINT and "kv-type" not in OOM_HINT_Q8_0 and "--ctx" in OOM_HINT_Q8_0


class RecordingRuntime:
    """Stands in for GpuRuntime: checks each launch against the kernel's declared signature."""

    max_shared = 227 * 1024  # an H100's opt-in limit

    def __init__(self):
        from memra_engine.gpu import build

        self.signatures = build.kernel_signatures()
        self.launches: list[tuple[str, tuple]] = []

    def launch(self, name, grid, block, args, shared=0):
        assert name in self.signatures, f"{name} is not declared in cuda/*.cu"
        sig = self.signatures[name][1]
        assert len(args) == len(sig), f"{name}: {len(args)} args for signature {sig}"
        for code, arg in zip(sig, args):
            assert isinstance(arg, np.float32) if code == "f" else isinstance(arg, (int, np.integer)), (name, arg)
        block = int(np.prod(block))
        if name.startswith(("kv_write_", "rope_qk_kv_")):
            assert block % 32 == 0, (name, block)  # store_row_q8_0 works in whole warps
        self.launches.append((name, tuple(args)))

    def __getattr__(self, name):  # memsets, uploads, ...: nothing to record
        return lambda *args, **kw: None


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-gemma3"])
@pytest.mark.parametrize("fuse_rope_kv", [True, False])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_forward_writes_the_cache_with_the_kernel_of_its_kv_type(tmp_path, preset, fuse_rope_kv, kv_type):
    from memra_engine.gpu.kv_cache import GpuKvCache
    from memra_engine.gpu.ops import Arena, DArray, GpuOps
    from memra_engine.gpu.weights import GpuWeights
    from memra_engine.model import arch_module
    from memra_engine.model.config import config_from_gguf

    g = open_gguf(write_synthetic_gguf(tmp_path / f"{preset}.gguf", preset=preset, seed=2))
    cfg = config_from_gguf(g)
    kv = GpuKvCache(None, cfg.n_layer, cfg.n_kv_head, 64, cfg.head_dim, kv_type)
    ops = GpuOps(None, cfg, kv, Arena.unbounded(), dry=True)
    ops.rt = rt = RecordingRuntime()
    ops.fuse_rope_kv = fuse_rope_kv
    ops.begin(64)
    ids = DArray(1 << 20, (3,), 1)
    arch_module(cfg.arch).forward(ops, GpuWeights(g, cfg).upload(None, None, dry=True), cfg, ids, ids, False)
    ops.flush()
    writes = [(name, args) for name, args in rt.launches if name.startswith(("kv_write_", "rope_qk_kv_"))]
    assert [name for name, _ in writes] == [f"{'rope_qk_kv' if fuse_rope_kv else 'kv_write'}_{kv_type}"] * cfg.n_layer
    for layer, (_, args) in enumerate(writes):
        cache = kv.write_args(layer)
        at = 4 if fuse_rope_kv else 2  # after (q, q_out, k, v) or (k, v)
        assert args[at:at + len(cache)] == cache
