"""A small local web server for the chat page: `webgguf serve [--port]`.

It serves three things from one origin (the page, its Python runtime and the models must share one,
so the worker can be created and WebGPU / fetch need no CORS):
- the built page, `web/dist/` (made by `tools/build_web.py`);
- the cached models, `/models/<file>` from `models.cache_dir()`, with HTTP Range requests, so the
  page can stream a GGUF straight into GPU buffers (and re-read a part of it);
- `/models/manifest.json`: the known models, each with its URL here and whether it is cached.

Every response carries COOP/COEP (the page is cross-origin isolated, which gives it precise timers
and SharedArrayBuffer), and no-store for the manifest so a newly fetched model shows up.

Every response is also open to pages of other origins, for embed.js (`<script src=".../embed.js">` on
any site, docs/BROWSER.md "Embedding"): such a page loads embed.js as a classic script (no-cors: it
needs `Cross-Origin-Resource-Policy: cross-origin`), then webgguf.js, the worker, Pyodide, the
wheels, the shaders and the models by CORS requests (`Access-Control-Allow-Origin: *`; no cookies
are involved, so the wildcard is enough). Range is not a CORS-safelisted header in every browser:
OPTIONS answers the preflight. Content-Range / Accept-Ranges are exposed to the page's scripts.
Stdlib only; threaded, so a slow model download does not block the page's other requests.
"""

import json
import mimetypes
import os
import re
import sys
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from . import models

WEB_DIST = models.REPO_ROOT / "web" / "dist"
MODELS_PREFIX = "/models/"
MANIFEST_URL = MODELS_PREFIX + "manifest.json"
COPY_CHUNK = 1 << 20  # bytes per write while sending a file

# Types the stdlib table lacks or gets wrong on some systems (the browser refuses to compile a
# .wasm with streaming instantiation, or to import a .mjs, served with another type).
MIME_TYPES = {
    ".wasm": "application/wasm",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".json": "application/json",
    ".whl": "application/zip",
    ".zip": "application/zip",
    ".gguf": "application/octet-stream",
    ".wgsl": "text/plain; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}

# What lets a page of another origin use the files (embed.js): see the module docstring.
CORS_HEADERS = {
    "Cross-Origin-Resource-Policy": "cross-origin",
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "Content-Length, Content-Range, Accept-Ranges",
}
# The answer to a CORS preflight (OPTIONS): what a cross-origin fetch may send.
PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
    "Access-Control-Allow-Headers": "Range",
    "Access-Control-Max-Age": "86400",
}

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def manifest_for_page(models_dir: Path) -> dict:
    """models/manifest.json as the page needs it: each model's URL on this server and whether it is
    in `models_dir` (complete: the manifest's size)."""
    manifest = models.load_manifest()
    listed = {}
    for name, entry in manifest["models"].items():
        path = models_dir / entry["file"]
        listed[name] = {
            "file": entry["file"],
            "size": entry["size"],
            "sha256": entry["sha256"],
            "license": entry.get("license", ""),
            "url": MODELS_PREFIX + entry["file"],
            "cached": path.is_file() and path.stat().st_size == entry["size"],
        }
    return {"default": manifest["default"], "models": listed}


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The byte range [start, end) of a single-range `Range` header, None if it cannot be satisfied.

    Multiple ranges ("bytes=0-1,5-9") are not supported and also give None (the page never asks)."""
    match = _RANGE.match(header.strip())
    if not match or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":  # a suffix: the last N bytes
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = size if last == "" else min(int(last) + 1, size)
    if start >= size or start >= end:
        return None
    return start, end


class Handler(SimpleHTTPRequestHandler):
    """Static files from `directory` plus the models; GET and HEAD (OPTIONS: CORS preflights)."""

    server_version = "webgguf"
    static_file = False  # the response is a file of the page (set per request)

    def __init__(self, *args, directory: str, models_dir: Path, **kwargs):
        self.models_dir = models_dir
        super().__init__(*args, directory=directory, **kwargs)

    def end_headers(self):
        for name, value in {**ISOLATION_HEADERS, **CORS_HEADERS}.items():
            self.send_header(name, value)
        if self.static_file:
            # Revalidate every time (a 304 when unchanged): a rebuilt page keeps its file names.
            self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def guess_type(self, path):
        suffix = Path(str(path)).suffix.lower()
        return MIME_TYPES.get(suffix) or mimetypes.guess_type(str(path))[0] or "application/octet-stream"

    def log_message(self, format, *args):
        if os.environ.get("WEBGGUF_SERVE_LOG"):
            super().log_message(format, *args)

    def do_GET(self):
        self._respond(send_body=True)

    def do_HEAD(self):
        self._respond(send_body=False)

    def do_OPTIONS(self):
        self.send_response(HTTPStatus.NO_CONTENT)
        for name, value in PREFLIGHT_HEADERS.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _respond(self, send_body: bool):
        path = unquote(urlsplit(self.path).path)
        self.static_file = not path.startswith(MODELS_PREFIX)
        if path == MANIFEST_URL:
            self._send_json(manifest_for_page(self.models_dir), send_body)
        elif path.startswith(MODELS_PREFIX):
            self._send_model(path[len(MODELS_PREFIX) :], send_body)
        elif send_body:
            try:
                super().do_GET()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the page went away mid-file (a closed tab): nothing to clean up
        else:
            super().do_HEAD()

    def _send_json(self, value, send_body: bool):
        body = json.dumps(value, indent=1).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _send_model(self, name: str, send_body: bool):
        # Only plain file names of the cache directory: no subdirectories, no "..".
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(".gguf"):
            self.send_error(HTTPStatus.NOT_FOUND, "no such model file")
            return
        path = self.models_dir / name
        if not path.is_file():
            self.send_error(HTTPStatus.NOT_FOUND, f"{name} is not in the model cache")
            return
        size = path.stat().st_size
        start, end = 0, size
        status = HTTPStatus.OK
        if "Range" in self.headers:
            byte_range = parse_range(self.headers["Range"], size)
            if byte_range is None:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            (start, end), status = byte_range, HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", MIME_TYPES[".gguf"])
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if send_body:
            with open(path, "rb") as f:
                f.seek(start)
                _copy(f, self.wfile, end - start)


def _copy(src, dst, n: int) -> None:
    try:
        while n > 0:
            block = src.read(min(COPY_CHUNK, n))
            if not block:
                break
            dst.write(block)
            n -= len(block)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the page stopped reading (a cancelled load): nothing to clean up


def make_server(
    port: int = 8000, host: str = "127.0.0.1", web_dir: Path | None = None
) -> ThreadingHTTPServer:
    """The server bound to (host, port); port 0 picks a free one (see `.server_address`)."""
    web_dir = Path(web_dir or WEB_DIST)
    if not (web_dir / "index.html").is_file():
        raise FileNotFoundError(f"{web_dir}/index.html is missing: build the page (tools/build_web.py)")
    handler = partial(Handler, directory=str(web_dir), models_dir=models.cache_dir())
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(port: int = 8000, host: str = "127.0.0.1", web_dir: Path | None = None) -> None:
    """Serve the page and the cached models until interrupted."""
    server = make_server(port, host, web_dir)
    host, port = server.server_address[:2]
    print(f"webgguf: serving the chat page on http://{host}:{port}/ (Ctrl-C stops)", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
