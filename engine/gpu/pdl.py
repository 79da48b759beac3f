"""Programmatic dependent launch (PDL) through ctypes: cuLaunchKernelEx, which PyCUDA lacks.

A kernel launched with PROGRAMMATIC_STREAM_SERIALIZATION may be scheduled while its predecessor
in the stream still runs; its `pdl_entry()` (cuda/common.cuh) waits for the predecessor's writes
before touching memory. In a captured decode graph that hides most of the launch gap between
consecutive small kernels. Only graph captures use it (see GpuRuntime.launch): eager launches stay
on PyCUDA, whose per-launch host cost is lower, and give the same bits.

Function handles: PyCUDA does not expose CUfunction, so the same fatbin is loaded once more
through libcuda in the same context and the functions are looked up there.

Clusters past the portable 8 blocks (attention.cu's 16-block hd64 clusters) need a function
attribute PyCUDA cannot set either: those kernels opt in here and always launch from here
(`wide_cluster`), eager launches without the PDL attribute.
"""
from __future__ import annotations

import ctypes

from memra_engine.gpu.graph import _check, _libcuda

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11  # .. _HEIGHT 12, _DEPTH 13: a kernel's __cluster_dims__
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
PORTABLE_CLUSTER = 8

_CTYPES = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "I": ctypes.c_uint32, "f": ctypes.c_float,
           "q": ctypes.c_int64, "Q": ctypes.c_uint64}


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
                ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("n_attrs", ctypes.c_uint)]


def _lib():
    lib = _libcuda()
    if not getattr(lib, "_memra_pdl", False):
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuModuleUnload.argtypes = [ctypes.c_void_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib._memra_pdl = True
    return lib


class PdlKernels:
    """CUfunctions of the loaded families, launched with the PDL attribute (or, for eager launches
    of wide-cluster kernels, without it)."""

    def __init__(self, fatbins: dict[str, bytes]):
        self._modules: list[ctypes.c_void_p] = []
        self._by_family: dict[str, ctypes.c_void_p] = {}
        for family, data in fatbins.items():
            self.load(family, data)
        self._funcs: dict[str, tuple[ctypes.c_void_p, tuple]] = {}
        self.wide_cluster: set[str] = set()  # kernels whose clusters pass PORTABLE_CLUSTER blocks
        self._attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attr.value[0] = 1  # programmaticStreamSerializationAllowed

    def load(self, family: str, image: bytes) -> None:
        mod = ctypes.c_void_p()
        _check(_lib().cuModuleLoadData(ctypes.byref(mod), image), f"cuModuleLoadData({family})")
        self._modules.append(mod)
        self._by_family[family] = mod

    def prepare(self, name: str, family: str, signature: str) -> None:
        fn = ctypes.c_void_p()
        _check(_lib().cuModuleGetFunction(ctypes.byref(fn), self._by_family[family], name.encode()),
               f"cuModuleGetFunction({name})")
        self._funcs[name] = (fn, tuple(_CTYPES[c] for c in signature))
        blocks = 1
        for attr in range(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH + 3):
            dim = ctypes.c_int()
            _check(_lib().cuFuncGetAttribute(ctypes.byref(dim), attr, fn), f"cuFuncGetAttribute({name})")
            blocks *= max(1, dim.value)
        if blocks > PORTABLE_CLUSTER:
            _check(_lib().cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                   f"cuFuncSetAttribute({name}, non-portable cluster)")
            self.wide_cluster.add(name)

    def set_max_dynamic_shared(self, name: str, nbytes: int) -> None:
        fn = self._funcs[name][0]
        _check(_lib().cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes)),
               f"cuFuncSetAttribute({name})")

    def launch(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int], stream: int,
               args, shared: int = 0, pdl: bool = True) -> None:
        fn, types = self._funcs[name]
        values = [t(float(a) if t is ctypes.c_float else int(a)) for t, a in zip(types, args, strict=True)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        cfg = _Config(*grid, *block, int(shared), ctypes.c_void_p(stream), ctypes.pointer(self._attr), int(pdl))
        _check(_lib().cuLaunchKernelEx(ctypes.byref(cfg), fn, params, None), f"cuLaunchKernelEx({name})")

    def close(self) -> None:
        lib = _lib()
        for mod in self._modules:
            lib.cuModuleUnload(mod)
        self._modules.clear()
        self._funcs.clear()
