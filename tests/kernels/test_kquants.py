"""Super-block weight formats (the K-quants Q2_K..Q6_K and IQ4_XS, 256 elements per super-block):
repack.wgsl output byte for byte against the layout documented in shaders/lib/weights.wgsl (built here
with numpy from the GGUF super-blocks), then gemv, gemm and embed on them against numpy, with the
runners and tolerances of test_gemv.py, test_gemm.py and test_embed.py. The matrices are random
well-formed super-blocks (random_weights.py).

The dequantization stays exact in f32 (f16 d times a sub-block scale of at most 8 bits times a quant of
at most 7 bits fits 24 bits; the one rounding at the end is numpy's too), so the f32 tolerances of the
other formats hold.
"""

import numpy as np
import pytest
from gpu_helpers import max_scaled_error
from random_weights import random_weights
from test_embed import run_embed
from test_gemm import run_gemm, tolerance_of
from test_gemv import RTOL, run_gemv
from test_weights import gpu_arrays

from webgguf.quants import TYPE_BY_NAME
from webgguf.weights import WEIGHT_TYPES, weight_row_bytes

SUPER_BLOCK_TYPES = [t for t in WEIGHT_TYPES if TYPE_BY_NAME[t].block_elems == 256]


# ---------------------------------------------------------------- the documented layout, in numpy


def pack_fields(values, width: int) -> bytes:
    """Element-ordered fields [..., n] of `width` bits → little-endian u32 words, field i of a word at
    bits width * i (32 / width fields per word)."""
    fields = values.reshape(-1, 32 // width).astype(np.uint32)
    shifts = np.arange(32 // width, dtype=np.uint32) * width
    return (fields << shifts).sum(axis=1, dtype=np.uint32).astype("<u4").tobytes()


def planes(data, shifts, width):
    """Bytes [n, m] → [n, len(shifts), m]: plane i holds the `width`-bit field at bit shifts[i] of each
    byte (GGUF's K-quants keep one element per byte in such bit planes)."""
    shifts = np.array(shifts, dtype=np.uint8).reshape(1, -1, 1)
    return (data[:, None, :] >> shifts) & ((1 << width) - 1)


def two_bit_quants(qs):
    """Q2_K/Q3_K quants, Q6_K high bits: element 128h + 32s + l is bits 2s of qs[32h + l] → [n, 256]."""
    return np.concatenate([planes(qs[:, 32 * h : 32 * h + 32], [0, 2, 4, 6], 2) for h in (0, 1)], axis=1)


def k4_nibbles(qs):
    """Q4_K/Q5_K qs [n, 128]: sub-block 2c / 2c+1 are the low / high nibbles of qs[32c..32c+31]."""
    return np.concatenate([planes(qs[:, 32 * c : 32 * c + 32], [0, 4], 4) for c in range(4)], axis=1)


def q6_k_nibbles(ql):
    """Q6_K ql [n, 128]: element 128h + 32k + l is nibble k // 2 of ql[64h + 32 (k % 2) + l]."""
    return np.concatenate([planes(ql[:, 64 * h : 64 * h + 64], [0, 4], 4) for h in (0, 1)], axis=1)


def documented_layout(raw, type_name):
    """{binding: bytes} of the GPU arrays for raw GGUF rows [n_out, row bytes]."""
    n = raw.size // TYPE_BY_NAME[type_name].block_bytes
    b = raw.reshape(n, -1)  # [super-block, byte]
    pad = np.zeros((n, 2), np.uint8)
    if type_name == "Q2_K":
        return {
            3: pack_fields(two_bit_quants(b[:, 16:80]), 2),
            4: np.concatenate([b[:, 80:84], b[:, 0:16]], axis=1).tobytes(),
        }
    if type_name == "Q3_K":
        return {
            3: pack_fields(two_bit_quants(b[:, 32:96]), 2),
            4: np.concatenate([b[:, 108:110], pad, b[:, 96:108]], axis=1).tobytes(),
            5: pack_fields(planes(b[:, 0:32], range(8), 1), 1),
        }
    if type_name == "IQ4_XS":
        return {3: b[:, 8:136].tobytes(), 4: b[:, 0:8].tobytes()}
    if type_name == "Q4_K":
        return {3: pack_fields(k4_nibbles(b[:, 16:144]), 4), 4: b[:, 0:16].tobytes()}
    if type_name == "Q5_K":
        return {
            3: pack_fields(k4_nibbles(b[:, 48:176]), 4),
            4: b[:, 0:16].tobytes(),
            5: pack_fields(planes(b[:, 16:48], range(8), 1), 1),
        }
    return {  # Q6_K
        3: pack_fields(q6_k_nibbles(b[:, 0:128]), 4),
        4: np.concatenate([b[:, 208:210], pad, b[:, 192:208]], axis=1).tobytes(),
        5: pack_fields(two_bit_quants(b[:, 128:192]), 2),
    }


@pytest.mark.parametrize("type_name", SUPER_BLOCK_TYPES)
def test_repacked_layout_is_the_documented_one(kernels, type_name):
    raw, _ = random_weights(np.random.default_rng(7), type_name, 5, 768)  # 3 super-blocks a row
    weight = kernels.uploads.upload_weight("w", type_name, 768, 5, raw)
    assert gpu_arrays(kernels.backend, weight) == documented_layout(raw, type_name)


@pytest.mark.parametrize("type_name", SUPER_BLOCK_TYPES)
def test_gpu_bytes_per_super_block_are_about_gguf(type_name):
    gguf_bytes = TYPE_BY_NAME[type_name].block_bytes
    assert gguf_bytes <= sum(weight_row_bytes(type_name, 256).values()) <= gguf_bytes + 2


def test_row_ranges_concatenate_across_parts(kernels):
    """[gate; up] written as two uploads into a weight split into parts of 3 rows."""
    rng = np.random.default_rng(8)
    gate, _ = random_weights(rng, "Q5_K", 4, 256)
    up, _ = random_weights(rng, "Q5_K", 4, 256)
    weight = kernels.uploads.create_weight("gate_up", "Q5_K", 256, 8, max_part_bytes=3 * 176 + 4)
    assert [(p.row_begin, p.row_end) for p in weight.parts] == [(0, 3), (3, 6), (6, 8)]
    kernels.uploads.write_rows(weight, 0, gate, 4)
    kernels.uploads.write_rows(weight, 4, up, 4)
    assert gpu_arrays(kernels.backend, weight) == documented_layout(np.concatenate([gate, up]), "Q5_K")


def test_rows_must_be_whole_super_blocks(kernels):
    with pytest.raises(ValueError, match="n_in 640 is not a multiple of 256"):
        kernels.uploads.create_weight("w", "Q4_K", 640, 2)


# ---------------------------------------------------------------- kernels on super-block weights


@pytest.mark.parametrize("type_name", SUPER_BLOCK_TYPES)
@pytest.mark.parametrize("n_out,n_in", [(67, 256), (40, 2048)])
def test_gemv_formats(gemv_kernels, type_name, n_out, n_in):
    got, want, scale = run_gemv(gemv_kernels, type_name, n_out, n_in)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize(
    "epilogue",
    [
        {"residual": True},
        {"gate_up": True},
        {"norm": True},
        {"norm": True, "gate_up": True},
        {"norm": True, "residual": True},
    ],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_gemv_epilogues(gemv_kernels, type_name, epilogue):
    got, want, scale = run_gemv(gemv_kernels, type_name, 45, 512, seed=1, **epilogue)
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_split_weight(gemv_kernels):
    got, want, scale = run_gemv(
        gemv_kernels,
        "Q6_K",
        100,
        256,
        max_part_bytes=30 * 212 + 4,
        residual=True,
    )
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize("type_name", SUPER_BLOCK_TYPES)
def test_gemm_formats(gemm_kernels, type_name):
    got, want, scale = run_gemm(gemm_kernels, type_name, 37, 70, 512)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


@pytest.mark.parametrize(
    "epilogue",
    [{"residual": True}, {"gate_up": True}, {"norm": True}, {"norm": True, "gate_up": True}],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_gemm_epilogues(gemm_kernels, type_name, epilogue):
    got, want, scale = run_gemm(gemm_kernels, type_name, 33, 45, 256, seed=1, **epilogue)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


def test_gemm_split_weight(gemm_kernels):
    got, want, scale = run_gemm(gemm_kernels, "Q2_K", 5, 150, 256, max_part_bytes=40 * 84 + 4)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


@pytest.mark.parametrize("type_name", SUPER_BLOCK_TYPES)
def test_embed_formats(kernels, type_name):
    got, want, _ = run_embed(kernels, type_name, 50, 512, [3, 0, 49, 3, 17])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_embed_split_table_offset_ids_and_scale(kernels):
    ids = [99, 98, 1, 60, 0, 33, 64]
    got, want, n_parts = run_embed(
        kernels,
        "Q3_K",
        100,
        256,
        ids,
        id_offset=2,
        scale=8.0,
        max_part_bytes=30 * 112 + 4,
    )
    assert n_parts == 4
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
