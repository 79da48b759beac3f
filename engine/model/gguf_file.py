"""Open a GGUF file: validate every header field, then expose metadata and memory-mapped tensors.

The header is parsed here by a small bounded reader instead of trusting gguf.GGUFReader: every
count, length and dimension is checked against the bytes that remain in the file before anything
is sized from it, so a corrupt or hostile file gives a one-line ModelFormatError, never a huge
allocation, a hang or a traceback. Tensor data is never read at open: each TensorInfo.data is a
view into one np.memmap of the file. Dequantizing goes through gguf.quants, the ground truth for
the ggml block layouts.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize as _gguf_dequantize

from memra_engine.errors import ModelFormatError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4            # GGML_MAX_DIMS
MAX_NAME_BYTES = 1024   # llama.cpp allows 64; leave room, but a name is never megabytes
HEADER_BYTES = 24       # magic, version, tensor_count, kv_count
# Counts above these are corrupt whatever the file size; below them, a count the remaining bytes
# cannot hold means the file was cut short.
MAX_KV_COUNT = 1 << 20
MAX_TENSOR_COUNT = 1 << 20
MAX_ARRAY_LENGTH = 1 << 32
MAX_STRING_BYTES = 1 << 32
MAX_DIM = 1 << 40       # per dimension; whether the bytes exist is checked against the file

# Fixed-size metadata value types: (struct format, size in bytes).
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_SCALAR_DTYPES: dict[int, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
# Types whose data gguf.GGUFReader (and we) expose as typed elements; all others as raw bytes.
_ELEMENT_DTYPES: dict[GGMLQuantizationType, type[np.generic]] = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
_KNOWN_TYPE_IDS = {int(t) for t in GGMLQuantizationType}
_OUR_ERRORS = (ModelFormatError, UnsupportedModelError)


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """One tensor as stored: numpy-order shape, ggml type, and a zero-copy view of its bytes."""

    name: str
    shape: tuple[int, ...]          # numpy order (rows, cols) = reversed ggml ne
    ggml_type: GGMLQuantizationType
    data: np.ndarray                # memmap view: typed for F32/F16/ints, else uint8 (rows, row_bytes)
    offset: int = 0                 # absolute byte offset of the data in the file

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(eq=False)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    version: int
    alignment: int
    data_offset: int                # absolute offset of the tensor data section
    file_size: int
    mmap: np.ndarray                # the one np.memmap every TensorInfo.data views
    # GGUF value type of each metadata key, and of the items for arrays (None otherwise),
    # so a writer can copy keys exactly (e.g. the synthetic generator's --tokenizer-from).
    metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = field(default_factory=dict)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


def dequantize(t: TensorInfo) -> np.ndarray:
    """float32 array of shape t.shape, decoded by gguf.quants (the ggml reference layouts)."""
    try:
        values = _gguf_dequantize(t.data, t.ggml_type)
    except NotImplementedError:
        raise UnsupportedModelError(
            f"tensor {t.name!r}: quant type {t.ggml_type.name} cannot be dequantized"
        ) from None
    except (ValueError, TypeError, OSError) as e:   # e.g. an I/O error reading the mapped file
        raise ModelFormatError(f"tensor {t.name!r}: cannot dequantize ({e})") from None
    return np.asarray(values, dtype=np.float32).reshape(t.shape)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Validate and memory-map a GGUF file. Raises ModelFormatError / UnsupportedModelError."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ModelFormatError(f"{path}: is a directory, not a GGUF file")
        size = path.stat().st_size
        if not path.is_file():
            raise ModelFormatError(f"{path}: not a regular file")
        if size < HEADER_BYTES:
            # np.memmap cannot map an empty file; report it like any other truncation.
            raise ModelFormatError(
                f"{path.name}: truncated at byte {size} while reading the header (file is {size} bytes)"
            )
        # Opened once, here, so that an unreadable file is told apart from a bad one.
        f = open(path, "rb")
        try:
            mm = np.memmap(f, dtype=np.uint8, mode="r")
        except BaseException:
            f.close()
            raise
    except _OUR_ERRORS:
        raise
    except PermissionError:
        raise ModelFormatError(f"{path}: permission denied") from None
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        # The header is parsed from a plain mmap: slicing it yields bytes, which decode ~5x faster
        # than memoryview slices of the np.memmap (a vocabulary is 10^5 strings).
        with f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as header:
            return _HeaderParser(path, mm, header).parse()
    except _OUR_ERRORS:
        raise
    except Exception as e:  # a bug in our parser must still reach the user as one line
        raise ModelFormatError(f"{path.name}: unreadable GGUF ({type(e).__name__}: {e})") from None


class _HeaderParser:
    """Reads the GGUF header with a cursor; every read is bounds-checked against the file size."""

    def __init__(self, path: Path, mm: np.ndarray, header: mmap.mmap):
        self.metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        self.path = path
        self.mm = mm
        self.buf = header
        self.size = len(mm)
        self.pos = 0
        self.where = "the header"   # what we are reading, for error messages

    # --- errors -------------------------------------------------------------------------------
    def fail(self, problem: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path.name}: {problem}")

    def truncated(self) -> ModelFormatError:
        return self.fail(f"truncated at byte {self.size} while reading {self.where} (file is {self.size} bytes)")

    # --- bounded primitive reads ---------------------------------------------------------------
    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int) -> None:
        if n > self.remaining():
            raise self.truncated()

    def check_count(self, count: int, what: str, cap: int, min_item_bytes: int) -> None:
        """A count read from the file, before anything is sized or looped over by it."""
        if count > cap:
            raise self.fail(f"{what} {count} is absurd (max {cap}) in {self.where}")
        if count * min_item_bytes > self.remaining():
            raise self.fail(
                f"truncated at byte {self.size} while reading {self.where}: {what} {count} needs at "
                f"least {count * min_item_bytes} more bytes, {self.remaining()} remain"
            )

    def scalar(self, fmt: str, n: int) -> Any:
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self) -> int:
        return self.scalar("<I", 4)

    def u64(self) -> int:
        return self.scalar("<Q", 8)

    def string(self, max_len: int | None = None, strict: bool = False) -> str:
        n = self.u64()
        if n > (max_len or MAX_STRING_BYTES):
            raise self.fail(f"string length {n} is absurd (max {max_len or MAX_STRING_BYTES}) in {self.where}")
        self.need(n)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            if strict:
                raise self.fail(f"{self.where} is not valid UTF-8") from None
            return raw.decode("utf-8", errors="replace")

    # --- sections ------------------------------------------------------------------------------
    def parse(self) -> GGUFFile:
        magic = self.buf[0:4]
        if magic != GGUF_MAGIC:
            raise self.fail(f"bad magic {magic!r} (not a GGUF file)")
        self.pos = 4
        version = self.u32()
        if version not in SUPPORTED_VERSIONS:
            if struct.unpack(">I", struct.pack("<I", version))[0] in SUPPORTED_VERSIONS:
                raise UnsupportedModelError(f"{self.path.name}: big-endian GGUF files are not supported")
            raise UnsupportedModelError(
                f"{self.path.name}: unsupported GGUF version {version} (supported: 2, 3)"
            )
        tensor_count = self.u64()
        kv_count = self.u64()
        # Smallest possible entries bound the counts: a kv is key length + type + 1 byte value,
        # a tensor info is name length + n_dims + one dim + type + offset.
        self.check_count(kv_count, "metadata count", MAX_KV_COUNT, 8 + 4 + 1)
        self.check_count(tensor_count, "tensor count", MAX_TENSOR_COUNT, 8 + 4 + 8 + 4 + 8)

        metadata = self.read_metadata(kv_count)
        alignment = self.read_alignment(metadata)
        raw_infos = [self.read_tensor_info(i) for i in range(tensor_count)]
        data_offset = -(-self.pos // alignment) * alignment
        tensors = self.build_tensors(raw_infos, data_offset, alignment)
        return GGUFFile(
            path=self.path, metadata=metadata, tensors=tensors, version=version,
            alignment=alignment, data_offset=data_offset, file_size=self.size, mmap=self.mm,
            metadata_types=self.metadata_types,
        )

    def read_metadata(self, kv_count: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for i in range(kv_count):
            self.where = f"metadata key {i}"
            key = self.string(MAX_NAME_BYTES, strict=True)
            self.where = f"metadata {key!r}"
            if key in metadata:
                raise self.fail(f"duplicate metadata key {key!r}")
            value_type = self.u32()
            metadata[key] = self.read_value(value_type, key)
            self.metadata_types[key] = (GGUFValueType(value_type), self.last_item_type)
        return metadata

    def read_value(self, value_type: int, key: str) -> Any:
        self.last_item_type = None
        if value_type in _SCALARS:
            fmt, n = _SCALARS[value_type]
            return self.scalar(fmt, n)
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type == GGUFValueType.ARRAY:
            return self.read_array(key)
        raise self.fail(f"metadata {key!r} has unknown value type {value_type}")

    def read_array(self, key: str) -> list[Any]:
        item_type = self.u32()
        count = self.u64()
        if item_type in _SCALARS or item_type == GGUFValueType.STRING:
            self.last_item_type = GGUFValueType(item_type)
        if item_type == GGUFValueType.STRING:
            self.check_count(count, "array length", MAX_ARRAY_LENGTH, 8)
            return self.read_string_array(count)
        if item_type in _SCALARS:
            item_size = _SCALARS[item_type][1]
            self.check_count(count, "array length", MAX_ARRAY_LENGTH, item_size)
            raw = self.buf[self.pos:self.pos + count * item_size]   # bytes: no export pins the mmap
            self.pos += count * item_size
            values = np.frombuffer(raw, dtype=_SCALAR_DTYPES[item_type])
            return (values.astype(bool) if item_type == GGUFValueType.BOOL else values).tolist()
        if item_type == GGUFValueType.ARRAY:
            raise self.fail(f"metadata {key!r}: nested arrays are not supported")
        raise self.fail(f"metadata {key!r}: array of unknown value type {item_type}")

    def read_string_array(self, count: int) -> list[str]:
        """string() unrolled: a vocabulary is 10^5 strings and opening must stay well under 1 s."""
        buf, pos, size = self.buf, self.pos, self.size
        unpack_u64 = struct.Struct("<Q").unpack_from
        out: list[str] = [""] * count
        for i in range(count):
            if pos + 8 > size:
                raise self.truncated()
            (n,) = unpack_u64(buf, pos)
            pos += 8
            if n > size - pos:
                raise self.truncated()
            out[i] = buf[pos:pos + n].decode("utf-8", "replace")
            pos += n
        self.pos = pos
        return out

    def read_alignment(self, metadata: dict[str, Any]) -> int:
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
                or alignment & (alignment - 1) or alignment > 1 << 20:
            shown = repr(alignment) if len(repr(alignment)) <= 80 else repr(alignment)[:80] + "…"
            raise self.fail(f"general.alignment {shown} is not a power of two")
        return alignment

    def read_tensor_info(self, index: int) -> tuple[str, tuple[int, ...], int, int]:
        self.where = f"tensor info {index}"
        name = self.string(MAX_NAME_BYTES, strict=True)
        self.where = f"tensor info {index} ({name!r})"
        n_dims = self.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions (must be 1..{MAX_DIMS})")
        ne = tuple(self.u64() for _ in range(n_dims))
        type_id = self.u32()
        offset = self.u64()
        for d in ne:
            if d == 0 or d > MAX_DIM:
                raise self.fail(f"tensor {name!r} has absurd dimension {d} (ne={list(ne)})")
        return name, ne, type_id, offset

    def build_tensors(self, raw_infos, data_offset: int, alignment: int) -> dict[str, TensorInfo]:
        tensors: dict[str, TensorInfo] = {}
        for name, ne, type_id, rel_offset in raw_infos:
            if name in tensors:
                raise self.fail(f"duplicate tensor name {name!r}")
            if type_id not in _KNOWN_TYPE_IDS:
                raise UnsupportedModelError(
                    f"{self.path.name}: tensor {name!r} has unknown ggml quant type id {type_id}"
                )
            ggml_type = GGMLQuantizationType(type_id)
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
            if ne[0] % block_size:
                raise self.fail(
                    f"tensor {name!r}: row length {ne[0]} is not a multiple of the "
                    f"{ggml_type.name} block size {block_size}"
                )
            n_elements = 1
            for d in ne:
                n_elements *= d
            n_bytes = n_elements // block_size * type_size
            if rel_offset % alignment:
                raise self.fail(f"tensor {name!r}: data offset {rel_offset} is not {alignment}-byte aligned")
            start = data_offset + rel_offset
            end = start + n_bytes
            if end > self.size:
                raise self.fail(
                    f"truncated: tensor {name!r} needs bytes {start}..{end} but the file is {self.size} bytes"
                )
            shape = tuple(reversed(ne))
            if ggml_type in _ELEMENT_DTYPES:
                data = self.mm[start:end].view(_ELEMENT_DTYPES[ggml_type]).reshape(shape)
            else:
                row_bytes = ne[0] // block_size * type_size
                data = self.mm[start:end].reshape(*shape[:-1], row_bytes)
            tensors[name] = TensorInfo(name=name, shape=shape, ggml_type=ggml_type, data=data, offset=start)
        return tensors
