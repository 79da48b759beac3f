"""The cpu KV cache: one preallocated float32 array each for keys and values.

Layout [n_layer, n_kv_head, n_ctx, head_dim]: for one layer and kv head the cached keys are a
contiguous [n_ctx, head_dim] matrix, so scores over the first L positions are one BLAS matmul
per kv head with no copy. Memory is only touched as the cache fills: the arrays live in an
anonymous mapping without transparent huge pages (lazy_zeros).

kv_type (engine/kv_type.py) sets what a cached value reads back as, not how it is stored: the
arrays stay float32 so attention is the same code for both.
- "f16": the value itself (float32; the reference keeps full precision, the GPU's f16 rounding is
  within the GPU tests' tolerance);
- "q8_0": the value after a Q8_0 round trip, bit for bit what ggml's quantize_row_q8_0 followed
  by dequantization gives (blocks of 32 along head_dim; see quantize_q8_0). The GPU's q8_0 cache
  stores the same int8 values and f16 scales, so the GPU can be checked against this.
"""
from __future__ import annotations

import mmap

import numpy as np

from memra_engine.kv_type import DEFAULT_KV_TYPE, Q8_0_BLOCK, check_kv_type


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [..., n] (n a multiple of 32) -> (qs int8 [..., n], d float16 [..., n/32]).

    ggml's quantize_row_q8_0_ref per block of 32: d = amax / 127, id = 1/d (0 when d is 0),
    q = roundf(x * id) (half away from zero), d stored as f16. All in float32, as in C."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(-1, Q8_0_BLOCK)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    scaled = blocks * inv
    a = np.abs(scaled)
    rounded = np.floor(a)
    rounded += a - rounded >= 0.5  # a - floor(a) is exact in float32: no double rounding
    qs = np.copysign(rounded, scaled).astype(np.int8)
    return qs.reshape(x.shape), d.astype(np.float16).reshape(*x.shape[:-1], -1)


def dequantize_q8_0(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(qs int8 [..., n], d float16 [..., n/32]) -> float32 [..., n]: q * float(d)."""
    blocks = qs.reshape(-1, Q8_0_BLOCK).astype(np.float32) * d.reshape(-1, 1).astype(np.float32)
    return blocks.reshape(qs.shape)


def lazy_zeros(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """Zeros whose pages are touched only where written. np.zeros would do it with small pages,
    but numpy advises huge pages for large arrays: then the first write into each 2 MiB of a
    layer's [n_ctx, head_dim] slices zeroes all of it, and the first prefill paid for the whole
    cache (0.86 s of a 1.17 s first prefill at --ctx 8192 on the default model; 0.27 s warm)."""
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))  # anonymous: zero-filled on demand
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


class KvCache:
    def __init__(self, n_layer: int, n_kv_head: int, n_ctx: int, head_dim: int, kv_type: str = DEFAULT_KV_TYPE):
        self.kv_type = check_kv_type(kv_type, head_dim)
        shape = (n_layer, n_kv_head, n_ctx, head_dim)
        self.k = lazy_zeros(shape)
        self.v = lazy_zeros(shape)
        self.n_ctx = n_ctx

    @staticmethod
    def bytes_needed(n_layer: int, n_kv_head: int, n_ctx: int, head_dim: int) -> int:
        return 2 * n_layer * n_kv_head * n_ctx * head_dim * 4  # float32 whatever the kv_type

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v [T, n_kv, hd] at positions start..start+T-1; return the layer's keys and
        values [n_kv, start+T, hd] for every position written so far, as views."""
        if self.kv_type == "q8_0":
            k, v = dequantize_q8_0(*quantize_q8_0(k)), dequantize_q8_0(*quantize_q8_0(v))
        end = start + k.shape[0]
        self.k[layer, :, start:end] = k.transpose(1, 0, 2)
        self.v[layer, :, start:end] = v.transpose(1, 0, 2)
        return self.k[layer, :, :end], self.v[layer, :, :end]
