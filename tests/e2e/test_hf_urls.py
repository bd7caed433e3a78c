"""Hugging Face URLs as people paste them, in headless Chromium: the address of a file's page
(https://huggingface.co/ORG/REPO/blob/main/FILE) loads the file, through /resolve/, whose answer is a
redirect to a CDN host (another origin) that serves Range requests and CORS, as Hugging Face does.

`HubServer` plays huggingface.co on a 127.0.0.1 port (Chromium maps the name there:
--host-resolver-rules, in a Chromium of this module's own; http, as a test server has no certificate);
the CDN is test_cache.ModelServer on another port. The model is SmolLM2 split in 3 files
(test_split_model_browser.py).
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from browser_env import CHROMIUM, CHROMIUM_ARGS
from test_cache import CORS_HEADERS, ModelServer, wait_ready
from test_split_model_browser import LOAD_TIMEOUT_MS, load, shards  # noqa: F401 (shards: a fixture)

REPO = "/example-org/SmolLM2-135M-Instruct-GGUF"


class HubServer:
    """huggingface.co as the page meets it: /ORG/REPO/resolve/REV/FILE answers 302 to the CDN (with
    CORS headers, so a CORS fetch may follow it); /ORG/REPO/blob/REV/FILE is the file's HTML page."""

    def __init__(self, cdn_url: str):
        self.log: list[tuple[str, str]] = []  # (method, path)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status: int, headers: dict, body: bytes = b""):
                self.send_response(status)
                for name, value in {**CORS_HEADERS, **headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_OPTIONS(self):
                self.answer(204, {"Access-Control-Allow-Methods": "GET, HEAD"})

            def do_GET(self):
                server.log.append((self.command, self.path))
                parts = self.path.split("/")  # ["", ORG, REPO, view, REV, FILE...]
                if len(parts) >= 6 and parts[3] == "resolve":
                    location = f"{cdn_url}/xet-bridge/{parts[4]}/{'/'.join(parts[5:])}?Signature=abc"
                    self.answer(302, {"Location": location})
                elif len(parts) >= 6 and parts[3] == "blob":
                    self.answer(200, {"Content-Type": "text/html"}, b"<!doctype html><title>a file</title>")
                else:
                    self.answer(404, {})

            do_HEAD = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.port = self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def cdn(shards):  # noqa: F811
    server = ModelServer(shards[0].parent)
    yield server
    server.close()


@pytest.fixture(scope="module")
def hub(cdn):
    server = HubServer(cdn.url)
    yield server
    server.close()


@pytest.fixture(scope="module")
def page(playwright_driver, server_url, hub):
    rules = f"--host-resolver-rules=MAP huggingface.co 127.0.0.1:{hub.port}"
    args = [*CHROMIUM_ARGS, rules, "--js-flags=--expose-gc"]  # gc(): see collect_garbage_until
    browser = playwright_driver.chromium.launch(executable_path=str(CHROMIUM), args=args, headless=True)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{server_url}/")
    wait_ready(page)
    yield page
    browser.close()


def collect_garbage_until(page, condition: str, timeout_ms: int):
    """Waits for `condition` while the worker's garbage collector runs every 0.2 s. Chromium drops the
    promise of an OPFS call whose handle was collected meanwhile (web/cache.js `held`): with collections
    this frequent, a load that did not hold its handles stalled every time."""
    for _ in range(timeout_ms // 200):
        if page.evaluate(condition):
            return
        for worker in page.workers:
            worker.evaluate("() => gc()")
        page.wait_for_timeout(200)
    status = page.inner_text("#status-text")
    raise AssertionError(f"not after {timeout_ms / 1000:.0f} s: {condition}; the page says {status!r}")


def test_a_pasted_file_page_url_loads_through_the_redirect(page, hub, cdn, shards):  # noqa: F811
    pasted = f"http://huggingface.co{REPO}/blob/main/{shards[0].name}"
    cdn.reset()
    page.fill("#model-url", pasted)
    page.click("#load-button")
    collect_garbage_until(
        page,
        "() => document.querySelector('#progress-stage').textContent.startsWith('Loaded in')"
        " || !document.getElementById('alert').hidden",
        LOAD_TIMEOUT_MS,
    )
    assert page.is_hidden("#alert"), page.inner_text("#alert")
    info = page.evaluate("() => window.webgguf.engine.model")
    assert info["files"] == [p.name for p in shards] and info["n_layer"] == 30
    # every request to the hub was for /resolve/ (the page of the file was never fetched), for each file
    assert hub.log and all(f"{REPO}/resolve/main/" in path for _, path in hub.log), hub.log
    assert {path.rsplit("/", 1)[-1] for _, path in hub.log} == {p.name for p in shards}
    # the CDN served the bytes by Range requests that followed the redirect, each file's bytes once
    gets = [e for e in cdn.reset() if e["method"] == "GET"]
    for path in shards:
        served = [e for e in gets if e["path"].split("?")[0].endswith(path.name)]
        assert served and all(e["range"] and e["path"].startswith("/xet-bridge/main/") for e in served)
        assert sum(e["sent"] for e in served) == path.stat().st_size
    # cached under the file URLs (/resolve/), so the page URL and the file URL are one entry
    entries = page.evaluate("() => window.webgguf.engine.listCachedModels()")
    resolve = [f"http://huggingface.co{REPO}/resolve/main/{p.name}" for p in shards]
    assert sorted(e["url"] for e in entries) == resolve and all(e["complete"] for e in entries)
    assert len(page.evaluate("() => window.webgguf.engine.tokenize('loaded from the hub')")) >= 4


def test_a_file_url_loads_from_the_cache(page, hub, cdn, shards):  # noqa: F811
    hub.log.clear()
    info = load(page, f"http://huggingface.co{REPO}/resolve/main/{shards[0].name}")
    assert "error" not in info, info
    assert info["cache"]["state"] == "hit"
    assert sum(e["sent"] for e in cdn.reset()) == 0


def test_a_repository_page_is_refused_with_what_to_give(page):
    error = load(page, f"http://huggingface.co{REPO}")
    assert error["type"] == "ModelUrlError", error
    assert "is a Hugging Face repository page, not a file: give the link of a .gguf file" in error["error"]
