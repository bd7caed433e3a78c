"""Fixtures shared by the model tests: the numpy reference of Gemma 3 270M and its logits, which both
the reference's and the GPU's parity tests compare against."""

import pytest
from test_arch_parity import load_refs, reference_logits

from webgguf.reference import ReferenceModel


@pytest.fixture(scope="session")
def gemma3(model_path):
    return ReferenceModel(model_path("gemma-3-270m"))


@pytest.fixture(scope="session")
def gemma3_logits(gemma3):
    """The reference's logits for every sequence of arch_gemma3.json (the F32 refs hold the same ids)."""
    return [reference_logits(gemma3, seq) for seq in load_refs("arch_gemma3.json")["sequences"]]
