"""Encoders for the ggml k-quants Q2_K to Q6_K and IQ4_XS, vectorised over blocks in numpy.

gguf.quants can decode these types but not encode them. These encoders write valid blocks with a
simple scale search (per-sub-block min/max, scales quantized once, nearest level); they are not
llama.cpp's error-minimising search, but the ggml layout is exact, and gguf.quants.dequantize
reads them back.
`quantize` is the one entry point for every type the synthetic generator writes: k-quants come
from here, the rest from gguf.quants.quantize.

Block layouts (QK_K = 256 weights per super-block, from ggml-common.h):
  Q4_K  144 B: d f16 | dmin f16 | scales[12] (8 x 6-bit scale, 8 x 6-bit min) | qs[128] 4-bit
  Q5_K  176 B: d f16 | dmin f16 | scales[12] | qh[32] (5th bits) | qs[128]
  Q6_K  210 B: ql[128] low 4 bits | qh[64] high 2 bits | scales[16] int8 | d f16
  Q2_K   84 B: scales[16] (4-bit scale | 4-bit min << 4, per 16 weights) | qs[64] 2-bit | d | dmin
  Q3_K  110 B: hmask[32] (3rd bits) | qs[64] low 2 bits | scales[12] (16 x 6-bit, offset 32) | d
  IQ4_XS 136 B: d f16 | scales_h u16 | scales_l[4] (8 x 6-bit, offset 32) | qs[128] 4-bit indices
         into kvalues_iq4nl
Q6_K, Q3_K and Q2_K store weight 128h + 32k + l of a super-block in bit field k of byte l of
half h (ql/qs), so the four 32-weight rows of a half share bytes.
"""
from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import quantize as _gguf_quantize

QK_K = 256
# Work on this many super-blocks at a time: ~1M weights keeps temporaries in cache-friendly sizes.
_CHUNK_BLOCKS = 4096

# Types the synthetic generator can write. F32/F16 stay typed; the rest are ggml byte blocks.
GGUF_ENCODED = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1)
K_ENCODED = (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q2_K, QT.Q3_K, QT.IQ4_XS)
ENCODABLE_TYPES = GGUF_ENCODED + K_ENCODED


def quantize(data: np.ndarray, qtype: QT) -> np.ndarray:
    """Encode float data (..., n) as ggml type qtype, the way it is stored in a GGUF.

    Returns float32/float16 arrays for F32/F16 and uint8 (..., row_bytes) for block types.
    """
    qtype = QT(qtype)
    if qtype in K_ENCODED:
        return _K_ENCODERS[qtype](data)
    if qtype in GGUF_ENCODED:
        return _gguf_quantize(np.asarray(data, dtype=np.float32), qtype)
    raise NotImplementedError(f"no encoder for ggml type {qtype.name}")


def _encode_blocks(data: np.ndarray, qtype: QT, encode_chunk) -> np.ndarray:
    data = np.asarray(data, dtype=np.float32)
    n = data.shape[-1]
    if n % QK_K:
        raise ValueError(f"{qtype.name} needs rows that are a multiple of {QK_K}, got {n}")
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = data.reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], type_size), dtype=np.uint8)
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        stop = start + _CHUNK_BLOCKS
        encode_chunk(blocks[start:stop], out[start:stop])
    return out.reshape(*data.shape[:-1], n // QK_K * type_size)


def _f16_at_least(x: np.ndarray) -> np.ndarray:
    """fp16 super-block scale no smaller than x, so the 6/8-bit sub-scales never overflow."""
    return (x * np.float32(1 + 2**-10)).astype(np.float16)


def _safe_inverse(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(x > 0, np.float32(1) / x, np.float32(0)).astype(np.float32)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and 8 six-bit mins into ggml's 12-byte get_scale_min_k4 layout."""
    packed = np.empty((sc.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return packed


def _asymmetric_sub_blocks(x: np.ndarray, levels: int, sub_size: int = 32, scale_max: int = 63):
    """Shared Q4_K/Q5_K/Q2_K search: sub-blocks of sub_size, each x ~ d*sc*q - dmin*m with q in
    [0, levels] and sc, m in [0, scale_max].

    Returns (q uint8 (nb, n_sub, sub_size), d f16, dmin f16, sc uint8 (nb, n_sub), m uint8 (nb, n_sub)).
    """
    xb = x.reshape(-1, QK_K // sub_size, sub_size)
    lo = np.minimum(xb.min(axis=-1), 0)      # ggml stores the min as a non-negative offset
    hi = xb.max(axis=-1)
    step = (hi - lo) / np.float32(levels)
    offset = -lo
    d = _f16_at_least(step.max(axis=-1) / scale_max)
    dmin = _f16_at_least(offset.max(axis=-1) / scale_max)
    d32 = d.astype(np.float32)[:, None]
    dmin32 = dmin.astype(np.float32)[:, None]
    # ceil: the quantized step must still span the sub-block's range, else its top is clipped.
    sc = np.minimum(np.ceil(step * _safe_inverse(d32)), scale_max).astype(np.uint8)
    m = np.minimum(np.rint(offset * _safe_inverse(dmin32)), scale_max).astype(np.uint8)
    eff_step = d32 * sc
    eff_offset = dmin32 * m
    q = np.rint((xb + eff_offset[..., None]) * _safe_inverse(eff_step)[..., None])
    q = np.clip(q, 0, levels).astype(np.uint8)
    return q, d, dmin, sc, m


def _encode_q4_k_chunk(x: np.ndarray, out: np.ndarray) -> None:
    q, d, dmin, sc, m = _asymmetric_sub_blocks(x, 15)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = _pack_k_scales(sc, m)
    # Byte group g holds sub-block 2g in its low nibbles and 2g+1 in its high nibbles.
    out[:, 16:144] = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)


def _encode_q5_k_chunk(x: np.ndarray, out: np.ndarray) -> None:
    q, d, dmin, sc, m = _asymmetric_sub_blocks(x, 31)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    out[:, 4:16] = _pack_k_scales(sc, m)
    # qh[l] bit j is the 5th bit of weight l of sub-block j.
    high = (q >> 4).astype(np.uint8)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= high[:, j, :] << j
    out[:, 16:48] = qh
    low = q & 0x0F
    out[:, 48:176] = (low[:, 0::2, :] | (low[:, 1::2, :] << 4)).reshape(-1, 128)


def _encode_q6_k_chunk(x: np.ndarray, out: np.ndarray) -> None:
    xb = x.reshape(-1, 16, 16)
    hi = xb.max(axis=-1)
    lo = xb.min(axis=-1)
    # Map the largest-magnitude weight to -32, the one level with no positive twin (as ggml does).
    extreme = np.where(-lo > hi, lo, hi)
    scale = extreme / np.float32(-32)
    d = _f16_at_least(np.abs(scale).max(axis=-1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(scale * _safe_inverse(d32)), -128, 127).astype(np.int8)
    eff_scale = d32 * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(eff_scale != 0, np.float32(1) / eff_scale, np.float32(0)).astype(np.float32)
    q = (np.clip(np.rint(xb * inv[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    # Each 128-weight half: ql byte l holds weights l (low nibble) and l+64 (high nibble);
    # qh byte l holds the top 2 bits of weights l, l+32, l+64, l+96.
    low = q & 0x0F
    out[:, 0:128] = (low[:, :, 0:64] | (low[:, :, 64:128] << 4)).reshape(-1, 128)
    high = (q >> 4).reshape(-1, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out[:, 128:192] = qh.reshape(-1, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d.view(np.uint8).reshape(-1, 2)


def _pack_rows_of_halves(q: np.ndarray, bits: int) -> np.ndarray:
    """(nb, 256) 2-bit values -> (nb, 64) bytes, Q2_K/Q3_K qs: weight 128h + 32k + l goes to
    bits [bits*k, bits*(k+1)) of byte 32h + l."""
    rows = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    packed = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for k in range(4):
        packed |= rows[:, :, k, :] << (bits * k)
    return packed.reshape(q.shape[0], 64)


def _encode_q2_k_chunk(x: np.ndarray, out: np.ndarray) -> None:
    q, d, dmin, sc, m = _asymmetric_sub_blocks(x, 3, sub_size=16, scale_max=15)
    out[:, 0:16] = sc | (m << 4)
    out[:, 16:80] = _pack_rows_of_halves(q.reshape(-1, QK_K), 2)
    out[:, 80:82] = d.view(np.uint8).reshape(-1, 2)
    out[:, 82:84] = dmin.view(np.uint8).reshape(-1, 2)


def _encode_q3_k_chunk(x: np.ndarray, out: np.ndarray) -> None:
    xb = x.reshape(-1, 16, 16)
    hi = xb.max(axis=-1)
    lo = xb.min(axis=-1)
    # As Q6_K: the largest-magnitude weight goes to -4, the level with no positive twin.
    extreme = np.where(-lo > hi, lo, hi)
    scale = extreme / np.float32(-4)
    d = _f16_at_least(np.abs(scale).max(axis=-1) / 31)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(scale * _safe_inverse(d32)), -32, 31).astype(np.int8)
    eff_scale = d32 * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(eff_scale != 0, np.float32(1) / eff_scale, np.float32(0)).astype(np.float32)
    q = (np.clip(np.rint(xb * inv[..., None]), -4, 3) + 4).astype(np.uint8).reshape(-1, QK_K)  # 0..7
    # hmask[l] bit 4h + k is the third bit of weight 128h + 32k + l (set: q >= 0).
    third = (q >> 2).reshape(-1, 8, 32)
    hmask = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for bit in range(8):
        hmask |= third[:, bit, :] << bit
    out[:, 0:32] = hmask
    out[:, 32:96] = _pack_rows_of_halves(q & 3, 2)
    # 6-bit scales + 32: low nibbles in bytes 0..7 (sub-blocks 0..7 low, 8..15 high nibble),
    # top 2 bits in bytes 8..11 (sub-block s at bits 2(s // 4) of byte 8 + s % 4).
    u = (sc.astype(np.int16) + 32).astype(np.uint8)
    packed = np.zeros((u.shape[0], 12), dtype=np.uint8)
    packed[:, 0:8] = (u[:, 0:8] & 0x0F) | ((u[:, 8:16] & 0x0F) << 4)
    top = (u >> 4).reshape(-1, 4, 4)  # [s // 4, s % 4]
    for i in range(4):
        packed[:, 8:12] |= top[:, i, :] << (2 * i)
    out[:, 96:108] = packed
    out[:, 108:110] = d.view(np.uint8).reshape(-1, 2)


KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _encode_iq4_xs_chunk(x: np.ndarray, out: np.ndarray) -> None:
    xb = x.reshape(-1, 8, 32)
    hi = xb.max(axis=-1)
    lo = xb.min(axis=-1)
    # The largest-magnitude weight goes to -127, the table's widest level; then nearest level.
    extreme = np.where(-lo > hi, lo, hi)
    scale = extreme / np.float32(-127)
    d = _f16_at_least(np.abs(scale).max(axis=-1) / 31)
    d32 = d.astype(np.float32)[:, None]
    ls = np.clip(np.rint(scale * _safe_inverse(d32)), -32, 31).astype(np.int8)
    eff_scale = d32 * ls
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(eff_scale != 0, np.float32(1) / eff_scale, np.float32(0)).astype(np.float32)
    midpoints = (KVALUES_IQ4NL[1:] + KVALUES_IQ4NL[:-1]) / 2
    idx = np.searchsorted(midpoints, xb * inv[..., None]).astype(np.uint8)  # (nb, 8, 32), 0..15
    u = (ls.astype(np.int16) + 32).astype(np.uint16)                       # (nb, 8), 0..63
    scales_h = np.zeros(u.shape[0], dtype=np.uint16)
    for ib in range(8):
        scales_h |= (u[:, ib] >> 4) << (2 * ib)
    low = (u & 0x0F).astype(np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = scales_h.view(np.uint8).reshape(-1, 2)
    out[:, 4:8] = low[:, 0::2] | (low[:, 1::2] << 4)
    out[:, 8:136] = (idx[:, :, :16] | (idx[:, :, 16:] << 4)).reshape(-1, 128)


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q4_K, _encode_q4_k_chunk)


def quantize_q5_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q5_K, _encode_q5_k_chunk)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q6_K, _encode_q6_k_chunk)


def quantize_q2_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q2_K, _encode_q2_k_chunk)


def quantize_q3_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q3_K, _encode_q3_k_chunk)


def quantize_iq4_xs(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.IQ4_XS, _encode_iq4_xs_chunk)


_K_ENCODERS = {QT.Q4_K: quantize_q4_k, QT.Q5_K: quantize_q5_k, QT.Q6_K: quantize_q6_k,
               QT.Q2_K: quantize_q2_k, QT.Q3_K: quantize_q3_k, QT.IQ4_XS: quantize_iq4_xs}
