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


# The files that take minutes (seconds on one worker of a fresh clone's `make test`, docs/TESTING.md
# "Time"), longest first. `make test` hands whole files to two workers in collection order
# (--dist loadfile --no-loadscope-reorder), so these start first and the short files fill in around
# them: when a long file started last, one worker ran it alone for minutes at the end.
LONG_FILES = (
    "tests/models/test_gpu_parity.py",  # ~360: SmolLM2's GPU logits, GPU kernel shapes on lavapipe
    "tests/e2e/test_browser.py",  # ~300: every kernel compiled in Chromium, SmolLM2 in the page
    "tests/models/test_arch_gpu_parity.py",  # ~280: Gemma 3's GPU logits at 240 positions on lavapipe
    "tests/models/test_int8_parity.py",  # ~230: SmolLM2's 8-bit logits, GPU kernel shapes on lavapipe
    "tests/kernels/test_sample_kernels.py",  # ~165: 2,000 draws per distribution case
    "tests/e2e/test_gemma_browser.py",  # ~140: Gemma 3 in the page and the CLI
    "tests/e2e/test_model_switch.py",  # ~135: 20 model switches in one page
    "tests/unit/test_fuzz.py",  # ~85: 100,000 fuzz inputs
)


def pytest_collection_modifyitems(items):
    """The long files first (LONG_FILES order), then the others in collection order; a file's tests
    keep their order (browser modules build on their earlier tests)."""
    rank = {path: i for i, path in enumerate(LONG_FILES)}

    def key(indexed):
        index, item = indexed
        path = item.nodeid.split("::", 1)[0]
        return (rank.get(path, len(LONG_FILES)), index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]
