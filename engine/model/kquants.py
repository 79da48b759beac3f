"""Encoders for the ggml k-quants Q4_K, Q5_K and Q6_K, vectorised over blocks in numpy.

gguf.quants can decode k-quants but not encode them. These encoders write valid blocks with a
simple scale search (per-sub-block min/max, scales quantized once); they are not llama.cpp's
error-minimising search, but the ggml layout is exact, and gguf.quants.dequantize reads them back.
`quantize` is the one entry point for every type the synthetic generator writes: k-quants come
from here, the rest from gguf.quants.quantize.

Block layouts (QK_K = 256 weights per super-block, from ggml-common.h):
  Q4_K  144 B: d f16 | dmin f16 | scales[12] (8 x 6-bit scale, 8 x 6-bit min) | qs[128] 4-bit
  Q5_K  176 B: d f16 | dmin f16 | scales[12] | qh[32] (5th bits) | qs[128]
  Q6_K  210 B: ql[128] low 4 bits | qh[64] high 2 bits | scales[16] int8 | d f16
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
K_ENCODED = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
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


def _asymmetric_sub_blocks(x: np.ndarray, levels: int):
    """Shared Q4_K/Q5_K search: 8 sub-blocks of 32, each x ~ d*sc*q - dmin*m with q in [0, levels].

    Returns (q uint8 (nb, 8, 32), d f16, dmin f16, sc uint8 (nb, 8), m uint8 (nb, 8)).
    """
    xb = x.reshape(-1, 8, 32)
    lo = np.minimum(xb.min(axis=-1), 0)      # ggml stores the min as a non-negative offset
    hi = xb.max(axis=-1)
    step = (hi - lo) / np.float32(levels)
    offset = -lo
    d = _f16_at_least(step.max(axis=-1) / 63)
    dmin = _f16_at_least(offset.max(axis=-1) / 63)
    d32 = d.astype(np.float32)[:, None]
    dmin32 = dmin.astype(np.float32)[:, None]
    # ceil: the quantized step must still span the sub-block's range, else its top is clipped.
    sc = np.minimum(np.ceil(step * _safe_inverse(d32)), 63).astype(np.uint8)
    m = np.minimum(np.rint(offset * _safe_inverse(dmin32)), 63).astype(np.uint8)
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


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q4_K, _encode_q4_k_chunk)


def quantize_q5_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q5_K, _encode_q5_k_chunk)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    return _encode_blocks(data, QT.Q6_K, _encode_q6_k_chunk)


_K_ENCODERS = {QT.Q4_K: quantize_q4_k, QT.Q5_K: quantize_q5_k, QT.Q6_K: quantize_q6_k}
