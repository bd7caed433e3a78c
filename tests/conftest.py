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


# The order files run in: the whole-model tests first (the longest: with pytest-xdist they start early),
# then kernels and unit tests, the browser tests last. Last because Playwright's sync API keeps an event
# loop running in the main thread for the rest of the process, and asyncio.run (the engine's async API,
# driven by other tests and the CLI) refuses to start inside it: on an xdist worker too, once a browser
# file ran, every later file must be a browser file.
RUN_ORDER = ("models", "kernels", "unit", "e2e")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        parts = item.path.parts
        directory = parts[parts.index("tests") + 1] if "tests" in parts else ""
        return RUN_ORDER.index(directory) if directory in RUN_ORDER else len(RUN_ORDER)

    items.sort(key=rank)  # stable: file order and test order within each directory stay as collected
