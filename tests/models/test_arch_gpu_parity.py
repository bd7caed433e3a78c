"""The GPU engine (native wgpu; lavapipe in tests) beyond the llama architecture: Gemma 3 270M (mixed quant
types, q/k norms, sandwich norms, GELU, sliding windows, a 262k vocabulary split over two bindings) and the
synthetic qwen2, qwen3 and Llama-3-style models, with the criteria of test_arch_parity.py against llama.cpp
(tests/refs/arch_*.json), logits within 1e-3 of the numpy reference, and greedy decoding equal to it.

Teacher forcing scores only the positions llama.cpp's logits were kept for; the prompt before them is
prefilled without the output head (262k rows for Gemma: by far the slowest part on a CPU adapter)."""

import numpy as np
import pytest
from test_arch_parity import (
    F32_TOP1_AGREEMENT,
    GEMMA3_F32_LOGIT_TOLERANCE,
    MIN_TOP1_AGREEMENT,
    TINY,
    TOKENS,
    build_synthetic,
    check_gemma3_against_llama_cpp_as_shipped,
    compare_next_tokens,
    gemma3_sequences,
    greedy_reference,
    load_refs,
    reference_logits,
    write_tiny_gemma3,
)

from webgguf import arch
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gguf import read_header
from webgguf.gpu.native import NativeBackend
from webgguf.reference import ReferenceModel
from webgguf.sampling import SamplingParams

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
        engine = GpuEngine(
            engine.model, engine.backend, n_ctx=64, max_chunk=16, batch=4, cpu_shapes=False, int8=False
        )
        engine.upload_from_file()
        assert engine.gpu.shape.n_splits > 1
    ids = refs["sequences"][0]["ids"][:20]
    assert engine.run_decode(ids, GREEDY_TOKENS - 1) == greedy_reference(reference, ids, GREEDY_TOKENS)


# --- Gemma 3 270M ------------------------------------------------------------------------------------------


# The sequences whose prompt fits Gemma 3's sliding window (512): five of six, 240 compared positions. The
# sixth (a 693-token prompt, so the local layers' window slides) costs lavapipe 160 s of prefill, more than
# the rest of this module; what it checks is covered in two halves: the numpy reference against llama.cpp
# on it (test_arch_parity.py) and the GPU against the reference while the window slides, on the tiny
# Gemma 3 below (a window of 4, both kernel shapes).
GEMMA3_GPU_SEQUENCES = [
    seq["name"] for seq in load_refs("arch_gemma3.json")["sequences"] if seq["n_prompt"] <= 512
]


@pytest.fixture(scope="module")
def gemma3_engine(model_path):
    engine = GpuEngine(
        LoadedModel.open(model_path("gemma-3-270m")), NativeBackend(), n_ctx=768, max_chunk=128
    )
    engine.upload_from_file()
    return engine


@pytest.fixture(scope="module")
def gemma3_gpu_logits(gemma3_engine):
    """The GPU's logits of GEMMA3_GPU_SEQUENCES, in the refs' order."""
    sequences = gemma3_sequences("arch_gemma3.json", GEMMA3_GPU_SEQUENCES)
    return [gpu_logits(gemma3_engine, seq) for seq in sequences]


def test_gemma3_gpu_sequences_stay_within_the_window(gemma3_engine):
    assert gemma3_engine.model.config.sliding_window == 512 and len(GEMMA3_GPU_SEQUENCES) == 5


def test_gemma3_gpu_logits_match_the_reference(gemma3_gpu_logits, gemma3_logits):
    names = [seq["name"] for seq in load_refs("arch_gemma3.json")["sequences"]]
    pairs = zip(names, gemma3_logits, strict=True)
    reference = [logits for name, logits in pairs if name in GEMMA3_GPU_SEQUENCES]
    error = max_relative_error(gemma3_gpu_logits, reference)
    print(f"gemma3 GPU vs reference: max relative logit error {error:.2e}")
    assert error <= MAX_RELATIVE_ERROR


def test_gemma3_gpu_agrees_with_llama_cpp_on_f32_weights(gemma3_gpu_logits):
    sequences = gemma3_sequences("arch_gemma3_f32.json", GEMMA3_GPU_SEQUENCES)
    result = compare_next_tokens(gemma3_gpu_logits, sequences)
    print(result)
    assert result["n_compared"] >= 5 * 48
    assert result["agreement"] >= F32_TOP1_AGREEMENT
    assert result["clear_disagreements"] == []
    assert result["max_logit_diff"] <= GEMMA3_F32_LOGIT_TOLERANCE


def test_gemma3_gpu_agrees_with_llama_cpp_as_shipped(gemma3_gpu_logits):
    """The criterion of test_arch_parity.py's as-shipped test."""
    check_gemma3_against_llama_cpp_as_shipped(gemma3_gpu_logits, GEMMA3_GPU_SEQUENCES)


def test_gemma3_gpu_greedy_equals_the_reference(gemma3_engine, reference_greedy):
    ids = load_refs("arch_gemma3.json")["sequences"][0]["ids"][:18]
    want = reference_greedy(gemma3_engine.model.path, ids, GREEDY_TOKENS)
    assert gemma3_engine.run_decode(ids, GREEDY_TOKENS - 1) == want


# --- a tiny random Gemma 3 with the kernel shapes of a real GPU --------------------------------------------


def tiny_gemma3(directory, cpu_shapes: bool):
    """(GPU engine, reference) of test_arch_parity's tiny Gemma 3 (sliding window of 4; no tokenizer: the
    engine is driven by ids), with the kernel shapes of CPU adapters or of GPUs."""
    path = directory / "tiny-gemma3.gguf"
    write_tiny_gemma3(path, pattern=3)
    header = read_header(path)
    config = arch.config_from_metadata(header.metadata, list(header.tensors))
    model = LoadedModel(path, header, config, tokenizer=None, template=None)
    engine = GpuEngine(
        model, NativeBackend(), n_ctx=64, max_chunk=16, batch=4, cpu_shapes=cpu_shapes, int8=False
    )
    engine.upload_from_file()
    return engine, ReferenceModel(path)


@pytest.fixture(scope="module")
def tiny_gemma3_gpu_shapes(tmp_path_factory):
    return tiny_gemma3(tmp_path_factory.mktemp("tiny"), cpu_shapes=False)


def test_tiny_gemma3_cpu_shapes_slide_the_window_like_the_reference(tmp_path):
    """The kernel shapes of CPU adapters (what the real Gemma 3 runs above, within its window) while the
    window slides: 17 positions scored in chunks of 16 and 1 through a window of 4, then greedy decoding
    on past it, against the reference."""
    engine, reference = tiny_gemma3(tmp_path, cpu_shapes=True)
    assert engine.model.config.sliding_window < 16
    ids = TOKENS[:18]
    chunks = [read.wait() for _, read in engine.score_chunks(ids, 1)]
    got = np.frombuffer(b"".join(chunks), np.float32).reshape(-1, TINY["n_vocab"])
    reference.reset()
    assert max_relative_error([got], [reference.forward(ids, 0)[1:]]) <= MAX_RELATIVE_ERROR
    assert engine.run_decode(ids, GREEDY_TOKENS - 1) == greedy_reference(reference, ids, GREEDY_TOKENS)


def is_post_norm_add(step) -> bool:
    return getattr(step, "pipeline", None) is not None and step.pipeline.name.startswith("rmsnorm")


def test_tiny_gemma3_decode_folds_the_post_norms_and_matches_the_reference(tiny_gemma3_gpu_shapes):
    """Decode on a GPU takes each post-norm add into the next GEMV (gemv.wgsl ADD_NORM, the residual stream
    in two halves): only the last one, before the output head, is left as an rmsnorm dispatch, and every
    step's logits stay within 1e-3 of the reference. The 17-token prompt ends with a 1-token prefill chunk,
    which folds too (and samples the first token)."""
    engine, reference = tiny_gemma3_gpu_shapes
    decode = engine.gpu.decode_plan(greedy=True)
    assert sum(map(is_post_norm_add, decode.steps)) == 1
    assert sum(map(is_post_norm_add, engine.gpu.prefill_plan(1, last=True, greedy=True).steps)) == 1
    # Prefill chunks keep the plain add (one rmsnorm ADD per post-norm).
    prefill = engine.gpu.prefill_plan(16, last=False, greedy=True)
    assert sum(map(is_post_norm_add, prefill.steps)) == 2 * TINY["n_layer"]

    prompt, backend, act = TOKENS[:17], engine.backend, engine.gpu.act
    reference.reset()
    want = reference.forward(prompt, 0)[-1]
    engine._start(prompt, SamplingParams())
    got, wanted = [], []
    for step in range(8):
        got.append(np.frombuffer(backend.read(act.logits, 0, 4 * TINY["n_vocab"]), np.float32))
        wanted.append(want)
        token = int(np.argmax(want))
        want = reference.forward([token], len(prompt) + step)[-1]
        backend.replay(decode)
    assert max_relative_error([np.stack(got)], [np.stack(wanted)]) <= MAX_RELATIVE_ERROR


def test_tiny_gemma3_one_token_chunks_flush_the_pending_add(tiny_gemma3_gpu_shapes):
    """A 1-token chunk without the output head ends with its last post-norm add still pending, and a
    1-token scoring chunk reads x with a GEMM: both dispatch the add as it is."""
    engine, reference = tiny_gemma3_gpu_shapes
    assert sum(map(is_post_norm_add, engine.gpu.prefill_plan(1, last=False, greedy=True).steps)) == 1
    ids = TOKENS[:18]  # position 0 prefilled alone, then 17 scored: chunks of 16 and 1
    chunks = [read.wait() for _, read in engine.score_chunks(ids, 1)]
    got = np.frombuffer(b"".join(chunks), np.float32).reshape(-1, TINY["n_vocab"])
    reference.reset()
    assert max_relative_error([got], [reference.forward(ids, 0)[1:]]) <= MAX_RELATIVE_ERROR
