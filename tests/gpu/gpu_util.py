"""Helpers for the GPU tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

import numpy as np


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.all(np.isfinite(got)), "non-finite output (an unwritten element keeps its NaN poison)"
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


def rope_ref(x, pos, base, neox, scale=1.0, ff=None):
    """float64 rope of x [T, n_heads, head_dim], token t at position pos[t] (neox or normal pairs)."""
    T, n, hd = x.shape
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if ff is not None:
        inv = inv / ff
    ang = (pos.astype(np.float64) * scale)[:, None] * inv[None]
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x = x.astype(np.float64)
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return np.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape)
