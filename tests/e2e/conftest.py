"""Browser fixtures: the built page (rebuilt when its sources changed), `webgguf serve` on a free
port, and one headless Chromium page with SmolLM2 loaded, shared by the whole session (Pyodide
boots and the model loads once: SwiftShader, the CPU WebGPU of the test machine, is slow).

Needs the Debian chromium (/usr/bin/chromium), the playwright package (its browsers are never
downloaded: the system Chromium runs) and `npm ci` (Pyodide, Vite); skipped without them.
"""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "build" / "e2e"  # screenshots and measured timings (git-ignored)
MODEL = "smollm2-135m-instruct"
# SwiftShader is Chromium's CPU WebGPU; WebGPU exists only in a secure context (127.0.0.1 is one).
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY_TIMEOUT_MS = 240_000  # Pyodide boot + model load, on a busy 2-core machine
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
def web_dist() -> Path:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    pytest.importorskip("playwright", reason="pip install playwright")
    if not (ROOT / "node_modules" / "pyodide").is_dir():
        pytest.skip("node_modules is missing: run `npm ci`")
    index = ROOT / "web" / "dist" / "index.html"
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


@pytest.fixture(scope="session")
def playwright_driver():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


def launch_chromium(playwright_driver):
    return playwright_driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)


@pytest.fixture(scope="session")
def browser(playwright_driver, server_url):
    browser = launch_chromium(playwright_driver)
    yield browser
    browser.close()


class ChatPage:
    """The session's page, with what it logged."""

    model = MODEL  # the model the page loaded
    artifacts = ARTIFACTS

    def __init__(self, page, console_errors: list[str], ready_ms: float, boot: dict):
        self.page = page
        self.console_errors = console_errors  # console errors and uncaught exceptions, in order
        self.ready_ms = ready_ms  # navigation → window.webgguf.ready (Pyodide + model loaded)
        self.boot = boot  # {"timings": ..., "gpu": ..., "model": ...} of the engine

    def python(self, code: str):
        """Run Python in the page's worker; the value of the last expression (JSON-like)."""
        return self.page.evaluate("(code) => window.webgguf.engine.runPython(code)", code)


@pytest.fixture(scope="session")
def chat_page(browser, server_url, model_path) -> ChatPage:
    model_path(MODEL)  # in the cache, so the server has it
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(f"uncaught: {e}"))
    page.goto(f"{server_url}/?model={MODEL}")
    ready_ms = _wait_ready(page)
    boot = page.evaluate(
        "() => { const e = window.webgguf.engine; return {timings: e.timings, gpu: e.gpu, model: e.model}; }"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    record = {"navigation_to_ready_ms": ready_ms, **boot}
    (ARTIFACTS / "load_timings.json").write_text(json.dumps(record, indent=1) + "\n")
    yield ChatPage(page, console_errors, ready_ms, boot)
    page.close()


def _wait_ready(page) -> float:
    """Milliseconds from navigation until window.webgguf.ready resolved (fails if it rejected)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    # The arrow returns nothing: page.evaluate would otherwise wait for `ready` with no time limit.
    page.evaluate(
        """() => { window.webgguf.ready.then(
            () => { window.readyAt = performance.now(); },
            (error) => { window.readyError = `${error.message}\n${error.detail ?? ""}`; }); }"""
    )
    try:
        page.wait_for_function("() => window.readyAt || window.readyError", timeout=READY_TIMEOUT_MS)
    except PlaywrightTimeoutError:
        status = page.evaluate("() => document.getElementById('status-text')?.textContent")
        storage = page.evaluate("async () => JSON.stringify(await navigator.storage.estimate())")
        seconds = READY_TIMEOUT_MS / 1000
        raise AssertionError(
            f"the page was not ready after {seconds:.0f} s; it says {status!r} (storage: {storage})"
        ) from None
    error = page.evaluate("() => window.readyError")
    assert error is None, f"the page did not get ready: {error}"
    return page.evaluate("() => window.readyAt")


def load_and_abort(page, url: str, after_bytes: int) -> str:
    """Loads `url` on the page's engine and aborts the load once `after_bytes` have arrived: the name of
    what the load ended with ("AbortError"; "loaded" if it finished first)."""
    return page.evaluate(
        """async ([url, afterBytes]) => {
            const controller = new AbortController();
            const onProgress = (e) => { if (e.loaded > afterBytes) controller.abort(); };
            return window.webgguf.engine.load(url, { onProgress, signal: controller.signal })
                .then(() => "loaded", (e) => e.name);
        }""",
        [url, after_bytes],
    )
