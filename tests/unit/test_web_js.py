"""The page's plain-JS modules (web/chat.js, web/markdown.js, web/conversations.js) under node's own
test runner: each tests/web/*.test.mjs file is one test here. They need node (which builds the page
too) and `npm ci` (markdown-it); in CI a missing one is a failure, elsewhere a skip."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS_TESTS = sorted((ROOT / "tests" / "web").glob("*.test.mjs"))
TIMEOUT_S = 300  # the slowest file parses every prefix of a few KiB of Markdown: seconds


def require(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@pytest.mark.parametrize("path", JS_TESTS, ids=[p.name for p in JS_TESTS])
def test_node_tests_pass(path):
    node = shutil.which("node")
    require(node is not None, "node is not installed (it builds the page: tools/setup_system.sh)")
    require((ROOT / "node_modules" / "markdown-it").is_dir(), "node_modules is missing: run `npm ci`")
    result = subprocess.run(
        [node, "--test", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, f"{result.stdout[-8000:]}\n{result.stderr[-4000:]}"
    assert "# fail 0" in result.stdout and "# pass 0" not in result.stdout, result.stdout[-2000:]
