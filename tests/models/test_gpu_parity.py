"""The GPU engine (native wgpu; lavapipe in tests) on SmolLM2 against the numpy reference and llama.cpp.

- logits of every position (teacher forcing through the scoring plans): relative error <= 1e-3 against the
  reference's (conftest.smollm2_logits);
- llama.cpp's next-token choice (tests/refs/llama_smollm2.json): the foundation criterion;
- greedy generation through the GPU-resident decode loop equals the reference's, token for token;
- dispatches per decode step within 7 per layer + 4; stop conditions waste at most one batch.
"""

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from webgguf.engine import GpuEngine, LoadedModel, reference_generate
from webgguf.gpu.native import NativeBackend
from webgguf.sampling import SamplingParams
from webgguf.state import STEP

REFS = Path(__file__).resolve().parent.parent / "refs"
MAX_RELATIVE_ERROR = 1e-3  # max |gpu - ref| / max |ref| per position
MIN_TOP1_AGREEMENT = 0.98
CLEAR_MARGIN = 1.0
GREEDY_PROMPTS = [
    "<|im_start|>user\nWhat is the tallest mountain in Europe?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n",
]
GREEDY_TOKENS = 32


@pytest.fixture(scope="module")
def model(model_path):
    return LoadedModel.open(model_path("smollm2-135m-instruct"))


@pytest.fixture(scope="module")
def engine(model):
    engine = GpuEngine(model, NativeBackend(), n_ctx=256, max_chunk=64, batch=8)
    engine.upload_from_file()
    return engine


@pytest.fixture(scope="module")
def reference(model, reference_model):
    return reference_model(model.path)


@pytest.fixture(scope="module")
def sequences():
    return json.loads((REFS / "llama_smollm2.json").read_text())["sequences"]


@pytest.fixture(scope="module")
def gpu_logits(engine, model, sequences):
    """Teacher-forced logits [n, n_vocab] of every reference sequence, from the GPU."""
    n_vocab = model.config.n_vocab
    out = []
    for seq in sequences:
        chunks = [
            np.frombuffer(read.wait(), np.float32).reshape(-1, n_vocab)
            for _, read in engine.score_chunks(seq["ids"])
        ]
        out.append(np.concatenate(chunks))
    return out


def test_logits_match_the_reference(gpu_logits, smollm2_logits, sequences):
    worst = 0.0
    for got, want in zip(gpu_logits, smollm2_logits, strict=True):
        assert got.shape == want.shape  # [n, n_vocab]: every position of the sequence
        error = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)  # [n]
        worst = max(worst, float(error.max()))
    n_positions = sum(len(seq["ids"]) for seq in sequences)
    print(f"max relative logit error over {len(sequences)} prompts, {n_positions} positions: {worst:.2e}")
    assert worst <= MAX_RELATIVE_ERROR


def test_next_token_agrees_with_llama_cpp(gpu_logits, sequences):
    n_compared = n_agree = 0
    clear_disagreements = []
    for seq, logits in zip(sequences, gpu_logits, strict=True):
        top_ids, top_logits = np.array(seq["top_ids"]), np.array(seq["top_logits"])
        for pos in range(seq["n_prompt"] - 1, len(seq["ids"]) - 1):
            ours, theirs = int(np.argmax(logits[pos])), int(top_ids[pos, 0])
            n_compared += 1
            n_agree += ours == theirs
            margin = top_logits[pos, 0] - top_logits[pos, 1]
            if ours != theirs and margin >= CLEAR_MARGIN:
                clear_disagreements.append((seq["name"], pos, ours, theirs, float(margin)))
    print(f"GPU top-1 agreement with llama.cpp: {n_agree}/{n_compared} = {n_agree / n_compared:.4f}")
    assert n_compared >= 5 * 48
    assert n_agree / n_compared >= MIN_TOP1_AGREEMENT
    assert clear_disagreements == []


@pytest.mark.parametrize("prompt", GREEDY_PROMPTS)
def test_greedy_generation_equals_the_reference(engine, model, reference_greedy, prompt):
    ids = model.prompt_ids(prompt)
    params = SamplingParams(temperature=0)
    # No stop on end-of-generation tokens here: compare all 32 tokens of the raw decode loop.
    gpu_ids = engine.run_decode(ids, GREEDY_TOKENS - 1)
    want = reference_greedy(model.path, ids, GREEDY_TOKENS)
    assert gpu_ids == want
    # The streaming API gives the same tokens, up to the first end-of-generation token if one comes.
    stream = asyncio.run(engine.generate(ids, params, 16))
    eog = [i for i, token in enumerate(want[:16]) if token in model.tokenizer.eog_ids]
    assert stream.ids == want[: eog[0] if eog else 16]
    assert stream.finish_reason == ("stop" if eog else "length")


def test_gpu_kernel_shapes_decode_like_the_cpu_shapes(engine, model):
    """The test device is a CPU (lavapipe), so the engine runs its CPU kernel shapes; the shapes made
    for real GPUs (more rows per workgroup, split attention) must give the same greedy tokens: the
    prefill's and 3 decode steps' (every step replays the same plan; on lavapipe a GPU-shape step takes
    ~8 s of CPU, so more steps would add time, not kernels: each kernel is held to numpy in tests/kernels)."""
    assert engine.backend.cpu_adapter and engine.gpu.shape.n_splits == 1
    gpu_shapes = GpuEngine(
        model, engine.backend, n_ctx=64, max_chunk=16, batch=4, cpu_shapes=False, int8=False
    )
    gpu_shapes.upload_from_file()
    assert gpu_shapes.gpu.shape.n_splits > 1
    ids = model.prompt_ids("The three primary colors are")
    assert gpu_shapes.run_decode(ids, 3) == engine.run_decode(ids, 3)


def test_dispatches_per_decode_step(engine, model):
    n_layer = model.config.n_layer
    assert engine.dispatches_per_decode_step(greedy=True) <= 7 * n_layer + 4
    assert engine.dispatches_per_decode_step(greedy=False) <= 7 * n_layer + 4


def ring_step(engine) -> int:
    return struct.unpack("<I", engine.backend.read(engine.gpu.act.state, 4 * STEP, 4))[0]


def test_stops_waste_at_most_one_batch(engine, model, reference):
    ids = model.prompt_ids("Once upon a time, in a small village by the sea,")
    params = SamplingParams(temperature=0)
    full = reference_generate(model, reference, ids, params, 24)
    stream = asyncio.run(engine.generate(ids, params, 24))
    assert stream.ids == full.ids and stream.text == full.text
    # A stop string taken from the middle of the text ends it right before the string.
    stop = full.text[len(full.text) // 2 :][:6]
    stopped = asyncio.run(engine.generate(ids, params, 24, stop=[stop]))
    assert stopped.finish_reason == "stop" and stopped.text == full.text[: full.text.index(stop)]
    assert ring_step(engine) <= len(stopped.ids) + 1 + 2 * engine.batch
    # The token budget: exactly max_tokens tokens, and the GPU ran no more than one batch past them.
    short = asyncio.run(engine.generate(ids, params, 3))
    assert short.ids == full.ids[:3] and short.finish_reason == "length"
    assert ring_step(engine) <= 3 + engine.batch


def test_abort_leaves_the_engine_usable(engine, model, reference):
    ids = model.prompt_ids("Once upon a time, in a small village by the sea,")
    params = SamplingParams(temperature=0)
    aborted = asyncio.run(engine.generate(ids, params, 40, should_abort=lambda: True))
    assert aborted.finish_reason == "abort" and len(aborted.ids) <= 1 + engine.batch
    assert aborted.ids == reference_generate(model, reference, ids, params, len(aborted.ids)).ids
    # The next generation starts clean: the reference's tokens and text, to the token limit (this
    # prompt's reply does not end within 4 tokens).
    want = reference_generate(model, reference, ids, params, 4)
    again = asyncio.run(engine.generate(ids, params, 4))
    assert (again.ids, again.text, again.finish_reason) == (want.ids, want.text, "length")
