"""One PyCUDA context on the engine thread, the kernel modules, and a registry of prepared kernels.

A PyCUDA context belongs to the thread that made it: create GpuRuntime on the engine thread and
use it only there. Every kernel is resolved and prepared before any graph capture, because
cuModuleGetFunction fails inside a capture region; `kernel()` refuses lookups while capturing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from memra_engine import switches
from memra_engine.errors import DeviceError
from memra_engine.gpu import build
from memra_engine.gpu.pdl import PdlKernels

Grid = int | tuple[int, ...]


def _dim3(d: Grid) -> tuple[int, int, int]:
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(int(x) for x in d)
    return d + (1,) * (3 - len(d))


class GpuRuntime:
    def __init__(self, device_index: int = 0, families: Sequence[str] | None = None, progress=None):
        try:
            import pycuda.driver as cuda
        except ImportError as err:
            raise DeviceError("PyCUDA is not installed (pip install 'memra[cuda]')") from err
        self.cuda = cuda
        try:
            cuda.init()
            if cuda.Device.count() <= device_index:
                raise DeviceError(f"no CUDA device {device_index} (found {cuda.Device.count()})")
            self.device = cuda.Device(device_index)
        except cuda.Error as err:
            raise DeviceError(f"CUDA init failed: {err}") from err
        major, minor = self.device.compute_capability()
        self.arch = build.arch_for_capability(major, minor)  # raises below 8.0
        self.device_name = self.device.name()
        # the most dynamic shared memory a block may opt into (227 KB on sm_90, 99 KB on sm_86/89)
        self.max_shared = self.device.get_attribute(cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.context = self.device.make_context()
        try:
            self.stream = cuda.Stream()
            self.capturing = False
            self._modules: dict[str, object] = {}
            self._kernels: dict[str, object] = {}
            self._signatures = build.kernel_signatures(families)
            fatbins = {}
            for family in sorted({fam for fam, _ in self._signatures.values()}):
                fatbins[family] = build.build_fatbin(family, archs=(self.arch,), progress=progress)
                self._modules[family] = cuda.module_from_buffer(fatbins[family])
            self.built_sm90 = built_sm90 = build.has_sm90_features(self.arch)
            # Programmatic dependent launch inside captured graphs (MEMRA_PDL=0 turns it off).
            self.use_pdl = built_sm90 and switches.pdl()
            # Attention splits merged inside thread-block clusters: sm_90+ (MEMRA_ATTN_CLUSTER=0 turns it off).
            self.cluster_attention = built_sm90 and switches.attn_cluster()
            # cuLaunchKernelEx: PDL in graphs, and every launch of a kernel with a 16-block cluster
            self.pdl = PdlKernels(fatbins) if built_sm90 else None
        except Exception:
            self.context.pop()
            self.context.detach()
            raise

    # ---- kernels ---------------------------------------------------------------------------
    def kernel(self, name: str, signature: str | None = None):
        """The prepared pycuda Function for an entry point; resolved once, then cached."""
        fn = self._kernels.get(name)
        if fn is not None:
            return fn
        if self.capturing:
            raise DeviceError(f"kernel {name!r} looked up during graph capture; resolve it before capturing")
        if name not in self._signatures:
            raise DeviceError(f"kernel {name!r} is not declared in any cuda/*.cu")
        family, parsed = self._signatures[name]
        fn = self._modules[family].get_function(name)
        fn.prepare(signature if signature is not None else parsed)
        if self.pdl is not None:
            self.pdl.prepare(name, family, signature if signature is not None else parsed)
        self._kernels[name] = fn
        return fn

    def load_module(self, family: str, image: bytes, signatures: dict[str, str]) -> None:
        """Load a cubin or fatbin built outside cuda/ (prototypes, scripts/proto/) as its own family,
        its entry points then launched as the engine's own (PDL in graphs included)."""
        if family in self._modules:
            raise DeviceError(f"kernel family {family!r} is already loaded")
        self._modules[family] = self.cuda.module_from_buffer(image)
        if self.pdl is not None:
            self.pdl.load(family, image)
        for name, signature in signatures.items():
            self._signatures[name] = (family, signature)

    def resolve_all(self) -> None:
        """Prepare every declared kernel now (before the first capture)."""
        for name in self._signatures:
            self.kernel(name)

    def set_max_dynamic_shared(self, name: str, nbytes: int) -> None:
        fn = self.kernel(name)
        fn.set_attribute(self.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))
        if self.pdl is not None:
            self.pdl.set_max_dynamic_shared(name, nbytes)

    def launch(self, name: str, grid: Grid, block: Grid, args: Sequence, shared: int = 0) -> None:
        """Asynchronous launch on self.stream: no sync, no allocation, so graph-capturable.
        Inside a capture on sm_90+ the launch carries the PDL attribute (see gpu/pdl.py)."""
        fn = self.kernel(name)
        pdl = self.capturing and self.use_pdl
        if self.pdl is not None and (pdl or name in self.pdl.wide_cluster):
            self.pdl.launch(name, _dim3(grid), _dim3(block), self.stream.handle, args, shared, pdl)
            return
        fn.prepared_async_call(_dim3(grid), _dim3(block), self.stream, *args, shared_size=shared)

    # ---- copies and sync -------------------------------------------------------------------
    def upload(self, dst_ptr: int, host: np.ndarray) -> None:
        """Synchronous host -> device copy (loading only, never inside a step)."""
        self.cuda.memcpy_htod(int(dst_ptr), np.ascontiguousarray(host))

    def download(self, src_ptr: int, shape, dtype) -> np.ndarray:
        """Synchronous device -> host copy after the stream drains (tests and prefill logits)."""
        out = np.empty(shape, dtype=dtype)
        self.stream.synchronize()
        self.cuda.memcpy_dtoh(out, int(src_ptr))
        return out

    def upload_async(self, dst_ptr: int, host: np.ndarray) -> None:
        self.cuda.memcpy_htod_async(int(dst_ptr), host, self.stream)

    def copy_async(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """Device -> device on self.stream (graph-capturable)."""
        self.cuda.memcpy_dtod_async(int(dst_ptr), int(src_ptr), int(nbytes), self.stream)

    def memset_u32(self, ptr: int, value: int, count: int) -> None:
        self.cuda.memset_d32_async(int(ptr), int(value) & 0xFFFFFFFF, int(count), self.stream)

    def pinned(self, shape, dtype) -> np.ndarray:
        """Page-locked host memory for async readback (the 4-byte token id)."""
        return self.cuda.pagelocked_empty(shape, dtype)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def check(self) -> None:
        """Surface an asynchronous launch error as DeviceError."""
        try:
            self.context.synchronize()
        except self.cuda.Error as err:
            raise DeviceError(f"CUDA error: {err}") from err

    def mem_info(self) -> tuple[int, int]:
        free, total = self.cuda.mem_get_info()
        return int(free), int(total)

    def close(self) -> None:
        if self.context is None:
            return
        try:
            self.context.synchronize()
        finally:
            self._kernels.clear()
            self._modules.clear()
            if self.pdl is not None:
                self.pdl.close()
            self.stream = None
            self.context.pop()
            self.context.detach()
            self.context = None
