"""The ops of memra_engine.model.ops, as kernel launches on the runtime's stream.

Every op allocates its output from a bump arena that the backend resets before each forward
(and whose two layer parts alternate, see Arena).
A forward program is straight-line code, so the same step allocates the same addresses in the
same order every time: that is what lets one captured CUDA graph replay many decode steps.
Nothing here synchronizes or calls cudaMalloc, so a whole forward can be captured.

With `dry=True` nothing launches and the arena only counts: the backend runs the forward once
that way to size the scratch region before reserving VRAM.

Fusion without touching the forward programs: two ops are deferred and fused with their
consumer when the pattern matches (else they launch on their own before the next op):
- `add` then `rms_norm` of its result -> add_rms_norm_f32 (residual add + next layer's norm);
- `rope(q)`, `rope(k)` then `attention(q, k, v)` -> rope_qk_kv_f16 (both ropes and the KV write);
  per-head `rms_norm` of q and of k before those ropes (qwen3, gemma3) are deferred and fused
  into it as well;
- `rms_norm(b)`, `add(a, that)`, `rms_norm(sum)` (gemma3's sandwich norms) -> norm_add_rms_norm_f32.
Attention writes a one-split row directly; rows with several splits go through attn_merge. RMSNorm, the gated
activations and attention (or its merge) write their output as q8_1 too, for the matvec that
reads it next; other one-token matmul inputs are quantized inside the matvec. Either way no
quantize_q8_1 launch in decode.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from memra_engine import switches
from memra_engine.errors import DeviceOutOfMemory
from memra_engine.gpu import moe, quant_ops
from memra_engine.gpu.quant_ops import GpuWeight

ARENA_ALIGN = 256
EW_BLOCK = 256  # elementwise kernels
ATTN_MAX_SPLITS = 32  # attention.cu: a row's keys go to at most this many blocks (split path)
ATTN_MERGE_DIMS = 64  # attn_*merge*: head dims per block
ATTN_MAX_SPLITS_CL = 64  # cluster path: so attn_cl_merge merges at most 8 partials
QKV_ROPE_VERIFY_MAX_BYTES = 8 << 20  # verify rows take the fused q|k|v + rope launch up to this weight size
NORM_SPLIT_ROWS = 16  # add_rms_norm_split_f32 up to this many rows (decode, verify): each block re-reads its row
ATTN_MIN_BUCKET = 32  # KV buckets are powers of two from here; a graph is captured per grid they give
BATCHED_MATVEC_MAX = quant_ops.MATVEC_MAX_COLUMNS  # up to this many tokens: matvec, beyond: GEMM
# prefill's rope_qk_kv: heads of a token a block, their pair angles (powf, sincosf) taken once;
# decode and verify keep a head a block (same bits either way). H100, 512-token prefill, µs a
# launch for 1 / 2 / 4 / 8 / 40 heads: qwen3-moe 27.8 / 22.1 / 20.4 / 20.2 / 31.7, llama-8b 29.0 /
# 16.7 / 14.8 / 15.6 / 28.7 (scripts/device_rope_sweep.sh, docs/gpu-log.md session 53).
PREFILL_ROPE_HEADS = 4
FUSED_QUANT_MAX_ROWS = 16384  # one-token matvecs quantize x per block; the LM head shares one quantize


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
    """Bump allocator over the scratch region, in three parts: what a forward allocates before
    its first layer, then one part for even and one for odd layers. begin_layer(i) empties the
    part of i's parity, which held layer i - 2's intermediates: dead by then (Ops.begin_layer),
    so the scratch holds two layers' worth, not all of them (the 8B shape at a 512-token chunk:
    ~0.6 GB instead of 5.4 GB). reset() at the start of every forward empties all three."""

    PARTS = 3

    def __init__(self, base: int, sizes: Sequence[int]):
        assert len(sizes) == self.PARTS
        self.sizes = [int(n) for n in sizes]
        self.starts = [base + sum(self.sizes[:k]) for k in range(self.PARTS)]
        self.used, self.peaks, self.part = [0] * self.PARTS, [0] * self.PARTS, 0

    @classmethod
    def unbounded(cls) -> "Arena":
        """For dry runs: parts far apart, sized by what the forward takes (peaks)."""
        return cls(0, [1 << 56] * cls.PARTS)

    def alloc(self, nbytes: int, forward_wide: bool = False) -> int:
        """forward_wide: from the first part, alive until the forward ends (buffers every layer reuses)."""
        k = 0 if forward_wide else self.part
        start = -(-self.used[k] // ARENA_ALIGN) * ARENA_ALIGN
        if start + nbytes > self.sizes[k]:
            raise DeviceOutOfMemory(f"scratch region full ({sum(self.sizes) >> 20} MiB); try a smaller prefill chunk or --ctx")
        self.used[k] = start + nbytes
        self.peaks[k] = max(self.peaks[k], self.used[k])
        return self.starts[k] + start

    def begin_layer(self, layer: int) -> tuple[int, int]:
        """Allocate from the part of this layer's parity, emptied first: returns the address
        range that held live data until now (the ops drop what they cached about it)."""
        self.part = 1 + layer % 2
        freed = (self.starts[self.part], self.starts[self.part] + self.used[self.part])
        self.used[self.part] = 0
        return freed

    def reset(self) -> None:
        self.used, self.part = [0] * self.PARTS, 0

    def part_sizes(self, slack: int = 0) -> list[int]:
        """Each part's peak, aligned, plus slack: the sizes of a real arena for this forward."""
        return [-(-(n + slack) // ARENA_ALIGN) * ARENA_ALIGN for n in self.peaks]


class _DryRuntime:
    """Stands in for GpuRuntime in a dry run: every call (launch, set_max_dynamic_shared, ...) is a no-op."""

    def __init__(self, max_shared: int):
        # the device's: it picks the prefill tiles (every pipelined tile needs the same scratch, x's
        # f16 copy) and whether an MoE prefill runs its grouped GEMM or the expert matvec (q8_1 copies)
        self.max_shared = max_shared

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _blocks(n: int, per: int = EW_BLOCK) -> int:
    return -(-n // per)


def kv_bucket(n_keys: int) -> int:
    """The power of two >= n_keys (at least ATTN_MIN_BUCKET) that sizes the attention grid."""
    bucket = ATTN_MIN_BUCKET
    while bucket < n_keys:
        bucket *= 2
    return bucket


def attn_chunk(head_dim: int) -> int:
    """Keys per block step in attention.cu (AttnShape::CHUNK)."""
    return 64 if head_dim == 64 else 32


@dataclass(frozen=True)
class AttnPlan:
    """attention.cu's attn_threads / attn_cluster / attn_cl_chunks for one (head dim, cache type):
    head dim 64 with an f16 cache runs the tensor-core kernel in 8-warp blocks and clusters of 16
    (rows of up to 128 chunks stay in one cluster); the rest, 4-warp blocks and clusters of 8."""

    threads: int
    cluster: int  # blocks per cluster (cluster path)
    cl_chunks: int  # the most chunks a split of a one-cluster row walks


def attn_plan(head_dim: int, kv_type: str = "f16") -> AttnPlan:
    if head_dim == 64 and kv_type == "f16":
        return AttnPlan(256, 16, 8)
    return AttnPlan(128, 8, 2)


# 4-warp attn_rows blocks resident at once on the cluster path: 40 clusters of 8 (H100, 132 SMs,
# 3 blocks an SM at 157 registers). A long row's splits beyond that queue for a second wave: at
# 4,224 keys the 8B (8 kv heads) ran 44 splits of 3 chunks a row, 48 clusters, attention + merge
# 17.8 µs a layer; capped at 40 splits (33 of 4 chunks, 40 clusters) 13.2 µs (docs/gpu-log.md,
# session 47).
ATTN_CL_BLOCKS = 320


def attn_max_splits(n_kv: int, group: int, head_dim: int, kv_type: str = "f16") -> int:
    """max_cl of attention.cu's split rule: the most splits a long decode/verify row takes on the
    cluster path, so that a row's clusters over every kv head (4-head blocks) fit ATTN_CL_BLOCKS.
    A model constant, never the grid's, so decode and verify rows split alike. hd64 f16 (8-warp
    blocks in clusters of 16, rows of up to 8,192 keys in one cluster) keeps the most."""
    forced = switches.attn_max_splits()
    if forced:
        return forced
    plan = attn_plan(head_dim, kv_type)
    if plan.cluster != 8:
        return ATTN_MAX_SPLITS_CL
    per_row = ATTN_CL_BLOCKS // (n_kv * -(-group // 4)) // plan.cluster * plan.cluster
    return min(max(per_row, plan.cluster), ATTN_MAX_SPLITS_CL)


def attn_row_splits(n_keys: int, head_dim: int, cluster: bool = False, kv_type: str = "f16",
                    max_splits: int = ATTN_MAX_SPLITS_CL) -> int:
    """A row's split count (attention.cu's attn_splits_of_row). Split path: at most ATTN_MAX_SPLITS
    splits of chunk * 2^k keys. Cluster path: the chunks spread evenly over one cluster while a split
    walks at most cl_chunks; longer rows take splits of cl_chunks (or more, for <= max_splits,
    clamped to one cluster .. ATTN_MAX_SPLITS_CL)."""
    chunk = attn_chunk(head_dim)
    if not cluster:
        split_len = chunk
        while -(-n_keys // split_len) > ATTN_MAX_SPLITS:
            split_len *= 2
        return -(-n_keys // split_len)
    plan = attn_plan(head_dim, kv_type)
    max_splits = min(max(max_splits, plan.cluster), ATTN_MAX_SPLITS_CL)
    chunks = -(-n_keys // chunk)
    per = -(-chunks // plan.cluster)
    if per > plan.cl_chunks:
        per = max(plan.cl_chunks, -(-chunks // max_splits))
    return -(-chunks // per)


@functools.lru_cache(maxsize=None)
def attn_splits(bucket: int, head_dim: int, cluster: bool = False, kv_type: str = "f16",
                max_splits: int = ATTN_MAX_SPLITS_CL) -> int:
    """grid.y: the most splits any row of up to `bucket` keys uses (a row's split count is not
    monotonic in its length on either path: take the max), in whole clusters on the cluster path.
    `bucket` may also be a sliding window: no row of such a layer has more keys."""
    chunk = attn_chunk(head_dim)
    most = max(attn_row_splits(c * chunk, head_dim, cluster, kv_type, max_splits)
               for c in range(1, -(-bucket // chunk) + 1))
    if not cluster:
        return most
    cs = attn_plan(head_dim, kv_type).cluster
    return -(-most // cs) * cs


def attn_slots(n_splits: int, cluster: bool = False, head_dim: int = 64, kv_type: str = "f16") -> int:
    """Partial slots per row in opart/ml: one per split, or one per cluster on the cluster path."""
    return n_splits // attn_plan(head_dim, kv_type).cluster if cluster else n_splits


# Below this many blocks an hd128 GQA group of 8 runs as two 4-head blocks: each block's fixed cost
# (q load, cluster merge) is then spread over twice the SMs. H100, qwen3-moe shape (32 heads over 4
# kv heads), attention + merge µs a layer, g8 -> g4 (session 43): a row of 128 keys (bucket 256: 32
# blocks of 8 heads) 7.43 -> 5.15; 1,024 keys (bucket 2,048: 128 blocks) 11.1 -> 9.5; 2,048 keys
# (bucket 4,096: 256 blocks, half without keys) 13.4 -> 10.5; 4,096 keys (bucket 8,192: 256
# blocks) 16.3 -> 18.0. The grid of those two buckets is the same, so both keep 8-head blocks.
ATTN_SMALL_GRID = 256


def attn_group_tile(group: int, head_dim: int, blocks: int) -> int:
    """Query heads per block: the kernel instance (1, 2, 4 or 8) that covers a GQA group; blocks:
    the grid 8-head blocks would give (kv heads x head groups x splits x rows). Every instance
    gives the same bits (tests/gpu/test_attention.py), so the choice may follow the grid."""
    cap = 4 if head_dim >= 128 and blocks < ATTN_SMALL_GRID else 8
    return next(g for g in (1, 2, 4, 8) if g >= min(group, cap))


PREFILL_ATTN_HEAD_DIMS = (64, 128)  # attn_prefill_hd* (cuda/attn_prefill.cu); f16 caches only
PREFILL_ATTN_TOKENS = 64  # query tokens a block


def prefill_attention_shared(head_dim: int) -> int:
    """Dynamic shared bytes of attn_prefill: K and V tiles of 64 padded rows, two of each."""
    return 2 * 2 * 64 * (head_dim + 8) * 2


def prefill_attention_launch(rt, q, q_ld, kc, vc, positions, T, n_head, n_kv, head_dim, n_ctx, window, scale,
                             softcap, out, out_h: int = 0) -> None:
    """Causal attention of a prefill chunk on tensor cores (cuda/attn_prefill.cu): one block per 64
    query tokens of a head; out [T, n_head * head_dim] f32 and, if out_h, its f16 copy for the o
    GEMM (rows of n_head * head_dim: a multiple of 8, no pad)."""
    name, smem = f"attn_prefill_hd{head_dim}", prefill_attention_shared(head_dim)
    rt.set_max_dynamic_shared(name, smem)
    rt.launch(name, (-(-T // PREFILL_ATTN_TOKENS), n_head), 128,
              (q, q_ld, kc, vc, positions, T, n_head, n_kv, n_ctx, int(window), np.float32(scale),
               np.float32(softcap), out, out_h), shared=smem)


def attention_launch(rt, q, q_ld, kc, vc, kd, vd, opart, ml, positions, T, n_head, n_kv, head_dim,
                     n_ctx, window, scale, softcap, out, xq, xq_stride, n_splits, kv_type="f16",
                     cluster=False, merge=True, group_tile: int | None = None,
                     max_splits: int = ATTN_MAX_SPLITS_CL) -> None:
    """attn_hd*_g*_* then attn_merge_hd*_g* (rows with several splits), or on sm_90+ attn_cl_*
    (clusters of splits merge themselves, attn_plan) then attn_cl_merge_* (rows of several clusters):
    decode, verify and prefill rows alike (see attention.cu). merge=False: the attention kernel
    alone (scripts/bench_attention.py times the two apart). group_tile: force the kernel instance
    (tests: every instance gives the same bits). max_splits: the model's attn_max_splits (n_splits
    must come from attn_splits with the same value)."""
    group = n_head // n_kv
    G = group_tile or attn_group_tile(group, head_dim, n_kv * -(-group // 8) * n_splits * T)
    grid = (n_kv * -(-group // G), n_splits, T)
    kind = "attn_cl" if cluster else "attn"
    rt.launch(f"{kind}_hd{head_dim}_g{G}_{kv_type}", grid, attn_plan(head_dim, kv_type).threads,
              (q, q_ld, kc, vc, kd, vd, opart, ml, positions, n_head, n_kv, n_ctx, int(window),
               np.float32(scale), np.float32(softcap), out, xq, xq_stride, max_splits))
    slots = attn_slots(n_splits, cluster, head_dim, kv_type)
    if slots > 1 and merge:
        merge_name = f"attn_cl_merge_hd{head_dim}_g{G}_{kv_type}" if cluster else f"attn_merge_hd{head_dim}_g{G}"
        rt.launch(merge_name, (grid[0], head_dim // ATTN_MERGE_DIMS, T), 128,
                  (opart, ml, positions, n_head, n_kv, slots, int(window), out, xq, xq_stride, max_splits))


class GpuOps:
    def __init__(self, rt, cfg, kv, arena: Arena, dry: bool = False, cluster: bool = False,
                 split_cap: int | None = None, max_shared: int = quant_ops.SM90_SHARED, k256_outputs: bool = False):
        """kv: engine.gpu.kv_cache.GpuKvCache (pointers per layer). rt None with dry=True.
        cluster: attention on the cluster path (GpuRuntime.cluster_attention). split_cap: the model's
        attn_max_splits (the backend's, which also sizes the graphs' grids); None: derived here.
        max_shared: with dry=True, the device's shared memory a block (GpuRuntime.max_shared).
        k256_outputs: norms and gated activations also write q8_k256 copies (quant_ops.k256_model)."""
        self.rt = _DryRuntime(max_shared) if dry else rt
        self.cfg, self.kv, self.arena, self.dry, self.cluster = cfg, kv, arena, dry, cluster
        self.attn_max_splits = split_cap or attn_max_splits(cfg.n_kv_head, cfg.n_head // cfg.n_kv_head,
                                                            cfg.head_dim, kv.kv_type)
        self.history_ptr = 0  # device token history the embed kernel records into (0: none)
        # MoE routing log: in a forward of T tokens moe_topk also writes layer l's ids at
        # moe_log_ptr + 4 * k * T * l, so the forward's log is one block of n_layer * T * k ints
        # the expert cache reads whole (forwards of up to moe_log_tokens tokens; 0: off)
        self.moe_log_ptr, self.moe_log_tokens = 0, 0
        self.n_splits = 1  # attention grid.y of this forward (attn_splits; set per forward by begin)
        self.prefill_splits = 0  # the split path's grid.y, for prefill forwards on the cluster path
        self._xq: dict[tuple[int, int], int] = {}
        self._xh: dict[tuple[int, int], int] = {}  # f16 copies for the pipelined GEMM, kept as _xq
        self._xk: dict[tuple[int, int], int] = {}  # q8_k256 copies for the Q4_K matvecs (k256.cu), kept as _xq
        # attention partials (opart, ml), one pair per shape and forward: a layer's partials are
        # merged before the next layer's attention starts (stream order), so every layer reuses them
        self._attn_parts: dict[tuple[int, ...], tuple[DArray, DArray]] = {}
        # Fusion switches (all on; the A/B script scripts/profile_decode.py turns them off one by one).
        self.fuse_add_norm = self.fuse_rope_kv = self.fuse_quant = self.fuse_qkv_rope = True
        self.k256_outputs = k256_outputs
        # a one-token q|k|v matmul attention() may run as matvec_qkv_rope: (x, w, y, bias, out),
        # out = y + bias (or y); launched as it is by flush() when anything else comes first
        self._pending_mm: tuple | None = None
        self._pending_embed: tuple | None = None  # (table, tokens, y, scale)
        self._pending_add: tuple[DArray, DArray, DArray] | None = None  # (sum, a, b)
        self._pending_pre: tuple | None = None  # the pending add's b is this deferred norm's output
        self._pending_norm2d: tuple | None = None  # a row norm: (x, w, eps, y, (xq, xq_stride, xk))
        self._pending_norm: dict[int, tuple] = {}  # per-head norm output ptr -> (x, w, eps, y)
        self._pending_rope: dict[int, tuple] = {}  # output ptr -> (x, y, positions, base, neox, scale, ff)

    def begin(self, n_splits: int, history_ptr: int = 0, prefill_splits: int = 0) -> None:
        """Start a forward whose attention grid has n_splits splits (attn_splits): reset the arena
        and the per-forward q8_1 cache. prefill_splits: attn_splits(bucket, hd, cluster=False), the
        grid of a forward of more than BATCHED_MATVEC_MAX tokens, which takes the split path even
        where clusters are on: its rows (GEMM prefill) never have to equal decode rows bit for bit,
        and a 16-block cluster per row made prefill 2x slower (docs/gpu-log.md round 7)."""
        self.arena.reset()
        self._xq.clear()
        self._xh.clear()
        self._xk.clear()
        self._attn_parts.clear()
        self._pending_add = self._pending_pre = self._pending_norm2d = self._pending_mm = self._pending_embed = None
        self._pending_norm.clear()
        self._pending_rope.clear()
        self.n_splits = n_splits
        self.prefill_splits = prefill_splits
        self.history_ptr = history_ptr

    def begin_layer(self, layer: int) -> None:
        lo, hi = self.arena.begin_layer(layer)
        # a q8_1 copy cached for an array of the emptied part would be found again for a new
        # array at the same address: drop those (and copies that lived there)
        for copies in (self._xq, self._xh, self._xk):
            for key in [k for k, xq in copies.items() if lo <= k[0] < hi or lo <= xq < hi]:
                del copies[key]
        stale = [p for p in (*self._pending_norm, *self._pending_rope) if lo <= p < hi]
        assert not stale, f"deferred ops on layer {layer - 2}'s scratch at layer {layer}"

    def new(self, shape: tuple[int, ...], itemsize: int = 4, forward_wide: bool = False) -> DArray:
        n = int(np.prod(shape))
        return DArray(self.arena.alloc(n * itemsize, forward_wide), tuple(shape), int(np.prod(shape[1:])))

    # ---- the ops Protocol ------------------------------------------------------------------
    def flush(self) -> None:
        """Launch whatever is deferred (the backend calls this at the end of a forward)."""
        self._flush_embed()
        self._flush_mm()
        self._flush_add()
        for x, w, eps, y in self._pending_norm.values():
            self._launch_rms_norm(x, w, eps, y)
        self._pending_norm.clear()
        for x, y, positions, base, neox, scale, ff in self._pending_rope.values():
            T, n_head, hd = x.shape
            self.rt.launch("rope_f32", (n_head, T), max(32, min(128, hd // 2)),
                           (x.ptr, y.ptr, positions.ptr, ff.ptr if ff is not None else 0,
                            hd, x.ld, y.ld, np.float32(base), np.float32(scale), int(bool(neox))))
        self._pending_rope.clear()

    def embed(self, table: GpuWeight, tokens: DArray) -> DArray:
        self.flush()
        y = self.new((tokens.rows, table.cols))
        self._pending_embed = (table, tokens, y, 1.0)  # a scale() of y goes into the same launch
        return y

    def _flush_embed(self) -> None:
        if self._pending_embed is not None:
            table, tokens, y, scale = self._pending_embed
            self._pending_embed = None
            lay = table.layout
            nb = lay.padded_cols // lay.block_values
            shared = 0 if lay.kernel_type == "f32" else nb * lay.block_values * 2
            self.rt.launch(f"embed_{lay.kernel_type}", tokens.rows, 128,
                           (table.q_ptr, table.meta_ptr, tokens.ptr, y.ptr, table.cols, nb, np.float32(scale),
                            self._positions_ptr, self.history_ptr), shared=shared)

    def matmul(self, x: DArray, w) -> DArray:
        self.flush()
        x = self._contiguous(x)
        T = x.rows
        y = self.new((T, w.rows))
        if self._qkv_fusable(w, T):
            self._pending_mm = (x, w, y, None, y)  # see attention()
            return y
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
        mm = self._pending_mm
        if isinstance(b, Vector) and mm is not None and mm[3] is None and mm[2].ptr == a.ptr and mm[2].shape == a.shape:
            y = self.new(a.shape)  # the bias goes with the deferred q|k|v matmul
            self._pending_mm = (*mm[:3], b, y)
            return y
        pre = self._pending_norm2d
        if isinstance(b, Vector) or pre is None or pre[3].ptr != b.ptr or pre[3].shape != b.shape or b.ptr == a.ptr:
            pre = None
        else:
            self._pending_norm2d = None  # b = that norm's output: it goes with the add (see rms_norm)
        self.flush()
        a = self._contiguous(a)
        y = self.new(a.shape)
        if isinstance(b, Vector):
            self.rt.launch("add_bias_f32", (_blocks(a.width), a.rows), EW_BLOCK, (y.ptr, a.ptr, b.ptr, a.width))
        else:
            self._pending_add = (y, a, b if pre is not None else self._contiguous(b))  # see rms_norm(y) / flush()
            self._pending_pre = pre
            if not self.fuse_add_norm:
                self.flush()
        return y

    def scale(self, x: DArray, s: float) -> DArray:
        pe = self._pending_embed
        if pe is not None and pe[2].ptr == x.ptr and pe[2].shape == x.shape:
            # gemma3's embedding scale: the embed kernel multiplies its rows (value * scale, the
            # same product scale_f32 takes); the unscaled rows are never written
            self._pending_embed = (*pe[:3], pe[3] * s)
            return x
        self.flush()
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

    def _flush_mm(self) -> None:
        if self._pending_mm is not None:
            x, w, y, bias, out = self._pending_mm
            self._pending_mm = None
            self._matmul_into(x, w, y.ptr)
            if bias is not None:
                self.rt.launch("add_bias_f32", (_blocks(y.width), y.rows), EW_BLOCK, (out.ptr, y.ptr, bias.ptr, y.width))

    def _flush_add(self) -> None:
        """Launch a deferred row norm and a deferred add (with the norm of its b, if deferred)."""
        if self._pending_norm2d is not None:
            x, w, eps, y, q = self._pending_norm2d
            self._pending_norm2d = None
            self._launch_rms_norm(x, w, eps, y, q)
        if self._pending_add is not None:
            y, a, b = self._pending_add
            pre, self._pending_add, self._pending_pre = self._pending_pre, None, None
            if pre is not None:
                x, w, eps, yb, q = pre
                self._launch_rms_norm(x, w, eps, yb, q)
            n = a.rows * a.width
            self.rt.launch("add_f32", _blocks(n), EW_BLOCK, (y.ptr, a.ptr, b.ptr, n))

    def _launch_rms_norm(self, x: DArray, w: Vector, eps: float, y: DArray, q: tuple = (0, 0, 0)) -> None:
        heads, n = (x.shape[1], x.shape[2]) if len(x.shape) == 3 else (1, x.width)
        block = min(1024, -(-n // 32) * 32)  # one element per thread up to 1024: one load latency, not n/128
        self.rt.launch("rms_norm_f32", x.rows * heads, block,
                       (x.ptr, w.ptr, y.ptr, n, heads, x.ld, y.ld, np.float32(eps), *q))

    def rms_norm(self, x: DArray, w: Vector, eps: float) -> DArray:
        heads, n = (x.shape[1], x.shape[2]) if len(x.shape) == 3 else (1, x.width)
        block = min(1024, -(-n // 32) * 32)  # one element per thread up to 1024: one load latency, not n/128
        if len(x.shape) == 3 and self.fuse_rope_kv and n <= 1024:  # q/k norm: rope_qk_kv does it (see attention())
            self._flush_add()
            y = self.new(x.shape)
            self._pending_norm[y.ptr] = (x, w, eps, y)
            return y
        pending = self._pending_add
        if pending is not None and pending[0].ptr == x.ptr and pending[0].shape == x.shape:
            pre, self._pending_add, self._pending_pre = self._pending_pre, None, None
            self.flush()
            total, a, b = pending
            y = self.new(x.shape)
            q = self._quantized_output(y)
            split = 1024 < n <= 4096 and x.rows <= NORM_SPLIT_ROWS and total.ptr not in (a.ptr, b.ptr)
            if pre is None and split:  # the same bits over n / 256 blocks a row (see norm.cu)
                self.rt.launch("add_rms_norm_split_f32", (-(-n // 256), x.rows), 256,
                               (total.ptr, a.ptr, b.ptr, w.ptr, y.ptr, n, np.float32(eps), *q))
            elif pre is None:
                self.rt.launch("add_rms_norm_f32", x.rows, block,
                               (total.ptr, a.ptr, b.ptr, w.ptr, y.ptr, n, np.float32(eps), *q))
            else:  # b = rms_norm(bx): one launch for both norms and the add
                bx, bw, beps, yb, _ = pre
                for copies in (self._xq, self._xh, self._xk):  # yb's quantized (f16) copies are not written here
                    copies.pop((yb.ptr, yb.rows), None)
                self.rt.launch("norm_add_rms_norm_f32", x.rows, block,
                               (total.ptr, a.ptr, bx.ptr, bw.ptr, yb.ptr, np.float32(beps), w.ptr, y.ptr, n,
                                np.float32(eps), *q))
            return y
        self.flush()
        y = self.new(x.shape)
        q = self._quantized_output(y) if heads == 1 else (0, 0, 0)
        if self.fuse_add_norm and len(x.shape) == 2 and x.contiguous:
            self._pending_norm2d = (x, w, eps, y, q)  # add(., y) may take it along
            return y
        self._launch_rms_norm(x, w, eps, y, q)
        return y

    def rope(self, x: DArray, positions: DArray, base: float, neox: bool, scale: float = 1.0,
             freq_factors: Vector | None = None) -> DArray:
        self._flush_add()
        if x.ptr not in self._pending_norm:
            for nx, nw, neps, ny in self._pending_norm.values():
                self._launch_rms_norm(nx, nw, neps, ny)
            self._pending_norm.clear()
        y = self.new(x.shape)
        self._pending_rope[y.ptr] = (x, y, positions, base, neox, scale, freq_factors)  # see attention()
        if not self.fuse_rope_kv:
            self.flush()
        return y

    def attention(self, layer: int, q: DArray, k: DArray, v: DArray, positions: DArray, scale: float,
                  window: int = 0, softcap: float = 0.0) -> DArray:
        T, n_head, hd = q.shape
        n_kv = k.shape[1]
        self._write_kv(layer, q, k, v, positions)
        kc, vc = self.kv.layer_ptrs(layer)
        q = self._contiguous(q)
        if (T > BATCHED_MATVEC_MAX and hd in PREFILL_ATTN_HEAD_DIMS and self.kv.kv_type == "f16"
                and switches.prefill_attention()):
            y = self.new((T, n_head * hd))
            prefill_attention_launch(self.rt, q.ptr, q.ld, kc, vc, positions.ptr, T, n_head, n_kv, hd, self.kv.n_ctx,
                                     window, scale, softcap, y.ptr, self._f16_output(y))
            return y
        cluster = self.cluster and T <= BATCHED_MATVEC_MAX  # decode and verify rows; prefill: split path
        S = self.prefill_splits if self.cluster and not cluster else self.n_splits
        if S < 1:
            raise ValueError("a prefill forward on the cluster path needs begin(..., prefill_splits)")
        slots = attn_slots(S, cluster, hd, self.kv.kv_type)  # sizes the partials every layer shares
        if window > 0:  # a sliding-window layer's rows have at most `window` keys: fewer splits, often no merge
            S = min(S, attn_splits(window, hd, cluster, self.kv.kv_type, self.attn_max_splits))
        key = (T, slots, n_head, hd)
        if key not in self._attn_parts:
            self._attn_parts[key] = (self.new((T, slots, n_head, hd), forward_wide=True),
                                     self.new((T, slots, n_head, 2), forward_wide=True))
        opart, ml = self._attn_parts[key]
        y = self.new((T, n_head * hd))
        xq, stride, _ = self._quantized_output(y, k256=False)  # the o matvec reads it (no quantize launch)
        kd, vd = self.kv.layer_scale_ptrs(layer)
        attention_launch(self.rt, q.ptr, q.ld, kc, vc, kd, vd, opart.ptr, ml.ptr, positions.ptr,
                         T, n_head, n_kv, hd, self.kv.n_ctx, window, scale, softcap, y.ptr, xq, stride, S,
                         self.kv.kv_type, cluster, max_splits=self.attn_max_splits)
        return y

    def _write_kv(self, layer: int, q: DArray, k: DArray, v: DArray, positions: DArray) -> None:
        """Rope q and k if pending and write k, v into the cache, in as few launches as the pending
        ops allow: matvec_qkv_rope (decode, no q/k norm), rope_qk_kv, or kv_write."""
        T, n_head, hd = q.shape
        n_kv = k.shape[1]
        rq, rk = self._pending_rope.get(q.ptr), self._pending_rope.get(k.ptr)
        if self._qkv_rope_launch(layer, q, k, v, positions, rq, rk):
            return
        if rq is not None and rk is not None and rq[2:] == rk[2:] and rk[2] == positions and v.shape == k.shape:
            del self._pending_rope[q.ptr], self._pending_rope[k.ptr]
            xq, xk = rq[0], rk[0]
            nq, nk = self._pending_norm.get(xq.ptr), self._pending_norm.get(xk.ptr)
            norm_w, block = (0, 0, 0.0), max(32, min(128, hd // 2))
            if nq is not None and nk is not None and nq[2] == nk[2]:  # q/k norms too: from the raw q, k
                del self._pending_norm[xq.ptr], self._pending_norm[xk.ptr]
                xq, xk = nq[0], nk[0]
                norm_w, block = (nq[1].ptr, nk[1].ptr, nq[2]), hd  # hd threads: rms_norm_f32's sum order
            self.flush()
            _, _, _, base, neox, pos_scale, ff = rq  # (not `scale`: that is the attention's)
            # decode and verify: a head a block; prefill: a few of a token's heads (their angles once)
            hpb = 1 if T <= BATCHED_MATVEC_MAX else switches.rope_heads() or PREFILL_ROPE_HEADS
            self.rt.launch(f"rope_qk_kv_{self.kv.kv_type}", (-(-(n_head + n_kv) // hpb), T), block,
                           (xq.ptr, q.ptr, xk.ptr, v.ptr, *self.kv.write_args(layer), positions.ptr, ff.ptr if ff is not None else 0,
                            n_head, n_kv, hd, xq.ld, xk.ld, v.ld, self.kv.n_ctx, np.float32(base), np.float32(pos_scale),
                            int(bool(neox)), norm_w[0], norm_w[1], np.float32(norm_w[2]), hpb))
        else:
            self.flush()
            self.rt.launch(f"kv_write_{self.kv.kv_type}", (T, n_kv), min(128, hd),
                           (k.ptr, v.ptr, *self.kv.write_args(layer), positions.ptr, k.ld, v.ld, hd, self.kv.n_ctx))

    def swiglu(self, gate: DArray, up: DArray) -> DArray:
        return self._gated("silu_mul_f32", gate, up)

    def gelu_mul(self, gate: DArray, up: DArray) -> DArray:
        return self._gated("gelu_tanh_mul_f32", gate, up)

    def softcap(self, x: DArray, cap: float) -> DArray:
        self.flush()
        x = self._contiguous(x)
        y = self.new(x.shape)
        n = x.rows * x.width
        self.rt.launch("softcap_f32", _blocks(n), EW_BLOCK, (y.ptr, x.ptr, np.float32(cap), n))
        return y

    def last_row(self, x: DArray) -> DArray:
        return DArray(x.ptr + (x.rows - 1) * x.ld * 4, (1,) + x.shape[1:], x.ld)

    def moe_ffn(self, layer: int, x: DArray, router, gate_up, down, n_used: int, renormalize: bool) -> DArray:
        """Router matmul, moe_topk (ids stay on the device), the experts, then the weighted sum
        (engine/gpu/moe.py). Up to BATCHED_MATVEC_MAX tokens (decode, verify) one expert matvec
        over every (token, expert) slot for gate|up and one for down: each slot's rows are a plain
        one-token matvec of its expert, so verify rows equal decode rows. Prefill groups the slots
        per expert (moe_sort) and runs the tensor-core GEMM over each expert's slots."""
        T, k = x.rows, n_used
        S = T * k
        self.flush()
        x = self._contiguous(x)
        # The router takes the matvec path at any T (f32, as in decode), never the f16 GEMM: it
        # is tiny, and its logits choose experts, where a close call settled by f16 rounding
        # gives a different function, not a rounding error.
        logits = self.new((T, router.rows))
        if T > BATCHED_MATVEC_MAX and router.layout.kernel_type == "f32":
            quant_ops.sgemm_f32(self.rt, router, x.ptr, logits.ptr, T)
        else:
            xq = 0 if router.layout.is_float else self._q8_1_of(x, router.cols)
            quant_ops.matvec(self.rt, router, x.ptr, xq, logits.ptr, T)
        ids, weights = self.new((S,)), self.new((S,))
        log = self.moe_log_ptr + 4 * k * T * layer if self.moe_log_ptr and T <= self.moe_log_tokens else 0
        moe.topk(self.rt, logits.ptr, ids.ptr, weights.ptr, log, T, router.rows, k, renormalize)
        ff = gate_up.rows // 2
        gu = self.new((S, 2 * ff))
        y = self.new((S, down.rows))
        # the prefill GEMM tile that fits a block's shared memory (moe.gemm_tile); a GPU where neither
        # does (99 KB: sm_86/89, Q8_0 and the K-quants) runs prefill slots on the expert matvec too
        tiles = [moe.gemm_tile(s, self.rt.max_shared) for s in (gate_up, down)]
        grouped = T > BATCHED_MATVEC_MAX and None not in tiles
        if not grouped:
            moe.expert_matvec(self.rt, gate_up, ids.ptr, self._q8_1_of(x, x.width), gu.ptr, S, k, x_per_slot=False)
            gate, up = self.split(gu, (ff, ff))
            h = self._gated("silu_mul_f32", gate, up)
            moe.expert_matvec(self.rt, down, ids.ptr, self._q8_1_of(h, ff), y.ptr, S, k, x_per_slot=True)
        else:
            assert S <= moe.SORT_MAX_SLOTS, "prefill chunks are bounded so that T * top_k slots fit moe_sort"
            offsets, order = self.new((gate_up.n_expert + 1,)), self.new((S,))
            moe.sort_slots(self.rt, ids.ptr, offsets.ptr, order.ptr, S, gate_up.n_expert)
            moe.expert_gemm(self.rt, gate_up, offsets.ptr, order.ptr, self._f16_of(x, x.width), gu.ptr, T, k,
                            x_per_slot=False, tile=tiles[0])
            gate, up = self.split(gu, (ff, ff))
            h = self._gated("silu_mul_f32", gate, up)
            moe.expert_gemm(self.rt, down, offsets.ptr, order.ptr, self._f16_of(h, ff), y.ptr, T, k, x_per_slot=True,
                            tile=tiles[1])
        out = self.new((T, down.rows))
        moe.combine(self.rt, y.ptr, weights.ptr, out.ptr, T, down.rows, k)
        return out

    # ---- helpers ---------------------------------------------------------------------------
    _positions_ptr = 0  # set by the backend: positions of this forward (the embed kernel records history)

    def _qkv_fusable(self, w, T: int) -> bool:
        """Whether w looks like a layer's stacked q|k|v weight that matvec_qkv_rope can take for T
        tokens. Each of a verify pass's tokens reads the weight again, so past one token only a
        weight that stays in L2 (the small models', where a launch less is worth the most)."""
        cfg = self.cfg
        if not (self.fuse_qkv_rope and self.fuse_rope_kv and isinstance(w, GpuWeight) and not w.layout.is_float
                and self.kv.kv_type == "f16" and w.rows == cfg.q_dim + 2 * cfg.kv_dim and w.cols == cfg.d_model):
            return False
        return T == 1 or (T <= BATCHED_MATVEC_MAX and w.layout.nbytes(w.rows) <= QKV_ROPE_VERIFY_MAX_BYTES)

    def _qkv_rope_launch(self, layer: int, q: DArray, k: DArray, v: DArray, positions: DArray, rq, rk) -> bool:
        """Decode's q|k|v matmul, bias, rope and KV write as one launch (matvec_qkv_rope), when the
        deferred matmul's output is exactly what the pending ropes and v take, with no q/k norm.
        The matmul's own f32 output is then never written: only q, the cache rows read on."""
        mm = self._pending_mm
        if mm is None or rq is None or rk is None or q.rows > BATCHED_MATVEC_MAX:
            return False
        x, w, _, bias, out = mm
        _, n_head, hd = q.shape
        n_kv = k.shape[1]
        xq_in, xk_in = rq[0], rk[0]
        if (xq_in.ptr != out.ptr or xk_in.ptr != out.ptr + n_head * hd * 4 or v.ptr != xk_in.ptr + n_kv * hd * 4
                or xq_in.ptr in self._pending_norm or xk_in.ptr in self._pending_norm
                or rq[2:] != rk[2:] or rk[2] != positions or not q.contiguous):
            return False
        del self._pending_rope[q.ptr], self._pending_rope[k.ptr]
        self._pending_mm = None
        self.flush()
        kc, vc = self.kv.write_args(layer)
        _, _, _, base, neox, pos_scale, ff = rq
        quant_ops.matvec_qkv_rope(self.rt, w, self._q8_1_of(x, w.cols), bias.ptr if bias is not None else 0, q.ptr,
                                  kc, vc, positions.ptr, ff.ptr if ff is not None else 0, n_head * hd, n_kv * hd,
                                  hd, self.kv.n_ctx, base, pos_scale, neox, n_tokens=q.rows)
        return True

    def _gated(self, kernel: str, gate: DArray, up: DArray) -> DArray:
        self.flush()
        assert gate.ld == up.ld
        n = gate.width
        y = self.new((gate.rows, n))
        xq, stride, xk = self._quantized_output(y)
        yh = self._f16_output(y)
        self.rt.launch(kernel, (_blocks(-(-n // 32) * 32), gate.rows), EW_BLOCK,
                       (gate.ptr, up.ptr, y.ptr, n, gate.ld, xq, stride, yh, quant_ops.f16_ld(n) if yh else 0, xk))
        return y

    def _f16_output(self, y: DArray) -> int:
        """An f16 copy of y that its producer writes too, for the prefill GEMM that reads y next
        (GEMM-sized batches only; 0 elsewhere)."""
        if y.rows <= BATCHED_MATVEC_MAX:
            return 0
        yh = self._xh[(y.ptr, y.rows)] = self.arena.alloc(quant_ops.f16_nbytes(y.width, y.rows))
        return yh

    def _quantized_output(self, y: DArray, k256: bool = True) -> tuple[int, int, int]:
        """Quantized copies of y that its producer writes too (for the matvecs that read y next):
        (q8_1 pointer, row stride, q8_k256 pointer). The q8_k256 copy (0 if none) only where the
        model has weights on the k256 matvecs (k256_outputs), y's rows are whole super-blocks and the
        producer writes one (k256); (0, 0, 0) where no matvec will want them (GEMM-sized batches)."""
        if not self.fuse_quant or y.rows > BATCHED_MATVEC_MAX:
            return 0, 0, 0
        xq = self.arena.alloc(quant_ops.q8_1_nbytes(y.width, y.rows))
        self._xq[(y.ptr, y.rows)] = xq
        xk = 0
        if k256 and self.k256_outputs and y.width % 256 == 0:
            xk = self._xk[(y.ptr, y.rows)] = self.arena.alloc(y.rows * quant_ops.q8_k256_stride(y.width))
        return xq, quant_ops.q8_1_stride(y.width), xk

    def _contiguous(self, x: DArray) -> DArray:
        if x.contiguous:
            return x
        y = self.new(x.shape)
        self.rt.launch("copy_rows_f32", (_blocks(x.width), x.rows), EW_BLOCK, (y.ptr, x.ptr, x.width, y.ld, x.ld))
        return y

    def _matmul_into(self, x: DArray, w: GpuWeight, y_ptr: int) -> None:
        T = x.rows
        if T > BATCHED_MATVEC_MAX:
            tile = quant_ops.gemm_variant(w, T, self.rt.max_shared)
            xh = self._f16_of(x, w.cols) if tile in quant_ops.PIPELINED_TILES else 0
            quant_ops.gemm(self.rt, w, x.ptr, y_ptr, T, xh, tile)
            return
        if quant_ops.uses_k256(w):
            quant_ops.matvec_k256(self.rt, w, self._q8_k256_of(x, w.cols), y_ptr, T)
            return
        key = (x.ptr, T)
        if (self.fuse_quant and T == 1 and not w.layout.is_float and w.rows < FUSED_QUANT_MAX_ROWS
                and key not in self._xq):
            quant_ops.matvec(self.rt, w, x.ptr, None, y_ptr, 1)  # quantizes x itself: one launch
            return
        xq = 0 if w.layout.is_float else self._q8_1_of(x, w.cols)
        quant_ops.matvec(self.rt, w, x.ptr, xq, y_ptr, T, slice_columns=quant_ops.verify_slice(w))

    def _f16_of(self, x: DArray, cols: int) -> int:
        """x's f16 copy for the pipelined GEMM tiles: the one its producer wrote, or one conversion
        per activation, however many weights read it (q, k, v; gate, up)."""
        return self._copy_of(self._xh, x, quant_ops.f16_nbytes(cols, x.rows), quant_ops.to_f16, cols)

    def _q8_1_of(self, x: DArray, cols: int) -> int:
        """x's q8_1 copy: the one its producer wrote, or a quantize launch (once per activation,
        however many weights read it)."""
        return self._copy_of(self._xq, x, quant_ops.q8_1_nbytes(cols, x.rows), quant_ops.quantize_q8_1, cols)

    def _q8_k256_of(self, x: DArray, cols: int) -> int:
        """x's q8_k256 copy, for the Q4_K matvecs: one quantize launch per activation."""
        return self._copy_of(self._xk, x, x.rows * quant_ops.q8_k256_stride(cols), quant_ops.quantize_q8_k256, cols)

    def _copy_of(self, copies: dict, x: DArray, nbytes: int, convert, cols: int) -> int:
        """The copy of x in `copies` (keyed by x's address and rows), made by convert on first use."""
        key = (x.ptr, x.rows)
        ptr = copies.get(key, 0)
        if not ptr:
            ptr = copies[key] = self.arena.alloc(nbytes)
            convert(self.rt, x.ptr, ptr, cols, x.rows)
        return ptr
