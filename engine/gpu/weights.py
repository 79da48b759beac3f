"""The GPU loader: GGUF tensors uploaded in their quant format (quant_ops.upload_weight repacks
them into aligned planes), 1-D tensors (norms, biases, rope_freqs) as f32 vectors.

The fusions every forward program expects (each arch's FUSED: attn_qkv, ffn_gate_up, ...) are
one weight when the parts share a quant type (their rows are simply concatenated before the
repack), and a FusedWeight of parts otherwise (Q4_K_M files often keep attn_v in Q6_K).
`plan()` gives every buffer's size without touching the device, so the pool can be sized first.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

from memra_engine.gpu import quant_ops
from memra_engine.gpu.memory import ALIGN, aligned
from memra_engine.gpu.moe import ExpertStack
from memra_engine.gpu.ops import FusedWeight, Vector
from memra_engine.model import arch_module
from memra_engine.model.gguf_file import TensorInfo, dequantize


def _stack(parts: list[TensorInfo], name: str) -> TensorInfo:
    """Rows of same-typed parts as one tensor (ggml rows are independent runs of blocks)."""
    data = np.concatenate([np.ascontiguousarray(p.data).reshape(p.shape[0], -1) for p in parts], axis=0)
    rows = sum(p.shape[0] for p in parts)
    return dataclasses.replace(parts[0], name=name, data=data, shape=(rows,) + tuple(parts[0].shape[1:]))


def _layout_bytes(t: TensorInfo) -> int:
    rows, cols = (1, t.shape[0]) if len(t.shape) == 1 else (t.shape[0], int(np.prod(t.shape[1:])))
    return quant_ops.weight_layout(t.ggml_type, rows, cols).nbytes(rows)


def _kind(t: TensorInfo) -> str:
    return {1: "vector", 3: "experts"}.get(len(t.shape), "matrix")


class GpuWeights:
    """ModelWeights (memra_engine.model.ops) for GpuOps."""

    def __init__(self, g, cfg, experts_resident: bool = True):
        """experts_resident False: expert stacks get tables but no bytes here (the expert cache
        places them, engine/gpu/expert_cache.py)."""
        self.g, self.cfg = g, cfg
        self.fused = arch_module(cfg.arch).FUSED
        self.shapes = arch_module(cfg.arch).tensor_shapes(cfg)
        self.experts_resident = experts_resident

    # ---- planning ----------------------------------------------------------------------------
    def _entries(self):
        """(kind, short name, layer or None, tensors) for every buffer: kind 'matrix' | 'vector'."""
        t = self.g.tensors
        yield "matrix", "token_embd", None, [t["token_embd.weight"]]
        if not self.cfg.tied_embeddings:
            yield "matrix", "output", None, [t["output.weight"]]
        yield "vector", "output_norm", None, [t["output_norm.weight"]]
        if self.cfg.has_rope_freqs:
            yield "vector", "rope_freqs", None, [t["rope_freqs.weight"]]
        for i in range(self.cfg.n_layer):
            prefix = f"blk.{i}."
            tensors = {}
            for name in self.shapes:
                if name.startswith(prefix):
                    tensors[name[len(prefix):].removesuffix(".weight").replace(".bias", "_bias")] = t[name]
            for fused_name, parts in self.fused.items():
                group = [tensors.pop(p) for p in parts]
                yield _kind(group[0]), fused_name, i, group
            for short, tensor in tensors.items():
                yield _kind(tensor), short, i, [tensor]

    def nbytes(self) -> int:
        """Weights-region bytes, alignment included."""
        total = 0
        for kind, name, _, group in self._entries():
            if kind == "experts":
                stack = ExpertStack.plan(group, name)
                total += stack.table_bytes + (stack.n_expert * stack.expert_bytes if self.experts_resident else 0)
            elif kind == "vector":
                total += aligned(sum(int(np.prod(p.shape)) for p in group) * 4)
            elif len({p.ggml_type for p in group}) == 1:
                total += aligned(sum(_layout_bytes(p) for p in group) + ALIGN)
            else:
                total += sum(aligned(_layout_bytes(p)) for p in group)
        return total

    # ---- upload ------------------------------------------------------------------------------
    def upload(self, rt, pool, dry: bool = False) -> SimpleNamespace:
        """Upload everything (dry: placeholders at address 0, for sizing the scratch arena)."""
        self.layers = [SimpleNamespace() for _ in range(self.cfg.n_layer)]
        self.rope_freqs = None
        for kind, name, layer, group in self._entries():
            if kind == "experts":
                value = self._experts(rt, pool, group, f"blk.{layer}.{name}", dry)
            elif kind == "vector":
                host = np.concatenate([dequantize(p).reshape(-1).astype(np.float32) for p in group])
                if dry:
                    value = Vector(0, host.size)
                else:
                    buf = pool.alloc("weights", host.nbytes, name)
                    rt.upload(buf.ptr, host)
                    value = Vector(buf.ptr, host.size)
            elif len({p.ggml_type for p in group}) == 1:
                value = self._matrix(rt, pool, group[0] if len(group) == 1 else _stack(group, name), dry)
            else:
                value = FusedWeight(tuple(self._matrix(rt, pool, p, dry) for p in group))
            setattr(self if layer is None else self.layers[layer], name, value)
        if self.cfg.tied_embeddings:
            self.output = self.token_embd
        return self

    def _experts(self, rt, pool, group: list[TensorInfo], name: str, dry: bool) -> ExpertStack:
        """The stack's table, and (all resident) its experts one blob after another."""
        stack = ExpertStack.plan(group, name)
        stack.table = np.zeros(stack.n_expert, np.uint64)
        if dry:
            return stack
        stack.table_ptr = pool.alloc("weights", stack.table_bytes, name + ".table").ptr
        if self.experts_resident:
            base = pool.alloc("weights", stack.n_expert * stack.expert_bytes, name).ptr
            for e in range(stack.n_expert):
                stack.table[e] = base + e * stack.expert_bytes
                rt.upload(int(stack.table[e]), stack.expert_host_bytes(e))
            rt.upload(stack.table_ptr, stack.table)
        return stack

    @staticmethod
    def _matrix(rt, pool, t: TensorInfo, dry: bool):
        if dry:
            rows, cols = t.shape[0], int(np.prod(t.shape[1:]))
            lay = quant_ops.weight_layout(t.ggml_type, rows, cols)
            from memra_engine.gpu.memory import DeviceBuffer

            return quant_ops.GpuWeight(t.ggml_type, rows, cols, DeviceBuffer(0, 0, t.name, "weights"), lay)
        return quant_ops.upload_weight(rt, pool, t)

    def layer(self, i: int) -> SimpleNamespace:
        return self.layers[i]
