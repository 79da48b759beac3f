"""gemma3: sliding-window attention on 5 of every 6 layers, q/k norms, sandwich norms, GeGLU.

Differences from llama, all visible below:
- the embedding is scaled by sqrt(d_model);
- q and k heads are RMS-normed before rope; local layers use their own rope base (10000);
- the attention and FFN outputs are RMS-normed again before the residual add;
- the FFN is GELU(tanh)-gated, not SiLU-gated.
GGUF norm weights already hold gemma's (1 + w): llama.cpp's converter adds the 1 (transformers
subtracts it again when it loads a GGUF), so rms_norm multiplies by the stored weight as is.
"""
from __future__ import annotations

from memra_engine.model.config import ModelConfig
from memra_engine.model.ops import Array, ModelWeights, Ops

# Loaders stack these GGUF tensors into one matrix each (see ops.LayerWeights).
FUSED = {
    "attn_qkv": ("attn_q", "attn_k", "attn_v"),
    "ffn_gate_up": ("ffn_gate", "ffn_up"),
}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hd = cfg.d_model, cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.n_layer):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (d,),
            f"blk.{i}.attn_q.weight": (cfg.q_dim, d),
            f"blk.{i}.attn_k.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_v.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_q_norm.weight": (hd,),
            f"blk.{i}.attn_k_norm.weight": (hd,),
            f"blk.{i}.attn_output.weight": (d, cfg.q_dim),
            f"blk.{i}.post_attention_norm.weight": (d,),
            f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.ffn_gate.weight": (cfg.d_ff, d),
            f"blk.{i}.ffn_up.weight": (cfg.d_ff, d),
            f"blk.{i}.ffn_down.weight": (d, cfg.d_ff),
            f"blk.{i}.post_ffw_norm.weight": (d,),
        }
    return shapes


def forward(ops: Ops, w: ModelWeights, cfg: ModelConfig, tokens: Array, positions: Array,
            last_only: bool = False) -> Array:
    """Logits [T, vocab] (or [1, vocab] with last_only) for tokens at positions."""
    x = ops.scale(ops.embed(w.token_embd, tokens), cfg.embed_scale)
    for i in range(cfg.n_layer):
        ops.begin_layer(i)
        L = w.layer(i)
        sliding = cfg.is_sliding(i)
        rope_base = cfg.rope_base_local if sliding else cfg.rope_base
        rope_scale = 1.0 if sliding else cfg.rope_scale  # linear scaling applies to global layers only
        window = cfg.sliding_window if sliding else 0

        h = ops.rms_norm(x, L.attn_norm, cfg.rms_eps)
        q, k, v = ops.split(ops.matmul(h, L.attn_qkv), (cfg.q_dim, cfg.kv_dim, cfg.kv_dim))
        q = ops.rms_norm(ops.heads(q, cfg.n_head), L.attn_q_norm, cfg.rms_eps)
        k = ops.rms_norm(ops.heads(k, cfg.n_kv_head), L.attn_k_norm, cfg.rms_eps)
        q = ops.rope(q, positions, rope_base, cfg.rope_neox, rope_scale)
        k = ops.rope(k, positions, rope_base, cfg.rope_neox, rope_scale)
        a = ops.attention(i, q, k, ops.heads(v, cfg.n_kv_head), positions, cfg.attn_scale,
                          window, cfg.attn_logit_softcap)
        a = ops.matmul(a, L.attn_output)
        x = ops.add(x, ops.rms_norm(a, L.post_attention_norm, cfg.rms_eps))

        h = ops.rms_norm(x, L.ffn_norm, cfg.rms_eps)
        gate, up = ops.split(ops.matmul(h, L.ffn_gate_up), (cfg.d_ff, cfg.d_ff))
        f = ops.matmul(ops.gelu_mul(gate, up), L.ffn_down)
        x = ops.add(x, ops.rms_norm(f, L.post_ffw_norm, cfg.rms_eps))

    if last_only:
        x = ops.last_row(x)
    x = ops.rms_norm(x, w.output_norm, cfg.rms_eps)
    logits = ops.matmul(x, w.output)
    if cfg.final_logit_softcap > 0:
        logits = ops.softcap(logits, cfg.final_logit_softcap)
    return logits
