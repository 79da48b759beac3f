"""mixtral (Mixtral 8x7B; GGUF arch 'llama' with experts): llama's attention, and in every layer
a routed FFN: softmax over all experts, top k (2), renormalized, each expert a SwiGLU FFN."""
from __future__ import annotations

from memra_engine.model.config import ModelConfig
from memra_engine.model.ops import Array, ModelWeights, Ops

# Loaders stack these GGUF tensors into one matrix each (see ops.LayerWeights and qwen3moe.FUSED).
FUSED = {
    "attn_qkv": ("attn_q", "attn_k", "attn_v"),
    "ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps"),
}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hd, e, eff = cfg.d_model, cfg.head_dim, cfg.n_expert, cfg.d_ff_expert
    shapes = {"token_embd.weight": (cfg.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, d)
    if cfg.has_rope_freqs:
        shapes["rope_freqs.weight"] = (hd // 2,)
    for i in range(cfg.n_layer):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (d,),
            f"blk.{i}.attn_q.weight": (cfg.q_dim, d),
            f"blk.{i}.attn_k.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_v.weight": (cfg.kv_dim, d),
            f"blk.{i}.attn_output.weight": (d, cfg.q_dim),
            f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.ffn_gate_inp.weight": (e, d),
            f"blk.{i}.ffn_gate_exps.weight": (e, eff, d),
            f"blk.{i}.ffn_up_exps.weight": (e, eff, d),
            f"blk.{i}.ffn_down_exps.weight": (e, d, eff),
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
        q, k, v = ops.split(ops.matmul(h, L.attn_qkv), (cfg.q_dim, cfg.kv_dim, cfg.kv_dim))
        q = ops.rope(ops.heads(q, cfg.n_head), positions, cfg.rope_base, cfg.rope_neox,
                     cfg.rope_scale, w.rope_freqs)
        k = ops.rope(ops.heads(k, cfg.n_kv_head), positions, cfg.rope_base, cfg.rope_neox,
                     cfg.rope_scale, w.rope_freqs)
        a = ops.attention(i, q, k, ops.heads(v, cfg.n_kv_head), positions, cfg.attn_scale)
        x = ops.add(x, ops.matmul(a, L.attn_output))

        h = ops.rms_norm(x, L.ffn_norm, cfg.rms_eps)
        x = ops.add(x, ops.moe_ffn(i, h, L.ffn_gate_inp, L.ffn_gate_up_exps, L.ffn_down_exps,
                                   cfg.n_expert_used, cfg.expert_weights_norm))

    if last_only:
        x = ops.last_row(x)
    x = ops.rms_norm(x, w.output_norm, cfg.rms_eps)
    return ops.matmul(x, w.output)
