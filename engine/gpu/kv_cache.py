"""The KV cache in the pool's kv region: per layer one K and one V buffer.

Layout of each buffer (n_kv heads, n_ctx positions, head_dim values per row):
- kv_type "f16":  half qs[n_kv][n_ctx][head_dim]
- kv_type "q8_0": int8 qs[n_kv][n_ctx][head_dim], then at the next 256-byte boundary
                  half d[n_kv][n_ctx][head_dim / 32]: ggml Q8_0 blocks split into values and
                  scales, so a row's values stay one contiguous run of head_dim bytes (16-byte
                  loads) and value j of a row has scale d[row][j / 32].
The q8_0 values and scales are exactly those of the cpu reference (engine/cpu/kv_cache.py,
quantize_q8_0); cuda/kv_cache.cu and cuda/rope.cu write them.
"""
from __future__ import annotations

from memra_engine.gpu.memory import aligned
from memra_engine.kv_type import DEFAULT_KV_TYPE, Q8_0_BLOCK, check_kv_type


def buffer_layout(n_kv: int, n_ctx: int, head_dim: int, kv_type: str) -> tuple[int, int]:
    """(bytes of one layer's K or V buffer, byte offset of its scales d; 0 for f16)."""
    n_values = n_kv * n_ctx * head_dim
    if kv_type == "f16":
        return 2 * n_values, 0
    scales_at = aligned(n_values)
    return scales_at + 2 * (n_values // Q8_0_BLOCK), scales_at


class GpuKvCache:
    @staticmethod
    def bytes_needed(n_layer: int, n_kv: int, n_ctx: int, head_dim: int, kv_type: str = DEFAULT_KV_TYPE) -> int:
        """kv-region bytes: 2 * n_layer buffers, each rounded up to the pool's alignment."""
        per, _ = buffer_layout(n_kv, n_ctx, head_dim, check_kv_type(kv_type, head_dim))
        return n_layer * 2 * aligned(per)

    def __init__(self, pool, n_layer: int, n_kv: int, n_ctx: int, head_dim: int, kv_type: str = DEFAULT_KV_TYPE):
        self.n_ctx = n_ctx
        self.kv_type = check_kv_type(kv_type, head_dim)
        self.layer_bytes, self.scales_offset = buffer_layout(n_kv, n_ctx, head_dim, kv_type)
        if pool is None:  # dry run: sizes only
            self.k = [0] * n_layer
            self.v = [0] * n_layer
            return
        self.k = [pool.alloc("kv", self.layer_bytes, f"k{i}").ptr for i in range(n_layer)]
        self.v = [pool.alloc("kv", self.layer_bytes, f"v{i}").ptr for i in range(n_layer)]

    def layer_ptrs(self, layer: int) -> tuple[int, int]:
        """The layer's K and V buffers: the f16 values, or the q8_0 int8 values."""
        return self.k[layer], self.v[layer]

    def layer_scale_ptrs(self, layer: int) -> tuple[int, int]:
        """The layer's q8_0 scales (k_d, v_d); (0, 0) for f16."""
        if self.kv_type != "q8_0":
            return 0, 0
        return self.k[layer] + self.scales_offset, self.v[layer] + self.scales_offset

    def write_args(self, layer: int) -> tuple[int, ...]:
        """The cache pointers kv_write_<kv_type> and rope_qk_kv_<kv_type> take: (kc, vc) for f16,
        (kc, vc, kd, vd) for q8_0."""
        if self.kv_type != "q8_0":
            return self.layer_ptrs(layer)
        return self.layer_ptrs(layer) + self.layer_scale_ptrs(layer)
