"""The model cache of the page (web/cache.js) and pre-flight, in headless Chromium.

One browser context for the module (the Origin Private File System persists per context, so a
reload of its page exercises the cache), one page; models come from `ModelServer`, a server on
another port (another origin, as a model host would be) that serves models/cache/ with HTTP Range,
counts the bytes of file data it sends per request, and can close a connection halfway.
Weight bytes over the network are counted there, on the server side.
"""

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from browser_env import MODEL
from page_calls import call, load, load_and_abort, run_python, wait_ready

CHUNK = 4 << 20  # web/cache.js CHUNK: the unit of resume and repair
HOLD_TIMEOUT_S = 120  # the longest ModelServer holds a response (hold_after)

CORS_HEADERS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "Range",
    "Access-Control-Expose-Headers": "Content-Range, Content-Length, Accept-Ranges",
    "Cross-Origin-Resource-Policy": "cross-origin",
}


class ModelServer:
    """Serves the GGUF files of `directory` under any path prefix, with Range and CORS."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.lock = threading.Lock()
        self.log: list[dict] = []  # one entry per GET/HEAD: {method, path, range, sent}
        self.drop_after: int | None = None  # close the next open-ended GET after this many bytes
        # Hold the next open-ended GET after this many bytes: `held` is set, and sending goes on once
        # `resume` is (or after HOLD_TIMEOUT_S).
        self.hold_after: int | None = None
        self.held, self.resume = threading.Event(), threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_OPTIONS(self):
                self.send_response(204)
                for name, value in CORS_HEADERS.items():
                    self.send_header(name, value)
                self.send_header("Access-Control-Allow-Methods", "GET, HEAD")
                self.end_headers()

            def do_HEAD(self):
                server.respond(self, body=False)

            def do_GET(self):
                server.respond(self, body=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> list[dict]:
        """The requests so far, and a fresh log."""
        with self.lock:
            log, self.log = self.log, []
        return log

    def respond(self, handler, body: bool):
        # /<anything>/<file>.gguf: the prefix gives one file several URLs (several cache entries)
        name = handler.path.split("?")[0].rsplit("/", 1)[-1]
        path = self.directory / name
        entry = {
            "method": handler.command,
            "path": handler.path,
            "range": handler.headers.get("Range"),
            "sent": 0,
        }
        with self.lock:
            self.log.append(entry)
        if not name.endswith(".gguf") or not path.is_file():
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            for key, value in CORS_HEADERS.items():
                handler.send_header(key, value)
            handler.end_headers()
            return
        size = path.stat().st_size
        start, end, status = 0, size, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", entry["range"] or "")
        open_ended = not match or not match.group(2)  # the whole file, or all of it from a byte on
        if match:
            start = int(match.group(1))
            end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            status = 206
        handler.send_response(status)
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("Accept-Ranges", "bytes")
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        for key, value in CORS_HEADERS.items():
            handler.send_header(key, value)
        handler.end_headers()
        if not body:
            return
        limit, hold = end - start, None
        with self.lock:
            if open_ended and self.drop_after is not None:
                limit, self.drop_after = min(limit, self.drop_after), None
            if open_ended and self.hold_after is not None:
                hold, self.hold_after = self.hold_after, None
        try:
            with open(path, "rb") as f:
                f.seek(start)
                while entry["sent"] < limit:
                    if hold is not None and entry["sent"] >= hold:
                        handler.wfile.flush()
                        self.held.set()
                        self.resume.wait(HOLD_TIMEOUT_S)
                        hold = None
                    block = f.read(min(1 << 20, limit - entry["sent"]))
                    handler.wfile.write(block)
                    entry["sent"] += len(block)
        except (BrokenPipeError, ConnectionResetError):
            return  # the page stopped reading
        if limit < end - start:  # the connection "dies" halfway
            handler.close_connection = True
            handler.wfile.flush()
            handler.connection.shutdown(2)


def bytes_sent(log: list[dict]) -> int:
    """File bytes sent by the GET requests of a log."""
    return sum(e["sent"] for e in log if e["method"] == "GET")


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def model_server(model_path):
    server = ModelServer(model_path(MODEL).parent)
    yield server
    server.close()


@pytest.fixture(scope="module")
def model_file(model_path) -> Path:
    return model_path(MODEL)


def booted_page(browser, server_url):
    """A page in a browser context of its own (its own model cache), Python booted; for module fixtures:
    `yield from booted_page(browser, server_url)`."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{server_url}/")
    wait_ready(page)
    yield page
    context.close()


@pytest.fixture(scope="module")
def page(browser, server_url):
    yield from booted_page(browser, server_url)


def cached_file_sha256(page, entry_id) -> str:
    """sha256 of a cache entry's data file, read in the page from the Origin Private File System."""
    return call(
        page,
        """async (id) => {
            const root = await navigator.storage.getDirectory();
            const dir = await root.getDirectoryHandle("webgguf-models");
            const file = await (await dir.getFileHandle(`${id}.gguf`)).getFile();
            const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
            return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
        }""",
        entry_id,
        what="hashing a cached model",
    )


def cached_models(page) -> list[dict]:
    return call(page, "() => window.webgguf.engine.listCachedModels()", what="listing the cached models")


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gets(log):
    return [e for e in log if e["method"] == "GET"]


# ---------------------------------------------------------------- the tests (in file order)

state = {}  # what earlier tests leave for later ones (cache entry ids)


def test_a_download_is_cached_and_a_reload_fetches_no_weight_bytes(page, model_server, model_file):
    size = model_file.stat().st_size
    url = f"{model_server.url}/first/{model_file.name}"
    model_server.reset()
    info = load(page, url)
    assert "error" not in info, info
    assert info["cache"]["state"] == "stored", info["cache"]
    assert bytes_sent(model_server.reset()) == size  # downloaded once, whole
    state["first"] = info["cache"]["id"]
    assert cached_file_sha256(page, state["first"]) == file_sha256(model_file)

    page.reload()  # same browser context: same Origin Private File System
    wait_ready(page)
    info = load(page, url)
    assert "error" not in info, info
    assert info["cache"]["state"] == "hit" and info["cache"]["network_bytes"] == 0
    log = model_server.reset()
    assert bytes_sent(log) == 0, log  # no weight bytes over the network: a HEAD for the size only
    assert [e["method"] for e in log] == ["HEAD"]
    assert info["n_layer"] == 30
    assert len(call(page, "() => window.webgguf.engine.tokenize('cached and loaded')")) >= 3
    # the page lists it: name and size
    page.wait_for_function("() => document.querySelectorAll('#cache-list li').length === 1")
    row = page.inner_text("#cache-list li")
    assert model_file.name in row and f"{size / 1e6:.0f} MB" in row


def test_an_interrupted_download_resumes_with_range_requests(page, model_server, model_file):
    size = model_file.stat().st_size
    url = f"{model_server.url}/dropped/{model_file.name}"
    model_server.reset()
    model_server.drop_after = 30 << 20  # the connection dies after 30 MiB
    info = load(page, url)
    assert "error" not in info, info
    log = gets(model_server.reset())
    # the header's chunk by a bounded request, then the stream, which dies after 30 MiB
    assert [e["range"] for e in log[:2]] == [f"bytes=0-{CHUNK - 1}", f"bytes={CHUNK}-"], log
    assert log[1]["sent"] == 30 << 20
    resumed = [int(re.fullmatch(r"bytes=(\d+)-", e["range"]).group(1)) for e in log[2:]]
    # one more request, from the byte reached (not from 0, not from the last whole chunk)
    assert len(resumed) == 1 and CHUNK < resumed[0] <= CHUNK + (30 << 20), log
    assert bytes_sent(log) <= size + CHUNK + (30 << 20) - resumed[0]
    assert cached_file_sha256(page, info["cache"]["id"]) == file_sha256(model_file)

    # A load stopped halfway (a closed tab, an abort) keeps what arrived; the next load resumes there.
    url = f"{model_server.url}/aborted/{model_file.name}"
    aborted = load_and_abort(page, url, 40_000_000)
    assert aborted == "AbortError"
    partial = [m for m in cached_models(page) if m["url"] == url]
    assert len(partial) == 1 and not partial[0]["complete"]
    valid = partial[0]["valid"]
    assert valid >= 40e6 - CHUNK and valid % CHUNK == 0
    model_server.reset()
    info = load(page, url)
    assert "error" not in info, info
    assert info["cache"]["state"] == "resumed" and info["cache"]["resumed_at"] == valid
    log = gets(model_server.reset())
    assert [e["range"] for e in log] == [f"bytes={valid}-"]
    assert bytes_sent(log) == size - valid
    assert cached_file_sha256(page, info["cache"]["id"]) == file_sha256(model_file)
    state["dropped"], state["aborted"] = None, info["cache"]["id"]


def test_a_damaged_cache_entry_is_detected_and_the_chunk_fetched_again(page, model_server, model_file):
    offset = 50_000_000  # a byte inside the weights
    call(
        page,
        """async ([id, offset]) => {
            const root = await navigator.storage.getDirectory();
            const dir = await root.getDirectoryHandle("webgguf-models");
            const handle = await dir.getFileHandle(`${id}.gguf`);
            const file = await handle.getFile();
            const byte = new Uint8Array(await file.slice(offset, offset + 1).arrayBuffer());
            const writable = await handle.createWritable({ keepExistingData: true });
            await writable.write({ type: "write", position: offset, data: new Uint8Array([byte[0] ^ 0xff]) });
            await writable.close();
        }""",
        [state["first"], offset],
    )
    assert cached_file_sha256(page, state["first"]) != file_sha256(model_file)
    url = f"{model_server.url}/first/{model_file.name}"
    model_server.reset()
    info = load(page, url)
    assert "error" not in info, info
    chunk = offset // CHUNK
    assert info["cache"]["state"] == "repaired" and info["cache"]["repaired_chunks"] == [chunk]
    log = gets(model_server.reset())
    assert [e["range"] for e in log] == [f"bytes={chunk * CHUNK}-{(chunk + 1) * CHUNK - 1}"]
    assert bytes_sent(log) == CHUNK  # only the damaged chunk came again
    assert cached_file_sha256(page, state["first"]) == file_sha256(model_file)
    assert "fetched again" in info["cache"]["message"]


def test_the_page_deletes_a_cached_model(page):
    entries = cached_models(page)
    assert len(entries) == 3
    page.click(f"#cache-list li[data-id='{state['aborted']}'] button")
    page.wait_for_function("() => document.querySelectorAll('#cache-list li').length === 2")
    left = {m["id"] for m in cached_models(page)}
    assert state["aborted"] not in left and state["first"] in left
    files = call(
        page,
        """async () => {
            const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("webgguf-models");
            const names = [];
            for await (const [name] of dir.entries()) names.push(name);
            return names;
        }""",
    )
    assert not any(name.startswith(state["aborted"]) for name in files)


def test_a_full_quota_gives_a_clear_message_and_the_model_still_loads(
    page, server_url, model_server, model_file
):
    cdp = page.context.new_cdp_session(page)
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": server_url, "quotaSize": 20_000_000})
    try:
        url = f"{model_server.url}/no-room/{model_file.name}"
        page.select_option("#context-size", "1024")
        page.fill("#model-url", url)
        page.click("#load-button")
        page.wait_for_function(
            "() => document.querySelector('#progress-stage').textContent.startsWith('Loaded in')",
            timeout=120_000,
        )
        note = page.inner_text("#cache-note")
        assert "Not cached" in note and "QuotaExceededError" in note and "loads from the network" in note
        info = page.evaluate("() => window.webgguf.engine.model")
        assert info["cache"]["state"] == "off" and info["n_ctx"] == 1024
        assert all(m["url"] != url for m in cached_models(page))
    finally:
        cdp.send("Storage.overrideQuotaForOrigin", {"origin": server_url})
        page.fill("#model-url", "")
        page.select_option("#context-size", "2048")


def test_preflight_refuses_a_model_that_does_not_fit_before_its_weights_move(page, model_server, model_file):
    # An adapter whose storage bindings hold 1 MiB (the KV cache of one layer at 8192 needs 6 MiB).
    run_python(
        page,
        """
import dataclasses, webgguf_worker
backend = webgguf_worker.session.backend
real_limits = backend.limits
backend.limits = dataclasses.replace(real_limits, max_storage_buffer_binding_size=1 << 20)
""",
    )
    try:
        url = f"{model_server.url}/too-large/{model_file.name}"
        model_server.reset()
        error = load(page, url, n_ctx=8192)
    finally:
        run_python(page, "backend.limits = real_limits")
    assert error.get("type") == "PreflightError", error
    message = error["error"]
    assert (
        "does not fit" in message and "blk.N.k_cache" in message and "maxStorageBufferBindingSize" in message
    )
    assert "a context of" in message  # what would fit
    # only the first chunk (the header: 1.8 MB of it) came, by a bounded Range request
    log = gets(model_server.reset())
    assert [e["range"] for e in log] == [f"bytes=0-{CHUNK - 1}"] and bytes_sent(log) == CHUNK
    assert all(m["url"] != url for m in cached_models(page))
    # the model loaded before is still there
    assert page.evaluate("() => window.webgguf.engine.model.n_layer") == 30
