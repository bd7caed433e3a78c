"""webgguf.gguf on valid files: round trips through the `gguf` package's writer, the real models
against `gguf.GGUFReader`, prefix parsing (the browser's incremental pattern) and mmap access."""

import struct
import time

import gguf
import gguf_writer as raw
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from webgguf.gguf import (
    GGUFError,
    GGUFIncomplete,
    GGUFValueType,
    next_prefix_length,
    open_gguf,
    parse_header,
    read_header,
)
from webgguf.quants import GGML_TYPES

SCALARS = [  # (key, value type, value): one of every scalar type, at the edges of its range
    ("test.uint8", VT.UINT8, 255),
    ("test.int8", VT.INT8, -128),
    ("test.uint16", VT.UINT16, 65535),
    ("test.int16", VT.INT16, -32768),
    ("test.uint32", VT.UINT32, 2**32 - 1),
    ("test.int32", VT.INT32, -(2**31)),
    ("test.uint64", VT.UINT64, 2**64 - 1),
    ("test.int64", VT.INT64, -(2**63)),
    ("test.float32", VT.FLOAT32, 0.1),
    ("test.float64", VT.FLOAT64, -1e300),
    ("test.bool_true", VT.BOOL, True),
    ("test.bool_false", VT.BOOL, False),
    ("test.string", VT.STRING, "héllo ▁wörld 🦙"),
]
ARRAYS = [  # (key, element type, values)
    ("test.array.uint8", VT.UINT8, [0, 1, 255]),
    ("test.array.int8", VT.INT8, [-128, 0, 127]),
    ("test.array.uint16", VT.UINT16, [0, 65535]),
    ("test.array.int16", VT.INT16, [-32768, 32767]),
    ("test.array.uint32", VT.UINT32, [0, 2**32 - 1]),
    ("test.array.int32", VT.INT32, [-(2**31), 2**31 - 1]),
    ("test.array.uint64", VT.UINT64, [0, 2**64 - 1]),
    ("test.array.int64", VT.INT64, [-(2**63), 2**63 - 1]),
    ("test.array.float32", VT.FLOAT32, [0.5, -2.25, 1e-3]),
    ("test.array.float64", VT.FLOAT64, [0.1, -1e-300]),
    ("test.array.bool", VT.BOOL, [True, False, True]),
    ("test.array.string", VT.STRING, ["a", "", "Ġthe", "<|im_start|>"]),
]
NESTED = [[1, 2, 3], [4], [5, 6]]  # an array of int32 arrays
NESTED_STRINGS = [["a", "b"], ["c"]]


def float32(x: float) -> float:
    """What a float32 field holds after writing `x`."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_value(vtype, value):
    return float32(value) if vtype == VT.FLOAT32 else value


def write_gguf_package_file(path, alignment=None):
    """Every metadata value type and several tensor types, written by gguf.GGUFWriter.

    Returns {tensor name: (ggml-order shape, type id, raw bytes)}."""
    writer = gguf.GGUFWriter(path, arch="llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, vtype, value in SCALARS:
        writer.add_key_value(key, value, vtype)
    for key, elem_type, values in ARRAYS:
        writer.add_key_value(key, values, VT.ARRAY, sub_type=elem_type)
    writer.add_key_value("test.nested", NESTED, VT.ARRAY, sub_type=VT.ARRAY)
    writer.add_key_value("test.nested_strings", NESTED_STRINGS, VT.ARRAY, sub_type=VT.ARRAY)

    rng = np.random.default_rng(0)
    tensors = {}
    f32 = rng.standard_normal((3, 5)).astype(np.float32)  # [rows=3][cols=5] -> ggml shape (5, 3)
    writer.add_tensor("t.f32", f32)
    tensors["t.f32"] = ((5, 3), QT.F32, f32.tobytes())
    f16 = rng.standard_normal((7,)).astype(np.float16)
    writer.add_tensor("t.f16", f16)
    tensors["t.f16"] = ((7,), QT.F16, f16.tobytes())
    for name, qtype, shape in [("t.q8_0", QT.Q8_0, (2, 64)), ("t.q4_k", QT.Q4_K, (3, 256))]:
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = (shape[0], shape[1] // block_elems * block_bytes)
        blocks = rng.integers(0, 256, size=byte_shape, dtype=np.uint8)
        writer.add_tensor(name, blocks, raw_dtype=qtype)
        tensors[name] = ((shape[1], shape[0]), qtype, blocks.tobytes())

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


def test_round_trip_gguf_writer_file(tmp_path):
    path = tmp_path / "all_types.gguf"
    written = write_gguf_package_file(path)
    with open_gguf(path) as f:
        header = f.header
        assert header.version == 3
        assert header.alignment == 32
        assert header.metadata["general.architecture"] == "llama"
        for key, vtype, value in SCALARS:
            assert header.metadata[key] == expected_value(vtype, value), key
            assert type(header.metadata[key]) is type(value), key
            assert header.metadata_types[key] == vtype, key
        for key, elem_type, values in ARRAYS:
            assert header.metadata[key] == [expected_value(elem_type, v) for v in values], key
            assert header.metadata_types[key] == (GGUFValueType.ARRAY, elem_type), key
        assert header.metadata["test.nested"] == NESTED
        assert header.metadata["test.nested_strings"] == NESTED_STRINGS
        assert header.metadata_types["test.nested"] == (GGUFValueType.ARRAY, GGUFValueType.ARRAY)

        assert list(header.tensors) == list(written)  # file order
        for name, (shape, type_id, data) in written.items():
            tensor = header.tensors[name]
            assert tensor.name == name
            assert tensor.shape == shape
            assert tensor.type == GGML_TYPES[type_id]
            assert tensor.nbytes == len(data)
            assert tensor.n_elements == int(np.prod(shape))
            assert tensor.offset % header.alignment == 0
            assert tensor.offset >= header.data_offset
            view = f.tensor_bytes(name)
            assert bytes(view) == data
            del view


def test_custom_alignment(tmp_path):
    path = tmp_path / "aligned.gguf"
    written = write_gguf_package_file(path, alignment=256)
    with open_gguf(path) as f:
        assert f.header.alignment == 256
        assert f.header.metadata["general.alignment"] == 256
        assert f.header.data_offset % 256 == 0
        for name, (_, _, data) in written.items():
            assert f.header.tensors[name].offset % 256 == 0
            view = f.tensor_bytes(name)
            assert bytes(view) == data
            del view


def test_version_2_parses_like_version_3(tmp_path):
    path = tmp_path / "v3.gguf"
    write_gguf_package_file(path)
    v3 = path.read_bytes()
    v2 = v3[:4] + struct.pack("<I", 2) + v3[8:]
    header2, header3 = parse_header(v2, len(v2)), parse_header(v3, len(v3))
    assert (header2.version, header3.version) == (2, 3)
    assert header2.metadata == header3.metadata
    assert header2.tensors == header3.tensors


def test_raw_values_gguf_writer_cannot_write():
    """Empty arrays, invalid UTF-8 (kept via surrogateescape) and a file without tensors."""
    data = raw.gguf_file(
        [
            raw.kv("empty", VT.ARRAY, raw.array(VT.STRING, [])),
            raw.kv("bad_utf8", VT.STRING, raw.string(b"ok\xff\xfe")),
            raw.kv("nested_empty", VT.ARRAY, raw.array(VT.ARRAY, [raw.array(VT.UINT8, [])])),
        ],
        [],
    )
    header = parse_header(data, len(data))
    assert header.metadata == {"empty": [], "bad_utf8": "ok\udcff\udcfe", "nested_empty": [[]]}
    assert header.metadata["bad_utf8"].encode("utf-8", "surrogateescape") == b"ok\xff\xfe"
    assert header.tensors == {}
    assert header.data_offset == len(data)


def small_file(tmp_path) -> bytes:
    path = tmp_path / "small.gguf"
    write_gguf_package_file(path)
    return path.read_bytes()


@pytest.mark.parametrize("file_size_known", [False, True])
def test_every_prefix_gives_header_or_incomplete(tmp_path, file_size_known):
    data = small_file(tmp_path)
    full = parse_header(data, len(data))
    file_size = len(data) if file_size_known else None
    first_complete = None
    for length in range(full.data_offset + 1):
        try:
            header = parse_header(data[:length], file_size)
        except GGUFIncomplete as e:
            assert first_complete is None, f"prefix {length} incomplete after {first_complete} was complete"
            assert length < e.needed <= full.data_offset, (length, e.needed)
            continue
        first_complete = length if first_complete is None else first_complete
        assert header == full
    assert first_complete is not None


def test_following_needed_reaches_the_header(tmp_path):
    data = small_file(tmp_path)
    full = parse_header(data, len(data))
    length, steps = 0, 0
    while True:
        try:
            header = parse_header(data[:length])
            break
        except GGUFIncomplete as e:
            length, steps = e.needed, steps + 1
            assert steps < 1000
    assert header == full
    assert steps > 1


def test_incomplete_is_a_gguf_error():
    # A caller that treats every GGUFError alike still gets a clean error from a short prefix.
    with pytest.raises(GGUFError):
        parse_header(b"GGUF\x03\x00")


def test_next_prefix_length_grows_geometrically():
    assert next_prefix_length(100, 150) == 200
    assert next_prefix_length(100, 1000) == 1000
    assert next_prefix_length(100, 150, file_size=170) == 170


def test_read_header_grows_from_a_tiny_first_read(tmp_path):
    path = tmp_path / "small.gguf"
    write_gguf_package_file(path)
    with open_gguf(path) as f:
        assert read_header(path, first_read=1) == f.header


def test_tensor_bytes_is_a_view_of_the_mapping(tmp_path):
    path = tmp_path / "small.gguf"
    write_gguf_package_file(path)
    f = open_gguf(path)
    view = f.tensor_bytes("t.q8_0")
    assert isinstance(view, memoryview)
    assert view.readonly
    assert type(view.obj).__name__ == "mmap"  # a slice of the mapping, not a copy
    with pytest.raises(BufferError, match="release every tensor_bytes"):
        f.close()
    del view
    f.close()  # works once the view is gone


def gguf_reader(path, monkeypatch) -> gguf.GGUFReader:
    """gguf.GGUFReader over a plain ndarray view of the file's mapping: the same parsing, without
    np.memmap's per-slice Python overhead (which makes it ~4x slower on the real models)."""
    memmap = np.memmap
    with monkeypatch.context() as patch:
        patch.setattr(np, "memmap", lambda file, mode="r": np.asarray(memmap(file, mode=mode)))
        return gguf.GGUFReader(path)


def reference_metadata(reader: gguf.GGUFReader) -> dict:
    """{key: value} from gguf.GGUFReader, without its GGUF.* pseudo-fields."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def reference_types(reader: gguf.GGUFReader) -> dict:
    def describe(types):
        return types[0] if len(types) == 1 else (types[0], types[1])

    return {key: describe(field.types) for key, field in reader.fields.items() if not key.startswith("GGUF.")}


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_real_model_matches_gguf_reader(model_path, model, monkeypatch, record_property):
    path = model_path(model)
    reader = gguf_reader(path, monkeypatch)
    metadata = reference_metadata(reader)
    with open_gguf(path) as f:
        header = f.header
        assert header.version == gguf.GGUF_VERSION
        assert header.alignment == reader.alignment
        assert header.data_offset == reader.data_offset
        assert header.metadata == metadata
        assert list(header.metadata) == list(metadata)
        assert header.metadata_types == reference_types(reader)
        assert len(header.tensors) == len(reader.tensors)
        for tensor, ref in zip(header.tensors.values(), reader.tensors, strict=True):
            assert tensor.name == ref.name
            assert tensor.shape == tuple(int(d) for d in ref.shape)
            assert tensor.type.id == int(ref.tensor_type)
            assert tensor.offset == ref.data_offset
            assert tensor.nbytes == ref.n_bytes
            assert tensor.n_elements == ref.n_elements
            ref_bytes = ref.data.reshape(-1).view(np.uint8)  # [nbytes]
            view = f.tensor_bytes(tensor.name)
            assert len(view) == ref_bytes.size
            assert bytes(view[:32]) == ref_bytes[:32].tobytes()
            assert bytes(view[-32:]) == ref_bytes[-32:].tobytes()
            del view
    assert read_header(path) == header  # the prefix-reading path (several GGUFIncomplete rounds)

    # Speed of the pure-Python parse of the header bytes (measured and reported, not asserted).
    with open(path, "rb") as file:
        header_bytes = file.read(header.data_offset)
    start = time.perf_counter()
    assert parse_header(header_bytes, path.stat().st_size) == header
    seconds = time.perf_counter() - start
    record_property("header_parse_seconds", seconds)
    print(f"{model}: header parse {seconds * 1000:.0f} ms")
