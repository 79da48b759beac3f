"""The expert cache's policy on scripted routing (engine/gpu/expert_cache.py), without a GPU:
exact hit and miss counts, which expert is evicted, copies in flight, and the budget floor.
The device side (copies, tables, bit-identical output) is tested in tests/gpu/test_moe_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from memra_engine.errors import DeviceOutOfMemory
from memra_engine.gpu.expert_cache import MIN_SLOTS_PER_TOP_K, ExpertPolicy, slots_for_budget


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
    assert MIN_SLOTS_PER_TOP_K == 1 and "holds 7 experts per layer" in str(err.value)
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
