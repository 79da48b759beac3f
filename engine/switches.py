"""Every MEMRA_* environment switch the engine reads, in one place. They exist for A/B runs and
debugging on the GPU; the defaults are what users get. The README's "Switches" table lists
these and the ones scripts/ and tests/ read."""
from __future__ import annotations

import os


def pdl() -> bool:
    """MEMRA_PDL=0: captured graphs launch without programmatic dependent launch (sm_90+)."""
    return os.environ.get("MEMRA_PDL", "1") != "0"


def attn_cluster() -> bool:
    """MEMRA_ATTN_CLUSTER=0: decode attention takes the split path instead of clusters (sm_90+)."""
    return os.environ.get("MEMRA_ATTN_CLUSTER", "1") != "0"


def attn_max_splits() -> int | None:
    """MEMRA_ATTN_MAX_SPLITS=N: the most splits of a long decode/verify row on the cluster path
    (ops.attn_max_splits; clamped to one cluster .. 64); None: the model's default."""
    forced = os.environ.get("MEMRA_ATTN_MAX_SPLITS")
    return int(forced) if forced else None


def batched_rows() -> int | None:
    """MEMRA_BATCHED_R=2|4: rows per warp of the batched (verify) matvec; None: chosen per shape."""
    forced = os.environ.get("MEMRA_BATCHED_R")
    return int(forced) if forced else None


def verify_mma() -> bool:
    """MEMRA_VERIFY_MMA=0: the batched (verify) Q4_K/Q6_K matvec on dp4a instead of int8 tensor cores."""
    return os.environ.get("MEMRA_VERIFY_MMA", "1") != "0"


def k256() -> bool:
    """MEMRA_K256=1: Q4_K decode and verify matvecs on the q8_k256 kernels (k256.cu) instead of the
    q8_1 ones (matvec.cu). Off by default: on the 8B its verify is 26% cheaper but its decode graph
    2% slower (H100, docs/gpu-log.md session 58)."""
    return os.environ.get("MEMRA_K256", "0") == "1"


def verify_slice() -> int | None:
    """MEMRA_VERIFY_SLICE=1|2|4|8|16: most columns a block of a batched (verify) matvec takes
    (blocks over the rest); None: chosen per shape (quant_ops.verify_slice)."""
    forced = os.environ.get("MEMRA_VERIFY_SLICE")
    return int(forced) if forced else None


def prefill_attention() -> bool:
    """MEMRA_PREFILL_ATTN=0: prefill chunks attend on the split kernel (decode's) instead of attn_prefill."""
    return os.environ.get("MEMRA_PREFILL_ATTN", "1") != "0"


def gemm_tile() -> str | None:
    """MEMRA_GEMM=gemm3|gemm4|gemm5|gemm6|gemm7 (f32 weights: gemm|gemm2): the prefill GEMM's tile; None: chosen per shape."""
    return os.environ.get("MEMRA_GEMM") or None


def moe_gemm_tile() -> str | None:
    """MEMRA_MOE_GEMM=gemm4|gemm7: the MoE prefill GEMM's tile where it fits; None: the best that fits."""
    return os.environ.get("MEMRA_MOE_GEMM") or None


def rope_heads() -> int | None:
    """MEMRA_ROPE_HEADS=N: heads a block of prefill's rope_qk_kv (A/B runs); None: ops.PREFILL_ROPE_HEADS."""
    forced = os.environ.get("MEMRA_ROPE_HEADS")
    return max(1, int(forced)) if forced else None


def moe_matvec_variant() -> str | None:
    """MEMRA_MOE_RU=R,U (or R,h: rows in half-warps, for the weights whose rows fit; the others
    keep the default): the MoE expert matvec's variant, as engine/gpu/moe.py names them (r4u1,
    r4h); None: the default."""
    forced = os.environ.get("MEMRA_MOE_RU")
    if not forced:
        return None
    r, u = forced.split(",")
    return f"r{int(r)}h" if u == "h" else f"r{int(r)}u{int(u)}"
