"""Browser fixtures: the built page (rebuilt when its sources changed), `webgguf serve` on a free
port, and one headless Chromium page with SmolLM2 loaded, shared by the whole session (Pyodide
boots and the model loads once: SwiftShader, the CPU WebGPU of the test machine, is slow).

Needs the Debian chromium (/usr/bin/chromium: tools/setup_system.sh installs it), the playwright
package (its browsers are never downloaded: the system Chromium runs) and `npm ci` (Pyodide, Vite).
Without them the browser tests are skipped with the reason, or fail when CI is set (tests/conftest.py).
Every promise a test awaits in a page is bounded (page_calls.py).
"""

import fcntl
import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import page_calls
import pytest
from browser_env import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, MODEL, ROOT
from page_calls import CALL_TIMEOUT_MS, run_python, wait_ready

# Test modules have imported these from here; they live in page_calls.py.
READY_TIMEOUT_MS = page_calls.READY_TIMEOUT_MS
load_and_abort = page_calls.load_and_abort

# What the page is built from: a newer file than web/dist/index.html means a rebuild.
BUILD_INPUTS = ["web", "py/webgguf", "shaders", "tools/build_web.py", "vite.config.js", "package-lock.json"]
BUILD_OUTPUTS = ("web/dist", "web/public/pyodide", "web/public/wheels", "web/public/shaders.json")


def _newest_input() -> float:
    newest = 0.0
    outputs = [ROOT / p for p in BUILD_OUTPUTS]
    for name in BUILD_INPUTS:
        path = ROOT / name
        files = [path] if path.is_file() else path.rglob("*")
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and not any(f.is_relative_to(o) for o in outputs):
                newest = max(newest, f.stat().st_mtime)
    return newest


@pytest.fixture(scope="session")
def web_dist(require) -> Path:
    require(
        CHROMIUM.exists(), f"no {CHROMIUM}: the browser tests need Debian's chromium (tools/setup_system.sh)"
    )
    require(importlib.util.find_spec("playwright") is not None, "no playwright: pip install -e '.[test]'")
    require((ROOT / "node_modules" / "pyodide").is_dir(), "node_modules has no pyodide: run `npm ci`")
    index = ROOT / "web" / "dist" / "index.html"
    # One build at a time: the suite's worker processes (pytest-xdist) each ask for the page.
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / "web.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not index.exists() or index.stat().st_mtime < _newest_input():
            result = subprocess.run(
                [sys.executable, "tools/build_web.py"], cwd=ROOT, capture_output=True, text=True
            )
            assert result.returncode == 0, f"tools/build_web.py failed:\n{result.stdout}\n{result.stderr}"
    return index.parent


@pytest.fixture(scope="session")
def server_url(web_dist):
    from webgguf.serve import make_server

    server = make_server(0, "127.0.0.1", web_dist)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# Playwright, Chromium and the chat page live for one module: Playwright's sync API keeps an event loop
# running in the main thread while it is started, where asyncio.run (the engine's async API, used by other
# tests and the CLI) refuses to run; pytest-xdist workers take test files in any order, so a browser
# module must leave none behind. (Starting them again costs a few seconds per module.)
@pytest.fixture(scope="module")
def playwright_driver():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


def launch_chromium(playwright_driver):
    return playwright_driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)


@pytest.fixture(scope="module")
def browser(playwright_driver, server_url):
    browser = launch_chromium(playwright_driver)
    yield browser
    browser.close()


class ChatPage:
    """The module's chat page, with what it logged."""

    model = MODEL  # the model the page loaded
    artifacts = ARTIFACTS

    def __init__(self, page, console_errors: list[str], ready_ms: float, boot: dict):
        self.page = page
        self.console_errors = console_errors  # console errors and uncaught exceptions, in order
        self.ready_ms = ready_ms  # navigation → window.webgguf.ready (Pyodide + model loaded)
        self.boot = boot  # {"timings": ..., "gpu": ..., "model": ...} of the engine

    def python(self, code: str, timeout_ms: int = CALL_TIMEOUT_MS):
        """Run Python in the page's worker; the value of the last expression (JSON-like)."""
        return run_python(self.page, code, timeout_ms)


@pytest.fixture(scope="module")
def chat_page(browser, server_url, model_path) -> ChatPage:
    model_path(MODEL)  # in the cache, so the server has it
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    page.goto(f"{server_url}/?model={MODEL}")
    ready_ms = wait_ready(page)
    boot = page.evaluate(
        "() => { const e = window.webgguf.engine; return {timings: e.timings, gpu: e.gpu, model: e.model}; }"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    record = {"navigation_to_ready_ms": ready_ms, **boot}
    (ARTIFACTS / "load_timings.json").write_text(json.dumps(record, indent=1) + "\n")
    yield ChatPage(page, console_errors, ready_ms, boot)
    page.close()
