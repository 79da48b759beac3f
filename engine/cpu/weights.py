"""The cpu loader: GGUF tensors dequantized to float32 matrices, stored [out, in] as in the file.

Matrices stay in GGUF row order so a matmul is `x @ W.T`, one BLAS call. The fusions every
forward program expects (attn_qkv, ffn_gate_up, ...; see each arch's FUSED) are built here by
dequantizing each part straight into its rows of one preallocated matrix.

Models whose float32 weights exceed the budget are not dequantized whole: layers are
dequantized on first use and kept in a small LRU, the embedding is read row by row from the
quantized data, and an LM head too big for the budget is dequantized in row chunks per call.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np

from memra_engine.model import arch_module
from memra_engine.model.config import ModelConfig
from memra_engine.model.gguf_file import GGUFFile, TensorInfo, dequantize

DEFAULT_BUDGET_BYTES = 2 << 30
DEQUANT_CHUNK_ROWS = 4096   # bounds gguf.quants' temporaries to a few MB per step


class QuantizedMatrix:
    """A [rows, cols] weight left quantized in the memory map; rows are dequantized on demand."""

    def __init__(self, t: TensorInfo):
        self.tensor = t
        self.shape = t.shape

    def rows(self, index: np.ndarray) -> np.ndarray:
        t = self.tensor
        return dequantize(dataclasses.replace(t, data=t.data[index], shape=(len(index), t.shape[1])))

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x @ W.T, one chunk of W's rows at a time."""
        out = np.empty((x.shape[0], self.shape[0]), dtype=np.float32)
        for a in range(0, self.shape[0], DEQUANT_CHUNK_ROWS):
            b = min(a + DEQUANT_CHUNK_ROWS, self.shape[0])
            out[:, a:b] = x @ dequantize_rows(self.tensor, a, b).T
        return out


def dequantize_rows(t: TensorInfo, a: int, b: int) -> np.ndarray:
    return dequantize(dataclasses.replace(t, data=t.data[a:b], shape=(b - a,) + t.shape[1:]))


def dequantize_into(t: TensorInfo, out: np.ndarray) -> None:
    """Dequantize t into out (same number of elements) without a full-size temporary."""
    if len(t.shape) == 1:
        out[:] = dequantize(t)
        return
    for a in range(0, t.shape[0], DEQUANT_CHUNK_ROWS):
        b = min(a + DEQUANT_CHUNK_ROWS, t.shape[0])
        out[a:b] = dequantize_rows(t, a, b)


def dequantize_stacked(parts: list[TensorInfo], out: np.ndarray) -> np.ndarray:
    """The parts' rows stacked into out (rows = the parts' rows summed). 3-D parts (experts)
    stack per expert: out[e] holds the rows of every part's expert e."""
    a = 0
    for p in parts:
        if len(p.shape) == 3:
            for e in range(p.shape[0]):
                out[e, a:a + p.shape[1]] = dequantize(dataclasses.replace(p, data=p.data[e], shape=p.shape[1:]))
            a += p.shape[1]
        else:
            dequantize_into(p, out[a:a + p.shape[0]])
            a += p.shape[0]
    return out


class QuantizedExperts:
    """[n_expert, rows, cols] experts left quantized in the memory map (parts stacked per expert,
    as dequantize_stacked does); expert e is dequantized when a token routes to it, and the
    last `keep` are kept. For MoE models too big to hold in float32 (the CPU's expert cache)."""

    def __init__(self, parts: list[TensorInfo], keep: int):
        self.parts, self.keep = parts, keep
        self.shape = (parts[0].shape[0], sum(p.shape[1] for p in parts), parts[0].shape[2])
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def __getitem__(self, e) -> np.ndarray:
        e = int(e)
        m = self._cache.get(e)
        if m is not None:
            self._cache.move_to_end(e)
            return m
        m = np.concatenate([dequantize(dataclasses.replace(p, data=p.data[e], shape=p.shape[1:]))
                            for p in self.parts])
        self._cache[e] = m
        while len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return m


class Arena:
    """One float32 buffer that all resident weights are carved from.

    A single large allocation gets transparent huge pages (numpy madvises allocations of 4 MB
    and more); most per-layer matrices are smaller. Decode streams every weight once per token,
    and with huge pages it ran ~7% faster (SmolLM2: 22.1 -> 23.8 tok/s, same process, same load).
    """

    def __init__(self, n_elements: int):
        self.buffer = np.empty(n_elements, dtype=np.float32)
        self.used = 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        view = self.buffer[self.used:self.used + n].reshape(shape)
        self.used += n
        return view


def f32_bytes(t: TensorInfo) -> int:
    return t.n_elements * 4


class CpuWeights:
    """ModelWeights for the numpy ops (see memra_engine.model.ops)."""

    def __init__(self, g: GGUFFile, cfg: ModelConfig, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.g, self.cfg = g, cfg
        self.fused = arch_module(cfg.arch).FUSED
        shapes = arch_module(cfg.arch).tensor_shapes(cfg)
        self.layer_tensors = [
            [name for name in shapes if name.startswith(f"blk.{i}.")] for i in range(cfg.n_layer)
        ]
        layer_bytes = max(sum(f32_bytes(g.tensors[n]) for n in names) for names in self.layer_tensors)
        # experts of a model too big for float32 stay quantized (QuantizedExperts), so they do
        # not count against the layer LRU; a few per layer are kept dequantized instead
        expert_bytes = max(sum(f32_bytes(g.tensors[n]) for n in names if n.endswith("_exps.weight"))
                           for names in self.layer_tensors)
        embd = g.tensors["token_embd.weight"]
        head = embd if cfg.tied_embeddings else g.tensors["output.weight"]
        global_bytes = f32_bytes(head) + (0 if cfg.tied_embeddings else f32_bytes(embd))
        self.all_resident = global_bytes + cfg.n_layer * layer_bytes <= budget_bytes

        if self.all_resident:
            names = set(shapes) | ({"token_embd.weight"} if cfg.tied_embeddings else set())
            self.allocate = Arena(sum(g.tensors[n].n_elements for n in names)).take
        else:
            self.allocate = lambda shape: np.empty(shape, dtype=np.float32)

        self.output_norm = self.load_matrix(g.tensors["output_norm.weight"])
        self.rope_freqs = self.load_matrix(g.tensors["rope_freqs.weight"]) if cfg.has_rope_freqs else None
        if self.all_resident:
            self.token_embd = self.load_matrix(embd)
            self.output = self.token_embd if cfg.tied_embeddings else self.load_matrix(head)
            self.max_cached_layers = cfg.n_layer
        else:
            self.token_embd = QuantizedMatrix(embd)
            head_fits = f32_bytes(head) <= budget_bytes // 2
            self.output = self.load_matrix(head) if head_fits else QuantizedMatrix(head)
            left = budget_bytes - (f32_bytes(head) if head_fits else 0)
            self.max_cached_layers = max(1, min(cfg.n_layer, left // max(1, layer_bytes - expert_bytes)))
            # 2 x top-k dequantized experts per layer: a token's experts, and the last token's
            self.experts_kept = 2 * max(1, cfg.n_expert_used)
        self._layers: OrderedDict[int, SimpleNamespace] = OrderedDict()
        if self.all_resident:
            for i in range(cfg.n_layer):
                self.layer(i)

    def load_matrix(self, t: TensorInfo) -> np.ndarray:
        """A float32 copy: never a view of the memory map, even for F32 tensors."""
        out = self.allocate(t.shape)
        dequantize_into(t, out)
        return out

    def load_stack(self, parts: list[TensorInfo]):
        """The parts stacked along rows (per expert for 3-D expert tensors)."""
        if len(parts[0].shape) == 3:
            if not self.all_resident:
                return QuantizedExperts(parts, self.experts_kept)
            shape = (parts[0].shape[0], sum(t.shape[1] for t in parts), parts[0].shape[2])
        else:
            shape = (sum(t.shape[0] for t in parts),) + parts[0].shape[1:]
        return dequantize_stacked(parts, self.allocate(shape))

    def layer(self, i: int) -> SimpleNamespace:
        layer = self._layers.get(i)
        if layer is not None:
            self._layers.move_to_end(i)
            return layer
        while len(self._layers) >= self.max_cached_layers:
            self._layers.popitem(last=False)
        layer = self._layers[i] = self.load_layer(i)
        return layer

    def load_layer(self, i: int) -> SimpleNamespace:
        prefix = f"blk.{i}."
        tensors = {}
        for name in self.layer_tensors[i]:
            short = name[len(prefix):].removesuffix(".weight").replace(".bias", "_bias")
            tensors[short] = self.g.tensors[name]
        arrays = {}
        for fused_name, parts in self.fused.items():
            stacked = [tensors.pop(p) for p in parts]
            arrays[fused_name] = self.load_stack(stacked)
        for short, t in tensors.items():
            arrays[short] = self.load_stack([t]) if len(t.shape) == 3 else self.load_matrix(t)
        return SimpleNamespace(**arrays)
