"""GGML tensor types: the block-format table, and numpy dequantization (the reference).

The table is pure Python (the GGUF reader uses it in Pyodide, which has no numpy);
numpy is imported only by the dequantization functions below it.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block_elems: int  # elements per block
    block_bytes: int  # bytes per block


_TYPES = [
    GGMLType(0, "F32", 1, 4),
    GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18),
    GGMLType(3, "Q4_1", 32, 20),
    GGMLType(6, "Q5_0", 32, 22),
    GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34),
    GGMLType(9, "Q8_1", 32, 36),
    GGMLType(10, "Q2_K", 256, 84),
    GGMLType(11, "Q3_K", 256, 110),
    GGMLType(12, "Q4_K", 256, 144),
    GGMLType(13, "Q5_K", 256, 176),
    GGMLType(14, "Q6_K", 256, 210),
    GGMLType(15, "Q8_K", 256, 292),
    GGMLType(16, "IQ2_XXS", 256, 66),
    GGMLType(17, "IQ2_XS", 256, 74),
    GGMLType(18, "IQ3_XXS", 256, 98),
    GGMLType(19, "IQ1_S", 256, 50),
    GGMLType(20, "IQ4_NL", 32, 18),
    GGMLType(21, "IQ3_S", 256, 110),
    GGMLType(22, "IQ2_S", 256, 82),
    GGMLType(23, "IQ4_XS", 256, 136),
    GGMLType(24, "I8", 1, 1),
    GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4),
    GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8),
    GGMLType(29, "IQ1_M", 256, 56),
    GGMLType(30, "BF16", 1, 2),
    GGMLType(34, "TQ1_0", 256, 54),
    GGMLType(35, "TQ2_0", 256, 66),
    GGMLType(39, "MXFP4", 32, 17),
]

GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in _TYPES}
TYPE_BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TYPES}


def tensor_nbytes(type_id: int, n_elements: int) -> int:
    """Bytes of a tensor of `n_elements` of GGML type `type_id` (n_elements must fill whole blocks)."""
    t = GGML_TYPES[type_id]
    return (n_elements // t.block_elems) * t.block_bytes


# ----------------------------------------------------------------------------------------------------------
# Dequantization (numpy reference). Each format's block layout is written as a numpy structured dtype, field
# by field in file order, so the dtype is the layout. Formulas follow ggml's dequantize_row_* (ggml-quants.c).
# ----------------------------------------------------------------------------------------------------------


class UnsupportedTypeError(ValueError):
    """Dequantization of this GGML type is not implemented."""


def dequantize(raw, type_id: int, shape) -> "np.ndarray":
    """Dequantize one tensor's bytes to float32.

    raw: the tensor's bytes (bytes, memoryview or a uint8 numpy array).
    shape: in ggml order (TensorInfo.shape: shape[0] is the contiguous row length).
    Returns a C-contiguous float32 array in numpy (reversed) shape: ggml (n_in, n_out) -> [n_out, n_in].
    """
    import numpy as np

    if type_id not in _DEQUANTIZERS:
        name = GGML_TYPES[type_id].name if type_id in GGML_TYPES else f"unknown type id {type_id}"
        supported = ", ".join(GGML_TYPES[t].name for t in _DEQUANTIZERS)
        raise UnsupportedTypeError(f"cannot dequantize {name}: supported types are {supported}")
    ggml_type = GGML_TYPES[type_id]
    n_elements = 1
    for dim in shape:
        n_elements *= int(dim)
    if n_elements % ggml_type.block_elems != 0:
        raise ValueError(f"{ggml_type.name}: {n_elements} elements do not fill whole blocks")
    if isinstance(raw, np.ndarray):
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    else:
        data = np.frombuffer(raw, dtype=np.uint8)
    expected = tensor_nbytes(type_id, n_elements)
    if data.size != expected:
        raise ValueError(f"{ggml_type.name} tensor {tuple(shape)} needs {expected} bytes, got {data.size}")
    values = _DEQUANTIZERS[type_id](data)  # [n_elements] float32
    return values.reshape(tuple(int(d) for d in reversed(shape)))


def _blocks(data, layout):
    """View raw bytes as an array of structured blocks (one record per block)."""
    import numpy as np

    return np.frombuffer(data, dtype=np.dtype(layout))


def _f16(field):
    """A per-block f16 field as float32, shaped [n_blocks, 1] to broadcast over the block's elements."""
    import numpy as np

    return field.astype(np.float32).reshape(-1, 1)


def _unpack_low_high_nibbles(qs):
    """[n, 16] bytes -> [n, 32] values: low nibbles are elements 0..15, high nibbles elements 16..31."""
    import numpy as np

    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _unpack_bits(packed_u32, n_bits):
    """[n] uint32 -> [n, n_bits] uint8: bit i of each word."""
    import numpy as np

    return ((packed_u32.reshape(-1, 1) >> np.arange(n_bits, dtype=np.uint32)) & 1).astype(np.uint8)


def _dequantize_f32(data):
    import numpy as np

    return data.view("<f4").astype(np.float32)


def _dequantize_f16(data):
    import numpy as np

    return data.view("<f2").astype(np.float32)


def _dequantize_bf16(data):
    # bf16 is the top half of an f32: shift it back into place.
    import numpy as np

    return (data.view("<u2").astype(np.uint32) << 16).view(np.float32)


def _dequantize_q4_0(data):
    # block (18 B, 32 elements): d f16 | qs[16] (element j: low nibble of qs[j], element j+16: high nibble)
    # x = d * (q - 8)
    blocks = _blocks(data, [("d", "<f2"), ("qs", "u1", 16)])
    q = _unpack_low_high_nibbles(blocks["qs"]).astype("i1") - 8  # [n_blocks, 32]
    return (_f16(blocks["d"]) * q).reshape(-1)


def _dequantize_q4_1(data):
    # block (20 B, 32 elements): d f16 | m f16 | qs[16] (nibbles as in Q4_0)
    # x = d * q + m
    blocks = _blocks(data, [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
    q = _unpack_low_high_nibbles(blocks["qs"])  # [n_blocks, 32]
    return (_f16(blocks["d"]) * q + _f16(blocks["m"])).reshape(-1)


def _five_bit_quants(blocks):
    """Q5_0/Q5_1: low 4 bits from the nibbles of qs, bit 4 of element j is bit j of the 32-bit qh."""
    low = _unpack_low_high_nibbles(blocks["qs"])  # [n_blocks, 32]
    high = _unpack_bits(blocks["qh"], 32)  # [n_blocks, 32]
    return low | (high << 4)


def _dequantize_q5_0(data):
    # block (22 B, 32 elements): d f16 | qh u32 (5th bits) | qs[16] (low 4 bits, nibbles as in Q4_0)
    # x = d * (q - 16)
    blocks = _blocks(data, [("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
    q = _five_bit_quants(blocks).astype("i1") - 16  # [n_blocks, 32]
    return (_f16(blocks["d"]) * q).reshape(-1)


def _dequantize_q5_1(data):
    # block (24 B, 32 elements): d f16 | m f16 | qh u32 | qs[16]
    # x = d * q + m
    blocks = _blocks(data, [("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)])
    q = _five_bit_quants(blocks)  # [n_blocks, 32]
    return (_f16(blocks["d"]) * q + _f16(blocks["m"])).reshape(-1)


def _dequantize_q8_0(data):
    # block (34 B, 32 elements): d f16 | qs int8[32]
    # x = d * q
    blocks = _blocks(data, [("d", "<f2"), ("qs", "i1", 32)])
    return (_f16(blocks["d"]) * blocks["qs"]).reshape(-1)


# K-quants: a super-block of 256 elements made of sub-blocks of 16 or 32 elements, each with its own scale.
QK_K = 256


def _two_bit_planes(qs):
    """Q2_K/Q3_K quants: [n, 64] bytes -> [n, 256] 2-bit values.

    Each half of the block (128 elements) uses 32 bytes; element h*128 + s*32 + l is bits 2s..2s+1 of byte
    h*32 + l (s = 0..3 picks the bit pair, l = 0..31).
    """
    import numpy as np

    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    planes = (qs.reshape(-1, 2, 1, 32) >> shifts) & 3  # [n, half, s, l]
    return planes.reshape(-1, QK_K)


def _dequantize_q2_k(data):
    # super-block (84 B, 256 elements): scales[16] (low nibble: scale, high nibble: min, per 16 elements)
    #                                    | qs[64] (2-bit quants, see _two_bit_planes) | d f16 | dmin f16
    # x = d * scale * q - dmin * min
    blocks = _blocks(data, [("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")])
    scale = _f16(blocks["d"]) * (blocks["scales"] & 0x0F)  # [n, 16]
    offset = _f16(blocks["dmin"]) * (blocks["scales"] >> 4)  # [n, 16]
    q = _two_bit_planes(blocks["qs"]).reshape(-1, 16, 16)  # [n, sub-block, 16]
    return (scale[:, :, None] * q - offset[:, :, None]).reshape(-1)


def _q3_k_scales(packed):
    """Q3_K: 16 signed 6-bit scales packed in 12 bytes: [n, 12] -> [n, 16] int (value - 32).

    Scale i: low 4 bits are nibble i // 8 of byte i % 8; high 2 bits are bits 2*(i // 4).. of byte 8 + i % 4.
    """
    import numpy as np

    i = np.arange(16)
    low = (packed[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 0x0F
    high = (packed[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 0x03
    return (low | (high << 4)).astype(np.int16) - 32


def _dequantize_q3_k(data):
    # super-block (110 B, 256 elements): hmask[32] (3rd bit) | qs[64] (low 2 bits, as Q2_K)
    #                                     | scales[12] (16 6-bit scales) | d f16
    # Element h*128 + s*32 + l has its 3rd bit at bit 4h+s of hmask[l]; a CLEAR bit means subtract 4.
    # x = d * (scale - 32) * (q - (hbit ? 0 : 4))
    import numpy as np

    blocks = _blocks(data, [("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")])
    low = _two_bit_planes(blocks["qs"]).astype(np.int8)  # [n, 256]
    bit_index = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    hbit = ((blocks["hmask"].reshape(-1, 1, 32) >> bit_index) & 1).reshape(-1, QK_K)  # [n, 256]
    q = low - 4 * (1 - hbit.astype(np.int8))  # [n, 256] in -4..3
    scale = _f16(blocks["d"]) * _q3_k_scales(blocks["scales"])  # [n, 16]
    return (scale[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1)


def _k4_scales_mins(packed):
    """Q4_K/Q5_K: 8 6-bit scales and 8 6-bit mins packed in 12 bytes: [n, 12] -> ([n, 8], [n, 8]).

    For j < 4: scale = b[j] & 63, min = b[j+4] & 63.
    For j >= 4: scale = (b[j+4] & 15) | (b[j-4] >> 6) << 4, min = (b[j+4] >> 4) | (b[j] >> 6) << 4.
    """
    import numpy as np

    b = packed
    scales = np.concatenate([b[:, 0:4] & 63, (b[:, 8:12] & 15) | ((b[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([b[:, 4:8] & 63, (b[:, 8:12] >> 4) | ((b[:, 4:8] >> 6) << 4)], axis=1)
    return scales, mins


def _k4_nibbles(qs):
    """Q4_K/Q5_K low 4 bits: [n, 128] bytes -> [n, 8, 32]. Each 32 bytes hold two sub-blocks of 32 elements:
    sub-block 2c from the low nibbles, sub-block 2c+1 from the high nibbles of bytes 32c..32c+31."""
    import numpy as np

    chunks = qs.reshape(-1, 4, 1, 32)  # [n, c, 1, l]
    nibbles = (chunks >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # [n, c, low/high, l]
    return nibbles.reshape(-1, 8, 32)


def _dequantize_q4_k(data):
    # super-block (144 B, 256 elements): d f16 | dmin f16 | scales[12] (8 6-bit scales + 8 6-bit mins,
    #                                     one per 32 elements) | qs[128] (4-bit quants, see _k4_nibbles)
    # x = d * scale * q - dmin * min
    blocks = _blocks(data, [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
    sc, mn = _k4_scales_mins(blocks["scales"])
    scale = _f16(blocks["d"]) * sc  # [n, 8]
    offset = _f16(blocks["dmin"]) * mn  # [n, 8]
    q = _k4_nibbles(blocks["qs"])  # [n, 8, 32]
    return (scale[:, :, None] * q - offset[:, :, None]).reshape(-1)


def _dequantize_q5_k(data):
    # super-block (176 B, 256 elements): d f16 | dmin f16 | scales[12] (as Q4_K) | qh[32] (5th bits)
    #                                     | qs[128] (low 4 bits, as Q4_K)
    # The 5th bit of element 32*s + l (sub-block s) is bit s of qh[l].
    # x = d * scale * q - dmin * min
    import numpy as np

    layout = [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)]
    blocks = _blocks(data, layout)
    sc, mn = _k4_scales_mins(blocks["scales"])
    scale = _f16(blocks["d"]) * sc  # [n, 8]
    offset = _f16(blocks["dmin"]) * mn  # [n, 8]
    bit_index = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    high = (blocks["qh"].reshape(-1, 1, 32) >> bit_index) & 1  # [n, 8, 32]
    q = _k4_nibbles(blocks["qs"]) | (high << 4)  # [n, 8, 32]
    return (scale[:, :, None] * q - offset[:, :, None]).reshape(-1)


def _dequantize_q6_k(data):
    # super-block (210 B, 256 elements): ql[128] (low 4 bits) | qh[64] (high 2 bits) | scales int8[16]
    #                                     (one per 16 elements) | d f16
    # Each half h (128 elements) uses ql[64h..64h+63] and qh[32h..32h+31]. Its element 32k + l (k = 0..3,
    # l = 0..31) takes the low nibble (k < 2) or the high nibble (k >= 2) of ql[64h + 32(k % 2) + l] and
    # bits 2k..2k+1 of qh[32h + l].
    # x = d * scale * (q - 32)
    import numpy as np

    blocks = _blocks(data, [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
    ql = blocks["ql"].reshape(-1, 2, 1, 2, 32)  # [n, h, nibble, k % 2, l]
    low = (ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1, 1)) & 0x0F
    low = low.reshape(-1, 2, 4, 32)  # [n, h, k, l]
    qh = blocks["qh"].reshape(-1, 2, 1, 32)  # [n, h, 1, l]
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 0x03  # [n, h, k, l]
    q = (low | (high << 4)).astype(np.int8) - 32  # [n, h, k, l]
    scale = _f16(blocks["d"]) * blocks["scales"]  # [n, 16]
    return (scale[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1)


# IQ4 formats: 4-bit indices into a fixed non-uniform code book (llama.cpp's kvalues_iq4nl).
IQ4_CODE_BOOK = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _dequantize_iq4_nl(data):
    # block (18 B, 32 elements): d f16 | qs[16] (nibbles as in Q4_0)
    # x = d * code_book[q]
    import numpy as np

    blocks = _blocks(data, [("d", "<f2"), ("qs", "u1", 16)])
    q = _unpack_low_high_nibbles(blocks["qs"])  # [n_blocks, 32]
    return (_f16(blocks["d"]) * np.array(IQ4_CODE_BOOK, np.float32)[q]).reshape(-1)


def _dequantize_iq4_xs(data):
    # super-block (136 B, 256 elements): d f16 | scales_h u16 | scales_l[4] | qs[128]
    # sub-block j (32 elements, nibbles as in Q4_0 over qs[16 j .. 16 j + 15]) has the 6-bit scale
    # s_j = (4 bits of scales_l[j / 2] at 4 (j % 2)) | (2 bits of scales_h at 2 j) << 4;
    # x = d * (s_j - 32) * code_book[q]
    import numpy as np

    blocks = _blocks(data, [("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)])
    j = np.arange(8)
    low = (blocks["scales_l"][:, j // 2] >> (4 * (j % 2))) & 0x0F  # [n, 8]
    high = (blocks["scales_h"].astype(np.uint32).reshape(-1, 1) >> (2 * j)) & 0x03  # [n, 8]
    scales = _f16(blocks["d"]) * ((low | (high << 4)).astype(np.float32) - 32)  # [n, 8]
    q = _unpack_low_high_nibbles(blocks["qs"].reshape(-1, 16)).reshape(-1, 8, 32)  # [n, 8, 32]
    return (scales[:, :, None] * np.array(IQ4_CODE_BOOK, np.float32)[q]).reshape(-1)


_DEQUANTIZERS = {
    0: _dequantize_f32,
    1: _dequantize_f16,
    30: _dequantize_bf16,
    2: _dequantize_q4_0,
    3: _dequantize_q4_1,
    6: _dequantize_q5_0,
    7: _dequantize_q5_1,
    8: _dequantize_q8_0,
    10: _dequantize_q2_k,
    11: _dequantize_q3_k,
    12: _dequantize_q4_k,
    13: _dequantize_q5_k,
    14: _dequantize_q6_k,
    20: _dequantize_iq4_nl,
    23: _dequantize_iq4_xs,
}
