"""Corrupt GGUF files: each gives a one-line ModelFormatError / UnsupportedModelError naming the
problem, fast, and never a crash, a hang or a huge allocation.

Every corrupt file is a mutation of a tiny synthetic model written into tmp_path.
"""
from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest

from memra_engine.errors import ModelFormatError, UnsupportedModelError
from memra_engine.model.gguf_file import open_gguf
from memra_engine.model.synthetic import write_synthetic_gguf

OPEN_LIMIT_S = 1.0


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[bytes, dict[str, int]]:
    """A valid tiny model's bytes, and the offsets of the fields the tests corrupt."""
    path = write_synthetic_gguf(tmp_path_factory.mktemp("good") / "good.gguf", preset="tiny-llama")
    raw = path.read_bytes()
    g = open_gguf(path)

    def string_at(text: str) -> int:
        at = raw.find(struct.pack("<Q", len(text)) + text.encode())
        assert at > 0, text
        return at

    first_key = 24
    tokens_key = string_at("tokenizer.ggml.tokens")
    infos = string_at("token_embd.weight")        # the first tensor info
    embd_n_dims = infos + 8 + len("token_embd.weight")
    offsets = {
        "first_key": first_key,
        "tokens_key": tokens_key,
        # key, value type (ARRAY), item type (STRING), then the array length
        "tokens_count": tokens_key + 8 + len("tokenizer.ggml.tokens") + 4 + 4,
        "tokens_value_type": tokens_key + 8 + len("tokenizer.ggml.tokens"),
        "infos": infos,
        "embd_n_dims": embd_n_dims,
        "embd_ne0": embd_n_dims + 4,
        "embd_type": embd_n_dims + 4 + 2 * 8,
        "embd_offset": embd_n_dims + 4 + 2 * 8 + 4,
        "q_name": string_at("blk.0.attn_q.weight") + 8,
        "ffn_up_name": string_at("blk.1.ffn_up.weight") + 8,
        "data": g.data_offset,
    }
    assert struct.unpack_from("<I", raw, offsets["embd_n_dims"])[0] == 2
    assert struct.unpack_from("<Q", raw, offsets["embd_ne0"])[0] == 64
    return raw, offsets


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    return path


def patched(raw: bytes, offset: int, fmt: str, value) -> bytes:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


def open_fails(path: Path, error=ModelFormatError) -> str:
    """Opening raises `error` within the time limit; returns its one-line message."""
    started = time.perf_counter()
    with pytest.raises(error) as info:
        open_gguf(path)
    elapsed = time.perf_counter() - started
    message = str(info.value)
    assert elapsed < OPEN_LIMIT_S, f"took {elapsed:.2f} s: {message}"
    assert message and "\n" not in message
    return message


def test_the_untouched_file_opens(good, tmp_path):
    raw, _ = good
    g = open_gguf(write(tmp_path, raw))
    assert g.metadata["general.architecture"] == "llama" and len(g.tensors) == 21


@pytest.mark.parametrize("where", [
    "empty", "in magic", "in header counts", "in first key", "in kv section", "in token array",
    "in tensor infos", "in last tensor info", "in data", "last byte",
])
def test_truncated_file(where, good, tmp_path):
    raw, at = good
    cut = {
        "empty": 0, "in magic": 3, "in header counts": 17, "in first key": at["first_key"] + 12,
        "in kv section": at["tokens_key"] - 5, "in token array": at["tokens_count"] + 900,
        "in tensor infos": at["infos"] + 30, "in last tensor info": at["data"] - 40,
        "in data": at["data"] + 1000, "last byte": len(raw) - 1,
    }[where]
    message = open_fails(write(tmp_path, raw[:cut]))
    assert "truncated" in message and "model.gguf" in message
    assert str(cut) in message   # names where the file ends


def test_truncation_names_the_section(good, tmp_path):
    raw, at = good
    assert "tensor info 0" in open_fails(write(tmp_path, raw[:at["infos"] + 30]))
    assert "'tokenizer.ggml.tokens'" in open_fails(write(tmp_path, raw[:at["tokens_count"] + 900]))
    assert "'output.weight'" in open_fails(write(tmp_path, raw[:len(raw) - 1]))


def test_bad_magic(good, tmp_path):
    raw, _ = good
    message = open_fails(write(tmp_path, b"GGUX" + raw[4:]))
    assert "bad magic b'GGUX'" in message and "not a GGUF file" in message


def test_not_a_gguf_at_all(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("this is a text file, not a model\n" * 10)
    assert "bad magic" in open_fails(text)


@pytest.mark.parametrize("version", [1, 9, 0xFFFFFFFF])
def test_unsupported_version(version, good, tmp_path):
    raw, _ = good
    message = open_fails(write(tmp_path, patched(raw, 4, "<I", version)), UnsupportedModelError)
    assert f"unsupported GGUF version {version}" in message


def test_big_endian_file_is_named(good, tmp_path):
    raw, _ = good
    message = open_fails(write(tmp_path, patched(raw, 4, ">I", 3)), UnsupportedModelError)
    assert "big-endian" in message


@pytest.mark.parametrize("field, offset, fmt, expected", [
    ("tensor count", 8, "<Q", "tensor count 1152921504606846976 is absurd"),
    ("kv count", 16, "<Q", "metadata count 1152921504606846976 is absurd"),
    ("key length", 24, "<Q", "string length 1152921504606846976 is absurd"),
    ("token array length", "tokens_count", "<Q", "array length 1152921504606846976 is absurd"),
    ("dimension", "embd_ne0", "<Q", "absurd dimension 1152921504606846976"),
    ("tensor offset", "embd_offset", "<Q", "needs bytes"),
])
def test_count_or_size_set_to_2_pow_60(field, offset, fmt, expected, good, tmp_path):
    raw, at = good
    offset = at[offset] if isinstance(offset, str) else offset
    message = open_fails(write(tmp_path, patched(raw, offset, fmt, 2**60)))
    assert expected in message, field


@pytest.mark.parametrize("n_dims", [0, 5, 2**31])
def test_absurd_n_dims(n_dims, good, tmp_path):
    raw, at = good
    message = open_fails(write(tmp_path, patched(raw, at["embd_n_dims"], "<I", n_dims)))
    assert f"'token_embd.weight' has {n_dims} dimensions" in message


def test_unknown_quant_type_names_type_and_tensor(good, tmp_path):
    raw, at = good
    message = open_fails(write(tmp_path, patched(raw, at["embd_type"], "<I", 200)), UnsupportedModelError)
    assert "unknown ggml quant type id 200" in message and "'token_embd.weight'" in message


def test_row_not_a_whole_number_of_blocks(good, tmp_path):
    raw, at = good
    message = open_fails(write(tmp_path, patched(raw, at["embd_ne0"], "<Q", 63)))
    assert "row length 63 is not a multiple of the Q8_0 block size 32" in message


def test_misaligned_tensor_offset(good, tmp_path):
    raw, at = good
    message = open_fails(write(tmp_path, patched(raw, at["embd_offset"], "<Q", 3)))
    assert "not 32-byte aligned" in message


def test_unknown_metadata_value_type(good, tmp_path):
    raw, at = good
    message = open_fails(write(tmp_path, patched(raw, at["tokens_value_type"], "<I", 99)))
    assert "'tokenizer.ggml.tokens' has unknown value type 99" in message


def test_duplicate_tensor_name(good, tmp_path):
    raw, at = good
    renamed = raw[:at["q_name"]] + b"blk.0.attn_k.weight" + raw[at["q_name"] + 19:]
    assert "duplicate tensor name 'blk.0.attn_k.weight'" in open_fails(write(tmp_path, renamed))


def test_missing_and_unreadable_paths(tmp_path):
    assert "cannot open" in open_fails(tmp_path / "absent.gguf")
    assert open_fails(tmp_path) == f"{tmp_path}: is a directory, not a GGUF file"


def test_unreadable_file_says_permission_denied(good, tmp_path, monkeypatch):
    """Tests run as root here, where chmod 000 still reads: an open() of the model that raises
    PermissionError stands in for it (whichever open the reader calls, builtin or numpy's)."""
    import builtins

    raw, _ = good
    path = write(tmp_path, raw)
    real_open = builtins.open

    def denying_open(file, *args, **kwargs):
        if not isinstance(file, int) and Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denying_open)
    assert open_fails(path) == f"{path}: permission denied"


def test_chmod_000_file_says_permission_denied(good, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads a chmod 000 file (test_unreadable_file_says_permission_denied mocks it)")
    raw, _ = good
    path = write(tmp_path, raw)
    path.chmod(0)
    try:
        assert open_fails(path) == f"{path}: permission denied"
    finally:
        path.chmod(0o644)


def test_missing_required_tensor_is_reported_by_the_config(good, tmp_path):
    from memra_engine.model.config import config_from_gguf

    raw, at = good
    # Same length, so the file stays structurally valid; only the tensor set changes.
    renamed = raw[:at["ffn_up_name"]] + b"blk.1.ffn_xx.weight" + raw[at["ffn_up_name"] + 19:]
    g = open_gguf(write(tmp_path, renamed))
    with pytest.raises(ModelFormatError, match="missing tensor 'blk.1.ffn_up.weight'"):
        config_from_gguf(g)


def test_random_header_corruption_never_escapes_as_another_exception(good, tmp_path):
    """300 files, each with a few random bytes of the header overwritten: each either opens or
    raises one of our two errors, quickly."""
    raw, at = good
    rng = np.random.default_rng(1234)
    outcomes = {"opened": 0, "rejected": 0}
    for trial in range(300):
        buf = bytearray(raw)
        for pos in rng.integers(4, at["data"], size=rng.integers(1, 4)):
            buf[pos] = int(rng.integers(0, 256))
        path = tmp_path / f"fuzz{trial}.gguf"
        path.write_bytes(bytes(buf))
        started = time.perf_counter()
        try:
            open_gguf(path)
            outcomes["opened"] += 1
        except (ModelFormatError, UnsupportedModelError) as e:
            assert "\n" not in str(e)
            outcomes["rejected"] += 1
        assert time.perf_counter() - started < OPEN_LIMIT_S
        path.unlink()
    # Most flips land in token strings and still open; some must hit lengths and types.
    assert outcomes["rejected"] > 10 and outcomes["opened"] > 10, outcomes
