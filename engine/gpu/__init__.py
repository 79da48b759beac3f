"""The PyCUDA backend. `available()` says whether `--backend auto` may pick it, and why not.

Nothing here creates a CUDA context: that happens on the engine thread in GpuRuntime.
"""
from __future__ import annotations


def available() -> tuple[bool, str]:
    """(True, device name) when PyCUDA, a device of compute capability >= 8.0, and kernels
    (prebuilt or nvcc) are all there; else (False, a one-line reason for the notice)."""
    try:
        import pycuda.driver as cuda
    except ImportError:
        return False, "PyCUDA is not installed (pip install 'memra[cuda]'); using the CPU backend"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return False, "no CUDA device found; using the CPU backend"
        dev = cuda.Device(0)
        major, minor = dev.compute_capability()
        name = dev.name()
    except Exception as err:  # driver missing or broken: any failure means "not usable"
        return False, f"CUDA driver not usable ({str(err).splitlines()[0] if str(err) else type(err).__name__}); using the CPU backend"
    if major < 8:
        return False, f"{name} has compute capability {major}.{minor}, below 8.0; using the CPU backend"
    from memra_engine.gpu import build

    if not build.nvcc_available() and not all(build._prebuilt(f) for f in build.kernel_families()):
        return False, "no nvcc and no prebuilt kernels; install the CUDA toolkit; using the CPU backend"
    return True, name


def create_backend(g, n_ctx: int, vram_budget: int | None = None, kv_type: str = "f16", share_with=None,
                   moe_vram: int | None = None, say=None):
    """The CUDA backend for an open GGUF; call on the thread that will use it (it owns the context).
    share_with: a CudaBackend whose runtime (context, stream, kernels) this one uses.
    moe_vram: VRAM bytes for MoE experts; say: load notices."""
    from memra_engine.gpu.backend import CudaBackend

    runtime = share_with.rt if share_with is not None else None
    return CudaBackend(g, n_ctx=n_ctx, vram_budget=vram_budget, kv_type=kv_type, runtime=runtime,
                       moe_vram=moe_vram, progress=say)
