"""Choosing and creating a backend: "auto" takes CUDA when it can, otherwise the numpy backend.

The GPU package provides two functions (they may be absent in a CPU-only install):
    memra_engine.gpu.available() -> tuple[bool, str]        # (usable, reason when not)
    memra_engine.gpu.create_backend(g: GGUFFile, n_ctx: int, vram_budget: int | None, kv_type: str,
                                    share_with: Backend | None, moe_vram: int | None,
                                    say: Callable[[str], None] | None) -> Backend
create_backend must be called on the thread that will use the backend (it owns the CUDA context).
"""
from __future__ import annotations

from typing import Callable

from memra_engine.errors import DeviceError, MemraError
from memra_engine.kv_type import DEFAULT_KV_TYPE, check_kv_type

BACKENDS = ("auto", "cpu", "cuda")


def gpu_available() -> tuple[bool, str]:
    try:
        from memra_engine import gpu

        check = gpu.available
    except (ImportError, AttributeError):
        return False, "this install has no CUDA backend"
    try:
        ok, reason = check()
    except Exception as err:  # a broken driver or toolkit must not stop the CPU path
        return False, f"CUDA check failed: {type(err).__name__}: {err}"
    # the GPU package words its reasons as notices; we add the consequence ourselves
    return bool(ok), str(reason).split("; using the CPU backend")[0]


def choose_backend(kind: str, progress: Callable[[str], None] | None = None) -> str:
    """Resolve "auto" | "cpu" | "cuda" to "cpu" or "cuda"; DeviceError when cuda was asked for and is absent."""
    if kind not in BACKENDS:
        raise MemraError(f"unknown backend {kind!r} (choose auto, cpu or cuda)")
    if kind == "cpu":
        return "cpu"
    ok, reason = gpu_available()
    if ok:
        return "cuda"
    if kind == "cuda":
        raise DeviceError(f"the CUDA backend is not usable: {reason}")
    if progress is not None:
        progress(f"no CUDA device: using the CPU backend ({reason})")
    return "cpu"


def create_backend(kind: str, g, n_ctx: int, vram_budget: int | None = None, kv_type: str = DEFAULT_KV_TYPE,
                   share_with=None, moe_vram: int | None = None, say: Callable[[str], None] | None = None):
    """Build the backend for a resolved kind ("cpu" or "cuda") on the calling thread.
    kv_type: "f16" or "q8_0" (engine/kv_type.py); an unknown one is a one-line MemraError.
    share_with: a backend of the same kind whose device context the new one uses (a draft model
    beside its target: one thread has one current CUDA context). Close the new one first.
    moe_vram: VRAM bytes for MoE experts (cuda only; the cpu backend keeps every expert in RAM).
    say: where load notices go (e.g. the expert budget chosen when experts exceed free VRAM)."""
    check_kv_type(kv_type)
    if kind == "cpu":
        from memra_engine.cpu.backend import CpuBackend

        return CpuBackend(g, n_ctx, kv_type=kv_type)
    from memra_engine import gpu

    return gpu.create_backend(g, n_ctx=n_ctx, vram_budget=vram_budget, kv_type=kv_type, share_with=share_with,
                              moe_vram=moe_vram, say=say)
