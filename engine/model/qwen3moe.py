"""qwen3moe (Qwen3-30B-A3B and kin): qwen3's attention, and in every layer a routed FFN.

The router is softmax over all experts, then the top k, renormalized (llama.cpp and the released
models' norm_topk_prob); each chosen expert is a SwiGLU FFN of width d_ff_expert. No shared expert.
"""
from __future__ import annotations

from memra_engine.model.config import ModelConfig
from memra_engine.model.ops import Array, ModelWeights, Ops

# Loaders stack these GGUF tensors into one matrix each (see ops.LayerWeights); expert stacks
# stack each expert's rows: ffn_gate_up_exps[e] = rows of ffn_gate_exps[e], ffn_up_exps[e].
FUSED = {
    "attn_qkv": ("attn_q", "attn_k", "attn_v"),
    "ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps"),
}


def tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hd, e, eff = cfg.d_model, cfg.head_dim, cfg.n_expert, cfg.d_ff_expert
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
        q = ops.rms_norm(ops.heads(q, cfg.n_head), L.attn_q_norm, cfg.rms_eps)
        k = ops.rms_norm(ops.heads(k, cfg.n_kv_head), L.attn_k_norm, cfg.rms_eps)
        q = ops.rope(q, positions, cfg.rope_base, cfg.rope_neox, cfg.rope_scale)
        k = ops.rope(k, positions, cfg.rope_base, cfg.rope_neox, cfg.rope_scale)
        a = ops.attention(i, q, k, ops.heads(v, cfg.n_kv_head), positions, cfg.attn_scale)
        x = ops.add(x, ops.matmul(a, L.attn_output))

        h = ops.rms_norm(x, L.ffn_norm, cfg.rms_eps)
        x = ops.add(x, ops.moe_ffn(i, h, L.ffn_gate_inp, L.ffn_gate_up_exps, L.ffn_down_exps,
                                   cfg.n_expert_used, cfg.expert_weights_norm))

    if last_only:
        x = ops.last_row(x)
    x = ops.rms_norm(x, w.output_norm, cfg.rms_eps)
    return ops.matmul(x, w.output)
