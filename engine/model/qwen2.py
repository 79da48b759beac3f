"""qwen2: llama's block with biases on q, k and v, and NeoX rope."""
from __future__ import annotations

from memra_engine.model.config import ModelConfig
from memra_engine.model.ops import Array, ModelWeights, Ops

# Loaders stack these GGUF tensors into one matrix (or bias) each (see ops.LayerWeights).
FUSED = {
    "attn_qkv": ("attn_q", "attn_k", "attn_v"),
    "attn_qkv_bias": ("attn_q_bias", "attn_k_bias", "attn_v_bias"),
    "ffn_gate_up": ("ffn_gate", "ffn_up"),
}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d = cfg.d_model
    shapes = {"token_embd.weight": (cfg.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.n_layer):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (d,),
            f"blk.{i}.attn_q.weight": (cfg.q_dim, d),
            f"blk.{i}.attn_q.bias": (cfg.q_dim,),
            f"blk.{i}.attn_k.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_k.bias": (cfg.kv_dim,),
            f"blk.{i}.attn_v.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_v.bias": (cfg.kv_dim,),
            f"blk.{i}.attn_output.weight": (d, cfg.q_dim),
            f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.ffn_gate.weight": (cfg.d_ff, d),
            f"blk.{i}.ffn_up.weight": (cfg.d_ff, d),
            f"blk.{i}.ffn_down.weight": (d, cfg.d_ff),
        }
    return shapes


def forward(ops: Ops, w: ModelWeights, cfg: ModelConfig, tokens: Array, positions: Array,
            last_only: bool = False) -> Array:
    """Logits [T, vocab] (or [1, vocab] with last_only) for tokens at positions."""
    x = ops.embed(w.token_embd, tokens)
    for i in range(cfg.n_layer):
        ops.begin_layer(i)
        L = w.layer(i)
        h = ops.rms_norm(x, L.attn_norm, cfg.rms_eps)
        qkv = ops.add(ops.matmul(h, L.attn_qkv), L.attn_qkv_bias)
        q, k, v = ops.split(qkv, (cfg.q_dim, cfg.kv_dim, cfg.kv_dim))
        q = ops.rope(ops.heads(q, cfg.n_head), positions, cfg.rope_base, cfg.rope_neox, cfg.rope_scale)
        k = ops.rope(ops.heads(k, cfg.n_kv_head), positions, cfg.rope_base, cfg.rope_neox, cfg.rope_scale)
        a = ops.attention(i, q, k, ops.heads(v, cfg.n_kv_head), positions, cfg.attn_scale)
        x = ops.add(x, ops.matmul(a, L.attn_output))

        h = ops.rms_norm(x, L.ffn_norm, cfg.rms_eps)
        gate, up = ops.split(ops.matmul(h, L.ffn_gate_up), (cfg.d_ff, cfg.d_ff))
        x = ops.add(x, ops.matmul(ops.swiglu(gate, up), L.ffn_down))

    if last_only:
        x = ops.last_row(x)
    x = ops.rms_norm(x, w.output_norm, cfg.rms_eps)
    return ops.matmul(x, w.output)
