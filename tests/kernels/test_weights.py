"""Weights in GPU layout: repack.wgsl output byte for byte against the layout documented in
shaders/lib/weights.wgsl (built here with numpy from the GGUF blocks), uploads of row ranges
(concatenated matrices such as [gate; up]), splitting into parts, and bad uploads."""

import numpy as np
import pytest
from random_weights import random_weights

from webgguf.quants import TYPE_BY_NAME
from webgguf.weights import WEIGHT_TYPES, weight_row_bytes

# Formats with blocks of up to 32 elements (super-block formats, whose rows are multiples of 256:
# test_kquants.py).
SMALL_BLOCK_TYPES = [t for t in WEIGHT_TYPES if TYPE_BY_NAME[t].block_elems <= 32]

# GGUF block layouts: (block bytes, byte range of the scale field(s), of qh, of the quants)
BLOCKS = {
    "Q8_0": (34, (0, 2), None, (2, 34)),
    "Q4_0": (18, (0, 2), None, (2, 18)),
    "Q4_1": (20, (0, 4), None, (4, 20)),
    "Q5_0": (22, (0, 2), (2, 6), (6, 22)),
    "Q5_1": (24, (0, 4), (4, 8), (8, 24)),
    "IQ4_NL": (18, (0, 2), None, (2, 18)),
}


def documented_layout(raw, type_name):
    """{binding: bytes} of the GPU arrays for raw GGUF rows [n_out, row bytes]."""
    if type_name in ("F32", "F16"):
        return {3: raw.tobytes()}
    block_bytes, scales, qh, qs = BLOCKS[type_name]
    blocks = raw.reshape(raw.shape[0], -1, block_bytes)  # [n_out, nb, block bytes]
    arrays = {3: blocks[:, :, qs[0] : qs[1]].tobytes()}
    scale_bytes = blocks[:, :, scales[0] : scales[1]]
    if scales[1] == 2 and blocks.shape[1] % 2:  # f16 d in pairs per row: an odd row ends half empty
        scale_bytes = np.concatenate([scale_bytes, np.zeros_like(scale_bytes[:, :1])], axis=1)
    arrays[4] = scale_bytes.tobytes()
    if qh is not None:
        arrays[5] = blocks[:, :, qh[0] : qh[1]].tobytes()
    return arrays


def gpu_arrays(backend, weight):
    parts = {binding: b"" for binding in weight.parts[0].arrays}
    for part in weight.parts:
        for binding, buffer in part.arrays.items():
            parts[binding] += backend.read(buffer)
    return parts


@pytest.mark.parametrize("type_name", SMALL_BLOCK_TYPES)
def test_repacked_layout_is_the_documented_one(kernels, type_name):
    raw, _ = random_weights(np.random.default_rng(7), type_name, 5, 96)  # 3 blocks a row: odd
    weight = kernels.uploads.upload_weight("w", type_name, 96, 5, raw)
    assert gpu_arrays(kernels.backend, weight) == documented_layout(raw, type_name)


def test_row_ranges_concatenate_across_parts(kernels):
    """[gate; up] written as two uploads into a weight split into parts of 3 rows."""
    rng = np.random.default_rng(8)
    gate, _ = random_weights(rng, "Q5_0", 4, 64)
    up, _ = random_weights(rng, "Q5_0", 4, 64)
    weight = kernels.uploads.create_weight("gate_up", "Q5_0", 64, 8, max_part_bytes=3 * 44 + 4)
    assert [(p.row_begin, p.row_end) for p in weight.parts] == [(0, 3), (3, 6), (6, 8)]
    kernels.uploads.write_rows(weight, 0, gate, 4)
    kernels.uploads.write_rows(weight, 4, up, 4)
    assert gpu_arrays(kernels.backend, weight) == documented_layout(np.concatenate([gate, up]), "Q5_0")


def test_part_sizes(kernels):
    weight = kernels.uploads.create_weight("w", "Q4_1", 64, 10, max_part_bytes=4 * 40 + 4)
    assert [(p.row_begin, p.row_end) for p in weight.parts] == [(0, 4), (4, 8), (8, 10)]
    assert {b: buf.size for b, buf in weight.parts[2].arrays.items()} == {
        b: 2 * size for b, size in weight_row_bytes("Q4_1", 64).items()
    }


def test_bad_uploads(kernels):
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.uploads.create_weight("w", "Q8_0", 48, 2)
    with pytest.raises(ValueError, match="no GPU kernels"):
        kernels.uploads.create_weight("w", "IQ2_XS", 256, 2)
    weight = kernels.uploads.create_weight("w", "Q8_0", 32, 2)
    with pytest.raises(ValueError, match="34 bytes for 2 rows"):
        kernels.uploads.write_rows(weight, 0, bytes(34), 2)
