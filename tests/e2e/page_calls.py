"""Calls into a page that end: a promise awaited in the page fails after a limit, with what the page says.

Playwright's `page.evaluate` waits for the promise a page function returns with no time limit, so a
page whose worker stalls (it has happened: docs/BROWSER.md) would hang the suite. Every test that
awaits something in a page goes through `call` (or the helpers built on it); the waits Playwright
bounds itself (wait_for_function, wait_for_selector, click, goto) keep their own timeouts.
"""

import json

READY_TIMEOUT_MS = 240_000  # Pyodide boot + model load, on a busy 2-core machine
LOAD_TIMEOUT_MS = 240_000  # engine.load of SmolLM2 (100 MB) from a local server, upload included
CALL_TIMEOUT_MS = 120_000  # a quick engine call (tokenize, a cache listing, Python in the worker)
TIMED_OUT = "__webgguf_test_timed_out__"  # what the race below returns when the limit came first

PAGE_STATUS = """() => JSON.stringify({
    status: document.getElementById("status-text")?.textContent ?? null,
    progress: document.getElementById("progress-stage")?.textContent ?? null,
    model: window.webgguf?.engine?.model?.name ?? null,
})"""


def page_status(page) -> str:
    """What the page shows about itself (status line, load progress, model): synchronous, so it
    answers even when the page's engine does not."""
    try:
        return page.evaluate(PAGE_STATUS)
    except Exception as e:  # a crashed or closed page
        return f"(the page did not answer: {e})"


def call(page, function: str, arg=None, *, timeout_ms: int = CALL_TIMEOUT_MS, what: str = ""):
    """page.evaluate(function, arg) for a page function that returns a promise, raced against a timer
    in the page: its value, or an AssertionError naming `what` and the page's status after timeout_ms.
    Rejections of the promise propagate as Playwright errors, as with page.evaluate."""
    raced = f"""async (arg) => {{
        let timer;
        const limit = new Promise((resolve) => {{
            timer = setTimeout(() => resolve({json.dumps(TIMED_OUT)}), {int(timeout_ms)});
        }});
        try {{
            return await Promise.race([({function})(arg), limit]);
        }} finally {{
            clearTimeout(timer);
        }}
    }}"""
    value = page.evaluate(raced, arg)
    if value == TIMED_OUT:
        seconds = timeout_ms / 1000
        raise AssertionError(
            f"{what or 'a call into the page'} did not finish within {seconds:.0f} s; "
            f"the page says {page_status(page)}"
        )
    return value


def run_python(page, code: str, timeout_ms: int = CALL_TIMEOUT_MS):
    """Run Python in the page's worker; the value of the last expression (JSON-like)."""
    return call(
        page,
        "(code) => window.webgguf.engine.runPython(code)",
        code,
        timeout_ms=timeout_ms,
        what="Python in the worker",
    )


def wait_ready(page) -> float:
    """Milliseconds from navigation until window.webgguf.ready resolved; fails if it rejected, or with
    the page's status if it took longer than READY_TIMEOUT_MS."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    try:
        page.wait_for_function("() => window.webgguf?.ready", timeout=READY_TIMEOUT_MS)
        # The arrow returns nothing: page.evaluate would otherwise wait for `ready` with no time limit.
        page.evaluate(
            """() => { window.webgguf.ready.then(
                () => { window.readyAt = performance.now(); },
                (error) => { window.readyError = `${error.message}\n${error.detail ?? ""}`; }); }"""
        )
        page.wait_for_function("() => window.readyAt || window.readyError", timeout=READY_TIMEOUT_MS)
    except PlaywrightTimeoutError:
        try:
            storage = call(page, "() => navigator.storage.estimate()", timeout_ms=10_000, what="an estimate")
        except AssertionError as e:
            storage = str(e)
        try:  # what the worker waits for (stats().waiting, .running): docs/BROWSER.md, a load that stalls
            worker = call(page, "() => window.webgguf.engine.stats()", timeout_ms=10_000, what="stats()")
        except AssertionError:
            worker = "no answer in 10 s: the worker's thread is blocked"
        raise AssertionError(
            f"the page was not ready after {READY_TIMEOUT_MS / 1000:.0f} s; it says {page_status(page)} "
            f"(storage: {storage}; the worker: {worker})"
        ) from None
    error = page.evaluate("() => window.readyError")
    assert error is None, f"the page did not get ready: {error}"
    return page.evaluate("() => window.readyAt")


def load(page, url, timeout_ms: int = LOAD_TIMEOUT_MS, **options):
    """engine.load(url, options) in the page: the model info, or {error, type} if it failed."""
    return call(
        page,
        """([url, options]) => window.webgguf.engine.load(url, options)
            .then((info) => info, (e) => ({ error: e.message, type: e.type ?? e.name }))""",
        [url, options],
        timeout_ms=timeout_ms,
        what=f"loading {url}",
    )


def load_and_abort(page, url: str, after_bytes: int) -> str:
    """Loads `url` on the page's engine and aborts the load once `after_bytes` have arrived: the name of
    what the load ended with ("AbortError"; "loaded" if it finished first)."""
    return call(
        page,
        """async ([url, afterBytes]) => {
            const controller = new AbortController();
            const onProgress = (e) => { if (e.loaded > afterBytes) controller.abort(); };
            return window.webgguf.engine.load(url, { onProgress, signal: controller.signal })
                .then(() => "loaded", (e) => e.name);
        }""",
        [url, after_bytes],
        timeout_ms=LOAD_TIMEOUT_MS,
        what=f"loading {url} and aborting it",
    )
