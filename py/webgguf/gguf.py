"""GGUF reader: header, typed metadata, tensor infos and alignment, parsed strictly and within bounds.

Pure Python (it runs in Pyodide). The parser works on any prefix of the file: the browser parses the
header while the rest of the file is still arriving, and GGUFIncomplete.needed says how long a prefix
it must wait for. Every count and length read from the file is checked against the bytes the file can
hold before anything is allocated, so a malformed file gets one GGUFError naming the field and its
byte offset: never a hang, a crash or an allocation the file size does not justify.

File layout (little-endian; versions 2 and 3 share it):
  magic "GGUF" | version u32 | tensor count u64 | metadata count u64
  metadata:     key string | value type u32 | value
  tensor infos: name string | n_dims u32 | dims u64[n_dims] | ggml type u32 | offset u64
  padding up to `general.alignment` | tensor data (tensor i starts at data_offset + its offset)
  string = length u64 + UTF-8 bytes; array = element type u32 + count u64 + elements

Why one module of ~500 lines: the format's every bound check lives beside the field it guards, in the
order of the file; the fuzz target (fuzz/) and the malformed-file tests read it as one parser.
"""

import os
import struct
from dataclasses import dataclass, replace
from enum import IntEnum
from itertools import pairwise
from pathlib import Path
from typing import Any

from webgguf.quants import GGML_TYPES, GGMLType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml tensors have at most 4 dimensions
MAX_ARRAY_DEPTH = 16  # nested arrays deeper than this are rejected (bounds the parser's recursion)
INT64_MAX = (1 << 63) - 1


class GGUFError(ValueError):
    """The file is not a valid GGUF file; the message names the field and its byte offset."""


class GGUFIncomplete(GGUFError):
    """The bytes given are a prefix of the file too short to hold the header.

    `needed` is the total prefix length required to continue parsing (a lower bound: parsing a
    longer prefix may ask for more again).
    """

    def __init__(self, needed: int, message: str):
        super().__init__(message)
        self.needed = needed


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# A metadata value's type: a GGUFValueType for scalars, (ARRAY, element type) for arrays.
# For nested arrays the element type is ARRAY; the inner arrays' own element types are not kept.
ValueTypeInfo = GGUFValueType | tuple[GGUFValueType, GGUFValueType]


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous (row) dimension
    type: GGMLType
    offset: int  # absolute file offset of the tensor's data (of a split model: see GGUFHeader.shards)
    nbytes: int
    n_elements: int


@dataclass(frozen=True)
class Shard:
    """One file of a split model (gguf_split.py) as laid out in the model's byte sequence."""

    name: str
    base: int  # where the file's bytes start in the sequence (the sizes of the files before it)
    size: int
    n_tensors: int


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # file order; values are int, float, bool, str or (nested) lists
    metadata_types: dict[str, ValueTypeInfo]
    tensors: dict[str, TensorInfo]  # file order
    alignment: int
    data_offset: int  # end of the tensor infos, padded to `alignment`
    # A split model's files (gguf_split.merge: then tensor offsets are offsets in the files laid end to
    # end); empty for a model of one file.
    shards: tuple[Shard, ...] = ()


_T = GGUFValueType
# Fixed-size value types: struct format of one element (the format is "<" + count + code for arrays).
_FIXED_CODES = {
    _T.UINT8: "B",
    _T.INT8: "b",
    _T.UINT16: "H",
    _T.INT16: "h",
    _T.UINT32: "I",
    _T.INT32: "i",
    _T.FLOAT32: "f",
    _T.UINT64: "Q",
    _T.INT64: "q",
    _T.FLOAT64: "d",
}
_FIXED_STRUCTS = {vtype: struct.Struct("<" + code) for vtype, code in _FIXED_CODES.items()}
# Smallest encoding of one array element of each type; used to bound counts before reading.
_MIN_ELEMENT_BYTES = {
    **{vtype: s.size for vtype, s in _FIXED_STRUCTS.items()},
    _T.BOOL: 1,
    _T.STRING: 8,  # the length
    _T.ARRAY: 12,  # element type + count
}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, a one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _quote(text: str, limit: int = 80) -> str:
    """repr() of a name for an error message, shortened: names come from the (possibly hostile) file."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _decode(raw) -> str:
    # Invalid UTF-8 bytes are kept (as lone surrogates) rather than failing the whole file.
    return str(raw, "utf-8", "surrogateescape")


class _Parser:
    """Reads the header fields in file order from `view`, checking each read against what is present."""

    def __init__(self, view: memoryview, file_size: int | None):
        self.view = view
        self.file_size = file_size  # None: unknown, `view` may be any prefix
        self.available = len(view) if file_size is None else min(len(view), file_size)
        self.pos = 0

    # --- bounds -----------------------------------------------------------------------------------

    def need(self, at: int, n: int, field: str) -> None:
        """Ensure bytes [at, at + n) are present, else raise: truncated file, or prefix too short."""
        if at + n <= self.available:
            return
        if self.file_size is not None and at + n > self.file_size:
            raise GGUFError(
                f"truncated: {field} at offset {at} needs {n} bytes, but the file ends at {self.file_size}"
            )
        raise GGUFIncomplete(at + n, f"{field} at offset {at} needs the first {at + n} bytes of the file")

    def need_count(self, count: int, min_bytes: int, start: int, field: str, field_at: int) -> None:
        """Ensure `count` items of at least `min_bytes` each can lie from `start` on (before reading them)."""
        total = count * min_bytes
        if self.file_size is not None and start + total > self.file_size:
            raise GGUFError(
                f"{field} at offset {field_at}: {count} items need at least {total} bytes from offset "
                f"{start}, but the file ends at {self.file_size} (corrupt count or truncated file)"
            )
        self.need(start, total, f"{field} {count}")

    # --- primitive fields -------------------------------------------------------------------------

    def u32(self, field: str) -> int:
        self.need(self.pos, 4, field)
        (value,) = _U32.unpack_from(self.view, self.pos)
        self.pos += 4
        return value

    def u64(self, field: str) -> int:
        self.need(self.pos, 8, field)
        (value,) = _U64.unpack_from(self.view, self.pos)
        self.pos += 8
        return value

    def string(self, field: str) -> str:
        length_at = self.pos
        length = self.u64(f"{field} length")
        if self.file_size is not None and self.pos + length > self.file_size:
            raise GGUFError(
                f"{field} length at offset {length_at}: {length} bytes from offset {self.pos} do not fit, "
                f"the file ends at {self.file_size} (corrupt length or truncated file)"
            )
        self.need(self.pos, length, field)
        text = _decode(self.view[self.pos : self.pos + length])
        self.pos += length
        return text

    def value_type(self, field: str) -> GGUFValueType:
        at = self.pos
        code = self.u32(field)
        if code not in _MIN_ELEMENT_BYTES:
            raise GGUFError(f"{field} at offset {at}: unknown GGUF value type {code}")
        return GGUFValueType(code)

    # --- metadata values --------------------------------------------------------------------------

    def scalar(self, vtype: GGUFValueType, field: str) -> Any:
        if vtype == _T.STRING:
            return self.string(f"{field} string")
        if vtype == _T.BOOL:
            return self.bools(1, field)[0]
        fixed = _FIXED_STRUCTS[vtype]
        self.need(self.pos, fixed.size, field)
        (value,) = fixed.unpack_from(self.view, self.pos)
        self.pos += fixed.size
        return value

    def array(self, field: str, depth: int) -> tuple[list, GGUFValueType]:
        """An array value (element type, count, elements); returns (elements, element type)."""
        if depth > MAX_ARRAY_DEPTH:
            raise GGUFError(f"{field} at offset {self.pos}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        elem_type = self.value_type(f"{field} array element type")
        count_at = self.pos
        count = self.u64(f"{field} array length")
        self.need_count(count, _MIN_ELEMENT_BYTES[elem_type], self.pos, f"{field} array length", count_at)
        if elem_type == _T.STRING:
            return self.strings(count, field), elem_type
        if elem_type == _T.ARRAY:
            return [self.array(f"{field}[{i}]", depth + 1)[0] for i in range(count)], elem_type
        if elem_type == _T.BOOL:
            return self.bools(count, field), elem_type
        values = struct.unpack_from(f"<{count}{_FIXED_CODES[elem_type]}", self.view, self.pos)
        self.pos += count * _MIN_ELEMENT_BYTES[elem_type]
        return list(values), elem_type

    def bools(self, count: int, field: str) -> list[bool]:
        self.need(self.pos, count, field)
        raw = bytes(self.view[self.pos : self.pos + count])
        if raw.translate(None, b"\x00\x01"):
            bad = next(i for i, byte in enumerate(raw) if byte > 1)
            raise GGUFError(f"{field} at offset {self.pos + bad}: bool byte is {raw[bad]}, not 0 or 1")
        self.pos += count
        return [byte == 1 for byte in raw]

    def strings(self, count: int, field: str) -> list[str]:
        """`count` strings; the hot loop of the header (token and merge lists), so kept flat."""
        view, pos, available = self.view, self.pos, self.available
        unpack_length = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 <= available:
                (length,) = unpack_length(view, pos)
                end = pos + 8 + length
                if end <= available:
                    append(str(view[pos + 8 : end], "utf-8", "surrogateescape"))  # _decode, inlined
                    pos = end
                    continue
            # This element runs past the bytes present: the general reader raises the right error.
            self.pos = pos
            append(self.string(f"{field}[{i}] string"))
            pos = self.pos
        self.pos = pos
        return out

    # --- sections ---------------------------------------------------------------------------------

    def header(self) -> GGUFHeader:
        self.need(0, 4, "magic")
        magic = bytes(self.view[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"magic at offset 0: {magic!r} is not {GGUF_MAGIC!r}, not a GGUF file")
        self.pos = 4
        version = self.read_version()
        tensor_count_at = self.pos
        tensor_count = self.u64("tensor count")
        kv_count_at = self.pos
        kv_count = self.u64("metadata count")
        self.need_count(kv_count, _MIN_KV_BYTES, self.pos, "metadata count", kv_count_at)
        self.need_count(tensor_count, _MIN_TENSOR_INFO_BYTES, self.pos, "tensor count", tensor_count_at)

        metadata, metadata_types = self.metadata(kv_count)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        self.need_count(tensor_count, _MIN_TENSOR_INFO_BYTES, self.pos, "tensor count", tensor_count_at)
        relative = [self.tensor_info(i, alignment) for i in range(tensor_count)]
        data_offset = -(-self.pos // alignment) * alignment
        tensors = self.place_tensors(relative, data_offset)
        return GGUFHeader(version, metadata, metadata_types, tensors, alignment, data_offset)

    def read_version(self) -> int:
        version = self.u32("version")
        if version in SUPPORTED_VERSIONS:
            return version
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (1, *SUPPORTED_VERSIONS):
            raise GGUFError(f"version at offset 4: big-endian GGUF is not supported (version {swapped})")
        raise GGUFError(f"version at offset 4: GGUF version {version} is not supported (only 2 and 3)")

    def metadata(self, count: int) -> tuple[dict[str, Any], dict[str, ValueTypeInfo]]:
        values: dict[str, Any] = {}
        types: dict[str, ValueTypeInfo] = {}
        for i in range(count):
            key_at = self.pos
            key = self.string(f"metadata[{i}] key")
            field = f"metadata[{i}] {_quote(key)}"
            if key in values:
                raise GGUFError(f"{field} key at offset {key_at}: duplicate metadata key")
            value_at = self.pos
            vtype = self.value_type(f"{field} value type")
            if vtype == _T.ARRAY:
                values[key], elem_type = self.array(field, depth=1)
                types[key] = (vtype, elem_type)
            else:
                values[key] = self.scalar(vtype, field)
                types[key] = vtype
            if key == "general.alignment":
                problem = _alignment_problem(values[key], vtype)
                if problem:
                    raise GGUFError(f"{field} at offset {value_at}: {problem}")
        return values, types

    def tensor_info(self, index: int, alignment: int) -> tuple[TensorInfo, int]:
        """One tensor info, its offset still relative to the data section; and where the info starts."""
        start = self.pos
        name = self.string(f"tensor[{index}] name")
        field = f"tensor[{index}] {_quote(name)}"
        n_dims_at = self.pos
        n_dims = self.u32(f"{field} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{field} n_dims at offset {n_dims_at}: {n_dims} is not in 1..{MAX_DIMS}")
        shape = []
        n_elements = 1
        for d in range(n_dims):
            dim_at = self.pos
            dim = self.u64(f"{field} dims[{d}]")
            n_elements *= dim
            if dim < 1 or n_elements > INT64_MAX:
                problem = "is < 1" if dim < 1 else "makes the element count overflow int64"
                raise GGUFError(f"{field} dims[{d}] at offset {dim_at}: {dim} {problem}")
            shape.append(dim)
        type_at = self.pos
        type_id = self.u32(f"{field} type")
        ggml_type = GGML_TYPES.get(type_id)
        if ggml_type is None:
            raise GGUFError(f"{field} type at offset {type_at}: unknown GGML type {type_id}")
        if shape[0] % ggml_type.block_elems:
            raise GGUFError(
                f"{field} dims[0] at offset {n_dims_at + 4}: {shape[0]} is not a multiple of the "
                f"{ggml_type.name} block size {ggml_type.block_elems}"
            )
        offset_at = self.pos
        offset = self.u64(f"{field} offset")
        if offset % alignment:
            raise GGUFError(
                f"{field} offset at offset {offset_at}: {offset} is not a multiple of {alignment}"
            )
        nbytes = n_elements // ggml_type.block_elems * ggml_type.block_bytes
        return TensorInfo(name, tuple(shape), ggml_type, offset, nbytes, n_elements), start

    def place_tensors(
        self, relative: list[tuple[TensorInfo, int]], data_offset: int
    ) -> dict[str, TensorInfo]:
        """TensorInfos with absolute offsets; checks names are unique, data in the file, no overlaps."""
        tensors: dict[str, TensorInfo] = {}
        starts: dict[str, int] = {}
        for index, (tensor, start) in enumerate(relative):
            field = f"tensor[{index}] {_quote(tensor.name)}"
            if tensor.name in tensors:
                raise GGUFError(f"{field} at offset {start}: duplicate tensor name")
            begin = data_offset + tensor.offset
            end = begin + tensor.nbytes
            if self.file_size is not None and end > self.file_size:
                raise GGUFError(
                    f"{field} at offset {start}: data [{begin}, {end}) "
                    f"extends past the end of the file ({self.file_size} bytes)"
                )
            tensors[tensor.name] = replace(tensor, offset=begin)
            starts[tensor.name] = start
        by_offset = sorted(tensors.values(), key=lambda t: t.offset)
        for before, after in pairwise(by_offset):
            if before.offset + before.nbytes > after.offset:
                raise GGUFError(
                    f"tensor {_quote(after.name)} at offset {starts[after.name]}: its data at "
                    f"{after.offset} overlaps tensor {_quote(before.name)} "
                    f"[{before.offset}, {before.offset + before.nbytes})"
                )
        return tensors


def _alignment_problem(value: Any, vtype: GGUFValueType) -> str | None:
    if vtype != _T.UINT32:
        return f"alignment must be a UINT32, not {vtype.name}"
    if value == 0 or value & (value - 1):
        return f"alignment {value} is not a nonzero power of two"
    return None


def parse_header(buf, file_size: int | None = None) -> GGUFHeader:
    """Parse the GGUF header from `buf`, the whole file or a prefix of it (any bytes-like object).

    `file_size` is the length of the whole file, if known (None: unknown). When `buf` holds the
    whole file (file_size <= len(buf)), running out of bytes is a GGUFError ("truncated ...");
    otherwise it raises GGUFIncomplete, whose `needed` is the prefix length to come back with.
    Counts and lengths are bounded by file_size when it is known, so a malformed file is rejected
    as soon as possible; tensor data is checked to lie within the file only then.
    """
    with memoryview(buf) as raw, raw.cast("B") as view:
        return _Parser(view, file_size).header()


def next_prefix_length(have: int, needed: int, file_size: int | None = None) -> int:
    """How long a prefix to fetch after GGUFIncomplete: at least `needed`, and grow geometrically
    (double) so that a header read in many small steps still costs O(header size) in total."""
    length = max(needed, 2 * have)
    return length if file_size is None else min(length, file_size)


def read_header(path: str | os.PathLike, first_read: int = 1 << 20) -> GGUFHeader:
    """Parse the header of the GGUF file at `path`, reading only a prefix of it (the browser's pattern)."""
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        buf = f.read(min(first_read, file_size))
        while True:
            try:
                return parse_header(buf, file_size)
            except GGUFIncomplete as e:
                more = f.read(next_prefix_length(len(buf), e.needed, file_size) - len(buf))
                if not more:
                    raise GGUFError(
                        f"truncated: {path} ended at {len(buf)} bytes while reading the header"
                    ) from e
                buf += more


async def read_header_async(head, size: int | None, name: str, first_read: int = 4 << 20) -> GGUFHeader:
    """`read_header` for a file held elsewhere (in the browser: a fetch stream or a File): `await
    head(n)` gives its first n bytes (fewer only where the file ends); `size` is its length, or None
    when unknown. Only the header's bytes are read."""
    have = min(first_read, size) if size else first_read
    while True:
        prefix = await head(have)
        try:
            return parse_header(prefix, size)
        except GGUFIncomplete as e:
            if len(prefix) < have:  # the file ended: without a size, the parser could not know
                raise GGUFError(f"truncated: {name} ended at {len(prefix)} bytes, in the header") from e
            have = next_prefix_length(len(prefix), e.needed, size)


class GGUFFile:
    """A GGUF file mapped into memory: its parsed header and zero-copy views of tensor data.

    Release (drop) every tensor_bytes() view before close(): a mapping cannot be closed while
    views of it exist.
    """

    def __init__(self, path: str | os.PathLike):
        import mmap  # native only: the browser parses a downloaded prefix instead

        self.path = Path(path)
        with open(self.path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size == 0:
                raise GGUFError(f"truncated: magic at offset 0 needs 4 bytes, but {self.path} is empty")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = file_size
        try:
            self.header = parse_header(self._mmap, file_size)
        except BaseException:
            self._mmap.close()
            raise
        self._view = memoryview(self._mmap)

    def tensor_bytes(self, name: str) -> memoryview:
        """The raw (quantized) bytes of tensor `name`: a view into the mapping, not a copy."""
        tensor = self.header.tensors[name]
        return self._view[tensor.offset : tensor.offset + tensor.nbytes]

    def close(self) -> None:
        self._view.release()
        try:
            self._mmap.close()
        except BufferError as e:
            raise BufferError(f"{self.path}: release every tensor_bytes() view before close()") from e

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Map the GGUF file at `path` and parse its header (tensor data is checked against the real size)."""
    return GGUFFile(path)
