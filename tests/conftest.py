"""Shared fixtures: real models from the manifest, materialized into the cache on first use."""

import pytest

from webgguf import models


@pytest.fixture(scope="session")
def model_path():
    def get(name: str):
        return models.ensure(name)

    return get
