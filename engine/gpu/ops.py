"""The ops of memra_engine.model.ops, as kernel launches on the runtime's stream.

Every op allocates its output from a bump arena that the backend resets before each forward.
A forward program is straight-line code, so the same step allocates the same addresses in the
same order every time: that is what lets one captured CUDA graph replay many decode steps.
Nothing here synchronizes or calls cudaMalloc, so a whole forward can be captured.

With `dry=True` nothing launches and the arena only counts: the backend runs the forward once
that way to size the scratch region before reserving VRAM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from memra_engine.errors import DeviceOutOfMemory
from memra_engine.gpu import quant_ops
from memra_engine.gpu.quant_ops import GpuWeight

ARENA_ALIGN = 256
EW_BLOCK = 256  # elementwise kernels
ATTN_SPLIT_LEN = 256  # keys per attention split (see attention.cu: fixed chunks keep rows exact)
BATCHED_MATVEC_MAX = quant_ops.MATVEC_MAX_COLUMNS  # up to this many tokens: matvec, beyond: GEMM


@dataclass(frozen=True)
class DArray:
    """A float32 (or int32) activation on the device: [T, n] or [T, n_head, head_dim], token rows
    `ld` elements apart (views from split keep the parent's ld)."""

    ptr: int
    shape: tuple[int, ...]
    ld: int

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return int(np.prod(self.shape[1:]))

    @property
    def contiguous(self) -> bool:
        return self.ld == self.width


@dataclass(frozen=True)
class FusedWeight:
    """A fused weight whose parts have different quant types: one matvec per part."""

    parts: tuple[GpuWeight, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def cols(self) -> int:
        return self.parts[0].cols


@dataclass(frozen=True)
class Vector:
    """A 1-D f32 weight (norm, bias, rope_freqs) on the device."""

    ptr: int
    n: int


class Arena:
    """Bump allocator over the scratch region; reset() at the start of every forward."""

    def __init__(self, base: int, size: int):
        self.base, self.size, self.used, self.peak = base, size, 0, 0

    def alloc(self, nbytes: int) -> int:
        start = -(-self.used // ARENA_ALIGN) * ARENA_ALIGN
        if start + nbytes > self.size:
            raise DeviceOutOfMemory(f"scratch region full ({self.size >> 20} MiB); try a smaller prefill chunk or --ctx")
        self.used = start + nbytes
        self.peak = max(self.peak, self.used)
        return self.base + start

    def reset(self) -> None:
        self.used = 0


class _DryRuntime:
    def launch(self, *args, **kwargs) -> None:
        pass


def _blocks(n: int, per: int = EW_BLOCK) -> int:
    return -(-n // per)


class GpuOps:
    def __init__(self, rt, cfg, kv, arena: Arena, dry: bool = False):
        """kv: engine.gpu.kv_cache.GpuKvCache (pointers per layer). rt None with dry=True."""
        self.rt = _DryRuntime() if dry else rt
        self.cfg, self.kv, self.arena, self.dry = cfg, kv, arena, dry
        self.history_ptr = 0  # device token history the embed kernel records into (0: none)
        self.n_splits = 1     # attention grid.y for this forward (set by the backend per KV bucket)
        self._xq: dict[tuple[int, int], int] = {}

    def begin(self, n_splits: int, history_ptr: int = 0) -> None:
        """Start a forward: reset the arena and the per-forward q8_1 cache."""
        self.arena.reset()
        self._xq.clear()
        self.n_splits = n_splits
        self.history_ptr = history_ptr

    def new(self, shape: tuple[int, ...], itemsize: int = 4) -> DArray:
        n = int(np.prod(shape))
        return DArray(self.arena.alloc(n * itemsize), tuple(shape), int(np.prod(shape[1:])))

    # ---- the ops Protocol ------------------------------------------------------------------
    def embed(self, table: GpuWeight, tokens: DArray) -> DArray:
        T = tokens.rows
        y = self.new((T, table.cols))
        lay = table.layout
        nb = lay.padded_cols // lay.block_values
        shared = 0 if lay.kernel_type == "f32" else nb * lay.block_values * 2
        self.rt.launch(f"embed_{lay.kernel_type}", T, 128,
                       (table.q_ptr, table.meta_ptr, tokens.ptr, y.ptr, table.cols, nb, np.float32(1.0),
                        self._positions_ptr, self.history_ptr), shared=shared)
        return y

    def matmul(self, x: DArray, w) -> DArray:
        x = self._contiguous(x)
        T = x.rows
        y = self.new((T, w.rows))
        parts = w.parts if isinstance(w, FusedWeight) else (w,)
        if len(parts) == 1 or T == 1:
            off = 0
            for part in parts:
                self._matmul_into(x, part, y.ptr + off * 4)
                off += part.rows
            return y
        off = 0  # several tokens, mixed types: each part into its own rows, then stack
        for part in parts:
            tmp = self.new((T, part.rows))
            self._matmul_into(x, part, tmp.ptr)
            self.rt.launch("copy_rows_f32", (_blocks(part.rows), T), EW_BLOCK,
                           (y.ptr + off * 4, tmp.ptr, part.rows, y.ld, part.rows))
            off += part.rows
        return y

    def add(self, a: DArray, b) -> DArray:
        a = self._contiguous(a)
        y = self.new(a.shape)
        if isinstance(b, Vector):
            self.rt.launch("add_bias_f32", (_blocks(a.width), a.rows), EW_BLOCK, (y.ptr, a.ptr, b.ptr, a.width))
        else:
            b = self._contiguous(b)
            n = a.rows * a.width
            self.rt.launch("add_f32", _blocks(n), EW_BLOCK, (y.ptr, a.ptr, b.ptr, n))
        return y

    def scale(self, x: DArray, s: float) -> DArray:
        x = self._contiguous(x)
        y = self.new(x.shape)
        n = x.rows * x.width
        self.rt.launch("scale_f32", _blocks(n), EW_BLOCK, (y.ptr, x.ptr, np.float32(s), n))
        return y

    def split(self, x: DArray, sizes: Sequence[int]) -> tuple[DArray, ...]:
        out, off = [], 0
        for n in sizes:
            out.append(DArray(x.ptr + off * 4, (x.rows, n), x.ld))
            off += n
        return tuple(out)

    def heads(self, x: DArray, n_head: int) -> DArray:
        return DArray(x.ptr, (x.rows, n_head, x.width // n_head), x.ld)

    def rms_norm(self, x: DArray, w: Vector, eps: float) -> DArray:
        heads, n = (x.shape[1], x.shape[2]) if len(x.shape) == 3 else (1, x.width)
        y = self.new(x.shape)
        block = min(1024, max(32, -(-n // 4) // 32 * 32))
        self.rt.launch("rms_norm_f32", x.rows * heads, block,
                       (x.ptr, w.ptr, y.ptr, n, heads, x.ld, y.ld, np.float32(eps)))
        return y

    def rope(self, x: DArray, positions: DArray, base: float, neox: bool, scale: float = 1.0,
             freq_factors: Vector | None = None) -> DArray:
        T, n_head, hd = x.shape
        y = self.new(x.shape)
        self.rt.launch("rope_f32", (n_head, T), max(32, min(128, hd // 2)),
                       (x.ptr, y.ptr, positions.ptr, freq_factors.ptr if freq_factors is not None else 0,
                        hd, x.ld, y.ld, np.float32(base), np.float32(scale), int(bool(neox))))
        return y

    def attention(self, layer: int, q: DArray, k: DArray, v: DArray, positions: DArray, scale: float,
                  window: int = 0, softcap: float = 0.0) -> DArray:
        T, n_head, hd = q.shape
        n_kv = k.shape[1]
        kc, vc = self.kv.layer_ptrs(layer)
        self.rt.launch("kv_write_f16", (T, n_kv), min(128, hd),
                       (k.ptr, v.ptr, kc, vc, positions.ptr, k.ld, v.ld, hd, self.kv.n_ctx))
        q = self._contiguous(q)
        S = self.n_splits
        opart = self.new((T, S, n_head, hd))
        ml = self.new((T, S, n_head, 2))
        group = n_head // n_kv
        n_hgroups = -(-group // 8)
        self.rt.launch(f"attn_split_hd{hd}", (n_kv * n_hgroups, S, T), 128,
                       (q.ptr, q.ld, kc, vc, opart.ptr, ml.ptr, positions.ptr, n_head, n_kv, self.kv.n_ctx,
                        int(window), np.float32(scale), np.float32(softcap), ATTN_SPLIT_LEN))
        y = self.new((T, n_head * hd))
        self.rt.launch("attn_combine", (n_head, T), hd, (opart.ptr, ml.ptr, y.ptr, n_head, hd, S))
        return y

    def swiglu(self, gate: DArray, up: DArray) -> DArray:
        return self._gated("silu_mul_f32", gate, up)

    def gelu_mul(self, gate: DArray, up: DArray) -> DArray:
        return self._gated("gelu_tanh_mul_f32", gate, up)

    def softcap(self, x: DArray, cap: float) -> DArray:
        x = self._contiguous(x)
        y = self.new(x.shape)
        n = x.rows * x.width
        self.rt.launch("softcap_f32", _blocks(n), EW_BLOCK, (y.ptr, x.ptr, np.float32(cap), n))
        return y

    def last_row(self, x: DArray) -> DArray:
        return DArray(x.ptr + (x.rows - 1) * x.ld * 4, (1,) + x.shape[1:], x.ld)

    # ---- helpers ---------------------------------------------------------------------------
    _positions_ptr = 0  # set by the backend: positions of this forward (the embed kernel records history)

    def _gated(self, kernel: str, gate: DArray, up: DArray) -> DArray:
        assert gate.ld == up.ld
        n = gate.width
        y = self.new((gate.rows, n))
        self.rt.launch(kernel, (_blocks(n), gate.rows), EW_BLOCK, (gate.ptr, up.ptr, y.ptr, n, gate.ld))
        return y

    def _contiguous(self, x: DArray) -> DArray:
        if x.contiguous:
            return x
        y = self.new(x.shape)
        self.rt.launch("copy_rows_f32", (_blocks(x.width), x.rows), EW_BLOCK, (y.ptr, x.ptr, x.width, y.ld, x.ld))
        return y

    def _matmul_into(self, x: DArray, w: GpuWeight, y_ptr: int) -> None:
        T = x.rows
        if T > BATCHED_MATVEC_MAX:
            quant_ops.gemm(self.rt, w, x.ptr, y_ptr, T)
            return
        xq = 0
        if not w.layout.is_float:
            key = (x.ptr, T)
            xq = self._xq.get(key, 0)
            if not xq:  # quantize each activation once, however many weights read it
                xq = self._xq[key] = self.arena.alloc(quant_ops.q8_1_nbytes(w.cols, T))
                quant_ops.quantize_q8_1(self.rt, x.ptr, xq, w.cols, T)
        quant_ops.matvec(self.rt, w, x.ptr, xq, y_ptr, T)
