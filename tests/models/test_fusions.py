"""Every fusion pass (passes.py) leaves the logits as they are without it, on the GPU (lavapipe here).

Each plan is built with all the fusions the adapter would get, with all but one, and with none, for a tiny
random llama and a tiny random Gemma 3 (q/k norms, sliding windows, post-norms: the one that exercises
ADD_NORM), with the kernel shapes of a GPU (where every fusion applies) and of a CPU adapter. Compared:
the logits after a prefill of 16 + 1 tokens (a 1-token chunk folds like a decode step) and after each of
6 decode steps, and scoring chunks of 16 and 1 tokens (the GEMM head reading a folded step's residual
stream).

Tolerance: max |fused - unfused| / max |unfused| <= 1e-5 per step. Both compute the same f32 sums in
another order (the RMSNorm's sum of squares inside the GEMV or in its own kernel; attention merged from
splits or computed by the prefill kernel; x + the post-norm stored once or added in place), a few ulp per
op through 2-3 layers: measured up to ~1e-6 here.
"""

import numpy as np
import pytest
from test_arch_parity import TOKENS, write_tiny_gemma3
from test_reference_parity import write_tiny_llama

from webgguf import arch, passes
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gguf import read_header
from webgguf.gpu.native import NativeBackend
from webgguf.sampling import SamplingParams

TOLERANCE = 1e-5
DECODE_STEPS = 6


def load(path):
    """A LoadedModel driven by ids (the tiny models have no tokenizer)."""
    header = read_header(path)
    config = arch.config_from_metadata(header.metadata, list(header.tensors))
    return LoadedModel(path, header, config, tokenizer=None, template=None)


@pytest.fixture(scope="module")
def backend():
    return NativeBackend()


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / f"tiny-{request.param}.gguf"
    if request.param == "llama":
        write_tiny_llama(path, tied_output=False)
    else:
        write_tiny_gemma3(path, pattern=3)
    return load(path)


def logits_of(model, backend, *, cpu_shapes: bool, fusions) -> np.ndarray:
    """[steps, n_vocab]: after the prefill of 17 tokens and after each decode step, then the teacher-forced
    logits of positions 1..17 (a 16-token scoring chunk and a 1-token one)."""
    engine = GpuEngine(
        model, backend, n_ctx=64, max_chunk=16, batch=4, cpu_shapes=cpu_shapes, fusions=fusions
    )
    engine.upload_from_file()
    n_vocab = model.config.n_vocab

    def logits() -> np.ndarray:
        return np.frombuffer(backend.read(engine.gpu.act.logits, 0, 4 * n_vocab), np.float32)

    engine._start(TOKENS[:17], SamplingParams())
    rows = [logits()]
    decode = engine.gpu.decode_plan(greedy=True)
    for _ in range(DECODE_STEPS):
        backend.replay(decode)
        rows.append(logits())
    for _, pending in engine.score_chunks(TOKENS[:18], first=1):
        rows += list(np.frombuffer(pending.wait(), np.float32).reshape(-1, n_vocab))
    return np.stack(rows)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


@pytest.mark.parametrize("cpu_shapes", [False, True], ids=["gpu_shapes", "cpu_shapes"])
def test_each_fusion_leaves_the_logits_as_they_are(tiny, backend, cpu_shapes):
    every = frozenset(passes.FUSIONS)
    if cpu_shapes:  # gemv_rows.wgsl has no ADD_NORM: CPU adapters never fold post-norm adds
        every -= {"post_norm_adds"}
    want = logits_of(tiny, backend, cpu_shapes=cpu_shapes, fusions=frozenset())
    for fusions in [every, *(every - {name} for name in sorted(every))]:
        got = logits_of(tiny, backend, cpu_shapes=cpu_shapes, fusions=fusions)
        error = relative_error(got, want)
        shapes = "cpu" if cpu_shapes else "gpu"
        print(f"{tiny.config.arch} {shapes} shapes, fusions {sorted(fusions)}: {error:.1e}")
        assert error <= TOLERANCE, sorted(fusions)


def test_the_fusions_remove_dispatches(tiny, backend):
    """What each fusion saves in a decode step of the GPU shapes: one RMSNorm per norm read by a linear,
    rope_kv + attn_prefill -> attn_decode per layer, and (gemma3) the post-norm adds but the last."""
    n_layer = tiny.config.n_layer

    def count(fusions):
        engine = GpuEngine(tiny, backend, n_ctx=64, max_chunk=16, batch=4, cpu_shapes=False, fusions=fusions)
        engine.gpu.weight_targets(tiny.header.tensors)  # the weights, empty: the plan needs no values
        return engine.dispatches_per_decode_step()

    every = frozenset(passes.FUSIONS)
    adds = 2 * n_layer - 1 if tiny.config.arch == "gemma3" else 0
    assert count(every - {"post_norm_adds"}) - count(every) == adds
    assert count(every - {"attention_splits"}) - count(every) == n_layer
    # Without the norms folded the adds are not either (they fold into NORM GEMVs).
    assert count(every - {"norms"}) - count(every) == 2 * n_layer + 1 + adds
