"""The KV cache in the pool's kv region: per layer K and V, each [n_kv][n_ctx][head_dim] f16."""
from __future__ import annotations

from memra_engine.gpu.memory import ALIGN


class GpuKvCache:
    BYTES_PER_VALUE = 2  # f16

    @staticmethod
    def bytes_needed(n_layer: int, n_kv: int, n_ctx: int, head_dim: int) -> int:
        """kv-region bytes: 2 * n_layer buffers, each rounded up to the pool's alignment."""
        per = n_kv * n_ctx * head_dim * GpuKvCache.BYTES_PER_VALUE
        return n_layer * 2 * (-(-per // ALIGN) * ALIGN)

    def __init__(self, pool, n_layer: int, n_kv: int, n_ctx: int, head_dim: int):
        self.n_ctx = n_ctx
        self.layer_bytes = n_kv * n_ctx * head_dim * self.BYTES_PER_VALUE
        if pool is None:  # dry run: sizes only
            self.k = [0] * n_layer
            self.v = [0] * n_layer
            return
        self.k = [pool.alloc("kv", self.layer_bytes, f"k{i}").ptr for i in range(n_layer)]
        self.v = [pool.alloc("kv", self.layer_bytes, f"v{i}").ptr for i in range(n_layer)]

    def layer_ptrs(self, layer: int) -> tuple[int, int]:
        return self.k[layer], self.v[layer]
