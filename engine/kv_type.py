"""KV cache element types, chosen with `--kv-type`: f16 (the default) or q8_0.

q8_0 stores each cached row (one kv head at one position: head_dim values) as ggml Q8_0 blocks of
32: 32 int8 values and one f16 scale, 34 bytes instead of 64, so the cache takes ~53% of the f16
bytes. The values read back are exactly those of ggml's quantize_row_q8_0 then dequantization;
engine/cpu/kv_cache.py holds the reference, engine/gpu/kv_cache.py the device layout.
"""
from __future__ import annotations

from memra_engine.errors import MemraError, UnsupportedModelError

KV_TYPES = ("f16", "q8_0")
DEFAULT_KV_TYPE = "f16"
Q8_0_BLOCK = 32  # values per scale


def check_kv_type(kv_type: str, head_dim: int | None = None) -> str:
    """kv_type itself when it is known and fits the model's head_dim; else a one-line MemraError."""
    if kv_type not in KV_TYPES:
        raise MemraError(f"unknown KV type {kv_type!r} (choose {' or '.join(KV_TYPES)})")
    if kv_type == "q8_0" and head_dim is not None and head_dim % Q8_0_BLOCK:
        raise UnsupportedModelError(f"--kv-type q8_0 needs a head dimension that is a multiple of {Q8_0_BLOCK}; "
                                    f"this model's is {head_dim} (use --kv-type f16)")
    return kv_type
