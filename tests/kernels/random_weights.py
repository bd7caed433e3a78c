"""Random weight matrices of every GPU weight format, with their numpy dequantization.

gguf-py quantizes F32..Q8_0 (gpu_helpers.random_matrix) but not the K-quants or IQ4 formats: for those
the matrices are random well-formed blocks, random bytes (every bit pattern of the quants and of the
4-8 bit sub-block scales is valid) with finite random f16 d / dmin.
"""

import numpy as np
from gpu_helpers import random_matrix

from webgguf.quants import TYPE_BY_NAME, dequantize

# Byte offsets of the f16 fields (d, dmin) in each block of the formats made of random blocks.
F16_FIELDS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def random_weights(rng, type_name: str, n_out: int, n_in: int):
    """(raw GGUF bytes [n_out, row bytes] uint8, dequantized weights [n_out, n_in] float64)."""
    if type_name not in F16_FIELDS:
        return random_matrix(rng, type_name, n_out, n_in)
    t = TYPE_BY_NAME[type_name]
    raw = rng.integers(0, 256, (n_out, n_in // t.block_elems * t.block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, t.block_bytes)  # a view: writes land in raw
    for at in F16_FIELDS[type_name]:
        d = (rng.standard_normal(len(blocks)) * 2e-3).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw, reference_dequantize(raw, type_name, n_out, n_in).astype(np.float64)


def reference_dequantize(raw, type_name: str, n_out: int, n_in: int):
    """webgguf.quants.dequantize (itself checked against gguf-py's in tests/unit/test_quants.py)."""
    return dequantize(raw, TYPE_BY_NAME[type_name].id, (n_in, n_out))
