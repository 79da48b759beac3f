"""Tiny random MoE models built in transformers and written to GGUF the way llama.cpp's converter
writes them, so our backends can be checked against transformers' own forward (test_moe.py).

transformers' GGUF loader covers none of mixtral or olmoe, so the test goes the other way: the
model is built in torch with known weights and converted here. The conversion follows
convert_hf_to_gguf.py: llama-arch q/k rows are permuted for adjacent-pair rope, expert stacks
[E, 2 * ff, d] are split into ffn_gate_exps / ffn_up_exps, all tensors are F32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

ARCHS = ("qwen3moe", "mixtral", "olmoe")
SHAPE = dict(vocab=384, d=64, n_layer=2, n_head=4, n_kv=2, head_dim=16, ff=32, n_expert=8, top_k=2)


def build_hf_model(arch: str, seed: int = 0, **shape):
    """A transformers model of `arch` with weights of realistic spread (std 1/sqrt(fan_in); norms
    around 1): transformers' own init (std 0.02) makes logits and router probabilities near-flat."""
    import torch
    from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)

    s = SHAPE | shape
    common = dict(vocab_size=s["vocab"], hidden_size=s["d"], num_hidden_layers=s["n_layer"],
                  num_attention_heads=s["n_head"], num_key_value_heads=s["n_kv"],
                  num_experts_per_tok=s["top_k"], rms_norm_eps=1e-6, tie_word_embeddings=False,
                  max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "qwen3moe":
        cfg = Qwen3MoeConfig(**common, head_dim=s["head_dim"], moe_intermediate_size=s["ff"],
                             intermediate_size=4 * s["ff"], num_experts=s["n_expert"], norm_topk_prob=True,
                             rope_theta=1e6)
        model = Qwen3MoeForCausalLM(cfg)
    elif arch == "mixtral":
        cfg = MixtralConfig(**common, intermediate_size=s["ff"], num_local_experts=s["n_expert"],
                            rope_theta=1e4, head_dim=s["d"] // s["n_head"])
        model = MixtralForCausalLM(cfg)
    else:
        cfg = OlmoeConfig(**common, intermediate_size=s["ff"], num_experts=s["n_expert"], norm_topk_prob=False,
                          rope_theta=1e4)
        model = OlmoeForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))
    return model.float().eval()


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: NeoX halves -> adjacent pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, arch: str, path: Path, metadata: dict | None = None) -> Path:
    import gguf

    c = model.config
    gguf_arch = "llama" if arch == "mixtral" else arch
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), gguf_arch)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_expert = getattr(c, "num_experts", None) or c.num_local_experts
    ff = c.moe_intermediate_size if arch == "qwen3moe" else c.intermediate_size
    a = gguf_arch
    meta = {
        "block_count": c.num_hidden_layers, "context_length": c.max_position_embeddings,
        "embedding_length": c.hidden_size, "feed_forward_length": c.intermediate_size,
        "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps),
        "rope.freq_base": float(c.rope_parameters["rope_theta"]),
        "expert_count": n_expert, "expert_used_count": c.num_experts_per_tok,
    }
    if arch == "qwen3moe":
        meta["expert_feed_forward_length"] = ff
    for key, value in (metadata or {}).items():   # bad-input tests: change or drop keys
        meta.pop(key) if value is None else meta.__setitem__(key, value)
    for key, value in meta.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{a}.{key}", value)

    def put(name: str, array: np.ndarray) -> None:
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch == "mixtral":
            q, k = permute_rows(q, c.num_attention_heads), permute_rows(k, c.num_key_value_heads)
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        put(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        if arch != "mixtral":
            put(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            put(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        put(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        gate_up = sd[p + "mlp.experts.gate_up_proj"]              # [E, 2 * ff, d]: gate rows, then up
        put(b + "ffn_gate_exps.weight", gate_up[:, :ff])
        put(b + "ffn_up_exps.weight", gate_up[:, ff:])
        put(b + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
