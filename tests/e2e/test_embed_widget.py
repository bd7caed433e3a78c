"""embed.js on a page of another origin: the one-line script tag, the launcher and a chat turn, inline
rendering into data-target, one global, and readable errors when the host page blocks the widget.

The host pages come from a second server (another port: another origin) and hold the script tag
pointing at `webgguf serve`'s /embed.js; everything the widget loads comes from that server by CORS.
Replies are 4 tokens (data-max-tokens) to keep the module short on SwiftShader.
"""

import http.client
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from browser_env import ARTIFACTS, MODEL

LOAD_TIMEOUT_MS = 180_000  # Pyodide boot + model load on a busy 2-core machine
REPLY_TIMEOUT_MS = 180_000  # prefill of the chat prompt + 4 tokens (SwiftShader)
FAIL_TIMEOUT_MS = 60_000

# Selectors pierce open shadow roots (Playwright's CSS engine); the host element is the only
# light-DOM node the widget adds.
HOST = "[data-webgguf-embed]"
PANEL = f"{HOST} section.panel"


class HostPages:
    """A second origin: serves `pages` (path → (html, extra headers)), nothing else."""

    def __init__(self):
        self.pages: dict[str, tuple[str, dict[str, str]]] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                page = pages.get(self.path.split("?")[0])
                if page is None:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                html, headers = page
                body = html.encode()
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, path: str, html: str, headers: dict[str, str] | None = None) -> str:
        # An empty icon: no request for /favicon.ico (a 404 would be a console error).
        self.pages[path] = ('<!doctype html><link rel="icon" href="data:,">\n' + html, headers or {})
        return self.url + path


@pytest.fixture(scope="module")
def host_pages(server_url, model_path):
    model_path(MODEL)  # in the cache, so the asset server has it
    pages = HostPages()
    thread = threading.Thread(target=pages.server.serve_forever, daemon=True)
    thread.start()
    yield pages
    pages.server.shutdown()
    pages.server.server_close()


def open_page(browser, url: str):
    """A new page (its own context) at `url`, with its console errors and requested URLs."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.errors = []
    page.requests = []
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto(url)
    return page


def wait_state(page, states: str, timeout: int):
    """Wait until the widget's panel is in one of `states` (space-separated); returns the state."""
    page.wait_for_function(
        """(states) => {
            const host = document.querySelector("[data-webgguf-embed]");
            const state = host?.shadowRoot.querySelector("section.panel").dataset.state;
            return states.split(" ").includes(state) && state;
        }""",
        arg=states,
        timeout=timeout,
    )
    return page.locator(PANEL).get_attribute("data-state")


def alert_text(page) -> str:
    return page.locator(f"{HOST} .alert").text_content()


def test_one_script_tag_on_another_origin_completes_a_chat_turn(browser, server_url, host_pages):
    tag = f'<script src="{server_url}/embed.js" data-model="{MODEL}" data-max-tokens="4" defer></script>'
    url = host_pages.add("/", f"<title>A host page</title><h1>Someone's page</h1>\n{tag}\n")
    assert url.split("/")[2] != server_url.split("/")[2]  # another port: another origin
    page = open_page(browser, url)
    try:
        assert page.evaluate("() => document.scripts.length") == 1
        # The widget is one host element with a shadow root; nothing else enters the page's DOM.
        shape = page.evaluate(
            """() => {
                const hosts = document.querySelectorAll("[data-webgguf-embed]");
                return {hosts: hosts.length, shadow: !!hosts[0]?.shadowRoot, lightButtons:
                        document.querySelectorAll("button").length, children: hosts[0]?.children.length};
            }"""
        )
        assert shape == {"hosts": 1, "shadow": True, "lightButtons": 0, "children": 0}
        launcher = page.locator(f"{HOST} button.launcher")
        assert launcher.get_attribute("aria-expanded") == "false"
        assert page.locator(PANEL).is_hidden()
        # Nothing loads before it opens (the model is 100 MB).
        assert page.locator(PANEL).get_attribute("data-state") == "idle"
        assert not [u for u in page.requests if "webgguf.js" in u or "pyodide" in u]

        # Keyboard only: Tab reaches the launcher, Enter opens the panel and starts the engine.
        page.keyboard.press("Tab")
        assert (
            page.evaluate("() => document.activeElement?.shadowRoot?.activeElement?.className") == "launcher"
        )
        page.keyboard.press("Enter")
        assert launcher.get_attribute("aria-expanded") == "true"
        assert page.locator(PANEL).is_visible()
        assert wait_state(page, "loading ready error", 10_000) in ("loading", "ready")
        assert wait_state(page, "ready error", LOAD_TIMEOUT_MS) == "ready", alert_text(page)

        # Everything came from the asset server (the other origin), by way of the script's URL.
        loaded = {
            name: [u for u in page.requests if name in u]
            for name in (
                "webgguf.js",
                "worker",
                "pyodide.asm.wasm",
                "wheels/",
                "shaders.json",
                "manifest.json",
                ".gguf",
            )
        }
        for name, urls in loaded.items():
            assert urls and all(u.startswith(server_url + "/") for u in urls), (name, urls)

        # The input has the focus once ready; type, Enter sends; the reply streams into the shadow DOM.
        assert page.evaluate("() => document.activeElement?.shadowRoot?.activeElement?.tagName") == "TEXTAREA"
        page.evaluate(
            """() => {
                // Record each text the reply shows and the widget's state at that moment.
                const root = document.querySelector("[data-webgguf-embed]").shadowRoot;
                window.__seen = [];
                new MutationObserver(() => {
                    const reply = root.querySelector(".message.assistant .text");
                    const state = root.querySelector("section.panel").dataset.state;
                    if (reply?.textContent) window.__seen.push([reply.textContent, state]);
                }).observe(root, {subtree: true, childList: true, characterData: true});
            }"""
        )
        page.keyboard.type("Hi!")
        page.keyboard.press("Enter")
        assert page.locator(f"{HOST} .message.user").text_content() == "Hi!"
        assert wait_state(page, "generating ready error", 10_000) in ("generating", "ready")
        assert wait_state(page, "ready error", REPLY_TIMEOUT_MS) == "ready", alert_text(page)
        reply = page.locator(f"{HOST} .message.assistant")
        text = reply.locator(".text").text_content()
        assert text.strip(), "the reply is empty"
        assert reply.get_attribute("data-finish") in ("length", "stop")
        seen = page.evaluate("() => window.__seen")
        assert any(state == "generating" for _, state in seen), f"no text shown while generating: {seen}"
        assert all(text.startswith(shown) for shown, _ in seen), (seen, text)  # it only grew
        assert page.locator(f"{HOST} .alert").is_hidden()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "embed_launcher.png")

        # Escape closes the panel and gives the focus back to the launcher.
        page.keyboard.press("Escape")
        assert page.locator(PANEL).is_hidden()
        assert launcher.get_attribute("aria-expanded") == "false"
        assert (
            page.evaluate("() => document.activeElement?.shadowRoot?.activeElement?.className") == "launcher"
        )
        assert page.errors == []
    finally:
        page.close()


def strict_csp(server_url: str, nonce: str = "", **changes: str) -> str:
    """The strictest Content-Security-Policy the widget works under (docs/BROWSER.md, Embedding);
    `changes` replace directives (underscores for dashes). A nonce admits the page's own inline code."""
    own = f" 'nonce-{nonce}'" if nonce else ""
    directives = {
        "default-src": "'self'",
        "script-src": f"{server_url} 'wasm-unsafe-eval'{own}",
        "worker-src": "blob:",
        "connect-src": server_url,
        "style-src": f"'self'{own}",  # no 'unsafe-inline': the widget's styles are constructed sheets
        "img-src": "data:",
    }
    directives.update({name.replace("_", "-"): value for name, value in changes.items()})
    return "; ".join(f"{name} {value}" for name, value in directives.items())


def test_inline_target_and_one_global(browser, server_url, host_pages):
    # Under the strict policy of the docs; the page's own inline script and style carry its nonce.
    html = f"""<title>Inline</title>
<script nonce="n0nce">window.keysBefore = Object.keys(window);</script>
<style nonce="n0nce">#chat-here {{ height: 420px; }}</style>
<main><p>Before the chat.</p><div id="chat-here"></div><p>After.</p></main>
<script src="{server_url}/embed.js" data-model="{MODEL}" data-target="#chat-here" data-title="Ask the model"
        data-max-tokens="4" defer></script>
"""
    csp = {"Content-Security-Policy": strict_csp(server_url, nonce="n0nce")}
    page = open_page(browser, host_pages.add("/inline", html, csp))
    try:
        # Rendered into the target, no launcher, the title shown; it loads at once.
        assert page.evaluate("() => document.querySelector('#chat-here > [data-webgguf-embed]') !== null")
        assert page.locator(f"{HOST} button.launcher").count() == 0
        assert page.locator(f"{HOST} h2").text_content() == "Ask the model"
        assert page.locator(PANEL).is_visible()
        box = page.locator(PANEL).bounding_box()
        target = page.locator("#chat-here").bounding_box()
        assert abs(box["y"] - target["y"]) < 2 and abs(box["height"] - 420) < 2, (box, target)
        assert wait_state(page, "ready error", LOAD_TIMEOUT_MS) == "ready", alert_text(page)

        added = page.evaluate(
            "() => Object.keys(window).filter((k) => !window.keysBefore.includes(k) && k !== 'keysBefore')"
        )
        assert added == ["webggufEmbed"]
        api = page.evaluate(
            """() => {
                const widget = webggufEmbed.widgets[0];
                return {version: webggufEmbed.version, widgets: webggufEmbed.widgets.length,
                        state: widget.state, model: widget.engine.model.name};
            }"""
        )
        assert api == {"version": 1, "widgets": 1, "state": "ready", "model": api["model"]}
        assert api["model"].lower().startswith("smollm2")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "embed_inline.png")
        assert page.errors == []
    finally:
        page.close()


def test_blocked_or_wrong_setups_show_readable_errors(browser, server_url, host_pages):
    # Pages whose Content-Security-Policy lacks one of what the widget needs: each fails at once
    # with a message naming the directive (not a hang: Pyodide never settles when its wasm or its
    # fetches are blocked, so the worker's bootstrap checks them first).
    tag = f'<script src="{server_url}/embed.js" data-model="{MODEL}" data-preload defer></script>'
    cases = {
        "worker-src": strict_csp(server_url, worker_src="'none'"),
        "wasm-unsafe-eval": strict_csp(server_url, script_src=server_url),
        "connect-src": strict_csp(server_url, connect_src="'self'"),
    }
    for directive, csp in cases.items():
        url = host_pages.add(
            f"/csp-{directive}", f"<title>CSP</title>{tag}", {"Content-Security-Policy": csp}
        )
        page = open_page(browser, url)
        try:
            assert wait_state(page, "ready error", FAIL_TIMEOUT_MS) == "error", directive
            message = alert_text(page)
            assert "Content-Security-Policy" in message and directive in message, message
            # Still styled: constructed style sheets are not inline styles for a CSP.
            launcher = page.locator(f"{HOST} button.launcher")
            assert launcher.evaluate("(b) => getComputedStyle(b).position") == "fixed"
        finally:
            page.close()

    # A model name the asset server does not know: the engine starts, the load fails, it says why.
    tag = f'<script src="{server_url}/embed.js" data-model="no-such-model" data-preload defer></script>'
    page = open_page(browser, host_pages.add("/unknown", f"<title>Unknown</title>{tag}"))
    try:
        assert wait_state(page, "ready error", LOAD_TIMEOUT_MS) == "error"
        message = alert_text(page)
        assert "unknown model no-such-model" in message and MODEL in message, message
        # The panel was never opened: the launcher carries the failure, and opening shows it.
        launcher = page.locator(f"{HOST} button.launcher")
        assert "failed" in launcher.get_attribute("aria-label")
        launcher.click()
        assert page.locator(f"{HOST} .alert").is_visible()
        page.screenshot(path=ARTIFACTS / "embed_error.png")
        assert page.locator(f"{HOST} textarea").is_disabled()
    finally:
        page.close()


def test_asset_server_sends_what_another_origin_needs(server_url, model_path):
    """The headers behind the browser tests above, one by one (no browser)."""
    address = urlsplit(server_url)
    origin = {"Origin": "https://somebody-else.example"}

    def ask(method, path, headers):
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        response.read()
        connection.close()
        return response

    for path in ("/embed.js", "/webgguf.js", "/pyodide/pyodide.asm.wasm", "/models/manifest.json"):
        response = ask("GET", path, origin)
        assert response.status == 200, path
        assert response.getheader("Access-Control-Allow-Origin") == "*", path
        assert response.getheader("Cross-Origin-Resource-Policy") == "cross-origin", path
    response = ask("GET", "/embed.js", origin)
    assert response.getheader("Content-Type") == "text/javascript"  # a classic script needs a JS type
    model_file = f"/models/{model_path(MODEL).name}"
    response = ask("GET", model_file, {**origin, "Range": "bytes=0-3"})
    assert response.status == 206
    exposed = {h.strip() for h in response.getheader("Access-Control-Expose-Headers").split(",")}
    assert {"Content-Range", "Content-Length", "Accept-Ranges"} <= exposed
    # A preflight, as a browser sends it for a Range it does not count as safelisted.
    preflight = {**origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "range"}
    response = ask("OPTIONS", model_file, preflight)
    assert response.status == 204
    assert response.getheader("Access-Control-Allow-Origin") == "*"
    assert "Range" in response.getheader("Access-Control-Allow-Headers")
    assert "GET" in response.getheader("Access-Control-Allow-Methods")
