"""A tiny raw GGUF byte builder for tests: every field is written as given, valid or not.

The `gguf` package's GGUFWriter only writes valid files; malformed-file tests need to put any
number anywhere. Value type codes come from the `gguf` package (the reference), not from webgguf.
"""

import struct

from gguf import GGUFValueType as VT

FIXED_FORMATS = {
    VT.UINT8: "B",
    VT.INT8: "b",
    VT.UINT16: "H",
    VT.INT16: "h",
    VT.UINT32: "I",
    VT.INT32: "i",
    VT.FLOAT32: "f",
    VT.UINT64: "Q",
    VT.INT64: "q",
    VT.FLOAT64: "d",
    VT.BOOL: "B",
}


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def string(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string; `length` overrides the length field (the bytes stay as given)."""
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def value(vtype: int, val) -> bytes:
    """The encoding of one value of type `vtype` (without the type code); arrays via array()."""
    if vtype == VT.STRING:
        return string(val)
    return struct.pack("<" + FIXED_FORMATS[vtype], val)


def array(elem_type: int, items: list[bytes], count: int | None = None) -> bytes:
    """An array value: element type, count (default: len(items)), then the encoded items."""
    return u32(elem_type) + u64(len(items) if count is None else count) + b"".join(items)


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One metadata entry; `payload` is the already-encoded value (see value() and array())."""
    return string(key) + u32(vtype) + payload


def scalar_kv(key: str, vtype: int, val) -> bytes:
    return kv(key, vtype, value(vtype, val))


def tensor_info(
    name: str | bytes, dims: list[int], type_id: int, offset: int, n_dims: int | None = None
) -> bytes:
    """One tensor info; `n_dims` overrides the dimension count (the dims stay as given)."""
    count = len(dims) if n_dims is None else n_dims
    return string(name) + u32(count) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def gguf_file(
    kvs: list[bytes],
    tensors: list[bytes],
    data: bytes = b"",
    *,
    alignment: int = 32,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
) -> bytes:
    """A whole file: header, metadata, tensor infos, padding to `alignment`, then `data` as given."""
    head = (
        magic
        + u32(version)
        + u64(len(tensors) if n_tensors is None else n_tensors)
        + u64(len(kvs) if n_kv is None else n_kv)
        + b"".join(kvs)
        + b"".join(tensors)
    )
    padding = -len(head) % alignment
    return head + b"\x00" * padding + data
