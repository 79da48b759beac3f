"""The cpu KV cache: one preallocated float32 array each for keys and values.

Layout [n_layer, n_kv_head, n_ctx, head_dim]: for one layer and kv head the cached keys are a
contiguous [n_ctx, head_dim] matrix, so scores over the first L positions are one BLAS matmul
per kv head with no copy. np.zeros maps pages lazily: memory is only touched as the cache fills.
"""
from __future__ import annotations

import numpy as np


class KvCache:
    def __init__(self, n_layer: int, n_kv_head: int, n_ctx: int, head_dim: int):
        shape = (n_layer, n_kv_head, n_ctx, head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.n_ctx = n_ctx

    @staticmethod
    def bytes_needed(n_layer: int, n_kv_head: int, n_ctx: int, head_dim: int) -> int:
        return 2 * n_layer * n_kv_head * n_ctx * head_dim * 4

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v [T, n_kv, hd] at positions start..start+T-1; return the layer's keys and
        values [n_kv, start+T, hd] for every position written so far, as views."""
        end = start + k.shape[0]
        self.k[layer, :, start:end] = k.transpose(1, 0, 2)
        self.v[layer, :, start:end] = v.transpose(1, 0, 2)
        return self.k[layer, :, :end], self.v[layer, :, :end]
