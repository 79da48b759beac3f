"""The expert cache's policy on scripted routing (engine/gpu/expert_cache.py), without a GPU:
exact hit and miss counts, which expert is evicted, copies in flight, and the budget floor.
The device side (copies, tables, bit-identical output) is tested in tests/gpu/test_moe_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.errors import DeviceOutOfMemory
from memra_engine.gpu.expert_cache import ExpertPolicy, slots_for_budget


def policy_with(resident: list[list[int]], n_expert: int = 8) -> ExpertPolicy:
    p = ExpertPolicy(len(resident), n_expert, len(resident[0]))
    for layer, experts in enumerate(resident):
        for slot, e in enumerate(experts):
            p.place(layer, e, slot)
    return p


def route(p: ExpertPolicy, *rows: list[int], may_admit: int = 64):
    return p.route(np.array(rows, np.int32), may_admit)


def test_hits_and_misses_are_counted_per_routed_token_expert():
    p = policy_with([[0, 1, 2], [3, 4, 5]])
    route(p, [0, 1, 0, 7], [3, 6, 6, 5], may_admit=0)   # two tokens, top-2, two layers
    assert (p.hits, p.misses) == (3 + 2, 1 + 2)
    route(p, [2, 2], [4, 5], may_admit=0)
    assert (p.hits, p.misses) == (5 + 2 + 2, 3)


def test_a_miss_takes_the_slot_of_the_coldest_expert_once_its_copy_lands():
    p = policy_with([[0, 1, 2]])
    route(p, [0, 1], may_admit=0)
    route(p, [0, 1], may_admit=0)          # 0 and 1 are hot, 2 was never used
    admit = route(p, [5, 0])
    assert admit == [(0, 5, 2, 2)]          # layer 0: expert 5 into slot 2, evicting expert 2
    assert p.slot_of[0, 2] == -1 and p.busy[0, 2]
    assert p.misses == 1
    assert route(p, [5, 1]) == []           # still in flight: a miss again, and not admitted twice
    assert p.misses == 2 and p.slot_of[0, 5] == -1
    p.landed(0, 5, 2)
    route(p, [5, 0])
    assert p.slot_of[0, 5] == 2 and p.misses == 2 and p.resident == 3


def test_a_cold_miss_does_not_evict_a_hotter_expert():
    p = policy_with([[0, 1]])
    for _ in range(3):
        route(p, [0, 1], may_admit=0)
    assert route(p, [6, 0]) == []           # 6 has score 1, the coldest resident ~2.7
    for _ in range(5):
        route(p, [6, 6], may_admit=0)
    assert route(p, [6, 0])[0][:2] == (0, 6)   # now 6 is the hotter one: it evicts 1 (0 is in use)


def test_ties_evict_the_least_recently_used():
    p = policy_with([[0, 1, 2]])
    route(p, [0, 1, 2], may_admit=0)        # equal scores... but 0 is reused later
    route(p, [1, 2, 1], may_admit=0)
    route(p, [2, 1, 2], may_admit=0)
    p.score[0, [0, 1, 2]] = 1.0             # force a score tie: recency decides
    admit = route(p, [7, 7, 7])
    assert admit[0][3] == 0


def test_admissions_stop_at_the_copies_allowed():
    p = policy_with([[0, 1, 2, 3]])
    assert len(route(p, [4, 5, 6, 7], may_admit=2)) == 2


def test_budget_floor_is_top_k_slots_per_layer():
    slot = 3 << 20
    assert slots_for_budget(24 * 64 * slot, 24, 64, 8, slot) == 64          # all of them
    assert slots_for_budget(24 * 16 * slot + slot, 24, 64, 8, slot) == 16   # 25% of a top-8 of 64
    with pytest.raises(DeviceOutOfMemory) as err:
        slots_for_budget(24 * 7 * slot, 24, 64, 8, slot)
    assert "holds 7 experts per layer" in str(err.value)
    assert "at least 8 (top-8)" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_slot_holds_the_largest_layer_expert():
    """k-quant mixes give layers different expert sizes: the slot stride is the largest."""
    from types import SimpleNamespace

    from memra_engine.gpu.expert_cache import slot_layout

    stacks = [(SimpleNamespace(expert_bytes=1000), SimpleNamespace(expert_bytes=500)),
              (SimpleNamespace(expert_bytes=1000), SimpleNamespace(expert_bytes=700))]
    parts, stride = slot_layout(stacks)
    assert parts == [[1000, 500], [1000, 700]] and stride == 1700


# --- the device side, on a fake CUDA: copies stay in their slots, tables switch only when a copy lands

class FakeDevice:
    """Device memory as named regions; every copy is bounds-checked against its region."""

    def __init__(self):
        self.regions: list[tuple[int, bytearray]] = []
        self.next = 1 << 32

    def alloc(self, nbytes: int) -> int:
        base = self.next
        self.regions.append((base, bytearray(nbytes)))
        self.next += nbytes + (1 << 20)
        return base

    def _at(self, ptr: int, n: int) -> tuple[bytearray, int]:
        for base, mem in self.regions:
            if base <= ptr and ptr + n <= base + len(mem):
                return mem, ptr - base
        raise AssertionError(f"copy of {n} bytes at {ptr:#x} is outside every allocation")

    def write(self, ptr: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        mem, off = self._at(ptr, raw.size)
        mem[off:off + raw.size] = raw.tobytes()

    def read(self, ptr: int, nbytes: int) -> bytes:
        mem, off = self._at(ptr, nbytes)
        return bytes(mem[off:off + nbytes])


class HostAlloc(bytearray):
    def get_device_pointer(self) -> int:
        return 0x7F00_0000_0000 + id(self) % (1 << 30) * 4096


class FakeEvent:
    landed = False  # the test decides when queued copies finish

    def record(self, stream):
        pass

    def query(self) -> bool:
        return FakeEvent.landed

    def time_since(self, start) -> float:
        return 0.5  # ms


class FakeCuda:
    class host_alloc_flags:
        DEVICEMAP = 2

    def __init__(self, dev: FakeDevice):
        self.dev = dev
        self.Event = FakeEvent

    def Stream(self, flags=0):
        return type("S", (), {"synchronize": lambda self: None})()

    def pagelocked_empty(self, shape, dtype, mem_flags=0):
        return np.ndarray(shape, dtype, buffer=HostAlloc(int(np.prod(shape)) * np.dtype(dtype).itemsize))

    def memcpy_htod(self, dst, src):
        self.dev.write(int(dst), src)

    def memcpy_htod_async(self, dst, src, stream):
        self.dev.write(int(dst), src)


class FakeRuntime:
    def __init__(self):
        self.dev = FakeDevice()
        self.cuda = FakeCuda(self.dev)

    def pinned(self, shape, dtype):
        return np.zeros(shape, dtype)

    def upload(self, ptr, host):
        self.dev.write(ptr, host)

    upload_async = upload

    def download(self, ptr, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer(self.dev.read(ptr, n), dtype).reshape(shape).copy()

    def synchronize(self):
        pass


class FakePool:
    def __init__(self, rt):
        self.rt = rt

    def alloc(self, region, nbytes, name=""):
        return type("B", (), {"ptr": self.rt.dev.alloc(nbytes)})()


class FakeStack:
    """An ExpertStack stand-in: expert e's bytes are all e + 1 (so a copy is recognisable)."""

    def __init__(self, rt, n_expert: int, expert_bytes: int):
        self.n_expert, self.expert_bytes = n_expert, expert_bytes
        self.table = np.zeros(n_expert, np.uint64)
        self.table_ptr = rt.dev.alloc(8 * n_expert)

    def expert_host_bytes(self, e: int) -> np.ndarray:
        return np.full(self.expert_bytes, e + 1, np.uint8)


def fake_cache(sizes: list[tuple[int, int]], n_expert=8, k=2, n_slots=3):
    from types import SimpleNamespace

    from memra_engine.gpu.expert_cache import ExpertCache

    FakeEvent.landed = False
    rt = FakeRuntime()
    cfg = SimpleNamespace(n_layer=len(sizes), n_expert=n_expert, n_expert_used=k)
    layers = [(FakeStack(rt, n_expert, a), FakeStack(rt, n_expert, b)) for a, b in sizes]
    log_tokens = 4
    log = rt.dev.alloc(4 * cfg.n_layer * log_tokens * k)
    return rt, ExpertCache(rt, FakePool(rt), cfg, layers, n_slots, log, log_tokens), layers, log


def route_one_token(rt, cache, log, ids_per_layer):
    # a one-token forward's log block: layer l's k ids at 4 * k * l (GpuOps.moe_ffn); what
    # follows is poisoned, so a reader that strides by the whole log reads garbage experts
    rt.dev.write(log, np.full(cache.cfg.n_layer * cache.log_tokens * cache.k, -1, np.int32))
    rt.dev.write(log, np.asarray(ids_per_layer, np.int32).reshape(len(ids_per_layer), cache.k))
    cache.after_forward(1)


def device_table(rt, stack) -> np.ndarray:
    return np.frombuffer(rt.dev.read(stack.table_ptr, 8 * stack.n_expert), np.uint64)


def test_copies_stay_inside_slots_when_layers_have_different_expert_sizes():
    """Layer 1's down experts are larger than layer 0's (a k-quant mix): a slot sized for
    layer 0 would overflow into its neighbour, and past the region at the last slot."""
    rt, cache, layers, log = fake_cache([(1024, 256), (1024, 768)])
    for step in range(6):  # misses everywhere: admissions into every slot of both layers
        route_one_token(rt, cache, log, [[6, 7], [6, 7]] if step % 2 else [[4, 5], [4, 5]])
        FakeEvent.landed = True
        cache.after_forward(0)
        FakeEvent.landed = False
    for layer, (gate_up, down) in enumerate(layers):
        for slot in range(cache.policy.n_slots):
            e = cache.policy.expert_in[layer, slot]
            base = cache.slot_ptr(layer, slot)
            assert rt.dev.read(base, gate_up.expert_bytes) == bytes([e + 1]) * gate_up.expert_bytes
            assert rt.dev.read(base + gate_up.expert_bytes, down.expert_bytes) == bytes([e + 1]) * down.expert_bytes


def test_tables_point_at_host_memory_until_the_copy_lands():
    rt, cache, layers, log = fake_cache([(512, 256)])
    gate_up, down = layers[0]
    host_ptr = lambda stack, e: cache.host[0][0 if stack is gate_up else 1][1] + e * stack.expert_bytes  # noqa: E731
    assert device_table(rt, gate_up)[5] == host_ptr(gate_up, 5)   # experts 0..2 start resident
    assert device_table(rt, gate_up)[0] == cache.slot_ptr(0, 0)
    route_one_token(rt, cache, log, [[5, 0]])   # 5 misses and is admitted into the slot of 1 or 2
    (layer, e, slot, _, _), = cache.in_flight
    evicted = [x for x in (1, 2) if cache.policy.slot_of[0, x] < 0]
    assert e == 5 and len(evicted) == 1
    assert device_table(rt, gate_up)[5] == host_ptr(gate_up, 5)             # not landed yet
    assert device_table(rt, gate_up)[evicted[0]] == host_ptr(gate_up, evicted[0])  # readers left the slot
    assert device_table(rt, down)[evicted[0]] == host_ptr(down, evicted[0])
    FakeEvent.landed = True
    cache.after_forward(0)
    assert device_table(rt, gate_up)[5] == cache.slot_ptr(0, slot)
    assert device_table(rt, down)[5] == cache.slot_ptr(0, slot) + gate_up.expert_bytes
    assert cache.bytes_moved == 512 + 256 and cache.copy_seconds == pytest.approx(5e-4)
