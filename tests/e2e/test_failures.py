"""Failure handling of the page in headless Chromium: no WebGPU, a lost GPU device, a prompt longer
than the context, aborts during a load and during a prefill, storage that fills up during a download;
after each, the engine still works.

One page for the module (its own browser context), SmolLM2 loaded from `ModelServer` (test_cache.py);
tests run in file order and the last of the engine tests completes a generation. SwiftShader needs
about 10 s to prefill even a short prompt, so generations are few and short.
"""

import pytest
from browser_env import CHROMIUM, CHROMIUM_ARGS, MODEL
from generation_gate import hold_next_generation, remove_gate
from page_calls import call, load, load_and_abort, run_python, wait_ready
from test_cache import ModelServer

GENERATION_TIMEOUT_MS = 240_000


@pytest.fixture(scope="module")
def model_server(model_path):
    server = ModelServer(model_path(MODEL).parent)
    yield server
    server.close()


@pytest.fixture(scope="module")
def model_url(model_server, model_path) -> str:
    return f"{model_server.url}/models/{model_path(MODEL).name}"


@pytest.fixture(scope="module")
def page(browser, server_url, model_url):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(f"{server_url}/")
    wait_ready(page)
    info = load(page, model_url)
    assert "error" not in info, info
    yield page
    context.close()


def test_a_raw_prompt_longer_than_the_context_is_a_clear_error(page):
    n_ctx = page.evaluate("() => window.webgguf.engine.model.n_ctx")
    error = call(
        page,
        """(text) => window.webgguf.engine.completions.create({ prompt: text, max_tokens: 4 })
            .then(() => null, (e) => ({ type: e.type, message: e.message }))""",
        "word " * (n_ctx + 10),
        what="a completion of a prompt longer than the context",
    )
    assert error is not None and error["type"] == "ContextError", error
    assert f"the context holds {n_ctx}" in error["message"] and "never truncated" in error["message"]


CHAT_POLICY = """
import webgguf_worker
from webgguf_worker import ContextError, fit_chat

model = webgguf_worker.session.model
turn = "Tell me more about the history of the city, its rivers and its bridges, please. " * 2
messages = [{"role": "system", "content": "You are terse."}]
for i in range(6):
    messages.append({"role": "user", "content": f"{i}: {turn}"})
    messages.append({"role": "assistant", "content": f"Answer {i}."})
messages.append({"role": "user", "content": "Last question?"})
ids, dropped = fit_chat(model, messages, 256, 16)
kept = messages[:1] + messages[1 + dropped :]
try:
    fit_chat(model, [{"role": "user", "content": turn * 20}], 256, 16)
    too_long = None
except ContextError as e:
    too_long = str(e)
{
    "n_ids": len(ids),
    "dropped": dropped,
    "same_as_kept": ids == model.chat_ids(kept),
    "full": len(model.chat_ids(messages)),
    "too_long": too_long,
}
"""


def test_a_chat_longer_than_the_context_drops_the_oldest_turns(page):
    """The truncation policy (worker.py fit_chat) on the real model's template and tokenizer: the
    oldest user/assistant pairs go, the system prompt and the last message stay, room is left for
    the reply; a last message too long by itself is an error."""
    result = run_python(page, CHAT_POLICY)
    assert result["full"] > 256  # the whole chat does not fit a context of 256
    assert result["n_ids"] <= 256 - 16
    assert result["dropped"] > 0 and result["dropped"] % 2 == 0  # whole turns
    assert result["same_as_kept"]  # = the system prompt + the newest turns, rendered by the template
    assert "the context holds 256" in result["too_long"] and "shorten it" in result["too_long"]


def test_an_aborted_load_leaves_the_engine_usable(page, model_server, model_path, model_url):
    url = f"{model_server.url}/another/{model_path(MODEL).name}"
    outcome = load_and_abort(page, url, 20_000_000)
    assert outcome == "AbortError"
    # The upload had begun (the previous model was released for it): the engine loads again, here
    # from the cache, and works.
    info = load(page, model_url)
    assert info["cache"]["state"] == "hit" and info["n_layer"] == 30
    assert call(page, "() => window.webgguf.engine.tokenize('still works')")


DESTROY_THE_DEVICE = """
import webgguf_worker
webgguf_worker.session.backend._context.device.destroy()  # the engine's GPUDevice, through pyodide.ffi
"""


def test_a_lost_device_is_reported_and_the_engine_reloads_in_place(page):
    """GPUDevice.destroy() on the engine's device, by code other than the engine's: the real device.lost
    promise resolves (reason "destroyed"), and the worker and the page handle it as any loss (a driver
    reset, a crashed GPU process)."""
    run_python(page, DESTROY_THE_DEVICE)
    page.wait_for_selector("#gpu-lost:not([hidden])", timeout=60_000)
    assert "GPU device was lost" in page.inner_text("#gpu-lost")
    assert page.inner_text("#status-text") == "GPU lost"
    # the model went with the device: a request says so instead of touching destroyed buffers
    error = call(
        page,
        """() => window.webgguf.engine.completions.create({ prompt: "Hi", max_tokens: 2 })
            .then(() => null, (e) => e.message)""",
    )
    assert error.startswith("the GPU device was lost") and error.endswith("reload the engine"), error
    page.evaluate("() => { window.pageId = 'not reloaded'; }")
    page.click("#reload-engine")
    page.wait_for_selector("#gpu-lost", state="hidden", timeout=120_000)
    assert page.evaluate("() => window.pageId") == "not reloaded"  # the page itself did not reload
    model = page.evaluate("() => window.webgguf.engine.model")
    assert model["n_layer"] == 30 and model["cache"]["state"] == "hit"
    assert "ready" in page.inner_text("#status-text")


def test_an_abort_during_prefill_then_a_generation_completes(page):
    """The abort lands while the prefill's token has not been read: the worker holds that read until
    the abort arrived (generation_gate.py) and tells the page when to abort, whatever the GPU's speed."""
    hold_next_generation(page, at_batch=0)
    try:
        outcome = call(
            page,
            """async () => {
                const engine = window.webgguf.engine;
                const controller = new AbortController();
                let text = "";
                let textAtAbort = null;
                const held = ({ data }) => {
                    if (data?.type !== "generation_held") return;
                    engine.worker.removeEventListener("message", held);
                    textAtAbort = text;
                    controller.abort();
                };
                engine.worker.addEventListener("message", held);
                const stream = await engine.completions.create({
                    prompt: "The history of the city, its rivers and its bridges, told in short:",
                    max_tokens: 8, stream: true, signal: controller.signal,
                });
                let aborted = "not aborted";
                try {
                    for await (const chunk of stream) text += chunk.choices[0].text;
                } catch (e) {
                    aborted = e.name;
                }
                const done = await engine.completions.create({ prompt: "Hi", max_tokens: 3 });
                return { aborted, text, textAtAbort, done };
            }""",
            timeout_ms=GENERATION_TIMEOUT_MS,
            what="an aborted completion, then a completion of 3 tokens",
        )
    finally:
        remove_gate(page)
    assert outcome["textAtAbort"] == ""  # aborted during the prefill: no token yet
    assert outcome["aborted"] == "AbortError"
    # the token the prefill sampled is read after the abort; decoding stops there (max_tokens was 8)
    assert len(outcome["text"].split()) <= 1
    done = outcome["done"]
    assert done["choices"][0]["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 3
    assert done["choices"][0]["text"]


STORAGE_FULL_AT = 40 << 20  # bytes of the download after which the origin's storage is full


def cache_files(page) -> list[str]:
    """Names of the model cache's files in the page's Origin Private File System."""
    return page.evaluate(
        """async () => {
            const root = await navigator.storage.getDirectory();
            const dir = await root.getDirectoryHandle("webgguf-models", { create: true });
            const names = [];
            for await (const [name] of dir.entries()) names.push(name);
            return names;
        }"""
    )


def greedy_ids(page) -> list[int]:
    return page.evaluate(
        """() => window.webgguf.engine.completions.create(
            { prompt: "Hi", max_tokens: 3, return_token_ids: true }).then((r) => r.choices[0].token_ids)"""
    )


def test_storage_full_in_the_middle_of_a_download(page, server_url, model_server, model_path):
    """The origin's storage fills up while the model downloads into the cache (CDP
    Storage.overrideQuotaForOrigin: a quota below what is stored, set while the server holds the
    download at 40 MB): the model still loads from the network and runs, the page says it could not be
    cached, and no partial entry is left that a later load would trust: that one downloads it anew."""
    url = f"{model_server.url}/storage-full/{model_path(MODEL).name}"
    size = model_path(MODEL).stat().st_size
    cdp = page.context.new_cdp_session(page)
    model_server.held.clear()
    model_server.resume.clear()
    model_server.hold_after = STORAGE_FULL_AT
    try:
        page.fill("#model-url", url)
        page.click("#load-button")
        assert model_server.held.wait(120), "the download never reached the point where storage fills"
        # the cache has written about 40 MB by now; the quota drops below that
        cdp.send("Storage.overrideQuotaForOrigin", {"origin": server_url, "quotaSize": 1 << 20})
        model_server.resume.set()
        page.wait_for_function(
            """() => document.querySelector('#progress-stage').textContent.startsWith('Loaded in')
                || !document.querySelector('#alert').hidden""",
            timeout=GENERATION_TIMEOUT_MS,
        )
        assert page.is_hidden("#alert"), page.inner_text("#alert")
        note = page.inner_text("#cache-note")
        assert "Not cached" in note and "QuotaExceededError" in note and "loads from the network" in note
        assert "storage for this site is full" in note  # a write failed (not the check before the download)
        info = page.evaluate("() => window.webgguf.engine.model")
        assert info["cache"]["state"] == "off" and info["n_layer"] == 30
        entry = info["cache"]["id"]
        # nothing of the entry is left: not listed, no data file, no metadata
        assert all(m["url"] != url for m in page.evaluate("() => window.webgguf.engine.listCachedModels()"))
        assert not [name for name in cache_files(page) if name.startswith(entry)]
        streamed = greedy_ids(page)  # the bytes after the switch from the cache to the network are right
    finally:
        model_server.resume.set()
        model_server.hold_after = None
        cdp.send("Storage.overrideQuotaForOrigin", {"origin": server_url})
        page.fill("#model-url", "")
    # A later load with room again: a fresh download (nothing resumed), cached whole, the same model.
    model_server.reset()
    info = load(page, url)
    assert "error" not in info, info
    assert info["cache"]["state"] == "stored" and info["cache"]["resumed_at"] == 0
    assert sum(e["sent"] for e in model_server.reset() if e["method"] == "GET") == size
    assert greedy_ids(page) == streamed


def test_no_webgpu_gives_a_message_naming_browsers_and_flags(browser, server_url):
    """Chromium without the flags that enable WebGPU on Linux: the page says WebGPU is missing and
    where it exists, right away (without waiting for Python to boot)."""
    args = [a for a in CHROMIUM_ARGS if "webgpu" not in a and "vulkan" not in a.lower()]
    # A second Chromium of the session's Playwright (a nested sync_playwright() is not allowed).
    other = browser.browser_type.launch(executable_path=str(CHROMIUM), args=args, headless=True)
    try:
        page = other.new_page()
        page.goto(f"{server_url}/?model={MODEL}")
        page.wait_for_selector("#alert:not([hidden])", timeout=30_000)
        alert = page.inner_text("#alert")
        assert "WebGPU is not available" in alert
        assert "Chrome" in alert and "Safari" in alert and "enable-unsafe-webgpu" in alert
        assert page.is_disabled("#load-button")
    finally:
        other.close()
