"""MoE experts on the GPU: the expert stacks, and the launches of a routed FFN.

Each expert of a layer's stack is repacked on its own (quant_ops.repack: q plane, then meta
plane) into a blob of `expert_bytes`, so an expert can live anywhere: in the weights region
(all resident), in a VRAM slot of the expert cache, or in pinned host memory read in place by
the device (engine/gpu/expert_cache.py). A device table of E base pointers per stack tells the
kernels where each expert is; moving an expert is a copy plus one table entry, and the captured
decode graph never changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from memra_engine import switches
from memra_engine.errors import UnsupportedModelError
from memra_engine.gpu import quant_ops
from memra_engine.gpu.memory import aligned
from memra_engine.model.gguf_file import TensorInfo

MAX_TOP_K = 16  # moe_topk keeps the chosen weights in shared memory (cuda/moe.cu)
MAX_EXPERTS = 4096  # moe_topk: the logits of one token in shared memory
TOPK_THREADS = 256  # MOE_TOPK_THREADS in cuda/moe.cu


@dataclass
class ExpertStack:
    """One layer's experts of one matrix ([E, rows, cols], parts stacked per expert)."""

    parts: list[TensorInfo]        # GGUF tensors [E, rows_i, cols], rows stacked per expert
    n_expert: int
    rows: int
    cols: int
    layout: quant_ops.WeightLayout  # of one expert [rows, cols]
    expert_bytes: int               # one expert's blob, aligned
    table_ptr: int = 0              # device uint64 [E]: each expert's base
    table: np.ndarray | None = None  # host copy of the table

    @classmethod
    def plan(cls, parts: list[TensorInfo], name: str) -> "ExpertStack":
        types = {p.ggml_type for p in parts}
        if len(types) != 1:
            raise UnsupportedModelError(f"{name}: expert parts of different types ({', '.join(t.name for t in types)})")
        t = parts[0]
        if t.ggml_type in quant_ops.FLOAT_TYPES:
            raise UnsupportedModelError(f"{name}: {t.ggml_type.name} experts have no GPU kernel (quantized only)")
        rows = sum(p.shape[1] for p in parts)
        layout = quant_ops.weight_layout(t.ggml_type, rows, t.shape[2])
        return cls(parts, t.shape[0], rows, t.shape[2], layout, aligned(layout.nbytes(rows)))

    def expert_host_bytes(self, e: int) -> np.ndarray:
        """Expert e's blob as the kernels read it (repacked; padded to expert_bytes)."""
        t = self.parts[0]
        data = np.concatenate([np.ascontiguousarray(p.data[e]).reshape(p.shape[1], -1) for p in self.parts])
        blob = quant_ops.repack(t.ggml_type, data, self.rows, self.cols)
        out = np.zeros(self.expert_bytes, np.uint8)
        out[:blob.size] = blob
        return out

    @property
    def table_bytes(self) -> int:
        return aligned(8 * self.n_expert)

    @property
    def meta_offset(self) -> int:
        return self.layout.meta_offset


def check_routing(cfg) -> None:
    if cfg.n_expert > MAX_EXPERTS:
        raise UnsupportedModelError(f"{cfg.n_expert} experts per layer: the GPU router handles at most {MAX_EXPERTS}")
    if cfg.n_expert_used > MAX_TOP_K:
        raise UnsupportedModelError(f"top-{cfg.n_expert_used} routing: the GPU router handles at most top-{MAX_TOP_K}")


def topk(rt, logits_ptr: int, ids_ptr: int, weights_ptr: int, log_ptr: int, n_tokens: int, n_expert: int, k: int,
         renorm: bool) -> None:
    rt.launch("moe_topk", n_tokens, TOPK_THREADS,
              (logits_ptr, ids_ptr, weights_ptr, log_ptr, n_expert, k, int(bool(renorm))))


# The expert matvec's variants: r<R>u<U> (R rows a warp, U units a lane step) and r<R>h (rows of at
# most HALF_WARP_UNITS units in half-warps, two side by side: 2 R rows a warp). All give the same bits.
MATVEC_VARIANTS = ("r1u1", "r2u1", "r4u1", "r2h", "r4h")
HALF_WARP_UNITS = 16
SORT_MAX_SLOTS = 8192  # moe_sort keeps each slot's rank in shared memory (cuda/moe.cu)
# The prefill GEMM's tiles, best first: slots a tile, threads a block and static shared bytes
# (`cuobjdump -res-usage`: the slot lists and 1 KB every kernel has), which count against the
# device's opt-in limit with gemm_shared's dynamic bytes. moe_gemm7 is gemm7's warp-specialized
# tile (fits sm_90's 227 KB), moe_gemm4 the pipelined 64-slot tile (fits 99 KB for the small types).
class MoeTile(NamedTuple):
    slots: int          # slots (tokens) a tile
    threads: int        # a block
    static_shared: int  # bytes
    slots_first: bool   # grid (slot tiles, row tiles, experts), as gemm7's token tiles; else rows first


GEMM_TILES = {"gemm7": MoeTile(128, 384, 2048, True), "gemm4": MoeTile(64, 128, 1280, False)}


# (rows per warp, units per step) of the expert matvec for every type; MEMRA_MOE_RU=R,U forces one
# (A/B runs). H200, Qwen3-MoE shape decode (2048 x 768 experts, top-8; scripts/profile_decode.py):
# Q4_K gate|up and down r1u1 12.53, r2u1 10.10, r4u1 11.46 µs a launch; Q6_K down 10.83, 9.46, 9.05
# µs. Since the branch-free Q4_K scale decode (session 32) four rows a warp win for Q4_K too:
# memra-bench tg128 graph r1u1 731.8, r2u1 802.8, r4u1 827.6 tok/s (MEMRA_MOE_RU, one call). The
# other types follow by analogy (not timed).
MATVEC_DEFAULT = "r4u1"


def unit_values(kernel_type: str) -> int:
    """Values a lane's unit covers in the matvec (quants.cuh T::UE): a quarter of a 256-value
    K-quant super-block, else one 32-value block."""
    return 64 if kernel_type in ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K") else 32


def fits_half_warps(stack: "ExpertStack") -> bool:
    """Whether a row has at most HALF_WARP_UNITS units (the half-warp variants' rows)."""
    return stack.cols // unit_values(stack.layout.kernel_type) <= HALF_WARP_UNITS


def matvec_variant(stack: "ExpertStack") -> str:
    """Half-warp rows where a row has at most 16 units (the down of an FFN-768 expert: 12 of 32
    lanes busy in a whole warp), else r4u1. H100, qwen3-moe shape (profile_decode.py, ctx 128, µs a
    launch), down r4u1 / r2h / r4h: Q4_K ~7.8 / 6.32 / 5.13, Q6_K 9.20 / 8.21 / 7.93; memra-bench
    tg128 graph 854.4 -> 881.3 tok/s, decode_sample default knobs 834.5 -> 861.1 (session 43)."""
    if fits_half_warps(stack):
        return "r4h"
    return MATVEC_DEFAULT


def expert_matvec(rt, stack: ExpertStack, ids_ptr: int, xq_ptr: int, y_ptr: int, n_slots: int, top_k: int,
                  x_per_slot: bool, variant: str | None = None) -> None:
    """y[s] = expert ids[s] @ x(s) for every slot s (cuda/matvec.cu, moe_matvec_<type>_<variant>)."""
    fits_half = fits_half_warps(stack)
    forced = switches.moe_matvec_variant()
    v = variant or (forced if forced and (fits_half or not forced.endswith("h")) else matvec_variant(stack))
    half = v.endswith("h")
    assert fits_half or not half, (v, stack.cols)
    rows_per_block = quant_ops.MATVEC_WARPS * int(v[1]) * (2 if half else 1)
    rt.launch(f"moe_matvec_{stack.layout.kernel_type}_{v}",
              (-(-stack.rows // rows_per_block), n_slots), 32 * quant_ops.MATVEC_WARPS,
              (stack.table_ptr, np.int64(stack.meta_offset), ids_ptr, xq_ptr, y_ptr, stack.rows, stack.cols,
               quant_ops.q8_1_stride(stack.cols), top_k, int(bool(x_per_slot))))


def sort_slots(rt, ids_ptr: int, offsets_ptr: int, order_ptr: int, n_slots: int, n_expert: int) -> None:
    """Group the slots per expert for expert_gemm: offsets int [E + 1], order int [S] (cuda/moe.cu)."""
    assert n_slots <= SORT_MAX_SLOTS
    rt.launch("moe_sort", 1, 1024, (ids_ptr, offsets_ptr, order_ptr, n_slots, n_expert))


def gemm_tile(stack: ExpertStack, max_shared: int) -> str | None:
    """The prefill GEMM tile for the stack's type: the first of GEMM_TILES whose shared memory fits a
    block (MEMRA_MOE_GEMM=gemm4|gemm7 forces one), None where none does (99 KB GPUs: the expert
    matvec takes the slots)."""
    forced = switches.moe_gemm_tile()
    for tile, spec in GEMM_TILES.items():
        if forced in (None, tile) and quant_ops.gemm_shared(tile, stack.layout) + spec.static_shared <= max_shared:
            return tile
    return None


def expert_gemm(rt, stack: ExpertStack, offsets_ptr: int, order_ptr: int, xh_ptr: int, y_ptr: int, n_tokens: int,
                top_k: int, x_per_slot: bool, tile: str) -> None:
    """Prefill: y[s] = expert(s) @ x(s) on tensor cores, each expert's slots (sort_slots) in tiles
    (cuda/gemm.cu, moe_<tile>_<type>, tile from gemm_tile); xh: x's f16 copy (quant_ops.to_f16),
    rows per token (x_per_slot False) or per slot."""
    name = f"moe_{tile}_{stack.layout.kernel_type}"
    spec = GEMM_TILES[tile]
    smem = quant_ops.gemm_shared(tile, stack.layout)
    rt.set_max_dynamic_shared(name, smem)
    row_tiles, slot_tiles = -(-stack.rows // 128), -(-n_tokens // spec.slots)
    grid = (slot_tiles, row_tiles) if spec.slots_first else (row_tiles, slot_tiles)
    rt.launch(name, (*grid, stack.n_expert), spec.threads,
              (stack.table_ptr, np.int64(stack.meta_offset), offsets_ptr, order_ptr, xh_ptr, y_ptr, stack.rows,
               stack.cols, top_k, int(bool(x_per_slot)), quant_ops.f16_ld(stack.cols)), shared=smem)


def combine(rt, y_ptr: int, weights_ptr: int, out_ptr: int, n_tokens: int, d: int, k: int) -> None:
    rt.launch("moe_combine", (-(-d // 256), n_tokens), 256, (y_ptr, weights_ptr, out_ptr, d, k))


