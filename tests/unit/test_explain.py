"""The plans of the real models on described adapters (explain.py: built as the engine builds them,
against a backend that allocates nothing): dispatches per decode step as docs/ENGINE.md states them,
and a note with a kernel and a reason for every dispatch."""

import pytest

from webgguf import explain
from webgguf.gguf import read_header
from webgguf.gpu.base import Limits

# Lavapipe's limits (Mesa 22, the tests' adapter): storage bindings of 128 MiB, so Gemma's 262k-row
# embedding and output head take two bindings each.
LAVAPIPE_LIMITS = Limits(128 << 20, (2 << 30) - 1, 32, 65535, 1024, 32768, 65536, 32, 32, 1024)


def decode_notes(model_path, name, backend):
    result = explain.explain(read_header(model_path(name)), backend, chunk=16, n_ctx=256)
    return next(iter(result["plans"].values()))


@pytest.mark.parametrize(
    "name, adapter, dispatches",
    [
        ("smollm2-135m-instruct", "gpu", 155),  # 5 per layer + 5 (the int8 head quantizes its input)
        ("smollm2-135m-instruct", "cpu", 185),  # + norm_inputs before each gate/up GEMV and the head
        ("gemma-3-270m", "gpu", 105),  # the post-norm adds folded, but the one before the head; int8 head
        ("gemma-3-270m", "cpu", 160),
    ],
)
def test_dispatches_per_decode_step(model_path, name, adapter, dispatches):
    notes = decode_notes(model_path, name, explain.planning_backend(adapter))
    assert len(notes) == dispatches
    assert all(n.kernel and n.reason and n.workgroups[0] >= 1 for n in notes)


def test_gemma_on_lavapipe_with_gpu_shapes_splits_the_vocabulary(model_path):
    """107 dispatches: the embedding and the (int8) output head take two bindings each at 128 MiB."""
    backend = explain.PlanningBackend(LAVAPIPE_LIMITS, {"shader-f16", "subgroups"}, (8, 8), cpu_adapter=False)
    notes = decode_notes(model_path, "gemma-3-270m", backend)
    assert len(notes) == 107
    # 197,379 rows of 680 bytes (Q8_0, 640 columns) fill a 128 MiB binding
    assert [n.name for n in notes if n.op == "embed"] == ["embed[0:197379]", "embed[197379:262144]"]
    assert [n.name for n in notes if n.tensor == "token_embd.weight" and n.op != "embed"] == [
        "output.quantize_q8",
        "output.gemv_q8[0:197379]",
        "output.gemv_q8[197379:262144]",
    ]
