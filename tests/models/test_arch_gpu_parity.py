"""The GPU engine (native wgpu; lavapipe in tests) beyond the llama architecture: Gemma 3 270M (mixed quant
types, q/k norms, sandwich norms, GELU, sliding windows, a 262k vocabulary split over two bindings) and the
synthetic qwen2, qwen3 and Llama-3-style models, with the criteria of test_arch_parity.py against llama.cpp
(tests/refs/arch_*.json), logits within 1e-3 of the numpy reference, and greedy decoding equal to it.

Teacher forcing scores only the positions llama.cpp's logits were kept for; the prompt before them is
prefilled without the output head (262k rows for Gemma: by far the slowest part on a CPU adapter)."""

import numpy as np
import pytest
from test_arch_parity import (
    GEMMA3_F32_LOGIT_TOLERANCE,
    MIN_TOP1_AGREEMENT,
    build_synthetic,
    check_gemma3_against_llama_cpp_as_shipped,
    compare_next_tokens,
    load_refs,
    reference_logits,
)

from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gpu.native import NativeBackend
from webgguf.reference import ReferenceModel

MAX_RELATIVE_ERROR = 1e-3  # max |gpu - ref| / max |ref| per position, as for SmolLM2
GREEDY_TOKENS = 12


def gpu_logits(engine: GpuEngine, seq: dict) -> np.ndarray:
    """The GPU's logits at the positions llama.cpp's top-k were kept for: [positions, n_vocab]."""
    ids = seq["ids"][:-1]  # the last token predicts nothing that is compared
    n_vocab = engine.model.config.n_vocab
    chunks = [
        np.frombuffer(read.wait(), np.float32).reshape(-1, n_vocab)
        for _, read in engine.score_chunks(ids, seq["first_position"])
    ]
    return np.concatenate(chunks)


def max_relative_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        worst = max(worst, float((np.abs(g - w).max(axis=1) / np.abs(w).max(axis=1)).max()))
    return worst


def greedy_reference(reference: ReferenceModel, ids: list[int], n: int) -> list[int]:
    reference.reset()
    logits = reference.forward(ids, 0)[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = reference.forward([out[-1]], len(ids) + len(out) - 1)[-1]
    return out


# --- synthetic qwen2, qwen3, Llama 3 -----------------------------------------------------------------------

SYNTHETIC = load_refs("arch_synthetic.json")["models"]


@pytest.fixture(scope="module", params=SYNTHETIC, ids=[m["recipe"]["name"] for m in SYNTHETIC])
def synthetic(request, model_path, tmp_path_factory):
    """(GPU engine, reference model, refs) of a synthetic model rebuilt byte for byte from its recipe."""
    refs = request.param
    path = build_synthetic(refs, model_path, tmp_path_factory)
    engine = GpuEngine(LoadedModel.open(path), NativeBackend(), n_ctx=128, max_chunk=32, batch=4)
    engine.upload_from_file()
    reference = ReferenceModel(path)
    yield engine, reference, refs
    path.unlink()


def test_synthetic_gpu_agrees_with_llama_cpp_and_the_reference(synthetic):
    engine, reference, refs = synthetic
    got = [gpu_logits(engine, seq) for seq in refs["sequences"]]
    result = compare_next_tokens(got, refs["sequences"])
    print(refs["recipe"]["name"], result)
    assert result["n_compared"] >= 100
    assert result["agreement"] >= MIN_TOP1_AGREEMENT
    assert result["clear_disagreements"] == []
    want = [reference_logits(reference, seq) for seq in refs["sequences"]]
    assert max_relative_error(got, want) <= MAX_RELATIVE_ERROR


@pytest.mark.parametrize("cpu_shapes", [True, False], ids=["cpu_shapes", "gpu_shapes"])
def test_synthetic_gpu_greedy_equals_the_reference(synthetic, cpu_shapes):
    """The decode loop (attn_decode with the family's bias / q-k norms / RoPE factors), with the kernel
    shapes of CPU adapters and of real GPUs (split attention, wide GEMV rows)."""
    engine, reference, refs = synthetic
    if not cpu_shapes:
        engine = GpuEngine(engine.model, engine.backend, n_ctx=64, max_chunk=16, batch=4, cpu_shapes=False)
        engine.upload_from_file()
        assert engine.gpu.shape.n_splits > 1
    ids = refs["sequences"][0]["ids"][:20]
    assert engine.run_decode(ids, GREEDY_TOKENS - 1) == greedy_reference(reference, ids, GREEDY_TOKENS)


# --- Gemma 3 270M ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_engine(model_path):
    engine = GpuEngine(
        LoadedModel.open(model_path("gemma-3-270m")), NativeBackend(), n_ctx=768, max_chunk=128
    )
    engine.upload_from_file()
    return engine


@pytest.fixture(scope="module")
def gemma3_gpu_logits(gemma3_engine):
    return [gpu_logits(gemma3_engine, seq) for seq in load_refs("arch_gemma3.json")["sequences"]]


def test_gemma3_gpu_logits_match_the_reference(gemma3_gpu_logits, gemma3_logits):
    error = max_relative_error(gemma3_gpu_logits, gemma3_logits)
    print(f"gemma3 GPU vs reference: max relative logit error {error:.2e}")
    assert error <= MAX_RELATIVE_ERROR


def test_gemma3_gpu_agrees_with_llama_cpp_on_f32_weights(gemma3_engine, gemma3_gpu_logits):
    refs = load_refs("arch_gemma3_f32.json")
    result = compare_next_tokens(gemma3_gpu_logits, refs["sequences"])
    print(result)
    assert result["n_compared"] >= 5 * 48
    # One prompt is longer than the local layers' window: their window slides during the continuation.
    assert max(seq["n_prompt"] for seq in refs["sequences"]) > gemma3_engine.model.config.sliding_window + 80
    assert result["agreement"] >= MIN_TOP1_AGREEMENT
    assert result["clear_disagreements"] == []
    assert result["max_logit_diff"] <= GEMMA3_F32_LOGIT_TOLERANCE


def test_gemma3_gpu_agrees_with_llama_cpp_as_shipped(gemma3_gpu_logits):
    """The criterion of test_arch_parity.py's as-shipped test."""
    check_gemma3_against_llama_cpp_as_shipped(gemma3_gpu_logits)


def test_gemma3_gpu_greedy_equals_the_reference(gemma3_engine, gemma3):
    ids = load_refs("arch_gemma3.json")["sequences"][0]["ids"][:18]
    assert gemma3_engine.run_decode(ids, GREEDY_TOKENS - 1) == greedy_reference(gemma3, ids, GREEDY_TOKENS)
