"""webgguf.serve without a browser: static files, models with Range requests, the manifest, headers."""

import http.client
import json
import threading

import pytest

from webgguf import models, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of a tiny page and a cache directory holding one fake model file."""
    web = tmp_path_factory.mktemp("web")
    (web / "index.html").write_text("<!doctype html><title>t</title>")
    (web / "runtime.wasm").write_bytes(b"\0asm\1\0\0\0")
    (web / "worker.mjs").write_text("export {};")
    cache = tmp_path_factory.mktemp("cache")
    model = bytes(range(256)) * 40  # 10240 bytes
    (cache / "tiny.gguf").write_bytes(model)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WEBGGUF_CACHE", str(cache))
        httpd = serve.make_server(0, "127.0.0.1", web)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], model
    httpd.shutdown()
    httpd.server_close()


def get(port, path, method="GET", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, headers=headers or {})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response, body


def test_page_files_have_isolation_headers_and_types(server):
    port, _ = server
    for path, content_type in (
        ("/", "text/html; charset=utf-8"),
        ("/runtime.wasm", "application/wasm"),
        ("/worker.mjs", "text/javascript"),
    ):
        response, _ = get(port, path)
        assert response.status == 200, path
        assert response.getheader("Content-Type") == content_type
        assert response.getheader("Cross-Origin-Opener-Policy") == "same-origin"
        assert response.getheader("Cross-Origin-Embedder-Policy") == "require-corp"
        assert response.getheader("Cross-Origin-Resource-Policy") == "cross-origin"  # embed.js
        assert response.getheader("Access-Control-Allow-Origin") == "*"
        assert response.getheader("Cache-Control") == "no-cache"


def test_model_whole_and_ranges(server):
    port, model = server
    response, body = get(port, "/models/tiny.gguf")
    assert response.status == 200 and body == model
    assert response.getheader("Content-Length") == str(len(model))
    assert response.getheader("Accept-Ranges") == "bytes"
    cases = {
        "bytes=0-99": (0, 100),
        "bytes=10000-": (10000, len(model)),
        "bytes=-40": (len(model) - 40, len(model)),
    }
    cases["bytes=100-999999"] = (100, len(model))  # a range past the end is cut at the end
    for header, (start, end) in cases.items():
        response, body = get(port, "/models/tiny.gguf", headers={"Range": header})
        assert response.status == 206, header
        assert body == model[start:end]
        assert response.getheader("Content-Range") == f"bytes {start}-{end - 1}/{len(model)}"
        assert response.getheader("Content-Length") == str(end - start)


def test_model_head_and_unsatisfiable_range(server):
    port, model = server
    response, body = get(port, "/models/tiny.gguf", method="HEAD")
    assert response.status == 200 and body == b""
    assert response.getheader("Content-Length") == str(len(model))
    response, _ = get(port, "/models/tiny.gguf", headers={"Range": f"bytes={len(model)}-"})
    assert response.status == 416
    assert response.getheader("Content-Range") == f"bytes */{len(model)}"


@pytest.mark.parametrize("path", ["/models/missing.gguf", "/models/..%2Fetc%2Fpasswd", "/models/x/y.gguf"])
def test_models_outside_the_cache_are_not_served(server, path):
    port, _ = server
    response, _ = get(port, path)
    assert response.status == 404


def test_manifest_lists_models_with_urls(server):
    port, _ = server
    response, body = get(port, "/models/manifest.json")
    assert response.status == 200
    assert response.getheader("Cache-Control") == "no-store"
    listed = json.loads(body)
    manifest = models.load_manifest()
    assert listed["default"] == manifest["default"]
    assert set(listed["models"]) == set(manifest["models"])
    for name, entry in listed["models"].items():
        assert entry["url"] == "/models/" + manifest["models"][name]["file"]
        assert entry["size"] == manifest["models"][name]["size"]
        assert entry["cached"] is False  # this server's cache holds only tiny.gguf


@pytest.mark.parametrize(
    "header,size,expected",
    [
        ("bytes=0-0", 10, (0, 1)),
        ("bytes=5-", 10, (5, 10)),
        ("bytes=-3", 10, (7, 10)),
        ("bytes=-30", 10, (0, 10)),
        ("bytes=10-", 10, None),
        ("bytes=5-2", 10, None),
        ("bytes=-", 10, None),
        ("bytes=0-1,4-5", 10, None),
        ("items=0-1", 10, None),
    ],
)
def test_parse_range(header, size, expected):
    assert serve.parse_range(header, size) == expected
