"""The numpy implementation of memra_engine.model.ops.Ops: float32, eager, clear rather than clever.

This is the reference every GPU kernel is checked against, so each op is written the plain way.
Where transformers (the oracle of this reference) fixes a rounding order, we follow it: rope
angles are float32 products pos * inv_freq, as in its rotary embedding.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from memra_engine.cpu.kv_cache import KvCache
from memra_engine.cpu.weights import QuantizedMatrix

SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


class CpuOps:
    def __init__(self, kv: KvCache):
        self.kv = kv
        self.routed = 0  # (token, expert) pairs the MoE routers chose, since load
        self.routes: list | None = None  # a list: moe_ffn appends (layer, top-k ids, margin) (tests)
        self._rope_tables: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def begin_layer(self, layer: int) -> None:
        pass  # numpy frees what is dead by itself

    def embed(self, table, tokens: np.ndarray) -> np.ndarray:
        if isinstance(table, QuantizedMatrix):
            return table.rows(tokens)
        return table[tokens]

    def matmul(self, x: np.ndarray, w) -> np.ndarray:
        if isinstance(w, QuantizedMatrix):
            return w.matmul(x)
        return x @ w.T

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def split(self, x: np.ndarray, sizes: Sequence[int]) -> tuple[np.ndarray, ...]:
        parts, start = [], 0
        for size in sizes:
            parts.append(x[..., start:start + size])
            start += size
        return tuple(parts)

    def heads(self, x: np.ndarray, n_head: int) -> np.ndarray:
        return x.reshape(x.shape[0], n_head, -1)

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        mean_square = np.square(x).sum(axis=-1, keepdims=True) / np.float32(x.shape[-1])
        return x * (1.0 / np.sqrt(mean_square + np.float32(eps))) * w

    def rope(self, x: np.ndarray, positions: np.ndarray, base: float, neox: bool,
             scale: float = 1.0, freq_factors: np.ndarray | None = None) -> np.ndarray:
        cos, sin = self.rope_table(base, scale, freq_factors, x.shape[-1])
        cos = cos[positions][:, None, :]   # [T, 1, hd/2], broadcast over heads
        sin = sin[positions][:, None, :]
        half = x.shape[-1] // 2
        if neox:
            x1, x2 = x[..., :half], x[..., half:]
        else:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        r1 = x1 * cos - x2 * sin
        r2 = x2 * cos + x1 * sin
        if neox:
            return np.concatenate([r1, r2], axis=-1)
        return np.stack([r1, r2], axis=-1).reshape(x.shape)

    def rope_table(self, base: float, scale: float, freq_factors: np.ndarray | None,
                   head_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin [n_ctx, hd/2] for every position, built once per (base, scale)."""
        key = (base, scale, head_dim, None if freq_factors is None else freq_factors.tobytes())
        table = self._rope_tables.get(key)
        if table is None:
            exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
            inv_freq = (np.float32(1.0) / np.float32(base) ** exponents) * np.float32(scale)
            if freq_factors is not None:
                inv_freq = inv_freq / freq_factors
            angles = np.arange(self.kv.n_ctx, dtype=np.float32)[:, None] * inv_freq[None, :]
            table = self._rope_tables[key] = (np.cos(angles), np.sin(angles))
        return table

    def attention(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  positions: np.ndarray, scale: float, window: int = 0,
                  softcap: float = 0.0) -> np.ndarray:
        n_tok, n_head, hd = q.shape
        n_kv = k.shape[1]
        group = n_head // n_kv
        keys, values = self.kv.write(layer, int(positions[0]), k, v)   # [n_kv, L, hd]
        n_keys = keys.shape[1]

        # Query head h = kv * group + j reads kv head `kv`: batch the group's rows per kv head.
        qg = q.reshape(n_tok, n_kv, group, hd).transpose(1, 2, 0, 3).reshape(n_kv, group * n_tok, hd)
        scores = np.matmul(qg, keys.transpose(0, 2, 1))                # [n_kv, group*T, L]
        scores *= np.float32(scale)
        if softcap > 0:
            scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
        scores = scores.reshape(n_kv, group, n_tok, n_keys)
        if n_tok > 1 or window > 0:
            key_pos = np.arange(n_keys)[None, :]
            query_pos = positions[:, None]
            visible = key_pos <= query_pos
            if window > 0:
                visible &= query_pos - key_pos < window
            scores = np.where(visible, scores, np.float32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.matmul(probs.reshape(n_kv, group * n_tok, n_keys), values)   # [n_kv, group*T, hd]
        return out.reshape(n_kv, group, n_tok, hd).transpose(2, 0, 1, 3).reshape(n_tok, n_head * hd)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        # silu(g) = g * sigmoid(g), with sigmoid written via tanh so large |g| cannot overflow exp.
        return gate * (np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * gate))) * up

    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        inner = SQRT_2_OVER_PI * (gate + np.float32(0.044715) * gate * gate * gate)
        return np.float32(0.5) * gate * (np.float32(1.0) + np.tanh(inner)) * up

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return np.float32(cap) * np.tanh(x / np.float32(cap))

    def moe_ffn(self, layer: int, x: np.ndarray, router, gate_up, down, n_used: int,
                renormalize: bool) -> np.ndarray:
        logits = self.matmul(x, router)                                   # [T, n_expert]
        logits = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]      # ties: the lower id
        weights = np.take_along_axis(probs, top, axis=-1)
        if self.routes is not None:  # margin: how far the k-th expert's logit leads the next one
            ranked = np.sort(logits, axis=-1)[:, ::-1]
            margin = ranked[:, n_used - 1] - ranked[:, n_used] if n_used < ranked.shape[1] else np.full(len(x), np.inf)
            self.routes.append((layer, top, margin))
        if renormalize:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        self.routed += top.size
        out = np.zeros_like(x)
        # expert by expert over the tokens routed to it: one matmul per expert, not per token
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            gu = x[rows] @ gate_up[e].T
            gate, up = np.split(gu, 2, axis=-1)
            y = self.swiglu(gate, up) @ down[e].T
            out[rows] += weights[rows, slot][:, None] * y
        return out

    def last_row(self, x: np.ndarray) -> np.ndarray:
        return x[-1:]
