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


# The order test files are handed to the xdist workers (`make test` runs with --no-loadscope-reorder):
# the whole-model files (minutes each on lavapipe) and the browser files (Chromium boots, SwiftShader)
# first, the many short kernel and unit files last, where they fill the workers' ends.
RUN_ORDER = ("models", "e2e", "kernels", "unit")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        parts = item.path.parts
        directory = parts[parts.index("tests") + 1] if "tests" in parts else ""
        return RUN_ORDER.index(directory) if directory in RUN_ORDER else len(RUN_ORDER)

    items.sort(key=rank)  # stable: the files' order and the tests' order within a file stay as collected
