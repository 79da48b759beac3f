"""Small number formatters shared by the panes and the CLI, and the size parser of --moe-vram."""
from __future__ import annotations

import re


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def fmt_rate(tok_s: float) -> str:
    return f"{tok_s:,.1f} tok/s" if tok_s < 1000 else f"{tok_s:,.0f} tok/s"


# --moe-vram and friends. Spelled-out binary units (KiB…) and bare letters (K, M, G, as llama.cpp
# reads them) are powers of 1024; KB, MB, GB are powers of 1000 (disk and datasheet numbers).
SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in a size such as `6GiB`, `512MiB`, `6G`, `1.5GB`, `800M` or `4096` (case does not
    matter). Raises ValueError with a message for the user."""
    match = _SIZE_RE.fullmatch(text)
    unit = match[2].lower() if match else ""
    if match is None or unit not in SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (say 6GiB, 512MiB, 6G or 1.5GB; "
                         "K/M/G and KiB/MiB/GiB are binary, KB/MB/GB decimal)")
    n = round(float(match[1]) * SIZE_UNITS[unit])
    if n <= 0:
        raise ValueError(f"the size must be more than 0 bytes, not {text!r}")
    return n
