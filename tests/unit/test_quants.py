"""Dequantization against the gguf package's reference (gguf.quants.dequantize) for every supported type."""

import subprocess
import sys
import zlib

import gguf
import numpy as np
import pytest

from webgguf.quants import GGML_TYPES, TYPE_BY_NAME, UnsupportedTypeError, dequantize, tensor_nbytes

# Byte offsets of the f16 scale fields inside one block: random bytes there could be inf/NaN, which a real
# quantizer never writes, so the test puts finite values there.
F16_FIELD_OFFSETS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
}
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16}
SUPPORTED = ["F32", "F16", "BF16", *F16_FIELD_OFFSETS]
# ggml shapes (row length first); row lengths are whole blocks for the block formats.
SHAPES = [(256,), (512, 3), (1024, 7), (256, 2, 3)]


def random_tensor_bytes(type_name: str, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """Well-formed random data of a type: uint8 [nbytes]."""
    ggml_type = TYPE_BY_NAME[type_name]
    if type_name in FLOAT_TYPES:
        values = rng.standard_normal(n_elements).astype(FLOAT_TYPES[type_name])
        return values.view(np.uint8)
    if type_name == "BF16":
        values = rng.standard_normal(n_elements).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    n_blocks = n_elements // ggml_type.block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, ggml_type.block_bytes), dtype=np.uint8)
    for offset in F16_FIELD_OFFSETS[type_name]:
        scale = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)  # [n_blocks]
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("type_name", SUPPORTED)
def test_dequantize_matches_gguf_package(type_name, shape):
    rng = np.random.default_rng(zlib.crc32(f"{type_name}{shape}".encode()))
    ggml_type = TYPE_BY_NAME[type_name]
    n_elements = int(np.prod(shape))
    raw = random_tensor_bytes(type_name, n_elements, rng)
    assert raw.size == tensor_nbytes(ggml_type.id, n_elements)

    ours = dequantize(raw.tobytes(), ggml_type.id, shape)

    numpy_shape = tuple(reversed(shape))
    row_bytes = shape[0] // ggml_type.block_elems * ggml_type.block_bytes
    theirs = gguf.quants.dequantize(
        raw.reshape(*numpy_shape[:-1], row_bytes), gguf.GGMLQuantizationType(ggml_type.id)
    )
    assert ours.dtype == np.float32
    assert ours.shape == numpy_shape
    assert np.all(np.isfinite(ours))
    np.testing.assert_array_equal(ours, theirs)


def test_dequantize_accepts_bytes_memoryview_and_uint8_array():
    raw = random_tensor_bytes("Q4_K", 512, np.random.default_rng(0))  # uint8 [288]
    q4_k = TYPE_BY_NAME["Q4_K"].id
    expected = dequantize(raw.tobytes(), q4_k, (512,))
    np.testing.assert_array_equal(dequantize(memoryview(raw.tobytes()), q4_k, (512,)), expected)
    np.testing.assert_array_equal(dequantize(raw, q4_k, (512,)), expected)


@pytest.mark.parametrize("type_name", ["Q8_1", "IQ2_XXS", "MXFP4"])
def test_unsupported_type_is_named_in_error(type_name):
    ggml_type = TYPE_BY_NAME[type_name]
    raw = bytes(ggml_type.block_bytes)
    with pytest.raises(UnsupportedTypeError, match=type_name):
        dequantize(raw, ggml_type.id, (ggml_type.block_elems,))


def test_unknown_type_id_is_an_error():
    assert 99 not in GGML_TYPES
    with pytest.raises(UnsupportedTypeError, match="99"):
        dequantize(b"", 99, (0,))


def test_wrong_byte_count_is_an_error():
    with pytest.raises(ValueError, match="needs 68 bytes, got 34"):
        dequantize(bytes(34), TYPE_BY_NAME["Q8_0"].id, (64,))


def test_partial_block_is_an_error():
    with pytest.raises(ValueError, match="whole blocks"):
        dequantize(bytes(34), TYPE_BY_NAME["Q8_0"].id, (48,))


def test_table_imports_without_numpy():
    # The GGUF reader uses the table in Pyodide, which has no numpy.
    block_numpy = "import sys; sys.modules['numpy'] = None"
    code = f"{block_numpy}; import webgguf.quants; print(webgguf.quants.tensor_nbytes(2, 64))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "36"
