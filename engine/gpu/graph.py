"""CUDA graphs for PyCUDA through ctypes: PyCUDA has no graph API, libcuda does.

Capture runs on PyCUDA's stream (stream.handle is the CUstream). While capturing, the runtime
refuses kernel lookups (cuModuleGetFunction is not allowed inside a capture) and nothing may
allocate or synchronize. Replays launch the instantiated graph on the same stream.
"""
from __future__ import annotations

import ctypes
import statistics
import ctypes.util

from memra_engine.errors import DeviceError

CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1  # other threads' CUDA calls don't invalidate our capture

_lib = None


def _libcuda():
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            _lib = ctypes.CDLL(name)
        except OSError as err:
            raise DeviceError(f"cannot load libcuda for graph capture: {err}") from err
        _lib.cuStreamBeginCapture_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
        _lib.cuStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        _lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong]
        _lib.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        _lib.cuGraphExecDestroy.argtypes = [ctypes.c_void_p]
        _lib.cuGraphDestroy.argtypes = [ctypes.c_void_p]
        _lib.cuGraphGetNodes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        _lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return _lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _libcuda().cuGetErrorString(rc, ctypes.byref(msg))
        raise DeviceError(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


class CudaGraph:
    """One captured and instantiated graph. Use as: `with graph.capture(rt): <launches>`."""

    def __init__(self):
        self.graph = ctypes.c_void_p()
        self.exec = ctypes.c_void_p()
        self.n_nodes = 0

    def capture(self, rt) -> "_Capture":
        return _Capture(self, rt)

    def launch(self, rt) -> None:
        _check(_libcuda().cuGraphLaunch(self.exec, ctypes.c_void_p(rt.stream.handle)), "cuGraphLaunch")

    def replay_us(self, rt, replays: int = 1, batches: int = 5, warmup: bool = True) -> float:
        """Median over `batches` of the device µs per replay, timed by events around `replays`
        back-to-back replays (the benchmarks' one timing loop)."""
        if warmup:
            self.launch(rt)
        cuda, out = rt.cuda, []
        for _ in range(batches):
            start, stop = cuda.Event(), cuda.Event()
            start.record(rt.stream)
            for _ in range(replays):
                self.launch(rt)
            stop.record(rt.stream)
            stop.synchronize()
            out.append(stop.time_since(start) * 1000.0 / replays)
        return statistics.median(out)

    def destroy(self) -> None:
        lib = _libcuda()
        if self.exec:
            lib.cuGraphExecDestroy(self.exec)
            self.exec = ctypes.c_void_p()
        if self.graph:
            lib.cuGraphDestroy(self.graph)
            self.graph = ctypes.c_void_p()

    def __del__(self):
        # Contexts may already be gone at interpreter exit; destroy() is the normal path.
        pass


class _Capture:
    def __init__(self, graph: CudaGraph, rt):
        self.g, self.rt = graph, rt

    def __enter__(self):
        lib = _libcuda()
        _check(lib.cuStreamBeginCapture_v2(ctypes.c_void_p(self.rt.stream.handle), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        self.rt.capturing = True
        return self.g

    def __exit__(self, exc_type, exc, tb):
        lib = _libcuda()
        self.rt.capturing = False
        graph = ctypes.c_void_p()
        rc = lib.cuStreamEndCapture(ctypes.c_void_p(self.rt.stream.handle), ctypes.byref(graph))
        if exc_type is not None:  # capture body failed: drop what was captured, keep the error
            if graph:
                lib.cuGraphDestroy(graph)
            return False
        _check(rc, "cuStreamEndCapture")
        self.g.graph = graph
        n = ctypes.c_size_t(0)
        lib.cuGraphGetNodes(graph, None, ctypes.byref(n))
        self.g.n_nodes = int(n.value)
        _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self.g.exec), graph, 0), "cuGraphInstantiate")
        return False
