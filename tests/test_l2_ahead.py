"""The weight ranges a decode/verify forward asks into L2 while a layer's attention runs
(engine/gpu/l2_ahead.py), on the Llama-8B shape's layouts: no GPU, no model file."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from gguf.constants import GGMLQuantizationType as QT

from memra_engine.gpu import l2_ahead, quant_ops
from memra_engine.gpu.memory import DeviceBuffer
from memra_engine.gpu.ops import FusedWeight

MIB = 1 << 20


def weight(qt, rows, cols, base):
    lay = quant_ops.weight_layout(qt, rows, cols)
    return quant_ops.GpuWeight(qt, rows, cols, DeviceBuffer(base, lay.nbytes(rows), "w", "weights"), lay)


def llama8b_layer():
    return SimpleNamespace(attn_qkv=weight(QT.Q4_K, 6144, 4096, 1 << 40),
                           attn_output=weight(QT.Q4_K, 4096, 4096, 2 << 40),
                           ffn_gate_up=weight(QT.Q4_K, 28672, 4096, 3 << 40),
                           ffn_down=weight(QT.Q6_K, 4096, 14336, 4 << 40))


def inside(w, ptr, n):
    return w.buf.ptr <= ptr and ptr + n <= w.buf.ptr + w.layout.nbytes(w.rows)


def test_the_o_projection_whole_then_the_first_rows_of_gate_up():
    L = llama8b_layer()
    o, gu = L.attn_output, L.ffn_gate_up
    budget = 16 * MIB
    ranges = l2_ahead.layer_ranges(L, budget)
    assert ranges[0] == (o.q_ptr, o.layout.nbytes(o.rows) & ~15)
    (q_ptr, q_n), (m_ptr, m_n) = ranges[1:]
    assert q_ptr == gu.q_ptr and m_ptr == gu.meta_ptr
    assert inside(gu, q_ptr, q_n) and inside(gu, m_ptr, m_n)
    blocks = gu.rows * (gu.layout.padded_cols // gu.layout.block_values)
    q_rows, m_rows = q_n / (blocks * gu.layout.q_bytes), m_n / (blocks * gu.layout.meta_bytes)
    assert 0.05 < q_rows < 0.2 and abs(q_rows - m_rows) < 1e-3  # the same first rows of both planes
    total = sum(n for _, n in ranges)
    assert budget - 64 <= total <= budget
    assert all(n % 16 == 0 and n > 0 for _, n in ranges)


def test_nothing_before_attention_and_at_most_four_ranges():
    L = llama8b_layer()
    ranges = l2_ahead.layer_ranges(L, 200 * MIB)  # more than o, gate|up and down together
    assert len(ranges) <= l2_ahead.MAX_RANGES
    assert not any(inside(L.attn_qkv, p, n) for p, n in ranges)
    assert [p for p, _ in ranges[:3]] == [L.attn_output.q_ptr, L.ffn_gate_up.q_ptr, L.ffn_down.q_ptr]
    assert all(inside(w, p, n) for (p, n), w in zip(ranges, (L.attn_output, L.ffn_gate_up, L.ffn_down)))


@pytest.mark.parametrize("budget", [0, 8])
def test_no_budget_no_ranges(budget):
    assert l2_ahead.layer_ranges(llama8b_layer(), budget) == []


def test_a_moe_layer_asks_for_its_o_projection_only():
    o = weight(QT.Q4_K, 2048, 4096, 1 << 40)
    L = SimpleNamespace(attn_output=o, ffn_gate_up_exps=object(), ffn_down_exps=object())
    assert l2_ahead.layer_ranges(L, 64 * MIB) == [(o.q_ptr, o.layout.nbytes(o.rows) & ~15)]


def test_a_fused_weight_of_mixed_types_goes_part_by_part():
    gate, up = weight(QT.Q4_K, 8192, 2048, 5 << 40), weight(QT.Q6_K, 8192, 2048, 6 << 40)
    L = SimpleNamespace(attn_output=weight(QT.Q4_K, 2048, 2048, 2 << 40), ffn_gate_up=FusedWeight((gate, up)))
    ranges = l2_ahead.layer_ranges(L, 64 * MIB)
    assert [p for p, _ in ranges] == [L.attn_output.q_ptr, gate.q_ptr, up.q_ptr]
