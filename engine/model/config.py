"""ModelConfig: the shape and math switches of a model, read from GGUF metadata and checked.

Every field that later sizes an allocation (layers, widths, heads, vocab) is bounded here, and
every tensor the architecture needs is checked against the shape the config implies, before
any weight is dequantized or any cache is allocated. A bad file gets one ModelFormatError line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.model.gguf_file import GGUFFile

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "olmoe")
MOE_ARCHS = ("qwen3moe", "olmoe")  # plus llama files with experts, which run as "mixtral"

# Upper bounds far above any real model; they only stop absurd headers from sizing allocations.
MAX_LAYERS = 1024
MAX_D_MODEL = 1 << 16
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_D_FF = 1 << 20
MAX_VOCAB = 1 << 22
MAX_CTX = 1 << 24
MAX_EXPERTS = 1 << 12

# gemma3: llama.cpp and transformers hard-code these; the GGUF only stores the window size.
GEMMA3_SLIDING_WINDOW_PATTERN = 6      # every 6th layer is global
GEMMA3_ROPE_BASE_LOCAL = 10000.0


@dataclass(frozen=True)
class ModelConfig:
    arch: str                     # the forward program: general.architecture, but "mixtral" for llama files with experts
    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab_size: int
    n_ctx_train: int
    rope_base: float              # global layers (all layers outside gemma3)
    rope_base_local: float        # gemma3 sliding-window layers; == rope_base elsewhere
    rope_neox: bool               # rotate halves (NeoX) rather than adjacent pairs (llama GGUFs)
    rope_scale: float             # linear position scaling on global layers (1 / factor)
    has_rope_freqs: bool          # llama 3.1+: per-frequency divisors in tensor rope_freqs.weight
    rms_eps: float
    sliding_window: int           # 0: no sliding-window layers
    sliding_window_pattern: int   # every Nth layer is global; 0: none slide
    tied_embeddings: bool         # no output.weight: the LM head is token_embd
    attn_scale: float             # multiplies q.k
    attn_logit_softcap: float     # 0: off
    final_logit_softcap: float    # 0: off
    embed_scale: float            # multiplies the embedding (gemma: sqrt(d_model))
    # MoE (0 experts: a dense FFN). Every layer routes; router: softmax over all experts, then top-k.
    n_expert: int = 0
    n_expert_used: int = 0        # top-k
    d_ff_expert: int = 0          # each expert's FFN width
    expert_weights_norm: bool = False  # divide the top-k probabilities by their sum

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def is_sliding(self, layer: int) -> bool:
        """gemma3: layers 0..4 slide, layer 5 is global, and so on (transformers' layer_types)."""
        p = self.sliding_window_pattern
        return self.sliding_window > 0 and p > 0 and (layer + 1) % p != 0


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    """Read and check the config; then check every tensor's presence and shape against it."""
    meta = g.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFormatError(f"{g.path.name}: metadata has no general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"unsupported architecture {_quote(arch)} (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    field = _FieldReader(g, arch)

    n_layer = field.integer("block_count", MAX_LAYERS)
    d_model = field.integer("embedding_length", MAX_D_MODEL)
    n_head = field.integer("attention.head_count", MAX_HEADS)
    n_kv_head = field.integer("attention.head_count_kv", MAX_HEADS, default=n_head)
    if n_head % n_kv_head:
        raise field.bad(f"attention.head_count {n_head} is not a multiple of head_count_kv {n_kv_head}")
    if "attention.key_length" in field:
        head_dim = field.integer("attention.key_length", MAX_HEAD_DIM)
    elif d_model % n_head == 0:
        head_dim = d_model // n_head
    else:
        raise field.bad(f"embedding_length {d_model} is not a multiple of head_count {n_head}")
    value_dim = field.integer("attention.value_length", MAX_HEAD_DIM, default=head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(f"key_length {head_dim} != value_length {value_dim} is not supported")
    if head_dim % 2:
        raise field.bad(f"head dimension {head_dim} is odd, rope needs pairs")
    rope_dim = field.integer("rope.dimension_count", MAX_HEAD_DIM, default=head_dim)
    if rope_dim != head_dim:
        raise UnsupportedModelError(f"partial rotary embeddings (rope dim {rope_dim} of {head_dim}) are not supported")
    d_ff = field.integer("feed_forward_length", MAX_D_FF)
    n_ctx_train = field.integer("context_length", MAX_CTX, default=4096)

    if "token_embd.weight" not in g.tensors:
        raise ModelFormatError(f"{g.path.name}: missing tensor 'token_embd.weight'")
    embd_shape = g.tensors["token_embd.weight"].shape
    vocab_size = embd_shape[0] if len(embd_shape) == 2 else 0
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise field.bad(f"token_embd.weight has shape {embd_shape}, not [vocab <= {MAX_VOCAB}, {d_model}]")
    if "vocab_size" in field and field.integer("vocab_size", MAX_VOCAB) != vocab_size:
        raise field.bad(f"vocab_size {field.integer('vocab_size', MAX_VOCAB)} != token_embd rows {vocab_size}")

    rope_base = field.number("rope.freq_base", default=10000.0, positive=True)
    rope_scale = 1.0
    scaling = field.text("rope.scaling.type", default="none")
    if scaling == "linear":
        factor = field.number("rope.scaling.factor", default=1.0)
        if not factor > 0:
            raise field.bad(f"rope.scaling.factor {factor} must be > 0")
        rope_scale = 1.0 / factor
    elif scaling not in ("none", ""):
        raise UnsupportedModelError(f"rope scaling {_quote(scaling)} is not supported (only linear)")

    common = dict(
        arch=arch,
        name=str(meta.get("general.name", g.path.stem)),
        n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head, head_dim=head_dim,
        d_ff=d_ff, vocab_size=vocab_size, n_ctx_train=n_ctx_train,
        rope_base=rope_base, rope_base_local=rope_base, rope_scale=rope_scale,
        has_rope_freqs="rope_freqs.weight" in g.tensors,
        rms_eps=field.number("attention.layer_norm_rms_epsilon", default=1e-5, positive=True),
        sliding_window=0, sliding_window_pattern=0,
        tied_embeddings="output.weight" not in g.tensors,
        attn_scale=1.0 / math.sqrt(head_dim),
        attn_logit_softcap=field.number("attn_logit_softcapping", default=0.0),
        final_logit_softcap=field.number("final_logit_softcapping", default=0.0),
        embed_scale=1.0,
    )
    moe = _moe_fields(field, arch, d_ff)
    if arch == "llama":
        # llama.cpp's converter permutes q/k rows so that adjacent-pair rope is right for llama GGUFs.
        if moe:
            common["arch"] = "mixtral"
        cfg = ModelConfig(**common, **moe, rope_neox=False)
    elif arch in ("qwen2", "qwen3", "qwen3moe", "olmoe"):
        cfg = ModelConfig(**common, **moe, rope_neox=True)
    else:  # gemma3
        common.update(
            sliding_window=field.integer("attention.sliding_window", MAX_CTX),
            sliding_window_pattern=GEMMA3_SLIDING_WINDOW_PATTERN,
            rope_base_local=field.number("rope.freq_base_swa", default=GEMMA3_ROPE_BASE_LOCAL, positive=True),
            embed_scale=math.sqrt(d_model),
        )
        if n_layer == 62:
            # Gemma 3 27B scales by d_model/n_head (query_pre_attn_scalar 168); llama.cpp does the same.
            common["attn_scale"] = 1.0 / math.sqrt(d_model / n_head)
        cfg = ModelConfig(**common, rope_neox=True)

    check_tensors(cfg, g)
    return cfg


def _moe_fields(field: "_FieldReader", arch: str, d_ff: int) -> dict[str, Any]:
    """Expert count, top-k and expert width; {} for a dense model. llama files carry experts
    for Mixtral; qwen3moe and olmoe must. Router math follows llama.cpp per architecture:
    qwen3moe and mixtral renormalize the top-k probabilities, olmoe does not."""
    if arch not in MOE_ARCHS and field.get("expert_count", 0) == 0:
        return {}
    if arch not in MOE_ARCHS + ("llama",):
        raise UnsupportedModelError(f"experts in a '{arch}' model are not supported")
    n_expert = field.integer("expert_count", MAX_EXPERTS)
    n_used = field.integer("expert_used_count", MAX_EXPERTS)
    if n_used > n_expert:
        raise field.bad(f"expert_used_count {n_used} is more than expert_count {n_expert}")
    d_ff_expert = field.integer("expert_feed_forward_length", MAX_D_FF) if arch == "qwen3moe" else d_ff
    return dict(n_expert=n_expert, n_expert_used=n_used, d_ff_expert=d_ff_expert,
                expert_weights_norm=arch != "olmoe")


def check_tensors(cfg: ModelConfig, g: GGUFFile) -> None:
    """Every tensor the architecture reads must exist with the shape the config implies."""
    from memra_engine.model import arch_module  # the registry imports this module

    for name, want in arch_module(cfg.arch).tensor_shapes(cfg).items():
        info = g.tensors.get(name)
        if info is None:
            raise ModelFormatError(f"{g.path.name}: missing tensor '{name}'")
        if tuple(info.shape) != want:
            raise ModelFormatError(
                f"{g.path.name}: tensor '{name}' has shape {list(info.shape)}, "
                f"the metadata implies {list(want)}"
            )


def _quote(value: Any, limit: int = 80) -> str:
    """repr of a metadata value for an error message: one line (repr escapes newlines), and
    short, since a string or array value can be as long as the file."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


class _FieldReader:
    """Typed, bounded access to '<arch>.<key>' metadata with one-line errors."""

    def __init__(self, g: GGUFFile, arch: str):
        self.meta, self.arch, self.file = g.metadata, arch, g.path.name

    def __contains__(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.meta

    def bad(self, problem: str) -> ModelFormatError:
        return ModelFormatError(f"{self.file}: {problem}")

    def get(self, key: str, default: Any) -> Any:
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return self.meta[full]
        if default is None:
            raise self.bad(f"missing metadata '{full}'")
        return default

    def integer(self, key: str, maximum: int, default: int | None = None) -> int:
        value = self.get(key, default)
        if isinstance(value, list) and value:
            if any(v != value[0] for v in value):
                raise UnsupportedModelError(f"per-layer values of '{self.arch}.{key}' differ ({_quote(value[:8])})")
            value = value[0]  # per-layer arrays holding one value are common for head counts
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(f"metadata '{self.arch}.{key}' is {_quote(value)}, expected an integer")
        if not 1 <= value <= maximum:
            raise self.bad(f"metadata '{self.arch}.{key}' = {value} is absurd (expected 1..{maximum})")
        return value

    def number(self, key: str, default: float, positive: bool = False) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.bad(f"metadata '{self.arch}.{key}' is {_quote(value)}, expected a finite number")
        if value < 0 or (positive and value == 0):
            raise self.bad(f"metadata '{self.arch}.{key}' = {value} must be {'> 0' if positive else '>= 0'}")
        return float(value)

    def text(self, key: str, default: str) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise self.bad(f"metadata '{self.arch}.{key}' is {_quote(value)}, expected a string")
        return value
