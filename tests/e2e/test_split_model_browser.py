"""Split GGUF models in the page (headless Chromium): SmolLM2 in 3 shards (tools/split_gguf.py, as
llama-gguf-split writes them) from the URL of its first file, downloaded with parallel Range requests
and cached per shard, with the greedy tokens of the unsplit model natively; again from the cache; from
the files dropped together; and clear errors for sets of files that are not one model.

One browser context (its own Origin Private File System) and page for the module; tests run in file
order. The shards come from `ShardServer` (test_cache.ModelServer, another origin, which also counts
the requests that run at once).
"""

import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from browser_env import MODEL, ROOT
from page_calls import wait_ready
from test_cache import ModelServer, booted_page

from webgguf.gguf import read_header

sys.path.insert(0, str(ROOT / "tools"))
import split_gguf  # noqa: E402

CHUNK = 4 << 20  # web/cache.js CHUNK
PARALLEL_DOWNLOADS = 3  # web/sources.js PARALLEL_DOWNLOADS
PROMPT = "The capital of France is"
GREEDY_TOKENS = 6
LOAD_TIMEOUT_MS = 240_000
GENERATION_TIMEOUT_MS = 240_000


class ShardServer(ModelServer):
    """ModelServer that also records the most GET requests it served at once."""

    def __init__(self, directory: Path):
        self.active = 0
        self.most_active = 0
        super().__init__(directory)

    def respond(self, handler, body: bool):
        with self.lock:
            self.active += body
            self.most_active = max(self.most_active, self.active)
        try:
            super().respond(handler, body)
        finally:
            with self.lock:
                self.active -= body


def run_bounded(page, script: str, arg=None, timeout_ms: int = LOAD_TIMEOUT_MS):
    """The value of the promise of `(script)(arg)` in the page, or {error, type}; waited for at most
    timeout_ms (page.evaluate alone would wait for it with no limit)."""
    page.evaluate(
        "(arg) => { window.settled = null; Promise.resolve((" + script + ")(arg)).then("
        "(value) => { window.settled = { value }; },"
        "(e) => { window.settled = { error: e.message, type: e.type ?? e.name }; }); }",
        arg,
    )
    page.wait_for_function("() => window.settled", timeout=timeout_ms)
    settled = page.evaluate("() => window.settled")
    return settled.get("value", settled)


def load(page, model, timeout_ms=LOAD_TIMEOUT_MS):
    return run_bounded(page, "(model) => window.webgguf.engine.load(model)", model, timeout_ms)


def greedy_ids(page) -> list[int]:
    result = run_bounded(
        page,
        """(prompt) => window.webgguf.completions.create(
            { prompt, max_tokens: TOKENS, temperature: 0, return_token_ids: true })""".replace(
            "TOKENS", str(GREEDY_TOKENS)
        ),
        PROMPT,
        GENERATION_TIMEOUT_MS,
    )
    assert "error" not in result, result
    return result["choices"][0]["token_ids"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cached_entries(page) -> list[dict]:
    return run_bounded(page, "() => window.webgguf.engine.listCachedModels()", None, 30_000)


def cached_sha256(page, entry_id) -> str:
    return run_bounded(
        page,
        """async (id) => {
            const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle("webgguf-models");
            const file = await (await dir.getFileHandle(`${id}.gguf`)).getFile();
            const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
            return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
        }""",
        entry_id,
        60_000,
    )


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def shards(model_path, tmp_path_factory) -> list[Path]:
    """SmolLM2 (98 MB) in 3 files of at most 40 MiB of tensor data."""
    source = model_path(MODEL)
    groups = split_gguf.group_tensors(read_header(source), max_bytes=40 << 20)
    paths = split_gguf.write_shards(source, tmp_path_factory.mktemp("shards") / "smollm2", groups)
    assert len(paths) == 3
    return paths


@pytest.fixture(scope="module")
def native_ids(web_dist, model_path):
    """The native CLI's greedy ids for PROMPT on the unsplit model (started now: it takes a while)."""
    command = [
        str(Path(sys.executable).parent / "webgguf"),
        "generate",
        str(model_path(MODEL)),
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(GREEDY_TOKENS),
        "--backend",
        "gpu",
        "--json",
    ]

    def run():
        result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])["ids"]

    pool = ThreadPoolExecutor(1)
    yield pool.submit(run)
    pool.shutdown(cancel_futures=True)


@pytest.fixture(scope="module")
def shard_server(shards):
    server = ShardServer(shards[0].parent)
    yield server
    server.close()


@pytest.fixture(scope="module")
def page(browser, server_url):
    yield from booted_page(browser, server_url)


# ---------------------------------------------------------------- the tests (in file order)


def test_a_split_model_loads_from_the_url_of_its_first_file(page, shards, shard_server, native_ids):
    url = f"{shard_server.url}/models/{shards[0].name}"
    shard_server.reset()
    info = load(page, url)
    assert "error" not in info, info
    assert info["files"] == [p.name for p in shards] and info["n_layer"] == 30
    assert info["file_bytes"] == sum(p.stat().st_size for p in shards)
    assert info["cache"]["state"] == "stored", info["cache"]
    assert [s["state"] for s in info["cache"]["shards"]] == ["stored"] * 3
    log = [e for e in shard_server.reset() if e["method"] == "GET"]
    for path in shards:
        requests = [e for e in log if e["path"].endswith(path.name)]
        # the header's chunk by a bounded Range request, then the rest, once
        assert requests[0]["range"] == f"bytes=0-{CHUNK - 1}", requests
        assert sum(e["sent"] for e in requests) == path.stat().st_size, requests
        assert all(e["range"] for e in requests), requests  # all by Range requests
    # the shards after the one being uploaded were downloaded meanwhile, a few at a time
    assert 2 <= shard_server.most_active <= PARALLEL_DOWNLOADS
    entries = {e["url"]: e for e in cached_entries(page)}
    for path in shards:
        entry = entries[f"{shard_server.url}/models/{path.name}"]
        assert entry["complete"] and entry["name"] == path.name
        assert cached_sha256(page, entry["id"]) == sha256(path.read_bytes())
    assert greedy_ids(page) == native_ids.result()


def test_a_reload_reads_every_shard_from_the_cache(page, shards, shard_server):
    page.reload()
    wait_ready(page)
    shard_server.reset()
    info = load(page, f"{shard_server.url}/models/{shards[0].name}")
    assert "error" not in info, info
    assert info["cache"]["state"] == "hit" and info["cache"]["network_bytes"] == 0
    assert sorted(e["method"] for e in shard_server.reset()) == ["HEAD"] * 3  # the sizes only
    # the page lists one entry per file
    page.wait_for_function("() => document.querySelectorAll('#cache-list li').length === 3")
    rows = page.inner_text("#cache-list")
    assert all(path.name in rows for path in shards)


def test_the_files_of_a_split_model_chosen_together(page, shards, native_ids):
    page.set_input_files("#file-input", [str(p) for p in reversed(shards)])  # any order
    page.wait_for_function(
        "() => document.querySelector('#progress-stage').textContent.startsWith('Loaded in')",
        timeout=LOAD_TIMEOUT_MS,
    )
    info = page.evaluate("() => window.webgguf.engine.model")
    assert sorted(info["files"]) == [p.name for p in shards] and info["cache"] is None
    assert f"{shards[0].name} and 2 more" in page.inner_text("#model-info")
    assert page.inner_text("#chat-title") == "smollm2"
    assert greedy_ids(page) == native_ids.result()


def drop_files(page, files: dict[str, bytes]):
    """Drops files on the page as a user would (a drop event whose DataTransfer holds them)."""
    page.evaluate(
        """(files) => {
            const transfer = new DataTransfer();
            for (const [name, bytes] of Object.entries(files)) {
                transfer.items.add(new File([new Uint8Array(bytes)], name));
            }
            window.dispatchEvent(new DragEvent("drop", { dataTransfer: transfer, cancelable: true }));
        }""",
        {name: list(data) for name, data in files.items()},
    )


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> list[Path]:
    """A small model's 3 shards (KBs: they go to the page as bytes)."""
    import gguf
    import numpy as np

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    for i in range(3):
        writer.add_tensor(f"t{i}", np.zeros((2, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return split_gguf.write_shards(path, path.with_name("tiny"), [["t0"], ["t1"], ["t2"]])


def alert_after_drop(page, files: dict[str, bytes]) -> str:
    page.evaluate("() => { document.getElementById('alert').textContent = ''; }")
    drop_files(page, files)
    page.wait_for_function("() => document.getElementById('alert').textContent", timeout=60_000)
    return page.inner_text("#alert")


def test_sets_of_files_that_are_not_one_model_are_refused(page, tiny_shards, shards, shard_server, tmp_path):
    first, second, third = (p.read_bytes() for p in tiny_shards)
    message = alert_after_drop(page, {"tiny-00001-of-00003.gguf": first, "tiny-00003-of-00003.gguf": third})
    assert "SplitError: shard 2 of 3 missing (tiny-00002-of-00003.gguf): give all 3 files" in message
    message = alert_after_drop(page, {"tiny-00002-of-00003.gguf": second})
    assert "shards 1, 3 of 3 missing (tiny-00001-of-00003.gguf, tiny-00003-of-00003.gguf)" in message
    message = alert_after_drop(page, {"a.gguf": first, "b.gguf": second, "c.gguf": second})
    assert "b.gguf and c.gguf are both shard 2 of 3" in message
    # the model loaded before is still there
    assert page.evaluate("() => window.webgguf.engine.model.files.length") == 3

    # A server that lacks a file: the load stops before any weight moves, and leaves no empty entry.
    served = tmp_path / "two"
    served.mkdir()
    for path in shards[:2]:
        (served / path.name).symlink_to(path)
    server = ModelServer(served)
    try:
        entries = len(cached_entries(page))
        error = load(page, f"{server.url}/models/{shards[0].name}")
        assert error["type"] == "SourceError", error
        assert "file 3 of the 3 of this split model: cannot fetch" in error["error"]
        assert "HTTP 404" in error["error"]
        assert sum(e["sent"] for e in server.reset()) == 0
        assert len(cached_entries(page)) == entries
    finally:
        server.close()
    assert page.evaluate("() => window.webgguf.engine.model.files.length") == 3
