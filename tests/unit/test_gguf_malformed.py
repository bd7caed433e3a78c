"""webgguf.gguf on malformed files: a corpus generated here, each case must give exactly GGUFError
(naming the field and byte offset), without hanging and without allocating more than the file justifies."""

import random
import signal
import tracemalloc
from contextlib import contextmanager

import gguf_writer as raw
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from webgguf.gguf import MAX_ARRAY_DEPTH, GGUFError, GGUFIncomplete, open_gguf, parse_header

HEADER_BYTES = 24  # magic, version, tensor count, metadata count
ALIGNMENT = 64


def valid_kvs() -> list[bytes]:
    return [
        raw.scalar_kv("general.architecture", VT.STRING, "llama"),
        raw.scalar_kv("general.alignment", VT.UINT32, ALIGNMENT),
        raw.kv(
            "tokenizer.ggml.tokens",
            VT.ARRAY,
            raw.array(VT.STRING, [raw.string(t) for t in ["a", "bc", "<s>"]]),
        ),
        raw.kv(
            "tokenizer.ggml.scores",
            VT.ARRAY,
            raw.array(VT.FLOAT32, [raw.value(VT.FLOAT32, x) for x in (0, 1)]),
        ),
        raw.scalar_kv("test.flag", VT.BOOL, True),
        raw.kv("test.nested", VT.ARRAY, raw.array(VT.ARRAY, [raw.array(VT.UINT8, [b"\x01", b"\x02"])])),
    ]


def valid_tensors() -> list[bytes]:
    # "a": 2 rows of 32 Q8_0 elements = 2 blocks of 34 bytes at 0; "b": 4 floats at 128 (68 padded to 64).
    return [raw.tensor_info("a", [32, 2], QT.Q8_0, 0), raw.tensor_info("b", [4], QT.F32, ALIGNMENT * 2)]


DATA = bytes(range(68)) + b"\x00" * 60 + bytes(16)  # the last tensor ends exactly at the end of the file


def build(kvs=None, tensors=None, data=DATA, **options) -> bytes:
    kvs = valid_kvs() if kvs is None else kvs
    tensors = valid_tensors() if tensors is None else tensors
    return raw.gguf_file(kvs, tensors, data, alignment=options.pop("alignment", ALIGNMENT), **options)


def one_kv(payload_kv: bytes) -> bytes:
    """A file whose only metadata entry is `payload_kv` (and no tensors)."""
    return raw.gguf_file([payload_kv], [], alignment=1)  # no padding: the entry ends the file


def one_tensor(info: bytes, data: bytes = bytes(256)) -> bytes:
    return build(tensors=[info], data=data)


def kvs_offset(index: int) -> int:
    """Byte offset of metadata entry `index` in a file built from valid_kvs()."""
    return HEADER_BYTES + sum(len(kv) for kv in valid_kvs()[:index])


def nested(depth: int) -> bytes:
    """An array value nested `depth` deep: [[...[1]...]]."""
    value = raw.array(VT.UINT8, [b"\x01"])
    for _ in range(depth - 1):
        value = raw.array(VT.ARRAY, [value])
    return value


VALID = build()
TENSORS_AT = kvs_offset(len(valid_kvs()))
HEADER_END = TENSORS_AT + sum(len(info) for info in valid_tensors())  # before the padding
BIG = 2**63

# (name, file bytes, regular expression the message must match; None: any GGUFError will do)
HEADER_CASES = [
    # header
    ("empty", b"", r"truncated: magic at offset 0"),
    ("bad magic", b"GGML" + VALID[4:], r"magic at offset 0: b'GGML' is not b'GGUF'"),
    ("zero magic", bytes(4) + VALID[4:], r"magic at offset 0"),
    ("version 1", build(version=1), r"version at offset 4: GGUF version 1 is not supported"),
    ("version 0", build(version=0), r"version at offset 4: GGUF version 0 is not supported"),
    ("version 4", build(version=4), r"version at offset 4: GGUF version 4 is not supported"),
    ("version 2^32-1", build(version=2**32 - 1), r"version at offset 4: GGUF version 4294967295"),
    ("big-endian", build(version=0x03000000), r"version at offset 4: big-endian GGUF is not supported"),
    ("big-endian v2", build(version=0x02000000), r"big-endian GGUF is not supported"),
    (
        "10^12 tensors",
        build(n_tensors=10**12),
        r"tensor count at offset 8: 1000000000000 items need at least",
    ),
    (
        "2^64-1 tensors",
        build(n_tensors=2**64 - 1),
        r"tensor count at offset 8: 18446744073709551615 items need at least",
    ),
    (
        "2^63 metadata",
        build(n_kv=BIG),
        r"metadata count at offset 16: 9223372036854775808 items need at least",
    ),
    ("one metadata too many", build(n_kv=7), None),
    ("one tensor too many", build(n_tensors=3), None),
    # metadata keys
    (
        "key length 2^32",
        one_kv(raw.string("k", length=2**32) + raw.u32(VT.UINT8) + b"\x01"),
        r"metadata\[0\] key length at offset 24: 4294967296 bytes from offset \d+ do not fit",
    ),
    (
        "key length 2^64-1",
        one_kv(raw.string("k", length=2**64 - 1) + raw.u32(VT.UINT8) + b"\x01"),
        r"metadata\[0\] key length at offset 24",
    ),
    (
        "duplicate key",
        build(kvs=valid_kvs() + [raw.scalar_kv("test.flag", VT.BOOL, False)]),
        rf"metadata\[6\] 'test.flag' key at offset {kvs_offset(6)}: duplicate metadata key",
    ),
    # metadata values
    (
        "unknown value type",
        one_kv(raw.kv("x", 13, b"\x00" * 8)),
        r"metadata\[0\] 'x' value type at offset 33: unknown GGUF value type 13",
    ),
    ("value type 2^32-1", one_kv(raw.kv("x", 2**32 - 1, b"")), r"unknown GGUF value type 4294967295"),
    (
        "string length 2^32",
        one_kv(raw.kv("x", VT.STRING, raw.string("abc", length=2**32))),
        r"metadata\[0\] 'x' string length at offset 37: 4294967296 bytes from offset \d+ do not fit",
    ),
    (
        "bool byte 2",
        one_kv(raw.kv("x", VT.BOOL, b"\x02")),
        r"metadata\[0\] 'x' at offset 37: bool byte is 2, not 0 or 1",
    ),
    (
        "bool array byte 7",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.BOOL, [b"\x01", b"\x00", b"\x07"]))),
        r"metadata\[0\] 'x' at offset 51: bool byte is 7",
    ),
    (
        "uint8 array length 2^63",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.UINT8, [b"\x01"], count=BIG))),
        r"metadata\[0\] 'x' array length at offset 41: 9223372036854775808 items need at least",
    ),
    (
        "uint64 array length 2^64-1",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.UINT64, [], count=2**64 - 1))),
        r"'x' array length at offset 41: 18446744073709551615 items need at least",
    ),
    (
        "string array length 2^63",
        one_kv(raw.kv("tokenizer.ggml.tokens", VT.ARRAY, raw.array(VT.STRING, [], count=BIG))),
        r"metadata\[0\] 'tokenizer.ggml.tokens' array length at offset 61: 9223372036854775808 items need",
    ),
    (
        "array of arrays length 2^63",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.ARRAY, [], count=BIG))),
        r"'x' array length at offset 41",
    ),
    (
        "string array element length 2^32",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.STRING, [raw.string("a"), raw.string("b", length=2**32)]))),
        r"metadata\[0\] 'x'\[1\] string length at offset 58: 4294967296 bytes from offset \d+ do not fit",
    ),
    (
        "string array count one too many",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.STRING, [raw.string("a"), raw.string("b")], count=3))),
        None,
    ),
    (
        "unknown array element type",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(13, [b"\x00"]))),
        r"'x' array element type at offset 37: unknown GGUF value type 13",
    ),
    (
        "nested array inner length 2^40",
        one_kv(
            raw.kv(
                "x",
                VT.ARRAY,
                raw.array(VT.ARRAY, [raw.array(VT.UINT8, [b"\x01"]), raw.array(VT.UINT8, [], count=2**40)]),
            )
        ),
        r"metadata\[0\] 'x'\[1\] array length at offset 66: 1099511627776 items need at least",
    ),
    (
        "nested array outer count too large",
        one_kv(raw.kv("x", VT.ARRAY, raw.array(VT.ARRAY, [raw.array(VT.UINT8, [b"\x01"])], count=1000))),
        r"'x' array length at offset 41: 1000 items need at least",
    ),
    ("nested too deep", one_kv(raw.kv("x", VT.ARRAY, nested(MAX_ARRAY_DEPTH + 1))), r"nested deeper than 16"),
    ("nesting bomb", one_kv(raw.kv("x", VT.ARRAY, nested(50_000))), r"nested deeper than 16"),
    # alignment
    (
        "alignment 0",
        build(kvs=[raw.scalar_kv("general.alignment", VT.UINT32, 0)], tensors=[]),
        r"metadata\[0\] 'general.alignment' at offset 49: alignment 0 is not a nonzero power of two",
    ),
    (
        "alignment 3",
        build(kvs=[raw.scalar_kv("general.alignment", VT.UINT32, 3)], tensors=[]),
        r"alignment 3 is not a nonzero power of two",
    ),
    (
        "alignment uint64",
        build(kvs=[raw.scalar_kv("general.alignment", VT.UINT64, 32)], tensors=[]),
        r"'general.alignment' at offset 49: alignment must be a UINT32, not UINT64",
    ),
    (
        "alignment string",
        build(kvs=[raw.scalar_kv("general.alignment", VT.STRING, "32")], tensors=[]),
        r"alignment must be a UINT32, not STRING",
    ),
    # tensor infos
    (
        "tensor name length 2^32",
        build(tensors=[raw.string("a", length=2**32)]),
        rf"tensor\[0\] name length at offset {TENSORS_AT}: 4294967296 bytes from offset \d+ do not fit",
    ),
    (
        "n_dims 0",
        one_tensor(raw.tensor_info("a", [], QT.F32, 0)),
        rf"tensor\[0\] 'a' n_dims at offset {TENSORS_AT + 9}: 0 is not in 1..4",
    ),
    (
        "n_dims 5",
        one_tensor(raw.tensor_info("a", [1, 1, 1, 1, 1], QT.F32, 0)),
        r"tensor\[0\] 'a' n_dims at offset \d+: 5 is not in 1..4",
    ),
    (
        "n_dims 2^32-1",
        one_tensor(raw.tensor_info("a", [4], QT.F32, 0, n_dims=2**32 - 1)),
        r"n_dims at offset \d+: 4294967295",
    ),
    (
        "dim 0",
        one_tensor(raw.tensor_info("a", [4, 0], QT.F32, 0)),
        rf"tensor\[0\] 'a' dims\[1\] at offset {TENSORS_AT + 21}: 0 is < 1",
    ),
    (
        "dim 2^63",
        one_tensor(raw.tensor_info("a", [BIG], QT.F32, 0)),
        r"dims\[0\] at offset \d+: 9223372036854775808 makes the element count overflow int64",
    ),
    (
        "dims product overflows",
        one_tensor(raw.tensor_info("a", [2**32, 2**32], QT.F32, 0)),
        r"'a' dims\[1\] at offset \d+: 4294967296 makes the element count overflow",
    ),
    (
        "dim 0 not a block multiple",
        one_tensor(raw.tensor_info("a", [33, 2], QT.Q8_0, 0)),
        r"'a' dims\[0\] at offset \d+: 33 is not a multiple of the Q8_0 block size 32",
    ),
    (
        "unknown ggml type 4",
        one_tensor(raw.tensor_info("a", [4], 4, 0)),
        rf"tensor\[0\] 'a' type at offset {TENSORS_AT + 21}: unknown GGML type 4",
    ),
    (
        "unknown ggml type 2^32-1",
        one_tensor(raw.tensor_info("a", [4], 2**32 - 1, 0)),
        r"unknown GGML type 4294967295",
    ),
    (
        "misaligned offset",
        one_tensor(raw.tensor_info("a", [4], QT.F32, 68)),
        rf"tensor\[0\] 'a' offset at offset {TENSORS_AT + 25}: 68 is not a multiple of 64",
    ),
    (
        "overlapping data",
        build(tensors=[raw.tensor_info("a", [32, 2], QT.Q8_0, 0), raw.tensor_info("b", [4], QT.F32, 64)]),
        r"tensor 'b' at offset \d+: its data at \d+ overlaps tensor 'a'",
    ),
    (
        "duplicate tensor name",
        build(tensors=[raw.tensor_info("a", [4], QT.F32, 0), raw.tensor_info("a", [4], QT.F32, 64)]),
        r"tensor\[1\] 'a' at offset \d+: duplicate tensor name",
    ),
    # truncation inside each section
    ("truncated counts", VALID[:20], r"truncated: metadata count at offset 16"),
    (
        "truncated key",
        VALID[: kvs_offset(2) + 10],
        rf"metadata\[2\] key length at offset {kvs_offset(2)}: 21 bytes",
    ),
    (
        "truncated string value",
        build(kvs=valid_kvs()[:1], tensors=[])[: kvs_offset(0) + 40],
        r"metadata\[0\] 'general.architecture' string length at offset 56: 5 bytes from offset 64 do not fit",
    ),
    (
        "truncated token list",
        VALID[: kvs_offset(2) + 72],
        r"metadata\[2\] 'tokenizer.ggml.tokens'\[2\] string length",
    ),
    (
        "truncated nested array",
        VALID[: kvs_offset(6) - 1],
        r"metadata\[5\] 'test.nested'\[0\] array length at offset \d+: 2 items need",
    ),
    (
        "truncated tensor info",
        VALID[: TENSORS_AT + 70],
        rf"truncated: tensor\[1\] 'b' offset at offset {TENSORS_AT + 66}",
    ),
]
# Tensor data past the end of the file: seen only when the file size is known.
DATA_CASES = [
    (
        "huge dims past the end",
        one_tensor(raw.tensor_info("a", [2**31, 2**31], QT.F32, 0)),
        r"tensor\[0\] 'a' at offset \d+: data .* extends past the end of the file",
    ),
    (
        "data past the end",
        build(data=DATA[:-1]),
        r"tensor\[1\] 'b' at offset \d+: data \[\d+, \d+\) extends past the end of the file",
    ),
    (
        "offset 2^64-64",
        one_tensor(raw.tensor_info("a", [4], QT.F32, 2**64 - 64)),
        r"extends past the end of the file",
    ),
    ("truncated tensor data", VALID[:-50], r"extends past the end of the file"),
]
CASES = HEADER_CASES + DATA_CASES


@contextmanager
def hang_guard(seconds: int = 10):
    """Fail a case still running after `seconds`: a guard against hangs, far above what a case takes."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum, frame):
        raise TimeoutError(f"parse_header ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_valid_base_file_parses():
    header = parse_header(VALID, len(VALID))
    assert header.alignment == ALIGNMENT
    assert header.metadata["test.nested"] == [[1, 2]]
    assert [t.offset - header.data_offset for t in header.tensors.values()] == [0, 128]
    assert header.data_offset + 128 + 16 == len(VALID)


@pytest.mark.parametrize(("name", "data", "pattern"), CASES, ids=[case[0] for case in CASES])
def test_malformed_file_gives_gguf_error(name, data, pattern):
    tracemalloc.start()
    try:
        with hang_guard(), pytest.raises(GGUFError, match=pattern) as error:
            parse_header(data, len(data))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert type(error.value) is GGUFError  # the whole file was given: never "incomplete"
    assert "offset" in str(error.value)
    assert peak < (1 << 20) + len(data), f"peak allocation {peak} bytes"


@pytest.mark.parametrize(("name", "data", "pattern"), HEADER_CASES, ids=[case[0] for case in HEADER_CASES])
def test_malformed_prefix_with_unknown_size_gives_gguf_error(name, data, pattern):
    # Without the file size the parser cannot tell a truncated file from a short prefix.
    with hang_guard(), pytest.raises(GGUFError):
        parse_header(data)


@pytest.mark.parametrize(("name", "data", "pattern"), DATA_CASES, ids=[case[0] for case in DATA_CASES])
def test_tensor_data_is_checked_only_when_the_file_size_is_known(name, data, pattern):
    header = parse_header(data)  # a prefix: the data may still arrive
    with pytest.raises(GGUFError, match=pattern):
        parse_header(data, len(data))
    with pytest.raises(GGUFError, match="extends past the end of the file"):
        parse_header(data, header.data_offset + 1)  # the size of a file shorter than its tensor data


def test_open_gguf_rejects_malformed_files_and_closes_them(tmp_path):
    for index, (_, data, pattern) in enumerate(CASES):
        path = tmp_path / f"case{index}.gguf"
        path.write_bytes(data)
        with pytest.raises(GGUFError, match=pattern):  # a failure to unmap would raise BufferError instead
            open_gguf(path)


def test_truncation_at_every_byte_is_a_gguf_error():
    for length in range(len(VALID)):
        with pytest.raises(GGUFError) as error:
            parse_header(VALID[:length], length)
        assert type(error.value) is GGUFError
        message = str(error.value)
        assert "truncated" in message or "past the end of the file" in message, message


def test_truncation_at_every_byte_with_unknown_size():
    for length in range(len(VALID)):
        try:
            parse_header(VALID[:length])
        except GGUFIncomplete as e:
            assert length < e.needed <= HEADER_END
        else:
            assert length >= HEADER_END


@pytest.mark.parametrize("replacement", [0x00, 0x01, 0x7F, 0x80, 0xFF])
def test_every_byte_overwritten_parses_or_gives_gguf_error(replacement):
    errors = 0
    for position in range(HEADER_END):
        data = bytearray(VALID)
        data[position] = replacement
        try:
            parse_header(data, len(data))
        except GGUFError as e:  # any other exception fails the test
            assert "offset" in str(e)
            errors += 1
    assert errors > 0


def test_random_mutations_parse_or_give_gguf_error():
    rng = random.Random(1234)
    errors = 0
    for _ in range(2000):
        data = bytearray(VALID)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(HEADER_END)] = rng.randrange(256)
        cut = rng.choice([len(data), rng.randrange(len(data) + 1)])
        try:
            with hang_guard():
                parse_header(data[:cut], rng.choice([cut, None]))
        except GGUFError as e:
            assert "offset" in str(e)
            errors += 1
    assert errors > 0
