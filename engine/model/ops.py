"""The ops a forward program is written in, and the weights it reads.

A forward program (engine/model/<arch>.py) is straight-line code over these ops. The numpy
backend (engine/cpu/ops.py) implements them eagerly; a GPU backend implements the same calls by
launching kernels on a stream, so a decode step can be captured into a CUDA graph. Hence:

- ops take and return backend arrays (`Array`); a forward program never looks at values;
- per-step values (token ids, positions) arrive as arrays, never as Python ints;
- Python scalars passed to ops (eps, rope base, window, head counts) are fixed per model;
- writing the KV cache is part of `attention`, so the cache never leaves the backend.

Shapes: T = tokens in this step. Activations are [T, width]; `heads` views them as
[T, n, head_dim]. Positions are int32 [T], ascending and contiguous, starting at the number
of tokens already in the cache.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

Array = Any   # a backend array: np.ndarray on cpu, a device buffer view on gpu
Weight = Any  # a backend weight handle: whatever the backend's loader made


class LayerWeights(Protocol):
    """One block's weights, named like the GGUF tensors without 'blk.N.' and '.weight'.

    Biases are '<name>_bias'. Loaders present two fusions on every backend:
    attn_qkv = rows of attn_q, attn_k, attn_v stacked (and attn_qkv_bias likewise), and
    ffn_gate_up = rows of ffn_gate, ffn_up stacked. A backend may keep the parts apart inside.
    """

    def __getattr__(self, name: str) -> Weight: ...


class ModelWeights(Protocol):
    token_embd: Weight       # [vocab, d_model]
    output_norm: Weight      # [d_model]
    output: Weight           # [vocab, d_model]; token_embd itself when embeddings are tied
    rope_freqs: Weight | None  # llama 3.1+: per-frequency divisors [head_dim / 2]

    def layer(self, i: int) -> LayerWeights: ...


class Ops(Protocol):
    def begin_layer(self, layer: int) -> None:
        """Layer `layer` starts. What the layers before the previous one made is dead from here:
        a layer reads the forward's inputs, the previous layer's outputs and its own (the GPU
        reuses their scratch)."""

    def embed(self, table: Weight, tokens: Array) -> Array:
        """Rows of `table` for int32 token ids [T] -> [T, d_model]."""

    def matmul(self, x: Array, w: Weight) -> Array:
        """x [T, in] times a weight stored [out, in] (GGUF row order) -> [T, out]."""

    def add(self, a: Array, b: Array) -> Array:
        """a + b; b is [T, n] like a, or a bias [n] broadcast over rows."""

    def scale(self, x: Array, s: float) -> Array:
        """x * s."""

    def split(self, x: Array, sizes: Sequence[int]) -> tuple[Array, ...]:
        """Split [T, sum(sizes)] along the last axis (views where the backend can)."""

    def heads(self, x: Array, n_head: int) -> Array:
        """View [T, n_head * head_dim] as [T, n_head, head_dim]."""

    def rms_norm(self, x: Array, w: Weight, eps: float) -> Array:
        """x / sqrt(mean(x^2) + eps) * w over the last axis ([T, d] or per head [T, n, hd])."""

    def rope(self, x: Array, positions: Array, base: float, neox: bool,
             scale: float = 1.0, freq_factors: Weight | None = None) -> Array:
        """Rotate [T, n, hd] by angle pos * scale * base^(-2i/hd) / freq_factors[i].

        neox: pair element i with i + hd/2 (NeoX/HF); else pair 2i with 2i+1 (llama GGUF).
        """

    def attention(self, layer: int, q: Array, k: Array, v: Array, positions: Array,
                  scale: float, window: int = 0, softcap: float = 0.0) -> Array:
        """Write k, v [T, n_kv, hd] into layer's cache at `positions`, then attend.

        q [T, n_head, hd]; query head h reads kv head h // (n_head // n_kv) (GQA). Row t sees
        cache positions j <= positions[t], and with window > 0 only those with
        positions[t] - j < window. Scores are q.k * scale, then softcap * tanh(s / softcap)
        if softcap > 0. Returns [T, n_head * hd].
        """

    def swiglu(self, gate: Array, up: Array) -> Array:
        """silu(gate) * up."""

    def gelu_mul(self, gate: Array, up: Array) -> Array:
        """gelu_tanh(gate) * up (gemma's GeGLU)."""

    def softcap(self, x: Array, cap: float) -> Array:
        """cap * tanh(x / cap)."""

    def moe_ffn(self, layer: int, x: Array, router: Weight, gate_up: Weight, down: Weight,
                n_used: int, renormalize: bool) -> Array:
        """The routed SwiGLU FFN of an MoE layer: x [T, d] -> [T, d].

        p = softmax(x @ router.T) over the experts (router [n_expert, d]); the n_used experts of
        highest p (ties: the lower id) get weights p_e, divided by their sum if renormalize.
        gate_up [n_expert, 2 * ff, d] stacks each expert's gate rows then up rows; down
        [n_expert, d, ff]. out = sum_e w_e * down_e @ silu(gate_e @ x) * (up_e @ x).
        `layer` names the layer for a backend that caches experts.
        """

    def last_row(self, x: Array) -> Array:
        """[T, n] -> [1, n]: the last token's row (prefill only needs its logits)."""
