"""Helpers for the GPU tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

import numpy as np


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.all(np.isfinite(got)), "non-finite output (an unwritten element keeps its NaN poison)"
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))
