"""Write random-weight GGUF models of any supported architecture, shape and quant type.

Tests use the tiny presets; GPU benchmarks use the docs/design.md §7 shapes (smollm2-135m, gemma3-270m,
llama-8b, qwen3-moe). Files use llama.cpp's tensor names and metadata keys, and carry a small
byte-level BPE tokenizer with ChatML specials (or one copied from a real model), so they run end
to end in the engine and in llama.cpp.

Weights are seeded and deterministic: each tensor is generated in fixed row chunks, each chunk
from its own generator keyed by (seed, tensor name, chunk index), so the bytes never depend on the
number of worker threads. Scales keep a deep stack numerically tame and the logits informative:
- a matrix with fan-in n gets std 1/sqrt(n) (0.04 at d=576, near real checkpoints): each projection
  keeps a unit-RMS input at unit RMS, so a layer adds ~0.8 RMS to the residual stream;
- token_embd/output get std 2/sqrt(d), so logits have std ~2 (peaked, not degenerate);
- norm weights are 1 +- 0.1, except gemma3's post-attention/post-FFN norms at 4 +- 0.4 (real
  gemma3 norms are large too). Without that, a tied model's residual stream stays dominated by
  the input token's own embedding and greedy decoding just repeats the last token.

    memra-make-gguf tiny.gguf --preset tiny-llama
    memra-make-gguf llama8b.gguf --preset llama-8b --quant Q8_0
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Iterator, Sequence

import numpy as np
from gguf import GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT, GGUFValueType

from memra_engine.errors import MemraError
from memra_engine.model.kquants import ENCODABLE_TYPES, quantize

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "olmoe")
MOE_ARCHS = ("qwen3moe", "olmoe")   # llama too, with n_expert > 0 (Mixtral)
MIXES = ("Q4_K_M",)   # llama.cpp-style mixes; every other quant name is one ggml type
QUANT_NAMES = tuple(t.name for t in ENCODABLE_TYPES) + MIXES

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0   # as in SmolLM2: bos <|im_start|>, eos <|im_end|>
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
# A few GPT-2-style merges, each built only from bytes or earlier merge results.
MERGES = (
    "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t", "Ġ w", "Ġ o", "e n",
    "Ġ c", "i t", "i s", "a n", "o r", "e s", "Ġ b", "e d", "Ġ f", "in g", "Ġ p", "o u", "Ġa n",
    "a l", "a r", "Ġt o", "Ġ m", "Ġo f", "Ġ in", "Ġ d", "Ġ h", "Ġan d", "l e", "i c", "Ġ l", "Ġ y",
    "Ġy ou",
)

# Control tokens (<|im_end|>, <|endoftext|>, ...) get near-zero embedding/output rows: their logit
# sits near 0 while the others spread with std ~2, so a random model almost never ends its reply
# or emits a control token, and benchmarks and tests get replies of the length they ask for.
QUIET_ROW_SCALE = 0.05
CHUNK_ELEMENTS = 1 << 20   # rows per generation chunk = this // cols; fixed, so output is deterministic


@dataclass(frozen=True)
class SyntheticSpec:
    """The shape and encoding of one synthetic model."""

    arch: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab: int
    ctx: int = 4096
    quant: str = "Q8_0"              # a ggml type name, or a mix such as Q4_K_M
    embed_type: str | None = None    # token_embd/output type; None: chosen by quant (as llama.cpp)
    tied: bool = False               # no output.weight: logits use token_embd
    rope_base: float = 10000.0
    rope_base_local: float = 10000.0  # gemma3 sliding-window layers
    sliding_window: int = 512         # gemma3
    rms_eps: float = 1e-5
    n_expert: int = 0                 # MoE: qwen3moe, olmoe, and llama with experts (Mixtral)
    n_expert_used: int = 0
    d_ff_expert: int = 0              # olmoe and Mixtral write it as feed_forward_length
    chat_template: bool = True
    name: str = "synthetic"

    def check(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r} (choose from {', '.join(ARCHS)})")
        for field in ("n_layer", "d_model", "n_head", "n_kv_head", "head_dim", "d_ff", "vocab", "ctx"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_kv_head {self.n_kv_head}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rope")
        for q in (self.quant, self.embed_type):
            if q is not None and q not in QUANT_NAMES:
                raise ValueError(f"unknown quant {q!r} (choose from {', '.join(QUANT_NAMES)})")
        if self.arch in MOE_ARCHS or self.n_expert:
            if self.arch not in MOE_ARCHS + ("llama",):
                raise ValueError(f"{self.arch} has no experts (MoE archs: llama, {', '.join(MOE_ARCHS)})")
            if not (self.n_expert > 0 and 0 < self.n_expert_used <= self.n_expert and self.d_ff_expert > 0):
                raise ValueError(f"{self.arch} with experts needs n_expert > 0, 0 < n_expert_used <= n_expert, "
                                 "d_ff_expert > 0")
        if self.vocab < min_vocab():
            raise ValueError(f"vocab {self.vocab} is below the tokenizer's minimum {min_vocab()}")


def _tiny(arch: str, **kw: Any) -> SyntheticSpec:
    base = dict(arch=arch, n_layer=2, d_model=64, n_head=4, n_kv_head=2, head_dim=16, d_ff=128,
                vocab=384, ctx=256, quant="Q8_0", rope_base=10000.0, name=f"tiny-{arch}")
    base.update(kw)
    return SyntheticSpec(**base)


PRESETS: dict[str, SyntheticSpec] = {
    # docs/design.md §7 shapes.
    "smollm2-135m": SyntheticSpec(
        "llama", n_layer=30, d_model=576, n_head=9, n_kv_head=3, head_dim=64, d_ff=1536, vocab=49152,
        ctx=8192, quant="Q4_1", embed_type="Q8_0", tied=True, rope_base=100000.0, name="smollm2-135m"),
    "gemma3-270m": SyntheticSpec(
        "gemma3", n_layer=18, d_model=640, n_head=4, n_kv_head=1, head_dim=256, d_ff=2048, vocab=262144,
        ctx=32768, quant="Q4_K_M", tied=True, rope_base=1e6, rope_base_local=10000.0, sliding_window=512,
        rms_eps=1e-6, name="gemma3-270m"),
    "llama-8b": SyntheticSpec(
        "llama", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, head_dim=128, d_ff=14336, vocab=49152,
        ctx=8192, quant="Q4_K_M", rope_base=500000.0, name="llama-8b"),
    # issue 16's Llama-3.2-1B shape (tied embeddings, head_dim 64) at the 8B's vocabulary
    "llama-1b": SyntheticSpec(
        "llama", n_layer=16, d_model=2048, n_head=32, n_kv_head=8, head_dim=64, d_ff=8192, vocab=49152,
        ctx=8192, quant="Q4_K_M", tied=True, rope_base=500000.0, name="llama-1b"),
    "qwen3-moe": SyntheticSpec(
        "qwen3moe", n_layer=24, d_model=2048, n_head=32, n_kv_head=4, head_dim=128, d_ff=6144, vocab=49152,
        ctx=32768, quant="Q4_K_M", rope_base=1e6, rms_eps=1e-6, n_expert=64, n_expert_used=8,
        d_ff_expert=768, name="qwen3-moe"),
    # Unit-test models: a few layers, generated in milliseconds.
    "tiny-llama": _tiny("llama"),
    "tiny-llama-tied": _tiny("llama", tied=True, name="tiny-llama-tied"),
    "tiny-qwen2": _tiny("qwen2", rope_base=1e6, rms_eps=1e-6),
    # head_dim 128 / 256: what transformers' GGUF loader assumes for qwen3 (it ignores key_length)
    # and gemma3 (query_pre_attn_scalar 256), so the tiny models also load in the oracle.
    "tiny-qwen3": _tiny("qwen3", head_dim=128, rope_base=1e6, rms_eps=1e-6),
    # 7 layers: layers 0-4 and 6 slide, layer 5 is global; a short window so tests cross it.
    "tiny-gemma3": _tiny("gemma3", n_layer=7, n_head=4, n_kv_head=1, head_dim=256, tied=True,
                         rope_base=1e6, sliding_window=16, rms_eps=1e-6),
    "tiny-qwen3moe": _tiny("qwen3moe", head_dim=32, d_ff=128, n_expert=4, n_expert_used=2,
                           d_ff_expert=32, rope_base=1e6, rms_eps=1e-6),
    # 8 experts, top 2 as Mixtral; top 3 of 6 for olmoe (no renormalization, so top-k > 1 matters).
    "tiny-mixtral": _tiny("llama", n_expert=8, n_expert_used=2, d_ff_expert=64, name="tiny-mixtral"),
    "tiny-olmoe": _tiny("olmoe", n_expert=6, n_expert_used=3, d_ff_expert=32),
}


# --- tokenizer ---------------------------------------------------------------------------------

def gpt2_byte_chars() -> list[str]:
    """The 256 printable stand-ins GPT-2's byte-level BPE uses for bytes 0..255, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def min_vocab() -> int:
    return len(SPECIAL_TOKENS) + 256 + len(MERGES)


def _filler_words() -> Iterator[str]:
    """Pseudo-words (with and without the GPT-2 space marker) that decode to readable text."""
    syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words: list[str] = list(syllables)
    while True:
        for w in words:
            yield "Ġ" + w
            yield w
        words = [w + s for w in words for s in syllables]


def build_tokenizer_metadata(vocab: int, chat_template: bool) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """tokenizer.* keys for a byte-level BPE vocab of exactly `vocab` tokens."""
    tokens = list(SPECIAL_TOKENS) + gpt2_byte_chars()
    types = [TOKEN_CONTROL] * len(SPECIAL_TOKENS) + [TOKEN_NORMAL] * 256
    seen = set(tokens)
    for merge in MERGES:
        left, right = merge.split(" ")
        assert left in seen and right in seen, merge   # merges only join known tokens
        tokens.append(left + right)
        seen.add(left + right)
        types.append(TOKEN_NORMAL)
    fillers = _filler_words()
    while len(tokens) < vocab:
        word = next(fillers)
        if word not in seen:
            seen.add(word)
            tokens.append(word)
            types.append(TOKEN_NORMAL)
    meta: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] = {
        "tokenizer.ggml.model": ("gpt2", GGUFValueType.STRING, None),
        "tokenizer.ggml.pre": ("smollm", GGUFValueType.STRING, None),
        "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY, GGUFValueType.STRING),
        "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY, GGUFValueType.INT32),
        "tokenizer.ggml.merges": (list(MERGES), GGUFValueType.ARRAY, GGUFValueType.STRING),
        "tokenizer.ggml.bos_token_id": (BOS_ID, GGUFValueType.UINT32, None),
        "tokenizer.ggml.eos_token_id": (EOS_ID, GGUFValueType.UINT32, None),
        "tokenizer.ggml.unknown_token_id": (UNK_ID, GGUFValueType.UINT32, None),
        "tokenizer.ggml.padding_token_id": (EOS_ID, GGUFValueType.UINT32, None),
        "tokenizer.ggml.add_bos_token": (False, GGUFValueType.BOOL, None),
        "tokenizer.ggml.add_space_prefix": (False, GGUFValueType.BOOL, None),
    }
    if chat_template:
        meta["tokenizer.chat_template"] = (CHATML_TEMPLATE, GGUFValueType.STRING, None)
    return meta


def copy_tokenizer_metadata(real_gguf: str | os.PathLike[str]) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """Every tokenizer.* key of a real model, with its exact GGUF value types."""
    from memra_engine.model.gguf_file import open_gguf

    g = open_gguf(real_gguf)
    meta = {}
    for key, value in g.metadata.items():
        if key.startswith("tokenizer."):
            vtype, sub_type = g.metadata_types[key]
            meta[key] = (value, vtype, sub_type)
    if "tokenizer.ggml.tokens" not in meta:
        raise ValueError(f"{real_gguf}: has no tokenizer.ggml.tokens to copy")
    return meta


# --- tensors -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]      # numpy order; 3-D for stacked experts
    qtype: QT
    std: float                  # weights ~ N(mean, std)
    mean: float = 0.0
    quiet_rows: tuple[int, ...] = ()   # rows (vocab ids) drawn at QUIET_ROW_SCALE x std

    @property
    def n_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        rows = int(np.prod(self.shape[:-1], dtype=np.int64))
        return rows * (self.shape[-1] // block_size) * type_size


def _use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's Q4_K_M rule for which attn_v / ffn_down layers get Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


# A k-quant tensor whose rows are not a multiple of 256 falls back as in llama.cpp, except that
# llama.cpp's IQ4_NL fallback for Q2_K/Q3_K/IQ4_XS has no GPU kernel here: Q4_0 instead.
_FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0,
             QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.IQ4_XS: QT.Q4_0}


def _fit_type(qtype: QT, cols: int) -> QT:
    if cols % GGML_QUANT_SIZES[qtype][0]:
        qtype = _FALLBACK.get(qtype, qtype)
    if cols % GGML_QUANT_SIZES[qtype][0]:
        qtype = QT.F16
    return qtype


def _matrix_type(spec: SyntheticSpec, kind: str, layer: int) -> QT:
    if spec.quant == "Q4_K_M":
        if kind in ("attn_v", "ffn_down", "ffn_down_exps") and _use_more_bits(layer, spec.n_layer):
            return QT.Q6_K
        return QT.Q4_K
    return QT[spec.quant]


def _embedding_types(spec: SyntheticSpec) -> tuple[QT, QT]:
    """(token_embd, output) types. llama.cpp keeps the output at Q6_K in k-quant mixes, and a tied
    token_embd is quantized as the output."""
    if spec.embed_type is not None:
        t = QT.Q6_K if spec.embed_type == "Q4_K_M" else QT[spec.embed_type]
        return t, t
    if spec.quant == "Q4_K_M":
        return (QT.Q6_K if spec.tied else QT.Q4_K), QT.Q6_K
    return QT[spec.quant], QT[spec.quant]


def plan_tensors(spec: SyntheticSpec, control_ids: Sequence[int] = ()) -> list[TensorPlan]:
    """Every tensor of the model in file order, with its numpy shape, ggml type and init scale.
    control_ids: vocab ids whose embedding/output rows are kept near zero (see QUIET_ROW_SCALE)."""
    d, hd, ff = spec.d_model, spec.head_dim, spec.d_ff
    q_dim, kv_dim = spec.n_head * hd, spec.n_kv_head * hd
    plans: list[TensorPlan] = []

    def matrix(name: str, shape: tuple[int, ...], qtype: QT, std: float | None = None, quiet=()) -> None:
        std = 1.0 / np.sqrt(shape[-1]) if std is None else std
        plans.append(TensorPlan(name, shape, _fit_type(qtype, shape[-1]), float(std), quiet_rows=quiet))

    def vector(name: str, n: int, mean: float, std: float) -> None:
        plans.append(TensorPlan(name, (n,), QT.F32, std, mean))

    embd_type, out_type = _embedding_types(spec)
    logit_std = 2.0 / np.sqrt(d)
    quiet = tuple(sorted(int(i) for i in control_ids if 0 <= i < spec.vocab))
    matrix("token_embd.weight", (spec.vocab, d), embd_type, logit_std, quiet)
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        vector(f"{blk}.attn_norm.weight", d, 1.0, 0.1)
        matrix(f"{blk}.attn_q.weight", (q_dim, d), _matrix_type(spec, "attn_q", i))
        matrix(f"{blk}.attn_k.weight", (kv_dim, d), _matrix_type(spec, "attn_k", i))
        matrix(f"{blk}.attn_v.weight", (kv_dim, d), _matrix_type(spec, "attn_v", i))
        if spec.arch == "qwen2":
            vector(f"{blk}.attn_q.bias", q_dim, 0.0, 0.02)
            vector(f"{blk}.attn_k.bias", kv_dim, 0.0, 0.02)
            vector(f"{blk}.attn_v.bias", kv_dim, 0.0, 0.02)
        if spec.arch in ("qwen3", "qwen3moe", "gemma3"):
            vector(f"{blk}.attn_q_norm.weight", hd, 1.0, 0.1)
            vector(f"{blk}.attn_k_norm.weight", hd, 1.0, 0.1)
        if spec.arch == "olmoe":   # over the whole projection, not per head
            vector(f"{blk}.attn_q_norm.weight", q_dim, 1.0, 0.1)
            vector(f"{blk}.attn_k_norm.weight", kv_dim, 1.0, 0.1)
        matrix(f"{blk}.attn_output.weight", (d, q_dim), _matrix_type(spec, "attn_output", i))
        if spec.arch == "gemma3":
            vector(f"{blk}.post_attention_norm.weight", d, 4.0, 0.4)
        vector(f"{blk}.ffn_norm.weight", d, 1.0, 0.1)
        if spec.n_expert:
            e, eff = spec.n_expert, spec.d_ff_expert
            # The router stays F32, as in real Qwen3-MoE files.
            matrix(f"{blk}.ffn_gate_inp.weight", (e, d), QT.F32, 1.0 / np.sqrt(d))
            matrix(f"{blk}.ffn_gate_exps.weight", (e, eff, d), _matrix_type(spec, "ffn_gate_exps", i))
            matrix(f"{blk}.ffn_up_exps.weight", (e, eff, d), _matrix_type(spec, "ffn_up_exps", i))
            matrix(f"{blk}.ffn_down_exps.weight", (e, d, eff), _matrix_type(spec, "ffn_down_exps", i))
        else:
            matrix(f"{blk}.ffn_gate.weight", (ff, d), _matrix_type(spec, "ffn_gate", i))
            matrix(f"{blk}.ffn_up.weight", (ff, d), _matrix_type(spec, "ffn_up", i))
            matrix(f"{blk}.ffn_down.weight", (d, ff), _matrix_type(spec, "ffn_down", i))
        if spec.arch == "gemma3":
            vector(f"{blk}.post_ffw_norm.weight", d, 4.0, 0.4)
    vector("output_norm.weight", d, 1.0, 0.1)
    if not spec.tied:
        matrix("output.weight", (spec.vocab, d), out_type, logit_std, quiet)
    return plans


@functools.cache
def _normal_table() -> np.ndarray:
    """The 65536 quantiles of N(0, 1) at (i + 0.5) / 65536."""
    quantile = NormalDist().inv_cdf
    return np.array([quantile((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)


def _standard_normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """N(0, 1) samples through a 16-bit quantile table: 2x faster than rng.standard_normal, which
    matters for 8B-class models, and as normal as random weights need (tails end at +-4.3)."""
    count = shape[0] * shape[1]
    index = np.frombuffer(rng.bytes(2 * count), dtype=np.uint16)
    return _normal_table()[index].reshape(shape)


def _chunk_bytes(plan: TensorPlan, seed: int, index: int, start: int, rows: int) -> bytes:
    name_key = zlib.crc32(plan.name.encode())
    rng = np.random.default_rng([seed, name_key, index])
    x = _standard_normal(rng, (rows, plan.shape[-1]))
    x *= np.float32(plan.std)
    if plan.quiet_rows:
        quiet = np.asarray(plan.quiet_rows)
        x[quiet[(quiet >= start) & (quiet < start + rows)] - start] *= np.float32(QUIET_ROW_SCALE)
    if plan.mean:
        x += np.float32(plan.mean)
    return np.ascontiguousarray(quantize(x, plan.qtype)).tobytes()


def _tensor_chunks(plan: TensorPlan, seed: int, pool: ThreadPoolExecutor, window: int) -> Iterator[bytes]:
    """The tensor's encoded bytes in order; chunks are computed in parallel, at most `window` ahead."""
    cols = plan.shape[-1]
    total_rows = int(np.prod(plan.shape[:-1], dtype=np.int64))
    rows_per_chunk = max(1, CHUNK_ELEMENTS // cols)
    starts = range(0, total_rows, rows_per_chunk)
    pending: deque = deque()
    for index, start in enumerate(starts):
        rows = min(rows_per_chunk, total_rows - start)
        pending.append(pool.submit(_chunk_bytes, plan, seed, index, start, rows))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


# --- writer ------------------------------------------------------------------------------------

_FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q5_1": LlamaFileType.MOSTLY_Q5_1,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K,
    "Q2_K": LlamaFileType.MOSTLY_Q2_K, "Q3_K": LlamaFileType.MOSTLY_Q3_K_S,
    "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS,
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M,
}


def _model_metadata(spec: SyntheticSpec) -> dict[str, tuple[Any, GGUFValueType]]:
    a = spec.arch
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    meta: dict[str, tuple[Any, GGUFValueType]] = {
        "general.name": (spec.name, GGUFValueType.STRING),
        "general.file_type": (int(_FILE_TYPES[spec.quant]), u32),
        "general.quantization_version": (2, u32),
        f"{a}.block_count": (spec.n_layer, u32),
        f"{a}.context_length": (spec.ctx, u32),
        f"{a}.embedding_length": (spec.d_model, u32),
        f"{a}.feed_forward_length": (spec.d_ff_expert if spec.n_expert and a != "qwen3moe" else spec.d_ff, u32),
        f"{a}.attention.head_count": (spec.n_head, u32),
        f"{a}.attention.head_count_kv": (spec.n_kv_head, u32),
        f"{a}.attention.key_length": (spec.head_dim, u32),
        f"{a}.attention.value_length": (spec.head_dim, u32),
        f"{a}.attention.layer_norm_rms_epsilon": (spec.rms_eps, f32),
        f"{a}.rope.freq_base": (spec.rope_base, f32),
        f"{a}.vocab_size": (spec.vocab, u32),
    }
    if a != "gemma3":
        meta[f"{a}.rope.dimension_count"] = (spec.head_dim, u32)
    if a == "gemma3":
        meta[f"{a}.attention.sliding_window"] = (spec.sliding_window, u32)
        # llama.cpp hard-codes 10000 for gemma3's local layers; freq_base_swa is its key for it.
        meta[f"{a}.rope.freq_base_swa"] = (spec.rope_base_local, f32)
    if spec.n_expert:
        meta[f"{a}.expert_count"] = (spec.n_expert, u32)
        meta[f"{a}.expert_used_count"] = (spec.n_expert_used, u32)
    if a == "qwen3moe":
        meta[f"{a}.expert_feed_forward_length"] = (spec.d_ff_expert, u32)
    return meta


def synthetic_spec(arch: str | None = None, preset: str | None = None, **overrides: Any) -> SyntheticSpec:
    """A preset (or a bare arch with tiny defaults) with any fields overridden; None values ignored."""
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
        spec = PRESETS[preset]
        if arch is not None and arch != spec.arch:
            raise ValueError(f"preset {preset!r} is arch {spec.arch!r}, not {arch!r}")
    elif arch is not None:
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r} (choose from {', '.join(ARCHS)})")
        spec = PRESETS[f"tiny-{arch}"]
    else:
        raise ValueError("give an arch or a preset")
    spec = dataclasses.replace(spec, **{k: v for k, v in overrides.items() if v is not None})
    spec.check()
    return spec


def write_synthetic_gguf(
    path: str | os.PathLike[str],
    arch: str | None = None,
    *,
    preset: str | None = None,
    seed: int = 0,
    tokenizer_from: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    progress: Any = None,
    **shape: Any,
) -> Path:
    """Write a random-weight GGUF and return its path.

    shape: any SyntheticSpec field (n_layer, d_model, n_head, n_kv_head, head_dim, d_ff, vocab, ctx,
    quant, embed_type, tied, rope_base, rope_base_local, sliding_window, rms_eps, n_expert,
    n_expert_used, d_ff_expert, chat_template, name). tokenizer_from copies a real model's
    tokenizer (the vocab size then follows it). progress(str) gets one line per layer.
    """
    unknown = set(shape) - {f.name for f in dataclasses.fields(SyntheticSpec)}
    if unknown:
        raise TypeError(f"unknown synthetic model fields: {', '.join(sorted(unknown))}")
    if tokenizer_from is not None:
        tokenizer_meta = copy_tokenizer_metadata(tokenizer_from)
        if not shape.get("chat_template", True):
            tokenizer_meta.pop("tokenizer.chat_template", None)
        shape["vocab"] = len(tokenizer_meta["tokenizer.ggml.tokens"][0])
        spec = synthetic_spec(arch, preset, **shape)
    else:
        spec = synthetic_spec(arch, preset, **shape)
        tokenizer_meta = build_tokenizer_metadata(spec.vocab, spec.chat_template)

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    token_types = tokenizer_meta.get("tokenizer.ggml.token_type", ((),))[0]
    plans = plan_tensors(spec, [i for i, kind in enumerate(token_types) if kind == TOKEN_CONTROL])
    writer = GGUFWriter(tmp, spec.arch)
    for key, (value, vtype) in _model_metadata(spec).items():
        writer.add_key_value(key, value, vtype)
    for key, (value, vtype, sub_type) in tokenizer_meta.items():
        writer.add_key_value(key, value, vtype, sub_type)
    for plan in plans:
        writer.add_tensor_info(plan.name, plan.shape, np.dtype(np.float32), plan.n_bytes, raw_dtype=plan.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    out = writer.fout[0]
    workers = threads or min(8, os.cpu_count() or 1)
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for plan in plans:
                if progress is not None and plan.name.endswith(".attn_norm.weight"):
                    layer = int(plan.name.split(".")[1])
                    progress(f"{path.name}: layer {layer + 1}/{spec.n_layer}")
                writer.write_padding(out, out.tell())
                for chunk in _tensor_chunks(plan, seed, pool, window=2 * workers):
                    out.write(chunk)
                writer.write_padding(out, plan.n_bytes)
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


# --- CLI ---------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memra-make-gguf",
        description="Write a random-weight GGUF model (seeded, deterministic) for tests and benchmarks.",
        epilog="presets: " + ", ".join(f"{k} ({v.arch})" for k, v in PRESETS.items()),
    )
    p.add_argument("out", type=Path, help="output .gguf path")
    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a named shape (see below)")
    p.add_argument("--arch", choices=ARCHS, help="architecture; without --preset starts from tiny-ARCH")
    p.add_argument("--layers", dest="n_layer", type=int, help="number of transformer blocks")
    p.add_argument("--d-model", type=int, help="embedding width")
    p.add_argument("--heads", dest="n_head", type=int, help="query heads")
    p.add_argument("--kv-heads", dest="n_kv_head", type=int, help="key/value heads (GQA)")
    p.add_argument("--head-dim", type=int, help="per-head width (may differ from d_model/heads)")
    p.add_argument("--d-ff", type=int, help="feed-forward width (dense layers)")
    p.add_argument("--vocab", type=int, help=f"vocabulary size (>= {min_vocab()}; filler tokens pad it)")
    p.add_argument("--ctx", type=int, help="training context length written to the metadata")
    p.add_argument("--quant", choices=QUANT_NAMES,
                   help="type for the matrices; Q4_K_M is llama.cpp's mix (Q4_K, Q6_K for some attn_v/ffn_down)")
    p.add_argument("--embed-type", choices=QUANT_NAMES, help="type for token_embd and output")
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="no output.weight: logits reuse token_embd")
    tie.add_argument("--untied", dest="tied", action="store_false", help="write a separate output.weight")
    p.add_argument("--rope-base", type=float, help="rope frequency base (global layers for gemma3)")
    p.add_argument("--rope-base-local", type=float, help="gemma3: rope base of sliding-window layers")
    p.add_argument("--sliding-window", type=int, help="gemma3: sliding-window size")
    p.add_argument("--rms-eps", type=float, help="RMSNorm epsilon")
    p.add_argument("--experts", dest="n_expert", type=int, help="MoE: experts per layer (llama: Mixtral)")
    p.add_argument("--experts-used", dest="n_expert_used", type=int, help="MoE: experts per token (top-k)")
    p.add_argument("--d-ff-expert", type=int, help="MoE: feed-forward width of each expert")
    p.add_argument("--no-chat-template", dest="chat_template", action="store_false", default=None,
                   help="omit tokenizer.chat_template (the model then runs in completion mode)")
    p.add_argument("--tokenizer-from", type=Path, metavar="REAL.gguf",
                   help="copy the tokenizer.* metadata of a real model (vocab size follows it)")
    p.add_argument("--name", help="general.name to write")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed and shape: same bytes)")
    p.add_argument("--threads", type=int, help="worker threads (output does not depend on it)")
    p.add_argument("--quiet", action="store_true", help="print only errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.preset is None and args.arch is None:
        args.preset = "tiny-llama"
    fields = {f.name for f in dataclasses.fields(SyntheticSpec)}
    shape = {k: v for k, v in vars(args).items() if k in fields and k != "arch" and v is not None}
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    started = time.perf_counter()
    try:
        path = write_synthetic_gguf(
            args.out, args.arch, preset=args.preset, seed=args.seed, tokenizer_from=args.tokenizer_from,
            threads=args.threads, progress=say, **shape)
    except (ValueError, MemraError, OSError) as e:
        print(f"memra-make-gguf: {e}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    if not args.quiet:
        print(f"wrote {path} ({size / 2**20:.1f} MiB) in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
