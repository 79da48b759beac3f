"""Quantized weights on the GPU: upload (with repacking), q8_1 activations, matvec and GEMM.

Kernels live in cuda/quants.cuh (block layouts and the per-type dot product), cuda/matvec.cu
(decode) and cuda/gemm.cu (prefill). Every launch goes on rt.stream with no host sync and no
allocation, so the calls can be captured into a CUDA graph.

Upload splits each ggml block into a q plane (the quant bits, 16-byte multiples) and a meta plane
(d, m, scales, qh): a byte split, no bit shuffling. The table is `QUANT_PLANES` below and the
comment at the top of quants.cuh. Float weights (F16/BF16/F32) are padded to rows of a multiple
of 8 values. numpy references for all of it are in memra_engine.gpu.quant_ref.
"""
from __future__ import annotations


from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from memra_engine import switches
from memra_engine.errors import DeviceError, ModelFormatError, UnsupportedModelError

MATVEC_WARPS = 4          # MV_WARPS in matvec.cu
MATVEC_MAX_COLUMNS = 16   # widest batched matvec; more tokens go in chunks of 16
PLANE_ALIGN = 256
SHARED_OPT_IN = 48 * 1024  # dynamic shared memory past this needs a per-function opt-in

# ggml type -> (kernel suffix, q plane byte ranges of the block, meta plane parts).
# A meta part is a (start, stop) byte range of the block or an int count of zero bytes.
QUANT_PLANES: dict[QT, tuple[str, list[tuple[int, int]], list[tuple[int, int] | int]]] = {
    QT.Q4_0: ("q4_0", [(2, 18)], [(0, 2)]),
    QT.Q4_1: ("q4_1", [(4, 20)], [(0, 4)]),
    QT.Q5_0: ("q5_0", [(6, 22)], [(0, 2), 2, (2, 6)]),
    QT.Q5_1: ("q5_1", [(8, 24)], [(0, 8)]),
    QT.Q8_0: ("q8_0", [(2, 34)], [(0, 2)]),
    QT.Q4_K: ("q4_K", [(16, 144)], [(0, 16)]),
    QT.Q5_K: ("q5_K", [(16, 176)], [(0, 16)]),
    QT.Q6_K: ("q6_K", [(0, 208)], [(208, 210)]),
    QT.Q2_K: ("q2_K", [(0, 80)], [(80, 84)]),            # scales,qs | d,dmin
    QT.Q3_K: ("q3_K", [(0, 96)], [(96, 110), 2]),        # hmask,qs | scales,d, pad to 16
    QT.IQ4_XS: ("iq4_xs", [(8, 136)], [(0, 8)]),         # qs | d,scales_h,scales_l
}
FLOAT_TYPES: dict[QT, tuple[str, int]] = {QT.F16: ("f16", 2), QT.BF16: ("bf16", 2), QT.F32: ("f32", 4)}
FLOAT_ROW_MULTIPLE = 8


@dataclass(frozen=True)
class WeightLayout:
    """Where the planes are in GpuWeight.buf. Float weights: q plane only, rows of padded_cols."""

    kernel_type: str       # kernel name suffix: q4_0 ... q6_K, f16, bf16, f32
    block_values: int      # values per block (QK); 8 for float types (one 16-byte unit of f16)
    q_bytes: int           # q plane bytes per block
    meta_bytes: int        # meta plane bytes per block (0 for float types)
    meta_offset: int       # byte offset of the meta plane in buf
    padded_cols: int       # values per row as stored

    @property
    def is_float(self) -> bool:
        return self.meta_bytes == 0

    def nbytes(self, rows: int) -> int:
        """Bytes of a weight of `rows` rows in this layout (both planes)."""
        blocks = rows * (self.padded_cols // self.block_values)
        return blocks * self.q_bytes if self.is_float else self.meta_offset + blocks * self.meta_bytes


@dataclass(frozen=True)
class GpuWeight:
    ggml_type: QT
    rows: int
    cols: int
    buf: object            # memory.DeviceBuffer
    layout: WeightLayout

    @property
    def q_ptr(self) -> int:
        return int(self.buf.ptr)

    @property
    def meta_ptr(self) -> int:
        return int(self.buf.ptr) + self.layout.meta_offset


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _plane_bytes(ranges: list) -> int:
    return sum(r if isinstance(r, int) else r[1] - r[0] for r in ranges)


def weight_layout(ggml_type: QT, rows: int, cols: int) -> WeightLayout:
    """The repacked layout for a [rows, cols] weight; one-line errors for what we cannot run."""
    if rows <= 0 or cols <= 0:
        raise ModelFormatError(f"weight of shape ({rows}, {cols}) is empty")
    if ggml_type in FLOAT_TYPES:
        name, esize = FLOAT_TYPES[ggml_type]
        padded = _align(cols, FLOAT_ROW_MULTIPLE)
        return WeightLayout(name, FLOAT_ROW_MULTIPLE, FLOAT_ROW_MULTIPLE * esize, 0, 0, padded)
    if ggml_type not in QUANT_PLANES:
        raise UnsupportedModelError(f"weight type {ggml_type.name} has no GPU kernel (supported: "
                                    f"{', '.join(t.name for t in (*QUANT_PLANES, *FLOAT_TYPES))})")
    name, q_ranges, meta_parts = QUANT_PLANES[ggml_type]
    qk, _ = GGML_QUANT_SIZES[ggml_type]
    if cols % qk:
        raise ModelFormatError(f"{ggml_type.name} weight has {cols} columns, not a multiple of {qk}")
    q_bytes, meta_bytes = _plane_bytes(q_ranges), _plane_bytes(meta_parts)
    meta_offset = _align(rows * (cols // qk) * q_bytes, PLANE_ALIGN)
    return WeightLayout(name, qk, q_bytes, meta_bytes, meta_offset, cols)


def repack(ggml_type: QT, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """GGUF tensor bytes -> the bytes of GpuWeight.buf (uint8, 1-D). Pure numpy."""
    layout = weight_layout(ggml_type, rows, cols)
    expected = rows * cols * FLOAT_TYPES[ggml_type][1] if ggml_type in FLOAT_TYPES else \
        rows * (cols // layout.block_values) * GGML_QUANT_SIZES[ggml_type][1]
    if data.nbytes != expected:
        raise ModelFormatError(f"{ggml_type.name} weight of shape ({rows}, {cols}) has {data.nbytes} bytes, expected {expected}")
    if ggml_type in FLOAT_TYPES:
        esize = FLOAT_TYPES[ggml_type][1]
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, cols * esize)
        out = np.zeros((rows, layout.padded_cols * esize), np.uint8)
        out[:, : cols * esize] = raw
        return out.reshape(-1)
    _, q_ranges, meta_parts = QUANT_PLANES[ggml_type]
    qk, block_bytes = GGML_QUANT_SIZES[ggml_type]
    nblocks = rows * (cols // qk)
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(nblocks, block_bytes)
    parts_q = [blocks[:, a:b] for a, b in q_ranges]
    parts_m = [np.zeros((nblocks, p), np.uint8) if isinstance(p, int) else blocks[:, p[0]:p[1]] for p in meta_parts]
    out = np.zeros(layout.meta_offset + nblocks * layout.meta_bytes, np.uint8)
    out[: nblocks * layout.q_bytes] = np.concatenate(parts_q, axis=1).reshape(-1)
    out[layout.meta_offset:] = np.concatenate(parts_m, axis=1).reshape(-1)
    return out


def upload_weight(rt, pool, tensor_info) -> GpuWeight:
    """Repack one 2-D GGUF weight and copy it into the pool's weights region."""
    shape = tuple(int(s) for s in tensor_info.shape)
    if len(shape) == 1:
        shape = (1, shape[0])
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    layout = weight_layout(tensor_info.ggml_type, rows, cols)
    host = repack(tensor_info.ggml_type, tensor_info.data, rows, cols)
    buf = pool.alloc("weights", host.nbytes, tensor_info.name)
    rt.upload(buf.ptr, host)
    return GpuWeight(tensor_info.ggml_type, rows, cols, buf, layout)


# ---- q8_1 activations --------------------------------------------------------------------------
# The q8_1 activation (cuda/quants.cuh, 3.) is two int8 terms per value: per 32-value block
# d1 = amax/127, qs = round(x/d1), then the residual r = x - d1*qs (|r| <= d1/2) as d2 = d1/254,
# qs2 = round(r/d2); x ~ d1*qs + d2*qs2 (~16-bit precision; one int8 term flipped greedy tokens).
# A token's row: int8 qs[Kq] | int8 qs2[Kq] | float4 ds[Kq/32] = (d1, sum of x, d2, 0), Kq = K
# rounded up to 32. Every byte of a row is written (no padding: 2*Kq + Kq/2 is a multiple of 16).
def q8_1_stride(n_cols: int) -> int:
    """Bytes per token row of the q8_1 activation: qs[Kq] | qs2[Kq] | float4 ds[Kq/32]."""
    kq = _align(n_cols, 32)
    return _align(2 * kq + (kq // 32) * 16, 16)


def q8_1_nbytes(n_cols: int, n_tokens: int = 1) -> int:
    return n_tokens * q8_1_stride(n_cols)


Q8_K256_BYTES = 512 + 32 + 4  # a super-block's share of a q8_k256 row: both terms, 8 int32 sums, d2


def q8_k256_stride(n_cols: int) -> int:
    """Bytes per token row of the per-256 activation (quants.cuh): q[nb][2][4][64] | int32 bs[nb][8] |
    float d2[nb], nb = n_cols / 256 rounded up."""
    return _align(-(-n_cols // 256) * Q8_K256_BYTES, 16)


def quantize_q8_k256(rt, x_ptr: int, xq_ptr: int, n_cols: int, n_tokens: int = 1) -> None:
    """f32 activations x[n_tokens][n_cols] -> q8_k256 rows at xq (n_tokens * q8_k256_stride bytes)."""
    rt.launch("quantize_q8_k256", (-(-n_cols // 256), n_tokens), 256, (x_ptr, xq_ptr, n_cols, q8_k256_stride(n_cols)))


# ---- Q4_K on q8_k256 (k256.cu): decode and verify with the same float steps ---------------------
K256_TYPES = ("q4_K",)
K256_WIDTHS = (4, 8, 16)
K256_MAX_COLUMNS = 16  # columns a block takes (8 on one MMA tile, 16 on two sharing the weight fragment)


def uses_k256(w: GpuWeight) -> bool:
    """Whether 1-16 columns of w take the q8_k256 matvecs (k256.cu) instead of the q8_1 ones."""
    return w.layout.kernel_type in K256_TYPES and switches.k256()


def k256_model(tensors) -> bool:
    """Whether a model's dense matrices (GGUF TensorInfos; experts aside, they keep the q8_1 expert
    matvec) include a type on the k256 matvecs: then its norms and gated activations write q8_k256
    copies for them (GpuOps.k256_outputs)."""
    return switches.k256() and any(t.ggml_type in QUANT_PLANES and QUANT_PLANES[t.ggml_type][0] in K256_TYPES
                                   and len(t.shape) == 2 and "_exps" not in t.name for t in tensors)


def k256_width(w: GpuWeight) -> int:
    """Warps a block of w's q8_k256 matvecs: the fewest of 4, 8, 16 that give 1,536 warps over the
    16-row tiles (about 12 an SM on an H100/H200), the best width on all eight 1B/8B Q4_K shapes
    for decode and verify alike (H200, scripts/proto/mma_q4k.py; docs/gpu-log.md session 56).
    Decode and verify of one weight take the same width: it sets the float order."""
    tiles = -(-w.rows // 16)
    for nw in K256_WIDTHS:
        if tiles * nw >= 1536:
            return nw
    return K256_WIDTHS[-1]


def matvec_k256(rt, w: GpuWeight, xq_ptr: int, y_ptr: int, n_tokens: int = 1) -> None:
    """y[t, rows] = W @ x[t] for t < n_tokens <= 16 from x's q8_k256 rows (quantize_q8_k256): one
    column on dp4a, more on int8 tensor cores, each (row, column) with the same bits either way."""
    nw, tiles = k256_width(w), -(-w.rows // 16)
    nc = 1 if n_tokens == 1 else 8 if n_tokens <= 8 else K256_MAX_COLUMNS  # a block's columns (one block row)
    rt.launch(f"matvec_{w.layout.kernel_type}_k256_c{nc}_w{nw}", (tiles, -(-n_tokens // nc)), 32 * nw,
              (w.q_ptr, w.meta_ptr, int(xq_ptr), int(y_ptr), w.rows, w.cols, n_tokens, q8_k256_stride(w.cols)))


def quantize_q8_1(rt, x_ptr: int, xq_ptr: int, n_cols: int, n_tokens: int = 1) -> None:
    """f32 activations x[n_tokens][n_cols] -> q8_1 rows at xq (q8_1_nbytes(n_cols, n_tokens) bytes)."""
    kq = _align(n_cols, 32)
    rt.launch("quantize_q8_1", (-(-kq // 256), n_tokens), 256,
              (int(x_ptr), int(xq_ptr), n_cols, q8_1_stride(n_cols)))


# ---- matvec (decode, verify) -------------------------------------------------------------------
# (rows per warp, units per step); units 0: one unit per step, the next step's weights loaded a step
# ahead (a register double buffer, cuda/matvec.cu matvec_dots_db)
ONE_COLUMN_VARIANTS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1), (1, 0), (2, 0), (4, 0))
FUSED_VARIANTS = ((1, 1), (2, 1))
BATCHED_VARIANTS = ((2, 1), (4, 1))  # verify: rows per warp share each column's activation loads
# verify on int8 tensor cores (matvec.cu, matvec_q4_K_mma, matvec_q6_K_mma): 16 rows a block, 8 or 16 columns
MMA_BATCHED_TYPES = ("q4_K", "q6_K")
MMA_ROWS, MMA_THREADS = 16, 256
# fewest columns the tensor cores take: 2 stay on dp4a, where a weight unit's two dots a row cost
# less than a 16-row MMA tile's fixed work (H100, 8B verify of 2 rows: dp4a 1.31x a decode step,
# MMA 1.55x; of 4: dp4a 1.87x, MMA 1.67x; session 41)
MMA_MIN_COLUMNS = 3


def _columns_variant(n: int) -> int:
    for c in (1, 2, 4, 8, 16):
        if n <= c:
            return c
    return MATVEC_MAX_COLUMNS


def matvec_variant(w: GpuWeight, fused: bool = False) -> tuple[int, int]:
    """(rows per warp, units per lane step) for one-token decode, picked from bench_kernels.py and
    bench_decode_matvecs.py on the H200 (docs/gpu-log.md). Every warp reads the whole activation
    row, so with the two-term q8_1 (2.5x the bytes of one term) tall matrices want two rows per warp
    (Q4_1 3072x576: 1.92 -> 1.51 µs); rows of K <= 1024 one unit per step; long rows more loads in
    flight (u2; Q8_0 u4 only past K = 4096: at 576x1536 u4 took 1.95 µs, u2 1.60); the K-quants,
    heavier per unit, u1 (Q6_K two rows per warp: 576x1536 1.95 -> 1.72 µs), and at the 1B-8B shapes
    the double-buffered loop (u0, below) where a lane has many steps (Q4_K: K >= 8192). Q2_K/Q3_K keep Q4_K's rule from before u0, and IQ4_XS
    follows the 32-wide types: not timed."""
    kind = w.layout.kernel_type
    if fused:
        return (2, 1) if w.rows >= 16384 else (1, 1)
    # The 8B / 1B shapes (bench_decode_matvecs.py, H200, µs a launch): the double-buffered loop (u0)
    # wins wherever a lane has several steps or a warp several rows. Q4_K 4096x14336 r1u1 25.2, r2u0
    # 15.4; 4096x4096 r1u1 8.3, r2u0 6.1; 28672x4096 r2u1 31.2, r4u0 30.2; 16384x2048 r2u1 12.5,
    # r4u0 10.7; 2048x8192 r2u0 7.2 (r1u1 9.4). Q5_K 4096x14336 r2u0 20.3, r4u0 19.5. Q6_K
    # 4096x14336 r2u2 27.9, r4u0 17.5; 49152x4096 (the LM head) r2u2 63.3, r4u1 48.8; 1024x4096 r2u1
    # 4.1, r2u2 3.1; 2048x8192 r2u1 8.7, r4u0 9.4.
    # Since the branch-free scale decode (session 32, kquant_scales_of) Q4_K's plain loop with four
    # rows a warp beats the double buffer on the K = 2048-4096 shapes: 28672x4096 r4u1 21.6, r4u0
    # 25.2; 6144x4096 6.95, 7.00; 16384x2048 7.40, 9.34; 4096x4096 5.40, r2u0 5.80; K >= 8192 keeps
    # r2u0 (4096x14336 14.4, r4u1 17.5; 2048x8192 5.97, r4u1 7.67). Q5_K 4096x14336 r4u0 14.1.
    # Below 4,096 rows (H100, session 42): 3072x2048 r1u1 4.64, r4u1 2.82; 2048x4096 (qwen3-moe's o)
    # r1u1 4.51, r2u0 3.45; 2048x2048 r1u1 2.60, r2u0 2.32 (r4u0 2.20); 1024x2048 r1u1 1.96, r2u0 1.80.
    if kind == "q4_K":
        if w.cols >= 8192:
            return (2, 0)
        if w.rows >= 3072:
            return (4, 1)
        return (2, 0) if w.rows >= 1024 and w.cols >= 2048 else (1, 1)
    # Q5_K, Q6_K, Q4_0, Q8_0 at the 8B shapes (session 38, scripts/device_quants.sh): Q5_K 28672x4096
    # r4u0 31.2, r4u1 26.2; 6144x4096 9.61, 7.29; 4096x4096 r2u0 6.78, r4u0 5.99; 1024x4096 r1u1 3.26,
    # r2u2 2.84. Q6_K 4096x4096 r2u2 8.49, r4u0 7.36. Q4_0 4096x14336 r1u2 17.5, r2u0 13.7; 6144x4096
    # r2u2 6.49, r2u1 5.98. Q8_0 1024x4096 r1u2 3.20, r1u4 2.66.
    if kind == "q5_K":
        if w.cols >= 8192:
            return (4, 0)
        if w.rows >= 6144:
            return (4, 1)
        if w.rows >= 4096:
            return (4, 0)
        return (2, 2) if w.rows >= 1024 and w.cols >= 4096 else (1, 1)
    if kind in ("q2_K", "q3_K"):
        return (2, 1) if w.rows >= 8192 else (1, 1)
    if kind == "q6_K":
        if w.cols >= 8192:
            return (4, 0) if w.rows >= 4096 else (2, 1)
        if w.rows >= 16384:
            return (4, 1)
        if w.rows == 4096 and w.cols >= 4096:
            return (4, 0)
        return (2, 2) if w.rows >= 1024 and w.cols >= 2048 else (2, 1)
    if w.cols <= 1024:
        return (2, 1) if w.rows >= 2048 else (1, 1)
    if w.cols <= 4096:
        if kind == "q8_0" and w.rows >= 1024 and w.cols == 4096:  # the 8B: 28672 rows r1u2 34.6, r1u4 33.9;
            return (1, 1) if w.rows == 4096 else (1, 4)       # 6144 10.1, 9.3; 4096 r1u2 7.4, r1u1 6.9 µs
        if kind == "q4_0" and w.rows >= 6144 and w.cols == 4096:
            return (2, 1)
        return (2, 2) if kind in ("q4_0", "q4_1") else (1, 2)
    if kind == "q4_0" and w.cols >= 8192:
        return (2, 0)
    return (1, 4) if kind == "q8_0" else (1, 2)


def batched_variant(w: GpuWeight) -> tuple[int, int]:
    """(rows per warp, units per step) for 2-16 columns. A warp loads each column's activation
    unit once for its R rows, so R rows per warp divide the activation traffic, which at 8
    columns outweighs the weight's (docs/gpu-log.md, "Speculative decoding"). Each row's sums
    do not depend on R: rows stay bit-identical to decode's.
    MEMRA_BATCHED_R=2|4 forces R (A/B runs; one row per warp, R1, was slower on every shape)."""
    forced = switches.batched_rows()
    if forced:
        return (forced, 1)
    # H200, verify of 8 rows against a decode step: SmolLM2 shape (K = 576) R1 2.47x, R2 2.29x,
    # R4 2.39x; Llama-8B shape (K = 4096) R1 5.68x, R2 3.47x, R4 2.81x
    return (4, 1) if w.cols >= 2048 else (2, 1)


def matvec(rt, w: GpuWeight, x_ptr: int, xq_ptr: int | None, y_ptr: int, n_tokens: int = 1,
           variant: tuple[int, int] | str | None = None, slice_columns: int | None = None) -> None:
    """y[t, rows] = W @ x[t] for t < n_tokens (x f32 [n_tokens, cols], y f32 [n_tokens, rows]).
    variant: (rows per warp, units per step), or "mma" (2-16 columns of a MMA_BATCHED_TYPES weight
    on tensor cores); None picks per shape.

    Quant weights read xq, written by quantize_q8_1 over the same n_tokens; xq_ptr=None instead
    quantizes x inside the matvec (one launch instead of two, the same bytes, so the same y: worth
    it for small K, see docs/gpu-log.md). Float weights read x. Up to 16 tokens share one pass
    over the weight; each column's arithmetic is the one-token kernel's, so results are
    bit-identical to n_tokens=1 whatever the variant.

    slice_columns (1, 2, 4, 8, 16): each block takes at most that many columns, the launch's
    second grid dimension the slices, so a few columns spread over more blocks; None: all columns
    in each block (the weight read once). The mma path (n >= MMA_MIN_COLUMNS of a MMA_BATCHED_TYPES
    weight) takes slices of 8 or 16 (a smaller slice: dp4a).
    Same bits either way."""
    lay = w.layout
    if lay.is_float:
        for t0 in range(0, n_tokens, MATVEC_MAX_COLUMNS):
            n = min(MATVEC_MAX_COLUMNS, n_tokens - t0)
            c = _columns_variant(min(n, slice_columns or n))
            rt.launch(f"matvec_{lay.kernel_type}_c{c}", (-(-w.rows // MATVEC_WARPS), -(-n // c)), 32 * MATVEC_WARPS,
                      (w.q_ptr, int(x_ptr) + t0 * w.cols * 4, int(y_ptr) + t0 * w.rows * 4, w.rows, w.cols, n))
        return
    stride = q8_1_stride(w.cols)
    if xq_ptr is None:
        r, u = variant or matvec_variant(w, fused=True)
        name = f"matvec_{lay.kernel_type}_fused_r{r}u{u}"
        if stride > SHARED_OPT_IN:  # the q8_1 row in shared memory: K > 19,660 needs the opt-in
            rt.set_max_dynamic_shared(name, stride)
        for t in range(n_tokens):
            rt.launch(name, -(-w.rows // (MATVEC_WARPS * r)), 32 * MATVEC_WARPS,
                      (w.q_ptr, w.meta_ptr, int(x_ptr) + t * w.cols * 4, int(y_ptr) + t * w.rows * 4,
                       w.rows, w.cols, 1, stride), shared=stride)
        return
    for t0 in range(0, n_tokens, MATVEC_MAX_COLUMNS):
        n = min(MATVEC_MAX_COLUMNS, n_tokens - t0)
        args = (w.q_ptr, w.meta_ptr, int(xq_ptr) + t0 * stride, int(y_ptr) + t0 * w.rows * 4, w.rows, w.cols, n, stride)
        if n > 1 and (variant == "mma" or (variant is None and n >= MMA_MIN_COLUMNS and uses_mma(w)
                                           and (slice_columns or 8) >= 8)):
            c = 8 if (n <= 8 or slice_columns == 8) else 16
            rt.launch(f"matvec_{lay.kernel_type}_mma_c{c}", (-(-w.rows // MMA_ROWS), -(-n // c)), MMA_THREADS, args)
            continue
        c = _columns_variant(min(n, slice_columns or n))
        r, u = variant or (matvec_variant(w) if c == 1 else batched_variant(w))
        rt.launch(f"matvec_{lay.kernel_type}_r{r}u{u}_c{c}", (-(-w.rows // (MATVEC_WARPS * r)), -(-n // c)),
                  32 * MATVEC_WARPS, args)


def verify_slice(w: GpuWeight) -> int | None:
    """Most columns one block of a verify (2-16 column) matvec of w takes; None: all of them. Short rows
    (K < 2048) in slices of 2: there a warp's column loop is the latency, not the weight's bytes
    (SmolLM2 shape, 9 rows, H100: verify 2.44x a decode step unsliced, 1.86x in slices of 1, 1.83x
    of 2, 1.91x of 4; docs/gpu-log.md, session 40)."""
    forced = switches.verify_slice()
    if forced:
        return forced
    return 2 if w.cols < 2048 else None


def uses_mma(w: GpuWeight) -> bool:
    """Whether 2-16 columns of w take the tensor-core matvec (same bits as the dp4a one, tested)."""
    return w.layout.kernel_type in MMA_BATCHED_TYPES and switches.verify_mma()


def matvec_qkv_rope(rt, w: GpuWeight, xq_ptr: int, bias_ptr: int, q_out: int, kc: int, vc: int, pos_ptr: int,
                    freq_factors_ptr: int, q_rows: int, kv_rows: int, head_dim: int, n_ctx: int, theta_base: float,
                    pos_scale: float, neox: bool, n_tokens: int = 1) -> None:
    """The q|k|v projection of n_tokens tokens (w stacks q, k, v rows; xq their q8_1 rows) with
    the bias, rope and the f16 KV write in the epilogue: token t's q roped into q_out row t
    [n_q * head_dim], its k roped and v into cache row pos[t] (matvec.cu, matvec_qkv_rope), each
    token as a decode step computes it. Same bits as matvec + add_bias + rope_qk_kv."""
    lay = w.layout
    pairs = w.rows // 2
    rt.launch(f"matvec_{lay.kernel_type}_qkv_rope", (-(-pairs // MATVEC_WARPS), n_tokens), 32 * MATVEC_WARPS,
              (w.q_ptr, w.meta_ptr, int(xq_ptr), int(bias_ptr), int(q_out), int(kc), int(vc), int(pos_ptr),
               int(freq_factors_ptr), w.rows, w.cols, q8_1_stride(w.cols), q_rows, kv_rows, head_dim, n_ctx,
               np.float32(theta_base), np.float32(pos_scale), int(bool(neox))))


# ---- GEMM (prefill) ----------------------------------------------------------------------------
# kernel prefix -> (tokens per tile, rows per tile, threads); see gemm.cu. gemm3 to gemm7 are the
# pipelined tiles, for every type but f32: they read x as f16 rows (to_f16). gemm5 is gemm3's tile
# with the dequant on producer warps and the products on mma.sync (its grid takes token tiles
# first), gemm7 the same with 8 producer warps instead of 4; their 156-200 KB of shared memory needs
# an sm_90-class GPU. gemm6 (64 x 64, 61-83 KB) is for GPUs whose blocks get 99 KB (sm_86, sm_89),
# where gemm3 and, for most types, gemm4 do not fit. f32 weights have the unpipelined gemm and
# gemm2 over f32 x.
GEMM_TILES = {"gemm": (64, 64, 128), "gemm2": (128, 128, 256), "gemm3": (128, 128, 256), "gemm4": (64, 128, 128),
              "gemm5": (128, 128, 256), "gemm6": (64, 64, 128), "gemm7": (128, 128, 384)}
PIPELINED_TILES = ("gemm3", "gemm4", "gemm5", "gemm6", "gemm7")
TOKEN_MAJOR_TILES = ("gemm5", "gemm7")  # grid (token tiles, row tiles); gemm7: gemm5 with 8 producer warps
GEMM_LDS = 128 + 8  # the f16 tile row in halves (gemm.cu GEMM_LDS)
SM90_SHARED = 227 * 1024  # the most dynamic shared memory a block of an H100/H200 may opt into


def gemm_tiles(w: GpuWeight, max_shared: int = SM90_SHARED) -> list[str]:
    """The tile shapes this weight's type has kernels for, among those whose shared memory fits
    max_shared (the device's opt-in limit per block, GpuRuntime.max_shared)."""
    f32 = w.layout.kernel_type == "f32"
    return [p for p in GEMM_TILES if (p in PIPELINED_TILES) != f32 and gemm_shared(p, w.layout) <= max_shared]


def gemm_shared(prefix: str, lay: WeightLayout) -> int:
    """Dynamic shared bytes of a tile (gemm.cu GemmTile::SMEM, PipeTile::SMEM, WsTile::SMEM)."""
    bm, bn, _ = GEMM_TILES[prefix]
    out = bm * (bn + 4) * 4  # the f32 y tile staged at the end
    if prefix not in PIPELINED_TILES:
        return max((bm + bn) * GEMM_LDS * 2, out)
    nb_step = 1 if lay.block_values >= 128 else 128 // lay.block_values
    mch = (nb_step * lay.meta_bytes + 6) // 4 if lay.meta_bytes else 0
    raw = bn * (nb_step * lay.q_bytes + _align(4 * mch, 16))
    if prefix in TOKEN_MAJOR_TILES:  # two x tiles, two raw steps, two w tiles; y from registers
        return 2 * (bm * GEMM_LDS * 2 + raw + bn * GEMM_LDS * 2)
    return max(2 * (bm * GEMM_LDS * 2 + raw) + bn * GEMM_LDS * 2, out)


def gemm_variant(w: GpuWeight, n_tokens: int, max_shared: int = SM90_SHARED) -> str:
    """The tile shape for a prefill chunk (bench_kernels.py times them all; docs/gpu-log.md)."""
    tiles = gemm_tiles(w, max_shared)
    forced = switches.gemm_tile()
    if forced in tiles:
        return forced
    big = n_tokens >= 256 and w.rows >= 2048
    if w.layout.kernel_type != "f32":
        # gemm7 where it fits (1.3-1.5x gemm3, 1.0-1.26x gemm5: H100, docs/gpu-log.md session 49);
        # gemm6 where no other does (99 KB GPUs)
        order = ("gemm7", "gemm5", "gemm3", "gemm4", "gemm6") if big else ("gemm4", "gemm6")
    else:
        order = ("gemm2", "gemm") if n_tokens >= 256 and w.rows >= 4096 else ("gemm", "gemm2")
    for p in order:
        if p in tiles:
            return p
    raise DeviceError(f"no prefill GEMM tile for {w.layout.kernel_type} weights fits {max_shared} bytes of shared memory")


def f16_ld(cols: int) -> int:
    """Row stride in halves of x's f16 copy (16-byte rows for the pipelined tiles' copies)."""
    return _align(cols, 8)


def f16_nbytes(cols: int, n_tokens: int) -> int:
    return 2 * f16_ld(cols) * n_tokens


def to_f16(rt, x_ptr: int, xh_ptr: int, cols: int, n_tokens: int) -> None:
    """x f32 [n_tokens, cols] -> f16 rows of stride f16_ld(cols), zero past cols (gemm.cu)."""
    ld = f16_ld(cols)
    rt.launch("f32_to_f16_rows", (-(-ld // 2048), n_tokens), 256, (int(x_ptr), int(xh_ptr), cols, ld, n_tokens))


def gemm(rt, w: GpuWeight, x_ptr: int, y_ptr: int, n_tokens: int, xh_ptr: int = 0, variant: str | None = None) -> None:
    """y[t, rows] = W @ x[t] on tensor cores (f16 operands, f32 accumulate), for prefill chunks.
    x is f32 [n_tokens, cols]; the weight is dequantized tile by tile in shared memory. The
    pipelined tiles read xh_ptr, x's f16 copy (to_f16), instead of x."""
    prefix = variant or gemm_variant(w, n_tokens, rt.max_shared)
    bm, bn, threads = GEMM_TILES[prefix]
    smem = gemm_shared(prefix, w.layout)
    name = f"{prefix}_{w.layout.kernel_type}"
    if smem > SHARED_OPT_IN:
        rt.set_max_dynamic_shared(name, smem)  # a function attribute, not a stream operation
    meta = w.meta_ptr if not w.layout.is_float else w.q_ptr
    grid = (-(-w.rows // bn), -(-n_tokens // bm))
    if prefix in TOKEN_MAJOR_TILES:
        grid = grid[::-1]
    if prefix in PIPELINED_TILES:
        if not xh_ptr:
            raise ValueError(f"{name} reads x as f16: pass xh_ptr (quant_ops.to_f16)")
        rt.launch(name, grid, threads, (w.q_ptr, meta, int(xh_ptr), int(y_ptr), w.rows, w.cols, n_tokens,
                                        f16_ld(w.cols)), shared=smem)
    else:
        rt.launch(name, grid, threads, (w.q_ptr, meta, int(x_ptr), int(y_ptr), w.rows, w.cols, n_tokens), shared=smem)


def sgemm_f32(rt, w: GpuWeight, x_ptr: int, y_ptr: int, n_tokens: int) -> None:
    """y[t, rows] = W @ x[t] in float32 FMAs, for an f32 weight and many tokens (gemm.cu sgemm_f32):
    prefill's MoE router, which the f16 tensor-core tiles would round and the 16-column matvecs
    run slowly (a 64-row weight gives them 8 blocks)."""
    assert w.layout.kernel_type == "f32", w.layout.kernel_type
    rt.launch("sgemm_f32", (-(-w.rows // 32), -(-n_tokens // 16)), 256,
              (w.q_ptr, w.layout.padded_cols, int(x_ptr), int(y_ptr), w.rows, w.cols, n_tokens))


def kernel_names() -> list[str]:
    """Every entry point this module may launch (resolve them before graph capture)."""
    names = ["quantize_q8_1", "quantize_q8_k256", "f32_to_f16_rows", "sgemm_f32"]
    names += [f"matvec_{t}_k256_{c}_w{nw}" for t in K256_TYPES for c in ("c1", "c8", "c16") for nw in K256_WIDTHS]
    for name, _, _ in QUANT_PLANES.values():
        names += [f"matvec_{name}_r{r}u{u}_c1" for r, u in ONE_COLUMN_VARIANTS]
        names += [f"matvec_{name}_r{r}u{u}_c{c}" for r, u in BATCHED_VARIANTS for c in (2, 4, 8, 16)]
        names += [f"matvec_{name}_fused_r{r}u{u}" for r, u in FUSED_VARIANTS]
        names.append(f"matvec_{name}_qkv_rope")
        if name in MMA_BATCHED_TYPES:
            names += [f"matvec_{name}_mma_c{c}" for c in (8, 16)]
        names += [f"{prefix}_{name}" for prefix in PIPELINED_TILES]
    for name, _ in FLOAT_TYPES.values():
        names += [f"matvec_{name}_c{c}" for c in (1, 2, 4, 8, 16)]
        names += [f"{prefix}_{name}" for prefix in GEMM_TILES if (prefix in PIPELINED_TILES) != (name == "f32")]
    return names
