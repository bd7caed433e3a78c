"""embed.wgsl against numpy: rows of every table format picked by ids read on the GPU, a table split
into parts, ids at an offset of a bigger buffer, a scale. The dequantization is exact in f32 (f16
scales times small integers), so the lookup must match numpy to f32 rounding (rtol 1e-6)."""

import numpy as np
import pytest
from gpu_helpers import read_f32, upload
from random_weights import random_weights

from webgguf import ops
from webgguf.gpu import Plan
from webgguf.quants import TYPE_BY_NAME
from webgguf.weights import WEIGHT_TYPES

# Formats with blocks of up to 32 elements (super-block formats, whose rows are multiples of 256:
# test_kquants.py).
SMALL_BLOCK_TYPES = [t for t in WEIGHT_TYPES if TYPE_BY_NAME[t].block_elems <= 32]


def run_embed(kernels, type_name, n_vocab, n_embd, ids, *, id_offset=0, scale=1.0, max_part_bytes=0):
    backend = kernels.backend
    rng = np.random.default_rng(5)
    raw, table = random_weights(rng, type_name, n_vocab, n_embd)
    weight = kernels.uploads.upload_weight("token_embd", type_name, n_embd, n_vocab, raw, max_part_bytes)
    ids_buf = upload(backend, "ids", np.array(ids, np.uint32))
    n_tokens = len(ids) - id_offset
    out = upload(backend, "out", np.full((n_tokens, n_embd), 7.0, np.float32))
    steps = ops.embed(kernels, weight, ids_buf, out, n_tokens, id_offset=id_offset, scale=scale)
    backend.replay(Plan("embed", tuple(steps)))
    got = read_f32(backend, out, (n_tokens, n_embd))
    for buffer in (ids_buf, out, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)
    rows = np.array([i if i < n_vocab else 0 for i in ids[id_offset:]])
    return got, table[rows] * scale, len(weight.parts)


@pytest.mark.parametrize("type_name", SMALL_BLOCK_TYPES)
def test_embed_formats(kernels, type_name):
    got, want, _ = run_embed(kernels, type_name, 50, 96, [3, 0, 49, 3, 17])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_embed_split_table_offset_ids_and_scale(kernels):
    ids = [99, 98, 1, 60, 0, 33, 64]
    got, want, n_parts = run_embed(
        kernels, "Q8_0", 100, 64, ids, id_offset=2, scale=8.0, max_part_bytes=30 * 68
    )
    assert n_parts == 4
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_embed_id_past_the_table_writes_nothing(kernels):
    got, _, _ = run_embed(kernels, "F16", 10, 32, [10])
    assert np.all(got == 7.0)
