"""The VRAM pool: named regions, each one cudaMalloc reserved up front and handed out by a bump
allocator. Every device allocation of the engine goes through here, so the stats are complete
and an allocation that does not fit fails with a message naming the region sizes.

Regions (docs/design.md §4.4): weights, kv, scratch, graph, and experts (the expert cache). Sizes are bytes. A region may be reset
(scratch between shapes); individual frees are not needed by a bump allocator whose buffers
live as long as the model.
"""
from __future__ import annotations

from dataclasses import dataclass

from memra_engine.errors import DeviceOutOfMemory
from memra_engine.events import VramStats

ALIGN = 256  # cudaMalloc's own alignment; keeps every buffer 16-byte-load friendly


def aligned(n: int) -> int:
    """n rounded up to ALIGN."""
    return -(-n // ALIGN) * ALIGN


MIB = 1 << 20
OOM_HINT = "try a smaller --ctx, --kv-type q8_0, or a smaller model"
OOM_HINT_Q8_0 = "try a smaller --ctx or a smaller model"  # the KV cache is q8_0 already


@dataclass(frozen=True)
class DeviceBuffer:
    ptr: int
    nbytes: int
    name: str = ""
    region: str = ""

    def __int__(self) -> int:
        return self.ptr

    def offset(self, nbytes: int) -> int:
        """Address nbytes into the buffer (for views such as per-layer KV slices)."""
        return self.ptr + nbytes


class _Region:
    def __init__(self, name: str, allocation, nbytes: int):
        self.name = name
        self.allocation = allocation  # pycuda DeviceAllocation, freed on close
        self.base = int(allocation) if allocation is not None else 0
        self.size = nbytes
        self.used = 0
        self.buffers: list[DeviceBuffer] = []


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


class VramPool:
    def __init__(self, regions: dict[str, int], budget: int | None = None, oom_hint: str = OOM_HINT):
        """Reserve each region now. budget caps the total (the --vram-budget knob, or tests).
        oom_hint ends every out-of-memory message (OOM_HINT_Q8_0 when the KV cache is q8_0)."""
        import pycuda.driver as cuda

        self._cuda = cuda
        self.oom_hint = oom_hint
        self._regions: dict[str, _Region] = {}
        total = sum(int(v) for v in regions.values())
        sizes = ", ".join(f"{k} {_mib(int(v))}" for k, v in regions.items())
        if budget is not None and total > budget:
            raise DeviceOutOfMemory(f"VRAM pool needs {_mib(total)} ({sizes}) over the budget of {_mib(budget)}; {oom_hint}")
        try:
            for name, nbytes in regions.items():
                nbytes = max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)
                try:
                    allocation = cuda.mem_alloc(nbytes)
                except cuda.MemoryError:
                    free, dev_total = cuda.mem_get_info()
                    raise DeviceOutOfMemory(
                        f"cannot reserve {_mib(nbytes)} for the {name} region ({sizes}; device free "
                        f"{_mib(free)} of {_mib(dev_total)}); {oom_hint}") from None
                self._regions[name] = _Region(name, allocation, nbytes)
        except Exception:
            self.close()
            raise

    def alloc(self, region: str, nbytes: int, name: str = "") -> DeviceBuffer:
        r = self._regions[region]
        nbytes = int(nbytes)
        start = -(-r.used // ALIGN) * ALIGN
        if start + nbytes > r.size:
            raise DeviceOutOfMemory(
                f"{region} region full: {name or 'buffer'} needs {_mib(nbytes)}, {_mib(r.size - start)} of "
                f"{_mib(r.size)} left; {self.oom_hint}")
        buf = DeviceBuffer(r.base + start, nbytes, name, region)
        r.used = start + nbytes
        r.buffers.append(buf)
        return buf

    def reset(self, region: str) -> None:
        """Forget every buffer of a region (their pointers become invalid)."""
        r = self._regions[region]
        r.used = 0
        r.buffers.clear()

    def region_size(self, region: str) -> int:
        return self._regions[region].size

    def stats(self) -> VramStats:
        free, total = self._cuda.mem_get_info()
        return VramStats(
            reserved={k: r.size for k, r in self._regions.items()},
            used={k: r.used for k, r in self._regions.items()},
            device_free=int(free),
            device_total=int(total),
        )

    def close(self) -> None:
        for r in self._regions.values():
            if r.allocation is not None:
                r.allocation.free()
                r.allocation = None
        self._regions.clear()
