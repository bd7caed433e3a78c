"""Fuzz target: webgguf.gguf.parse_header on arbitrary bytes and on mutations of small valid GGUF files.

Each input is parsed as a whole file, as a file of unknown size, as the prefix of a longer file, and
in growing prefixes the way the browser streams a header. What must hold:
- only GGUFError escapes, and GGUFIncomplete only when the file may go on past the bytes given,
  asking for more bytes than were given and no more than the file has;
- streaming the header prefix by prefix ends in the same result as parsing the whole file, in a
  logarithmic number of steps;
- a parsed header is consistent (tensor data aligned, inside the file, not overlapping) and holds no
  more values, characters and list items than the file has bytes (nothing allocated unjustified).
"""

import math
import tempfile
import zlib
from pathlib import Path

import atheris
import numpy as np
from harness import fuzz

with atheris.instrument_imports(include=["webgguf"]):
    from webgguf.gguf import GGUFError, GGUFHeader, GGUFIncomplete, next_prefix_length, parse_header
    from webgguf.quants import tensor_nbytes

MAX_STREAM_STEPS = 64  # doubling from any prefix of a 4 KiB input takes far fewer


def parse(data: bytes, file_size: int | None) -> GGUFHeader | GGUFError:
    try:
        return parse_header(data, file_size)
    except GGUFError as e:
        return e


def same(a: GGUFHeader | GGUFError, b: GGUFHeader | GGUFError) -> bool:
    # repr, not ==: metadata may hold NaN, which is never equal to itself
    return type(a) is type(b) and (repr(a) == repr(b) if isinstance(a, GGUFHeader) else str(a) == str(b))


def footprint(value) -> int:
    """Values, characters and list items in a metadata value; the file spends at least a byte on each."""
    if isinstance(value, str):
        return max(1, len(value))
    if isinstance(value, list):
        return 1 + sum(footprint(item) for item in value)
    return 1


def check_header(header: GGUFHeader, file_size: int) -> None:
    assert header.version in (2, 3)
    assert header.alignment > 0 and header.alignment & (header.alignment - 1) == 0
    assert header.metadata.keys() == header.metadata_types.keys()
    total = sum(footprint(key) + footprint(value) for key, value in header.metadata.items())
    total += sum(footprint(t.name) + len(t.shape) + 1 for t in header.tensors.values())
    assert total <= file_size, f"header holds {total} items, more than the {file_size} bytes of the file"
    end = header.data_offset
    for tensor in sorted(header.tensors.values(), key=lambda t: t.offset):
        assert tensor.offset >= end, f"tensor {tensor.name!r} overlaps the one before it or the header"
        assert tensor.offset % header.alignment == 0
        assert tensor.n_elements == math.prod(tensor.shape)
        assert tensor.nbytes == tensor_nbytes(tensor.type.id, tensor.n_elements)
        end = tensor.offset + tensor.nbytes
    assert not header.tensors or end <= file_size


def check_incomplete(result, have: int, file_size: int | None) -> None:
    assert result.needed > have, f"GGUFIncomplete asks for {result.needed} bytes, {have} were given"
    assert file_size is None or result.needed <= file_size, "GGUFIncomplete asks for more than the file"


def stream(data: bytes, first: int) -> GGUFHeader | GGUFError:
    """Parse growing prefixes of data, starting with `first` bytes, as read_header and the browser do."""
    have = first
    for _ in range(MAX_STREAM_STEPS):
        result = parse(data[:have], len(data))
        if not isinstance(result, GGUFIncomplete):
            return result
        check_incomplete(result, have, len(data))
        have = next_prefix_length(have, result.needed, len(data))
    raise AssertionError(f"streaming the header did not finish in {MAX_STREAM_STEPS} steps")


def test_one_input(data: bytes) -> None:
    size = len(data)
    whole = parse(data, size)
    assert not isinstance(whole, GGUFIncomplete), "GGUFIncomplete although the whole file was given"
    if isinstance(whole, GGUFHeader):
        check_header(whole, size)

    # where to cut a prefix and how much longer the file is, varied per input but reproducible
    digest = zlib.crc32(data)
    unknown_size = parse(data, None)
    longer = parse(data, size + 1 + digest % 4096)
    for result, file_size in ((unknown_size, None), (longer, size + 1 + digest % 4096)):
        if isinstance(result, GGUFIncomplete):
            check_incomplete(result, size, file_size)
        elif isinstance(whole, GGUFHeader):
            assert same(result, whole), "a known whole file and a prefix of it parse differently"
    assert same(stream(data, digest % (size + 1)), whole), "streaming the header changed the result"


# ---- seed corpus: small valid files from the reference writer (the gguf package) ---------------------


def _write(build) -> bytes:
    import gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seed.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        build(writer, gguf)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path.read_bytes()


def _every_value_type(writer, gguf) -> None:
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -3)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -300)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -70000)
    writer.add_float32("t.f32", 1.5)
    writer.add_uint64("t.u64", 1 << 40)
    writer.add_int64("t.i64", -(1 << 40))
    writer.add_float64("t.f64", -2.25)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ▁wörld")
    writer.add_array("t.tokens", ["<s>", "</s>", "a", "bc", "▁d"])
    writer.add_array("t.scores", [0.0, -1.0, -2.5])
    writer.add_array("t.types", [1, 3, 6])
    writer.add_array("t.flags", [True, False])
    writer.add_array("t.nested", [[1, 2], [3]])


def _tensors(writer, gguf) -> None:
    quant = gguf.GGMLQuantizationType
    writer.add_custom_alignment(64)
    writer.add_array("t.merges", ["a b", "ab c"])
    writer.add_tensor("f32", np.arange(4, dtype=np.float32))
    writer.add_tensor("f16", np.ones((2, 8), dtype=np.float16))
    writer.add_tensor("q8_0", np.zeros((2, 34), dtype=np.uint8), raw_dtype=quant.Q8_0)
    writer.add_tensor("q4_k", np.zeros((1, 144), dtype=np.uint8), raw_dtype=quant.Q4_K)


def seeds() -> list[bytes]:
    with_tensors = _write(_tensors)
    every_type = _write(_every_value_type)
    version_2 = every_type[:4] + (2).to_bytes(4, "little") + every_type[8:]
    return [_write(lambda writer, gguf: None), every_type, with_tensors, version_2, b"GGUF", b""]


if __name__ == "__main__":
    fuzz(test_one_input, seeds())
