"""The MoE expert cache: every expert in pinned host memory, a fixed set of VRAM slots per layer
holding the hot ones (--moe-vram caps the slots' bytes).

How a miss fits the captured decode step: the kernels find each expert through a device table
of base pointers (engine/gpu/moe.py). A resident expert's entry points at its VRAM slot; a
missing one's points at its pinned host copy, mapped into the device's address space, so the
expert matvec reads a miss in place over the host link. The decode graph never changes, never
waits for a copy, and reads the same bytes either way: the output is bit-identical to fully
resident. After each step the host reads the step's routing log (moe_topk writes it), counts
hits and misses, and admits hot misses: the victim's entry goes back to host memory, the
expert's bytes are copied into the victim's slot on a copy stream, and the entry switches to
the slot only once that copy has finished. Steps never read a slot while it is being written.

The policy (ExpertPolicy) is frequency-aware LRU per layer: a use adds 1 to an expert's score,
scores decay by DECAY per step; a missed expert takes the slot of the resident expert with the
lowest score (least recently used among equals) when its own score is at least that high.
At least top_k slots per layer (one token's experts), or the budget is refused; fewer than
3 x top_k (the published baseline's floor) works, since misses are read in place, but hits
then depend on the routing repeating itself.
"""
from __future__ import annotations

import numpy as np

from memra_engine.errors import DeviceOutOfMemory

DECAY = 0.95
MAX_COPIES_IN_FLIGHT = 64  # admissions wait while this many copies are queued on the copy stream


class ExpertPolicy:
    """Which experts of each layer hold a slot; counts hits and misses. Pure bookkeeping."""

    def __init__(self, n_layer: int, n_expert: int, n_slots: int):
        self.n_layer, self.n_expert, self.n_slots = n_layer, n_expert, n_slots
        self.slot_of = np.full((n_layer, n_expert), -1, np.int32)   # -1: in host memory
        self.expert_in = np.full((n_layer, n_slots), -1, np.int32)  # -1: free
        self.busy = np.zeros((n_layer, n_slots), bool)              # a copy into it is in flight
        self.score = np.zeros((n_layer, n_expert))
        self.last_use = np.zeros((n_layer, n_expert), np.int64)
        self.step = 0
        self.hits = self.misses = 0

    def place(self, layer: int, expert: int, slot: int) -> None:
        old = self.expert_in[layer, slot]
        if old >= 0:
            self.slot_of[layer, old] = -1
        self.expert_in[layer, slot] = expert
        self.slot_of[layer, expert] = slot

    def route(self, ids: np.ndarray, may_admit: int) -> list[tuple[int, int, int, int]]:
        """Count one forward's routing (ids [n_layer, n_routed]) and choose admissions: at most
        may_admit of (layer, expert, slot, evicted expert or -1). The caller copies and then
        calls place(). Experts already being copied count as misses until they land."""
        self.step += 1
        self.score *= DECAY
        admit = []
        for layer in range(self.n_layer):
            row = ids[layer]
            resident = self.slot_of[layer, row] >= 0
            n_hit = int(resident.sum())
            self.hits += n_hit
            self.misses += row.size - n_hit
            used, counts = np.unique(row, return_counts=True)
            self.score[layer, used] += counts
            self.last_use[layer, used] = self.step
            for e in used[self.slot_of[layer, used] < 0]:
                if len(admit) >= may_admit:
                    break
                if np.any(self.expert_in[layer][self.busy[layer]] == e):
                    continue  # already on its way in
                slot = self._victim(layer, e)
                if slot is not None:
                    admit.append((layer, int(e), slot, int(self.expert_in[layer, slot])))
                    self.busy[layer, slot] = True
                    old = self.expert_in[layer, slot]
                    if old >= 0:
                        self.slot_of[layer, old] = -1
                        self.expert_in[layer, slot] = -1
        return admit

    def _victim(self, layer: int, expert: int) -> int | None:
        free = np.flatnonzero((self.expert_in[layer] < 0) & ~self.busy[layer])
        if free.size:
            return int(free[0])
        candidates = np.flatnonzero(~self.busy[layer])
        if not candidates.size:
            return None
        held = self.expert_in[layer, candidates]
        key = np.lexsort((self.last_use[layer, held], self.score[layer, held]))  # lowest score, then oldest
        slot = int(candidates[key[0]])
        victim = self.expert_in[layer, slot]
        if self.score[layer, expert] < self.score[layer, victim]:
            return None
        return slot

    def landed(self, layer: int, expert: int, slot: int) -> None:
        self.busy[layer, slot] = False
        self.place(layer, expert, slot)

    @property
    def resident(self) -> int:
        return int((self.slot_of >= 0).sum())


def slots_for_budget(budget: int, n_layer: int, n_expert: int, top_k: int, slot_bytes: int) -> int:
    """Slots per layer that `budget` bytes hold (at most every expert); DeviceOutOfMemory when
    fewer than top_k (one token's experts)."""
    n = min(n_expert, budget // (n_layer * slot_bytes))
    floor = top_k  # config_from_gguf keeps top_k <= n_expert
    if n < floor:
        need = floor * n_layer * slot_bytes
        raise DeviceOutOfMemory(
            f"--moe-vram {budget / 2**20:.0f} MiB holds {n} experts per layer; the expert cache needs at least "
            f"{floor} (top-{top_k}), {need / 2**20:.0f} MiB")
    return n


def slot_layout(layers: list[tuple]) -> tuple[list[list[int]], int]:
    """Each layer's expert part sizes, and the slot stride that holds any layer's expert: k-quant
    mixes change types per layer (Q4_K_M gives some layers' ffn_down_exps Q6_K), so a layer-0
    sized slot overflowed into the next one (and past the region: a load failed)."""
    parts = [[s.expert_bytes for s in stacks] for stacks in layers]
    return parts, max(sum(p) for p in parts)


class ExpertCache:
    """The device side: pinned host copies, VRAM slots, tables, the copy stream and its events."""

    def __init__(self, rt, pool, cfg, layers: list[tuple], n_slots: int, log_ptr: int, log_tokens: int):
        """layers[l] = (gate_up ExpertStack, down ExpertStack) of layer l, tables allocated,
        experts not uploaded. log_ptr: the routing log the ops write (GpuOps.moe_log_ptr)."""
        cuda = rt.cuda
        self.rt, self.cfg, self.layers = rt, cfg, layers
        self.k, self.log_ptr, self.log_tokens = cfg.n_expert_used, log_ptr, log_tokens
        self.parts, self.slot_bytes = slot_layout(layers)
        self.policy = ExpertPolicy(cfg.n_layer, cfg.n_expert, n_slots)
        # non-blocking: the copies never wait for the compute stream, nor it for them (they are
        # ordered by the table entries, see the module doc)
        self.copy_stream = cuda.Stream(flags=1)  # CU_STREAM_NON_BLOCKING
        for stacks in layers:
            for s in stacks:  # pinned, so the table uploads are asynchronous on the compute stream
                s.table = rt.pinned(s.n_expert, np.uint64)
        self.in_flight: list[tuple] = []  # (layer, expert, slot, start event, end event)
        self.bytes_moved, self.copy_seconds = 0, 0.0
        self.host = []  # per layer, per stack: pinned device-mapped [E, expert_bytes]
        slots = pool.alloc("experts", cfg.n_layer * n_slots * self.slot_bytes, "expert slots").ptr
        self.slot_ptr = lambda layer, slot: slots + (layer * n_slots + slot) * self.slot_bytes  # noqa: E731
        for stacks in layers:
            mine = []
            for s in stacks:
                h = cuda.pagelocked_empty((s.n_expert, s.expert_bytes), np.uint8,
                                          mem_flags=cuda.host_alloc_flags.DEVICEMAP)
                for e in range(s.n_expert):
                    h[e] = s.expert_host_bytes(e)
                mine.append((h, int(h.base.get_device_pointer())))
            self.host.append(mine)
        for layer in range(cfg.n_layer):
            for e in range(cfg.n_expert):
                self._point(layer, e, None)
            for slot in range(n_slots):  # start with experts 0..n_slots-1 resident
                self._copy_sync(layer, slot, slot)
                self.policy.place(layer, slot, slot)
                self._point(layer, slot, slot)
        self._upload_tables()
        rt.synchronize()

    def _point(self, layer: int, expert: int, slot: int | None) -> None:
        """Table entries of `expert`: its slot's parts, or its host copies (slot None)."""
        off = 0
        for s, (_, host_dev), nbytes in zip(self.layers[layer], self.host[layer], self.parts[layer]):
            s.table[expert] = host_dev + expert * s.expert_bytes if slot is None else self.slot_ptr(layer, slot) + off
            off += nbytes

    def _copy_sync(self, layer: int, expert: int, slot: int) -> None:
        off = 0
        for (h, _), nbytes in zip(self.host[layer], self.parts[layer]):
            self.rt.cuda.memcpy_htod(self.slot_ptr(layer, slot) + off, h[expert])
            off += nbytes

    def _upload_tables(self) -> None:
        """On the compute stream, before the next step. The host changes the tables only after
        it has synchronized that stream, so an upload never reads a half-changed table."""
        for stacks in self.layers:
            for s in stacks:
                self.rt.upload_async(s.table_ptr, s.table)

    def after_forward(self, n_tokens: int) -> None:
        """After a forward of n_tokens has finished on the stream (the host synchronized): count
        its routing, switch landed copies into their slots, start admissions."""
        cuda = self.rt.cuda
        changed = False
        still = []
        for layer, e, slot, start, end in self.in_flight:
            if end.query():
                self.copy_seconds += end.time_since(start) / 1e3
                self.bytes_moved += sum(self.parts[layer])
                self.policy.landed(layer, e, slot)
                self._point(layer, e, slot)
                changed = True
            else:
                still.append((layer, e, slot, start, end))
        self.in_flight = still
        new = []
        if n_tokens > 0:
            # only this forward's block: a decode step reads n_layer * k ints, not the whole log
            ids = self.rt.download(self.log_ptr, (self.cfg.n_layer, n_tokens * self.k), np.int32)
            new = self.policy.route(ids, MAX_COPIES_IN_FLIGHT - len(self.in_flight))
            for layer, _, _, evicted in new:
                if evicted >= 0:
                    self._point(layer, evicted, None)  # readers go to host memory before the slot is overwritten
        if changed or new:
            self._upload_tables()  # the stream is idle: the next step sees the new entries
        for layer, e, slot, _ in new:
            start, end = cuda.Event(), cuda.Event()
            start.record(self.copy_stream)
            off = 0
            for (h, _), nbytes in zip(self.host[layer], self.parts[layer]):
                cuda.memcpy_htod_async(self.slot_ptr(layer, slot) + off, h[e], self.copy_stream)
                off += nbytes
            end.record(self.copy_stream)
            self.in_flight.append((layer, e, slot, start, end))

    def drain(self) -> None:
        """Wait for every queued copy and switch it in (tests: a settled cache)."""
        self.copy_stream.synchronize()
        self.after_forward(0)
