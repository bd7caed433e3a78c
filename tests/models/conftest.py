"""Fixtures shared by the model tests: the numpy reference models, loaded once per session and only when
a test needs one, and what the parity tests compare against: the reference's logits over llama.cpp's
sequences (tests/refs/) and its greedy continuations. These are kept on disk between runs
(reference_cache.py), so a second run computes them again only when the model or the reference code
changed."""

import numpy as np
import pytest
from reference_cache import cached_arrays
from test_arch_parity import greedy_reference, load_refs, reference_logits

from webgguf import arch
from webgguf.gguf import read_header
from webgguf.reference import ReferenceModel


@pytest.fixture(scope="session")
def reference_model():
    """reference_model(path): the numpy reference of a GGUF file, loaded on first use."""
    loaded = {}

    def get(path) -> ReferenceModel:
        if path not in loaded:
            loaded[path] = ReferenceModel(path)
        return loaded[path]

    return get


@pytest.fixture(scope="session")
def reference_greedy(reference_model):
    """reference_greedy(path, ids, n): the reference's n greedy tokens after `ids` (argmax at every step,
    no stop at end-of-generation tokens)."""

    def greedy(path, ids: list[int], n: int) -> list[int]:
        def compute():
            return [np.array(greedy_reference(reference_model(path), ids, n), np.int64)]

        [tokens] = cached_arrays("greedy", path, [list(ids), n], compute)
        return tokens.tolist()

    return greedy


@pytest.fixture(scope="session")
def gemma3_config(model_path):
    header = read_header(model_path("gemma-3-270m"))
    return arch.config_from_metadata(header.metadata, list(header.tensors))


@pytest.fixture(scope="session")
def gemma3_logits(model_path, reference_model):
    """The reference's logits [positions, n_vocab] at the compared positions of every sequence of
    arch_gemma3.json (arch_gemma3_f32.json holds the same ids)."""
    path = model_path("gemma-3-270m")
    sequences = load_refs("arch_gemma3.json")["sequences"]
    request = [[seq["ids"], seq["first_position"]] for seq in sequences]
    return cached_arrays(
        "logits", path, request, lambda: [reference_logits(reference_model(path), seq) for seq in sequences]
    )


@pytest.fixture(scope="session")
def smollm2_logits(model_path, reference_model):
    """The reference's logits [n, n_vocab] at every position of every sequence of llama_smollm2.json
    (llama_smollm2_f32.json holds the same ids)."""
    path = model_path("smollm2-135m-instruct")
    sequences = load_refs("llama_smollm2.json")["sequences"]

    def compute():
        reference = reference_model(path)
        logits = []
        for seq in sequences:
            reference.reset()
            logits.append(reference.forward(seq["ids"], 0))  # teacher forced: the whole sequence at once
        return logits

    return cached_arrays("logits", path, [seq["ids"] for seq in sequences], compute)
