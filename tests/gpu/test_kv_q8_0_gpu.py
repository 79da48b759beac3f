"""The q8_0 KV cache writes against numpy, byte for byte: kv_write_q8_0 (cuda/kv_cache.cu) and
rope_qk_kv_q8_0 (cuda/rope.cu) fill a buffer laid out as engine/gpu/kv_cache.py says
(int8 qs[n_kv][n_ctx][head_dim], then at a 256-byte boundary half d[n_kv][n_ctx][head_dim/32]) with
exactly the values of engine/cpu/kv_cache.quantize_q8_0, which tests/test_kv_q8_0.py holds equal to
gguf's own Q8_0 quantizer. Tolerance: none (the quantizer's arithmetic is IEEE float32 on both sides).
Bytes the launch must not write (other positions, the alignment gap) keep their fill pattern.
End to end, CudaBackend(kv_type="q8_0") follows CpuBackend(kv_type="q8_0") (bounds at the test).
"""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.cpu.kv_cache import quantize_q8_0
from memra_engine.gpu.kv_cache import buffer_layout

pytestmark = pytest.mark.gpu

f32 = np.float32
FILL = 0x5A  # every cache byte before a launch
T, N_CTX = 5, 37  # 37 positions: n_kv * 37 * head_dim is not a multiple of 256, so there is a gap


def random_rows(rng, shape) -> np.ndarray:
    """Normal values with a different scale per 32-block (1e-3 .. 1e3), one block of .5 ties
    (amax 127: d = 1 exactly, so x * id hits the ties) and one all-zero block (d = 0)."""
    x = rng.standard_normal(shape).reshape(*shape[:-1], -1, 32)
    x *= 10.0 ** rng.uniform(-3, 3, x.shape[:-1] + (1,))
    x = x.reshape(shape).astype(f32)
    x[0, 0, :8] = [127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5]
    x[0, 0, 8:32] = 0.25
    x[1, -1, -32:] = 0.0
    return x


def expected_cache(rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The bytes of one K or V buffer after rows [T, n_kv, head_dim] are written at positions pos."""
    _, n_kv, hd = rows.shape
    nbytes, scales_at = buffer_layout(n_kv, N_CTX, hd, "q8_0")
    buf = np.full(nbytes, FILL, np.uint8)
    qs = buf[: n_kv * N_CTX * hd].view(np.int8).reshape(n_kv, N_CTX, hd)
    d = buf[scales_at:].view(np.float16).reshape(n_kv, N_CTX, hd // 32)
    q, s = quantize_q8_0(rows)
    qs[:, pos] = q.transpose(1, 0, 2)
    d[:, pos] = s.transpose(1, 0, 2)
    return buf


def filled_cache(gpu, n_kv: int, hd: int) -> tuple[int, int, int]:
    """(buffer pointer, its scales pointer, its size) of a fresh q8_0 buffer full of FILL."""
    nbytes, scales_at = buffer_layout(n_kv, N_CTX, hd, "q8_0")
    ptr = gpu.put(np.full(nbytes, FILL, np.uint8))
    return ptr, ptr + scales_at, nbytes


def assert_same_bytes(got: np.ndarray, want: np.ndarray, n_values: int) -> None:
    bad = np.flatnonzero(got != want)
    where = "the values" if bad.size and bad[0] < n_values else "the scales or the gap"
    assert bad.size == 0, f"{bad.size} bytes differ, first at byte {bad[0] if bad.size else 0} ({where})"


@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("block", [32, 128])
def test_kv_write_q8_0_writes_ggml_q8_0_rows(gpu, hd, block):
    rng = np.random.default_rng(hd + block)
    n_q, n_kv = 2, 3
    width = (n_q + 2 * n_kv) * hd  # k and v are slices of one qkv row, as in the forward
    qkv = rng.standard_normal((T, width)).astype(f32)
    k, v = random_rows(rng, (T, n_kv, hd)), random_rows(rng, (T, n_kv, hd))
    qkv[:, n_q * hd:(n_q + n_kv) * hd] = k.reshape(T, -1)
    qkv[:, (n_q + n_kv) * hd:] = v.reshape(T, -1)
    pos = rng.choice(N_CTX, T, replace=False).astype(np.int32)
    p = gpu.put(qkv)
    kc, kd, nbytes = filled_cache(gpu, n_kv, hd)
    vc, vd, _ = filled_cache(gpu, n_kv, hd)
    gpu.rt.launch("kv_write_q8_0", (T, n_kv), block,
                  (p + n_q * hd * 4, p + (n_q + n_kv) * hd * 4, kc, vc, kd, vd, gpu.put(pos), width, width, hd, N_CTX))
    assert_same_bytes(gpu.get(kc, (nbytes,), np.uint8), expected_cache(k, pos), n_kv * N_CTX * hd)
    assert_same_bytes(gpu.get(vc, (nbytes,), np.uint8), expected_cache(v, pos), n_kv * N_CTX * hd)


@pytest.mark.parametrize("hd,n_kv,neox,norms", [(64, 3, True, False), (64, 3, False, False),
                                                (128, 2, True, True), (256, 1, True, True)])
@pytest.mark.parametrize("all_heads", [False, True])  # a head a block (decode), a token's heads a block (prefill)
def test_rope_qk_kv_q8_0_writes_the_roped_k_as_ggml_q8_0_rows(gpu, hd, n_kv, neox, norms, all_heads):
    """The q heads are given the k heads' values (n_q = n_kv, the same norm weights), so q_out holds
    exactly the float roped k that the kernel quantized: the K bytes must be quantize_q8_0(q_out).
    The f16 variant on the same input must give the same q_out and half(q_out) in its K cache."""
    rng = np.random.default_rng(hd + n_kv + 2 * neox)
    eps = 1e-6
    width = 3 * n_kv * hd  # q (= k), k, v
    k, v = random_rows(rng, (T, n_kv, hd)), random_rows(rng, (T, n_kv, hd))
    qkv = np.concatenate([k.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], axis=1)
    pos = rng.choice(N_CTX, T, replace=False).astype(np.int32)
    ff = gpu.put((1 + rng.random(hd // 2)).astype(f32)) if not norms else 0
    w = gpu.put((1 + 0.2 * rng.standard_normal(hd)).astype(f32)) if norms else 0
    block = hd if norms else max(32, min(128, hd // 2))  # as ops.attention launches it
    p, ppos = gpu.put(qkv), gpu.put(pos)
    hpb = 2 * n_kv if all_heads else 1
    grid = (-(-2 * n_kv // hpb), T)
    rope_args = (ppos, ff, n_kv, n_kv, hd, width, width, width, N_CTX, f32(1e4), f32(1.0), int(neox), w, w, f32(eps),
                 hpb)

    kc, kd, nbytes = filled_cache(gpu, n_kv, hd)
    vc, vd, _ = filled_cache(gpu, n_kv, hd)
    q_out = gpu.empty(T * n_kv * hd)
    gpu.rt.launch("rope_qk_kv_q8_0", grid, block,
                  (p, q_out, p + n_kv * hd * 4, p + 2 * n_kv * hd * 4, kc, vc, kd, vd, *rope_args))
    roped = gpu.get(q_out, (T, n_kv, hd))
    assert np.all(np.isfinite(roped))
    assert_same_bytes(gpu.get(kc, (nbytes,), np.uint8), expected_cache(roped, pos), n_kv * N_CTX * hd)
    assert_same_bytes(gpu.get(vc, (nbytes,), np.uint8), expected_cache(v, pos), n_kv * N_CTX * hd)

    zeros = np.zeros((n_kv, N_CTX, hd), np.float16)
    kc16, vc16, q_out16 = gpu.put(zeros), gpu.put(zeros), gpu.empty(T * n_kv * hd)
    gpu.rt.launch("rope_qk_kv_f16", grid, block,
                  (p, q_out16, p + n_kv * hd * 4, p + 2 * n_kv * hd * 4, kc16, vc16, *rope_args))
    assert np.array_equal(gpu.get(q_out16, (T, n_kv, hd)), roped)
    k16 = gpu.get(kc16, (n_kv, N_CTX, hd), np.float16)
    assert np.array_equal(k16[:, pos], roped.astype(np.float16).transpose(1, 0, 2))
    if not norms:  # plain rope: the same arithmetic as rope_f32
        y = gpu.empty(T * n_kv * hd)
        gpu.rt.launch("rope_f32", (n_kv, T), 32, (p + n_kv * hd * 4, y, ppos, ff, hd, width, n_kv * hd, f32(1e4),
                                                 f32(1.0), int(neox)))
        assert np.array_equal(gpu.get(y, (T, n_kv, hd)), roped)


# --- end to end (needs the q8_0 read path of the attention kernels) --------------------------------

E2E_MODELS = {
    "tiny-llama": dict(preset="tiny-llama", head_dim=64, n_head=4, n_kv_head=2, d_model=256),  # kv_write / rope fused
    "tiny-qwen3": dict(preset="tiny-qwen3"),    # head_dim 128, q/k norms fused into rope_qk_kv_q8_0
    "tiny-gemma3": dict(preset="tiny-gemma3"),  # head_dim 256, sliding window
}
PREFILL_BOUND_Q8 = 0.02  # f16 cache: <= 0.01 (test_backend.py); a cached value may land one q8_0 step
                         # (amax/127) away when the GPU's k differs from the cpu's by an ulp
LOGIT_BOUND_Q8 = 0.12    # decode rows, as test_backend.py's bound for the f16 cache


@pytest.mark.parametrize("name", list(E2E_MODELS))
def test_cuda_backend_with_q8_0_follows_the_cpu_q8_0_reference(tmp_path, name):
    """CudaBackend(kv_type="q8_0") against CpuBackend(kv_type="q8_0"): both caches hold the same
    Q8_0 values, so the bounds of the f16 comparison hold (prefill rows <= 0.02, 32 decode steps
    <= 0.12 each); graph replay equals eager bit for bit; the kv region is the q8_0 size."""
    from memra_engine.cpu.backend import CpuBackend
    from memra_engine.gpu.backend import CudaBackend
    from memra_engine.gpu.kv_cache import GpuKvCache
    from memra_engine.model.gguf_file import open_gguf
    from memra_engine.model.synthetic import write_synthetic_gguf

    g = open_gguf(write_synthetic_gguf(tmp_path / f"{name}.gguf", seed=3, **E2E_MODELS[name]))
    cpu = CpuBackend(g, 128, kv_type="q8_0")
    gpu = CudaBackend(g, n_ctx=128, kv_type="q8_0")
    try:
        cfg = gpu.config
        assert gpu.memory_stats().reserved["kv"] == GpuKvCache.bytes_needed(
            cfg.n_layer, cfg.n_kv_head, 128, cfg.head_dim, "q8_0")
        prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, 20).tolist()
        ref, got = cpu.prefill(prompt, all_logits=True), gpu.prefill(prompt, all_logits=True)
        assert np.all(np.isfinite(got))
        prefill_err = np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
        assert prefill_err.max() <= PREFILL_BOUND_Q8, prefill_err.max()
        tokens = [int(np.argmax(ref[-1]))]
        errs, steps = [], []
        for _ in range(32):
            r, o = cpu.decode(tokens[-1]), gpu.decode(tokens[-1])
            errs.append(np.linalg.norm(o - r) / np.linalg.norm(r))
            steps.append(o)
            tokens.append(int(np.argmax(r)))
        assert max(errs) <= LOGIT_BOUND_Q8, f"max decode row error {max(errs):.4f}, mean {np.mean(errs):.4f}"
        # the same steps again, eagerly (the decode above replays graphs): the same bits
        gpu.truncate(len(prompt))
        gpu.use_graphs = False
        for token, want in zip(tokens, steps):
            assert np.array_equal(gpu.decode(token), want)
    finally:
        gpu.close()
