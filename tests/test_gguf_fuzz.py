"""Fuzz the GGUF reader: open_gguf, then config_from_gguf, on structured mutations of small valid
synthetic files (tiny-llama and tiny-qwen3moe, whose tensor data is zeroed so a saved input
compresses to a few KB).

The property, for every input: it loads (open_gguf and config_from_gguf both succeed) or raises
ModelFormatError / UnsupportedModelError with a one-line message; never any other exception,
never the reader's last-resort "unreadable GGUF (SomeError: ...)" wrapper (that is a parser bug
reaching the user), never a message over 10,000 characters, never a hang (each case runs under a 2 s alarm and must take < 1 s of CPU time), and
never an allocation sized from an unchecked field (tracemalloc peak < 8 MiB for a <= 200 KB file).

Mutations are structural, so most of them get past the magic and the counts: header (magic,
version, lying tensor/kv counts), metadata (keys: renamed, duplicated, invalid UTF-8, lying
lengths; values: every value type, boundary ints and floats, strings with newlines, arrays with
lying lengths, nested or unknown item types; the config keys of every supported architecture,
incl. the MoE keys expert_count / expert_used_count), tensor infos (n_dims, dims, ggml type ids,
offsets, names), the data section's length, and finally raw truncation and byte overwrites.

Every input that ever failed is in tests/fuzz_corpus/ (gzip'd GGUF files) and is replayed on
every run by test_corpus_input.

CI runs a bounded, reproducible search (derandomize=True, DEFAULT_EXAMPLES = 7000 examples, ~60 s
on a shared 2-core machine). A longer search on demand (25000 take ~200 s):

    MEMRA_FUZZ_EXAMPLES=100000 pytest tests/test_gguf_fuzz.py -s

and MEMRA_FUZZ_SAVE=1 writes the minimized failing input of a failed run into tests/fuzz_corpus/
(commit it with the fix). MEMRA_FUZZ_SEED=<int> explores a different part of the space than CI.
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import signal
import struct
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.model.config import SUPPORTED_ARCHS, config_from_gguf
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf

CORPUS = Path(__file__).parent / "fuzz_corpus"
DEFAULT_EXAMPLES = 7000
EXAMPLES = int(os.environ.get("MEMRA_FUZZ_EXAMPLES") or DEFAULT_EXAMPLES)
CASE_LIMIT_S = 1.0
ALARM_S = 2.0
PEAK_LIMIT = 8 << 20
MAX_MESSAGE = 10_000   # two names of <= 1024 bytes, each repr'd at most 4x longer, and prose
PRESETS = ("tiny-llama", "tiny-qwen3moe")

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
INT_RANGE = {U8: (0, 2**8 - 1), I8: (-2**7, 2**7 - 1), U16: (0, 2**16 - 1), I16: (-2**15, 2**15 - 1),
             U32: (0, 2**32 - 1), I32: (-2**31, 2**31 - 1), U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1),
             BOOL: (0, 255)}
CONFIG_KEYS = (
    "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
    "attention.key_length", "attention.value_length", "rope.dimension_count", "feed_forward_length",
    "context_length", "vocab_size", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
    "attention.layer_norm_rms_epsilon", "attn_logit_softcapping", "final_logit_softcapping",
    "expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window",
    "rope.freq_base_swa",
)
GENERAL_KEYS = ("general.architecture", "general.alignment", "general.name")
# ggml type ids: every known one, the gaps (4, 5, 31-33, 36-38) and far out of range
TYPE_IDS = (*range(0, 43), 200, 2**31, 2**32 - 1)


# --- the file as parts -------------------------------------------------------------------------

@dataclass(frozen=True)
class KV:
    key: bytes
    vtype: int
    payload: bytes          # the encoded value after the type id
    key_len: int | None = None   # declared key length; None: the real one


@dataclass(frozen=True)
class Info:
    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    n_dims: int | None = None    # declared; None: len(dims)
    name_len: int | None = None


@dataclass(frozen=True)
class Parts:
    kvs: tuple[KV, ...]
    infos: tuple[Info, ...]
    data_len: int
    magic: bytes = b"GGUF"
    version: int = 3
    tensor_count: int | None = None
    kv_count: int | None = None

    def serialize(self) -> bytes:
        out = bytearray(self.magic)
        out += struct.pack("<IQQ", self.version,
                           len(self.infos) if self.tensor_count is None else self.tensor_count,
                           len(self.kvs) if self.kv_count is None else self.kv_count)
        for kv in self.kvs:
            out += struct.pack("<Q", len(kv.key) if kv.key_len is None else kv.key_len) + kv.key
            out += struct.pack("<I", kv.vtype) + kv.payload
        for t in self.infos:
            out += struct.pack("<Q", len(t.name) if t.name_len is None else t.name_len) + t.name
            out += struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims)
            out += b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.ggml_type, t.offset)
        align = self.alignment()
        out += bytes(-len(out) % align)
        out += bytes(self.data_len)
        return bytes(out)

    def alignment(self) -> int:
        """Pad as the (possibly mutated) general.alignment says, where it is a usable value."""
        for kv in self.kvs:
            if kv.key == b"general.alignment" and kv.vtype == U32 and len(kv.payload) == 4:
                (a,) = struct.unpack("<I", kv.payload)
                if 0 < a <= 1 << 20 and not a & (a - 1):
                    return a
        return 32


def split_valid(raw: bytes) -> Parts:
    """The parts of a valid file (an independent walk of the layout; valid input only)."""
    pos = 24
    _, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", raw, 0)

    def take(n: int) -> bytes:
        nonlocal pos
        pos += n
        return raw[pos - n:pos]

    def value_len(vtype: int, at: int) -> int:
        if vtype in SCALAR_FMT:
            return struct.calcsize(SCALAR_FMT[vtype])
        if vtype == STRING:
            return 8 + struct.unpack_from("<Q", raw, at)[0]
        item, count = struct.unpack_from("<IQ", raw, at)
        n, p = 12, at + 12
        for _ in range(count):
            k = value_len(item, p)
            n, p = n + k, p + k
        return n

    kvs = []
    for _ in range(n_kv):
        (klen,) = struct.unpack("<Q", take(8))
        key = take(klen)
        (vtype,) = struct.unpack("<I", take(4))
        kvs.append(KV(key, vtype, take(value_len(vtype, pos))))
    infos = []
    for _ in range(n_tensors):
        (nlen,) = struct.unpack("<Q", take(8))
        name = take(nlen)
        (nd,) = struct.unpack("<I", take(4))
        dims = struct.unpack(f"<{nd}Q", take(8 * nd))
        gtype, offset = struct.unpack("<IQ", take(12))
        infos.append(Info(name, dims, gtype, offset))
    data_start = pos + (-pos % 32)
    return Parts(tuple(kvs), tuple(infos), len(raw) - data_start, version=version)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Parts]:
    out = {}
    for preset in PRESETS:
        path = write_synthetic_gguf(tmp_path_factory.mktemp("base") / f"{preset}.gguf", preset=preset)
        raw = path.read_bytes()
        parts = split_valid(raw)
        assert parts.serialize()[:len(raw) - parts.data_len] == raw[:len(raw) - parts.data_len]
        out[preset] = parts
    return out


# --- encoders and strategies ---------------------------------------------------------------------

def enc_str(b: bytes, declared: int | None = None) -> bytes:
    return struct.pack("<Q", len(b) if declared is None else declared) + b


def lie(real_len: int):
    """A declared length: usually the real one, else off by a little or absurd."""
    return st.one_of(
        st.just(None), st.just(None), st.just(None),
        st.sampled_from([0, 1, real_len + 1, max(real_len - 1, 0), real_len + 8, 2**31, 2**32,
                         2**40, 2**63, 2**64 - 1]),
        st.integers(0, 2**64 - 1),
    )


raw_text = st.one_of(
    st.text(max_size=24).map(lambda s: s.encode()),
    st.binary(max_size=24),                                  # mostly invalid UTF-8
    st.sampled_from([b"", b"\n", b"a\nb", b"\r", b"\xff\xfe", b"x" * 1024, b"x" * 1025, "é\u2028".encode(),
                     b"\x00" * 1024, b"y" * 20000]),   # names at and over the cap; a value longer than any message
)


EDGE_INTS = (0, 1, 2, 3, 4, 7, 8, 16, 64, 128, 384, 1024, 4096, 2**16, 2**20, 2**22, 2**24 + 1,
             2**31, 2**32 - 1, -1, -2, 2**40, 2**63 - 1)


def int_for(vtype: int):
    lo, hi = INT_RANGE[vtype]
    edges = sorted({x for x in EDGE_INTS + (lo, hi) if lo <= x <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


floats = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-5, 1e-30, 1e30, 1e300, math.inf, -math.inf, math.nan,
                     2.0, 0.5, 1e6, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def enc_scalar(vtype: int, value) -> bytes:
    if vtype == F32:
        try:
            return struct.pack("<f", value)
        except OverflowError:
            return struct.pack("<f", math.inf if value > 0 else -math.inf)
    return struct.pack(SCALAR_FMT[vtype], value)


@st.composite
def scalar_value(draw, vtype: int | None = None) -> tuple[int, bytes]:
    vtype = draw(st.sampled_from(sorted(SCALAR_FMT))) if vtype is None else vtype
    value = draw(floats) if vtype in (F32, F64) else draw(int_for(vtype))
    return vtype, enc_scalar(vtype, value)


@st.composite
def string_value(draw) -> tuple[int, bytes]:
    b = draw(st.one_of(raw_text, st.sampled_from([a.encode() for a in SUPPORTED_ARCHS + ("mixtral",)]),
                       st.sampled_from([b"linear", b"none", b"yarn", b""])))
    return STRING, enc_str(b, draw(lie(len(b))))


@st.composite
def array_value(draw) -> tuple[int, bytes]:
    item = draw(st.one_of(st.sampled_from(sorted(SCALAR_FMT) + [STRING, STRING]),
                          st.sampled_from([ARRAY, 13, 99, 2**32 - 1])))
    n = draw(st.integers(0, 6))
    if item in SCALAR_FMT:
        shared = draw(scalar_value(item))[1]
        body = b"".join(shared if draw(st.booleans()) else draw(scalar_value(item))[1] for _ in range(n))
    elif item == STRING:
        body = b"".join(draw(string_value())[1] for _ in range(n))
    elif item == ARRAY:
        body = b"".join(draw(array_value())[1] for _ in range(n))
    else:
        body = draw(st.binary(max_size=16))
    count = draw(lie(n))
    return ARRAY, struct.pack("<IQ", item, n if count is None else count) + body


@st.composite
def any_value(draw) -> tuple[int, bytes]:
    return draw(st.one_of(
        scalar_value(), scalar_value(U32), scalar_value(F32), string_value(), array_value(),
        st.tuples(st.sampled_from([13, 14, 99, 2**31, 2**32 - 1]), st.binary(max_size=8)),
    ))


@st.composite
def mutate_kvs(draw, parts: Parts) -> Parts:
    kvs = list(parts.kvs)
    arch = next(kv.payload[8:] for kv in kvs if kv.key == b"general.architecture")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "set", "set", "delete", "retype", "dup", "rekey", "keylen"]))
        i = draw(st.integers(0, len(kvs) - 1)) if kvs else None
        if op == "set":
            key = draw(st.one_of(
                st.sampled_from([arch + b"." + k.encode() for k in CONFIG_KEYS]),
                st.sampled_from([k.encode() for k in GENERAL_KEYS]),
                st.sampled_from([kv.key for kv in kvs] or [b"x"]),
            ))
            if key == b"general.architecture" and draw(st.booleans()):
                value = (STRING, enc_str(draw(st.sampled_from(SUPPORTED_ARCHS + ("mixtral", "gpt2"))).encode()))
            else:
                value = draw(any_value())
            new = KV(key, *value)
            hits = [j for j, kv in enumerate(kvs) if kv.key == key]
            if hits:
                kvs[hits[0]] = new
            else:
                kvs.insert(draw(st.integers(0, len(kvs))), new)
        elif i is None:
            continue
        elif op == "delete":
            del kvs[i]
        elif op == "retype":
            kvs[i] = replace(kvs[i], vtype=draw(st.sampled_from([*range(15), 99, 2**32 - 1])))
        elif op == "dup":
            kvs.insert(draw(st.integers(0, len(kvs))), kvs[i])
        elif op == "rekey":
            kvs[i] = replace(kvs[i], key=draw(raw_text))
        elif op == "keylen":
            kvs[i] = replace(kvs[i], key_len=draw(lie(len(kvs[i].key))))
    return replace(parts, kvs=tuple(kvs))


dim_values = st.one_of(
    st.sampled_from([0, 1, 2, 16, 31, 32, 33, 64, 128, 256, 384, 2**31, 2**32, 2**40, 2**40 + 1,
                     2**63, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)


@st.composite
def mutate_infos(draw, parts: Parts) -> Parts:
    infos = list(parts.infos)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["n_dims", "dim", "dim", "type", "type", "offset", "offset",
                                   "name", "swap_names", "delete", "dup", "resize"]))
        i = draw(st.integers(0, len(infos) - 1)) if infos else None
        if i is None:
            break
        t = infos[i]
        if op == "n_dims":
            infos[i] = replace(t, n_dims=draw(st.sampled_from([0, 1, 2, 3, 4, 5, 2**31, 2**32 - 1])))
        elif op == "resize":   # a consistent n_dims with more or fewer dims
            nd = draw(st.integers(1, 4))
            infos[i] = replace(t, dims=(t.dims + (1, 1, 1, 1))[:nd])
        elif op == "dim":
            k = draw(st.integers(0, len(t.dims) - 1))
            infos[i] = replace(t, dims=t.dims[:k] + (draw(dim_values),) + t.dims[k + 1:])
        elif op == "type":
            infos[i] = replace(t, ggml_type=draw(st.sampled_from(TYPE_IDS)))
        elif op == "offset":
            infos[i] = replace(t, offset=draw(st.one_of(
                st.sampled_from([0, 1, 3, 31, 32, 64, parts.data_len, parts.data_len - 32,
                                 parts.data_len + 32, 2**63, 2**64 - 32, 2**64 - 1]),
                st.integers(0, 2**64 - 1),
                st.sampled_from([u.offset for u in infos]),
            )))
        elif op == "name":
            infos[i] = replace(t, name=draw(st.one_of(raw_text, st.sampled_from([u.name for u in infos]))),
                               name_len=draw(lie(len(t.name))))
        elif op == "swap_names":
            j = draw(st.integers(0, len(infos) - 1))
            infos[i], infos[j] = replace(t, name=infos[j].name), replace(infos[j], name=t.name)
        elif op == "delete":
            del infos[i]
        elif op == "dup":
            infos.insert(draw(st.integers(0, len(infos))), t)
    return replace(parts, infos=tuple(infos))


@st.composite
def plausible_value(draw) -> tuple[int, bytes]:
    """Honestly encoded values of the types real files use for config keys."""
    kind = draw(st.sampled_from(["int", "int", "float", "string", "array", "other"]))
    if kind == "int":
        return draw(scalar_value(draw(st.sampled_from([U32, U32, I32, U64, I64, U16, U8]))))
    if kind == "float":
        return draw(scalar_value(draw(st.sampled_from([F32, F64]))))
    if kind == "string":
        b = draw(st.one_of(st.sampled_from([a.encode() for a in SUPPORTED_ARCHS] + [b"linear", b"none", b""]),
                           st.sampled_from([b"a\nb", b"y" * 20000]), raw_text))
        return STRING, enc_str(b)
    if kind == "array":   # per-layer values: the same one repeated, or a few different ones
        item = draw(st.sampled_from([U32, I32, F32, STRING, BOOL]))
        n = draw(st.integers(0, 4))
        same = draw(st.booleans())
        one = draw(scalar_value(item) if item != STRING else string_value())[1]
        body = b"".join(one if same else draw(scalar_value(item) if item != STRING else string_value())[1]
                        for _ in range(n))
        return ARRAY, struct.pack("<IQ", item, n) + body
    return draw(scalar_value(BOOL))


@st.composite
def config_mutation(draw, parts: Parts) -> Parts:
    """Well-formed files whose config values (and sometimes tensor shapes) change: what
    config_from_gguf has to judge."""
    kvs = list(parts.kvs)
    arch = next(kv.payload[8:] for kv in kvs if kv.key == b"general.architecture")
    if draw(st.integers(0, 3)) == 0:   # another architecture's reading of the same keys
        arch = draw(st.sampled_from([a.encode() for a in SUPPORTED_ARCHS] + [b"mixtral", b"a\nb"]))
        kvs = [kv if kv.key != b"general.architecture" else KV(kv.key, STRING, enc_str(arch)) for kv in kvs]
        if draw(st.booleans()):
            old = next(kv.key.split(b".")[0] for kv in parts.kvs if kv.key.endswith(b".block_count"))
            kvs = [replace(kv, key=arch + kv.key[len(old):]) if kv.key.startswith(old + b".") else kv
                   for kv in kvs]
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.one_of(st.sampled_from([arch + b"." + k.encode() for k in CONFIG_KEYS]),
                             st.sampled_from([k.encode() for k in GENERAL_KEYS])))
        if draw(st.integers(0, 4)) == 0:
            kvs = [kv for kv in kvs if kv.key != key]
            continue
        new = KV(key, *draw(plausible_value()))
        hits = [j for j, kv in enumerate(kvs) if kv.key == key]
        if hits:
            kvs[hits[0]] = new
        else:
            kvs.append(new)
    parts = replace(parts, kvs=tuple(kvs))
    if draw(st.booleans()):
        infos = list(parts.infos)
        for _ in range(draw(st.integers(1, 2))):
            i = draw(st.integers(0, len(infos) - 1))
            t = infos[i]
            op = draw(st.sampled_from(["dim", "delete", "swap_names"]))
            if op == "dim":
                k = draw(st.integers(0, len(t.dims) - 1))
                d = draw(st.sampled_from([1, 2, 16, 32, 64, 128, 256, 384]))
                infos[i] = replace(t, dims=t.dims[:k] + (d,) + t.dims[k + 1:])
            elif op == "delete":
                del infos[i]
            else:
                j = draw(st.integers(0, len(infos) - 1))
                infos[i], infos[j] = replace(t, name=infos[j].name), replace(infos[j], name=t.name)
        # keep every tensor inside the data section: re-lay the offsets
        off, laid = 0, []
        for t in infos:
            laid.append(replace(t, offset=off))
            off += -(-tensor_bytes(t) // 32) * 32
        parts = replace(parts, infos=tuple(laid), data_len=max(off, 0))
    return parts


def tensor_bytes(t: Info) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    n = math.prod(t.dims)
    return -(-n // block) * size


@st.composite
def mutated_file(draw, bases: dict[str, Parts]) -> bytes:
    parts = bases[draw(st.sampled_from(PRESETS))]
    mode = draw(st.sampled_from(["config", "config", "config", "kvs", "kvs", "infos", "infos", "both",
                                 "header", "raw"]))
    if mode == "config":
        parts = draw(config_mutation(parts))
    if mode in ("kvs", "both", "raw"):
        parts = draw(mutate_kvs(parts))
    if mode in ("infos", "both", "raw"):
        parts = draw(mutate_infos(parts))
    if mode == "header":
        parts = replace(parts, **draw(st.sampled_from([
            {"magic": draw(st.binary(min_size=4, max_size=4))},
            {"version": draw(st.sampled_from([0, 1, 2, 3, 4, 2**24 * 3, 2**32 - 1]))},
            {"tensor_count": len(parts.infos) + draw(st.sampled_from([-1, 1, 2**20, 2**60]))},
            {"kv_count": len(parts.kvs) + draw(st.sampled_from([-1, 1, 2**20, 2**60]))},
            {"data_len": draw(st.sampled_from([0, 31, parts.data_len - 1, parts.data_len + 1]))},
        ])))
    raw = parts.serialize()
    if mode == "raw":
        if draw(st.booleans()):
            raw = raw[:len(raw) - draw(st.integers(0, len(raw)))]
        buf = bytearray(raw)
        for _ in range(draw(st.integers(0, 4))):
            if len(buf) > 24:
                buf[draw(st.integers(24, len(buf) - 1))] = draw(st.integers(0, 255))
        raw = bytes(buf)
    return raw


# --- the property --------------------------------------------------------------------------------

class Hang(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` in the reader swallows it."""


@contextmanager
def alarm(seconds: float):
    def ring(signum, frame):
        raise Hang(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_input(raw: bytes, path: Path) -> str:
    """Load raw as a model file; assert the property. Returns 'loaded' or the error message."""
    path.write_bytes(raw)
    tracemalloc.start()
    # the parser's own CPU time, not the wall clock: CI runs test files on two processes (and the
    # kernel build's nvcc jobs beside them), and a case then waited for a core (1.12 s of wall time)
    started = time.process_time()
    try:
        with alarm(ALARM_S):
            try:
                g = open_gguf(path)
                config_from_gguf(g)
                outcome = "loaded"
                del g
            except (ModelFormatError, UnsupportedModelError) as e:
                outcome = str(e)
                assert outcome, f"{type(e).__name__} with an empty message"
                assert "\n" not in outcome and "\r" not in outcome, f"message is not one line: {outcome!r}"
                assert "unreadable GGUF (" not in outcome, f"a parser bug reached the user: {outcome}"
                # a message that quotes a value (a string or array as long as the file) quotes it short
                assert len(outcome) <= MAX_MESSAGE, f"{len(outcome)}-char message: {outcome[:200]}..."
        elapsed = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        path.unlink(missing_ok=True)
    assert elapsed < CASE_LIMIT_S, f"took {elapsed:.2f} s of CPU: {outcome}"
    assert peak < PEAK_LIMIT, f"peak allocation {peak} bytes for a {len(raw)}-byte file: {outcome}"
    return outcome


def save_to_corpus(raw: bytes) -> Path:
    CORPUS.mkdir(exist_ok=True)
    out = CORPUS / f"{hashlib.sha256(raw).hexdigest()[:16]}.gguf.gz"
    out.write_bytes(gzip.compress(raw, mtime=0))
    return out


STATS = {"cases": 0, "loaded": 0, "rejected": 0}


def test_fuzz_open_and_config(bases, tmp_path):
    path = tmp_path / "fuzz.gguf"
    last_failure: list[bytes] = []

    search_seed = os.environ.get("MEMRA_FUZZ_SEED")

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=search_seed is None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much], print_blob=False)
    @given(raw=mutated_file(bases))
    def run(raw: bytes) -> None:
        STATS["cases"] += 1
        try:
            outcome = check_input(raw, path)
        except BaseException:
            last_failure[:] = [raw]
            raise
        STATS["loaded" if outcome == "loaded" else "rejected"] += 1

    if search_seed is not None:
        run = seed(int(search_seed))(run)
    started = time.perf_counter()
    try:
        run()
    except BaseException:
        if last_failure and os.environ.get("MEMRA_FUZZ_SAVE"):
            print(f"\nminimized failing input saved to {save_to_corpus(last_failure[0])}")
        raise
    finally:
        print(f"\nfuzz: {STATS['cases']} cases ({STATS['loaded']} loaded, {STATS['rejected']} rejected) "
              f"in {time.perf_counter() - started:.1f} s")
    # The mutations must reach past the header: both outcomes happen often.
    assert STATS["loaded"] > EXAMPLES // 50 and STATS["rejected"] > EXAMPLES // 5, STATS


def test_the_unmutated_bases_load(bases, tmp_path):
    for parts in bases.values():
        assert check_input(parts.serialize(), tmp_path / "base.gguf") == "loaded"


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.gguf.gz")) or ["(empty)"])
def test_corpus_input(name, tmp_path):
    """Every input that ever failed still satisfies the property."""
    if name == "(empty)":
        pytest.skip("tests/fuzz_corpus/ is empty")
    raw = gzip.decompress((CORPUS / name).read_bytes())
    check_input(raw, tmp_path / "corpus.gguf")
