"""numpy references for the quantized weight path (cuda/matvec.cu, cuda/gemm.cu).

- random_weight_bytes: valid random GGUF bytes of any supported type (every bit pattern of the
  quants, sane d/m fields), so tests need no encoder and cover all codes.
- quantize_q8_1_ref: the exact bytes quantize_q8_1 writes for the two-term q8_1 activation (same
  divisions, roundf, residual rounding and warp-tree summation order); q8_1_bytes lays them out
  as a device row, dequantize_q8_1_ref gives the activation the int8 dots see, d1*qs + d2*qs2.
- matvec_q8_1_ref: what the int8 matvec computes, in float64: the weights as gguf dequantizes them
  times that two-term activation, except that each block's offset term (Q4_0's -8d, Q4_1's m,
  Q4_K/Q5_K's -dmin*m) multiplies the exact float sum s of the block, as the kernel does (Q2_K's
  -dmin*m, per 16 values, multiplies the rounded two-term activation like the rest of the weight).
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import Q4_K, dequantize

from memra_engine.gpu.quant_ops import FLOAT_TYPES, Q8_K256_BYTES, QUANT_PLANES

# byte ranges of f16 fields that must hold finite values: (start, stop) within the block
_HALF_FIELDS = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208], QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.IQ4_XS: [0],
}


def random_weight_bytes(ggml_type: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """GGUF data for a random [rows, cols] weight: uint8 (rows, row_bytes) or float (rows, cols)."""
    if ggml_type == QT.F32:
        return rng.standard_normal((rows, cols), dtype=np.float32)
    if ggml_type == QT.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16)
    if ggml_type == QT.BF16:
        f = rng.standard_normal((rows, cols)).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2)
    qk, bs = GGML_QUANT_SIZES[ggml_type]
    nb = rows * cols // qk
    blocks = rng.integers(0, 256, size=(nb, bs), dtype=np.uint8)
    for off in _HALF_FIELDS[ggml_type]:
        # d (and m / dmin) around 1/64 with random signs: values of order one, never inf/nan
        h = (rng.uniform(0.5, 1.5, nb) * rng.choice([-1.0, 1.0], nb) / 64).astype(np.float16)
        blocks[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, cols // qk * bs)


def dequantize_weight(ggml_type: QT, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if ggml_type == QT.BF16:
        u = np.ascontiguousarray(data).view(np.uint16).reshape(rows, cols).astype(np.uint32) << 16
        return u.view(np.float32)
    if ggml_type in FLOAT_TYPES:
        return np.asarray(data, dtype=np.float32).reshape(rows, cols)
    return dequantize(np.ascontiguousarray(data), ggml_type).reshape(rows, cols).astype(np.float32)


def _warp_tree_sum(v: np.ndarray) -> np.ndarray:
    """float32 sum over the last axis (32) in the order of common.cuh warp_sum (xor butterfly)."""
    lanes = np.arange(32)
    v = v.astype(np.float32)
    for o in (16, 8, 4, 2, 1):
        v = v + v[..., lanes ^ o]
    return v[..., 0]


def _quantize_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [..., 32] -> (d f32 [...], q f32 [..., 32]): d = amax/127, q = roundf(x/d), 0 where amax = 0."""
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        rounded = _roundf((blocks / d[..., None]).astype(np.float32))
    return d, np.where(amax[..., None] == 0, 0, rounded).astype(np.float32)


def _roundf(v: np.ndarray) -> np.ndarray:
    """C's roundf on float32 values: half away from zero, with no |v| + 0.5 rounding error."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.sign(v) * (whole + (a - whole >= 0.5))


def quantize_q8_1_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x f32 [T, K] -> (qs int8 [T, Kq], qs2 int8 [T, Kq], ds f32 [T, Kq/32, 4]) exactly as the
    kernel writes them: ds = (d1, sum, d2, 0), qs the first int8 term, qs2 the residual's."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    kq = -(-k // 32) * 32
    xp = np.zeros((t, kq), np.float32)
    xp[:, :k] = x
    blocks = xp.reshape(t, kq // 32, 32)
    d1, q1, d2, q2 = _two_terms(blocks)
    s = _warp_tree_sum(blocks)
    ds = np.stack([d1, s, d2, np.zeros_like(d1)], axis=-1).astype(np.float32)
    return q1.astype(np.int8).reshape(t, kq), q2.astype(np.int8).reshape(t, kq), ds


def _two_terms(blocks: np.ndarray):
    """f32 [..., n] -> (d1, q1, d2, q2): q1 = roundf(x/d1), d1 = amax/127, and the residual's q2 with
    d2 = d1/254, as quantize_q8_1 writes them (any block length n)."""
    d1, q1 = _quantize_blocks(blocks)
    # the kernel's fmaf(-d1, q1, x): x - d1*q1 is exact in float64 (q1 has 8 bits), then one rounding
    r = (blocks.astype(np.float64) - d1[..., None].astype(np.float64) * q1).astype(np.float32)
    d2 = (d1 / np.float32(254)).astype(np.float32)  # fixed: |r| <= d1/2 (quants.cuh)
    with np.errstate(divide="ignore", invalid="ignore"):
        q2 = np.clip(_roundf((r / d2[..., None]).astype(np.float32)), -127, 127)
    return d1, q1, d2, np.where(d1[..., None] == 0, 0, q2).astype(np.float32)


def quantize_q8_k256_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The per-256 activation (issue 14; cuda/k256.cu's quantize_q8_k256, quants.cuh's layout):
    quantize_q8_1_ref's two int8 terms with one scale per 256 values (K padded to 256) and integer
    sums per 32, bs = 254 sum(q1) + sum(q2). x f32 [T, K] -> (q1, q2 int8 [T, Kp], d2 f32 [T, Kp/256],
    bs int32 [T, Kp/32]); the values are d2 (254 q1 + q2)."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    kp = -(-k // 256) * 256
    xp = np.zeros((t, kp), np.float32)
    xp[:, :k] = x
    _, q1, d2, q2 = _two_terms(xp.reshape(t, kp // 256, 256))
    q1, q2 = q1.astype(np.int8).reshape(t, kp), q2.astype(np.int8).reshape(t, kp)
    bs = 254 * q1.reshape(t, -1, 32).astype(np.int32).sum(-1) + q2.reshape(t, -1, 32).astype(np.int32).sum(-1)
    return q1, q2, d2, bs.astype(np.int32)


def q8_k256_positions() -> np.ndarray:
    """Where value k of a super-block lands in its 256-byte term block (quants.cuh, q8_k256):
    k = 64 i + 32 h + 8 t + e -> 64 i + 16 t + 8 h + e."""
    k = np.arange(256)
    return (k & 192) + ((k >> 3) & 3) * 16 + ((k >> 5) & 1) * 8 + (k & 7)


def q8_k256_bytes(q1: np.ndarray, q2: np.ndarray, d2: np.ndarray, bs: np.ndarray, stride: int) -> np.ndarray:
    """The device image of quantize_q8_k256's rows (quantize_q8_k256_ref's output), `stride` bytes apart:
    per super-block both terms' 256 values (q8_k256_positions), then int32 bs[nb][8], then float d2[nb]."""
    t, kp = q1.shape
    nb = kp // 256
    terms = np.zeros((t, nb, 2, 256), np.uint8)
    pos = q8_k256_positions()
    terms[:, :, 0, pos] = q1.view(np.uint8).reshape(t, nb, 256)
    terms[:, :, 1, pos] = q2.view(np.uint8).reshape(t, nb, 256)
    out = np.zeros((t, stride), np.uint8)
    out[:, :nb * 512] = terms.reshape(t, -1)
    out[:, nb * 512:nb * 544] = np.ascontiguousarray(bs, np.int32).view(np.uint8).reshape(t, -1)
    out[:, nb * 544:nb * 548] = np.ascontiguousarray(d2, np.float32).view(np.uint8).reshape(t, -1)
    return out


def dequantize_q8_k256_ref(q1: np.ndarray, q2: np.ndarray, d2: np.ndarray) -> np.ndarray:
    """The activation the per-256 format holds, d2 (254 q1 + q2): float64 [T, Kp]."""
    t = q1.shape[0]
    v = 254 * q1.reshape(t, -1, 256).astype(np.float64) + q2.reshape(t, -1, 256)
    return (d2.astype(np.float64)[..., None] * v).reshape(t, -1)


def dequantize_q8_k256_bytes(rows: np.ndarray) -> np.ndarray:
    """dequantize_q8_k256_ref of a q8_k256 row image (q8_k256_bytes' layout; for tests)."""
    t, stride = rows.shape
    nb = stride // Q8_K256_BYTES  # the row's alignment pad is under 16 bytes
    terms = rows[:, :nb * 512].reshape(t, nb, 2, 256)[..., q8_k256_positions()].view(np.int8)
    d2 = rows[:, nb * 544:nb * 548].copy().view(np.float32)
    return dequantize_q8_k256_ref(terms[:, :, 0], terms[:, :, 1], d2)


def dequantize_q8_1_ref(qs: np.ndarray, qs2: np.ndarray, ds: np.ndarray) -> np.ndarray:
    """The activation the int8 dot products see, d1*qs + d2*qs2: float64 [T, Kq]."""
    t = qs.shape[0]
    d = ds.astype(np.float64)
    x = qs.reshape(t, -1, 32) * d[..., 0:1] + qs2.reshape(t, -1, 32) * d[..., 2:3]
    return x.reshape(t, -1)


def q8_1_bytes(qs: np.ndarray, qs2: np.ndarray, ds: np.ndarray, stride: int) -> np.ndarray:
    """The device buffer image of quantize_q8_1's output (for exact byte comparison):
    per row int8 qs[Kq] | int8 qs2[Kq] | float4 ds[Kq/32], rows `stride` bytes apart."""
    t, kq = qs.shape
    out = np.zeros((t, stride), np.uint8)
    out[:, :kq] = qs.view(np.uint8)
    out[:, kq:2 * kq] = qs2.view(np.uint8)
    out[:, 2 * kq:2 * kq + ds[0].nbytes] = np.ascontiguousarray(ds, np.float32).view(np.uint8).reshape(t, -1)
    return out


def block_offsets(ggml_type: QT, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Per 32-value block, the constant part B of w = (scaled int) + B: [rows, cols/32] float64."""
    qk, bs = GGML_QUANT_SIZES[ggml_type]
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(-1, bs)
    half = lambda off: blocks[:, off:off + 2].copy().view(np.float16).astype(np.float64)[:, 0]  # noqa: E731
    if ggml_type in (QT.Q4_0, QT.Q5_0):
        b = -(8.0 if ggml_type == QT.Q4_0 else 16.0) * half(0)
        return b.reshape(rows, cols // 32)
    if ggml_type in (QT.Q4_1, QT.Q5_1):
        return half(2).reshape(rows, cols // 32)
    if ggml_type in (QT.Q4_K, QT.Q5_K):
        _, m = Q4_K.get_scale_min(blocks[:, 4:16])
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [nb, 1]
        b = -(dmin * m.reshape(-1, 8).astype(np.float32)).astype(np.float64)  # kernel: float dmin*m
        return b.reshape(rows, cols // 32)
    # Q8_0, Q6_K, Q3_K, IQ4_XS: symmetric. Q2_K's mins are per 16 values, finer than q8_1's exact
    # sums, so its kernel applies them to the rounded (two-term) activation: no correction either.
    return np.zeros((rows, cols // 32))


def matvec_q8_1_ref(ggml_type: QT, data: np.ndarray, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    """float64 emulation of the int8 matvec: y [T, rows]."""
    w = dequantize_weight(ggml_type, data, rows, cols).astype(np.float64)
    qs, qs2, ds = quantize_q8_1_ref(x)
    t = x.shape[0]
    xhat = dequantize_q8_1_ref(qs, qs2, ds)
    b = block_offsets(ggml_type, data, rows, cols)
    correction = ds[..., 1].astype(np.float64) - xhat.reshape(t, -1, 32).sum(-1)  # [T, nb]: exact sum minus rounded sum
    return xhat @ w.T + correction @ b.T


def matvec_q8_k256_ref(ggml_type: QT, data: np.ndarray, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    """float64 value of the q8_k256 matvecs (k256.cu): the weight times the activation the format
    holds. No correction term: their block sums bs are the held values' own sums. y [T, rows]."""
    w = dequantize_weight(ggml_type, data, rows, cols).astype(np.float64)
    q1, q2, d2, _ = quantize_q8_k256_ref(x)
    return dequantize_q8_k256_ref(q1, q2, d2)[:, :cols] @ w.T


def supported_types() -> list[QT]:
    return [*QUANT_PLANES, *FLOAT_TYPES]
