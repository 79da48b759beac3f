"""Weights asked into L2 while a decode step's attention runs (cuda/l2_prefetch.cu).

A layer's attention, norms and activations leave DRAM nearly idle, and the matvecs after them are
bound by the bytes they keep in flight, not by DRAM. So right after a decode or verify forward's
attention launch, one l2_prefetch launch asks L2 for the weights the layer reads next, in the
order it reads them: the o projection, then gate|up, then down, whole weights first and the next
one's first rows with what is left of the budget (the matvecs' first blocks take the first rows).
`MEMRA_L2_AHEAD=MiB` sets the budget a layer (0: off); sm_90 only (bulk prefetch). Prefetching
changes no arithmetic: the same bits with or without it.
"""
from __future__ import annotations

import numpy as np

from memra_engine.gpu.quant_ops import GpuWeight

MAX_RANGES = 4  # l2_prefetch's (pointer, size) pairs
BLOCKS, THREADS = 32, 32  # its grid: a warp on each of 32 SMs issues the requests
AFTER_ATTENTION = ("attn_output", "ffn_gate_up", "ffn_down")  # read in this order after attention


def _weights(layer) -> list[GpuWeight]:
    out = []
    for name in AFTER_ATTENTION:
        w = getattr(layer, name, None)
        for part in getattr(w, "parts", (w,)):  # a FusedWeight of mixed types: its parts in order
            if isinstance(part, GpuWeight):
                out.append(part)
    return out


def _prefix(w: GpuWeight, nbytes: int) -> list[tuple[int, int]]:
    """The ranges of w's first rows that come to about nbytes: the same share of each plane."""
    lay = w.layout
    blocks = w.rows * (lay.padded_cols // lay.block_values)
    if lay.is_float:
        return [(w.q_ptr, min(nbytes, blocks * lay.q_bytes))]
    q, meta = blocks * lay.q_bytes, blocks * lay.meta_bytes
    share = nbytes / (q + meta)
    return [(w.q_ptr, int(q * share)), (w.meta_ptr, int(meta * share))]


def layer_ranges(layer, budget: int) -> list[tuple[int, int]]:
    """(pointer, bytes) ranges of the layer's weights after attention, up to `budget` bytes and
    MAX_RANGES ranges; sizes cut to multiples of 16 (the bulk requests' unit)."""
    out: list[tuple[int, int]] = []
    for w in _weights(layer):
        if budget < 16 or len(out) == MAX_RANGES:
            break
        whole = w.layout.nbytes(w.rows)
        got = [(w.q_ptr, whole)] if whole <= budget else _prefix(w, budget)
        got = got[:MAX_RANGES - len(out)]
        out += [(p, n & ~15) for p, n in got if n >= 16]
        budget -= sum(n for _, n in got)
    return out


def launch(rt, ranges: list[tuple[int, int]]) -> None:
    args = []
    for i in range(MAX_RANGES):
        p, n = ranges[i] if i < len(ranges) else (0, 0)
        args += [int(p), np.int64(n)]
    rt.launch("l2_prefetch", BLOCKS, THREADS, args)
