"""A small storage-binding limit splits every large tensor into parts, and nothing else changes.

Browsers bind at most 128 MiB per storage buffer by default, and a 7-8B model's embedding and output
head are 280-450 MB: the engine splits such weights on row boundaries, one dispatch per part (docs/GPU.md).
Here SmolLM2 on lavapipe under a simulated 4 MiB limit (its 30 MB Q8_0 embedding / output head becomes 8
parts, its layers stay whole) gives the logits of the unsplit engine: the same products in the same
order, so the same bits up to the order of the output head's sums (tolerance 1e-6 of the largest logit).
"""

import dataclasses
import struct

import numpy as np

from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gpu.native import NativeBackend

SPLIT_LIMIT = 4 << 20
IDS = [1, 504, 3458, 282, 253, 6353, 30, 2]


def logits_of(model, backend) -> tuple[np.ndarray, int]:
    engine = GpuEngine(model, backend, n_ctx=64, max_chunk=8, batch=4)
    engine.upload_from_file()
    parts = len(engine.gpu.weights["token_embd.weight"].parts)
    rows = []
    for _, pending in engine.score_chunks(IDS):
        raw = pending.wait()
        rows.append(np.array(struct.unpack(f"<{len(raw) // 4}f", raw)))
    return np.concatenate(rows).reshape(len(IDS), -1), parts


def test_split_weights_give_the_same_logits(model_path):
    model = LoadedModel.open(model_path("smollm2-135m-instruct"))
    whole, whole_parts = logits_of(model, NativeBackend())
    backend = NativeBackend()
    backend.limits = dataclasses.replace(backend.limits, max_storage_buffer_binding_size=SPLIT_LIMIT)
    split, split_parts = logits_of(model, backend)
    assert whole_parts == 1 and split_parts == 8
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-6 * np.abs(whole).max())
    assert (split.argmax(axis=1) == whole.argmax(axis=1)).all()
