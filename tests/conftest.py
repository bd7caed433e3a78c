"""Shared fixtures: real models from the manifest, materialized into the cache on first use, and the rule
for what a test needs from the machine (a browser, a GPU adapter).

With CI set (CI=true, as CI runs `make test`), a missing prerequisite fails the test with its reason:
a green CI run must have run every test. Elsewhere it skips the test, and `make test` prints the reason
(-rs). docs/TESTING.md lists the skips to expect.
"""

import os

import pytest

from webgguf import models

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(present: bool, missing: str) -> None:
    """A prerequisite of the test: when not `present`, skip with the message `missing` (fail under CI)."""
    if present:
        return
    if IN_CI:
        pytest.fail(f"{missing} (CI is set: a missing prerequisite fails the run)", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="session", name="require")
def require_fixture():
    """`require(present, missing)` for fixtures and tests: see `require` above."""
    return require


@pytest.fixture(scope="session")
def model_path():
    def get(name: str):
        return models.ensure(name)

    return get
