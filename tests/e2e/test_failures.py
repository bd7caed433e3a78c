"""Failure handling of the page in headless Chromium: no WebGPU, a lost GPU device, a prompt longer
than the context, and aborts during a load and during a prefill; after each, the engine still works.

One page for the module (its own browser context), SmolLM2 loaded from `ModelServer` (test_cache.py);
tests run in file order and the last of the engine tests completes a generation. SwiftShader needs
about 10 s to prefill even a short prompt, so generations are few and short.
"""

import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, MODEL
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


def test_a_lost_device_is_reported_and_the_engine_reloads_in_place(page):
    call(page, "() => window.webgguf.engine.call('debug_lose_device', {})")  # as a driver reset would
    page.wait_for_selector("#gpu-lost:not([hidden])")
    assert "GPU device was lost" in page.inner_text("#gpu-lost")
    assert page.inner_text("#status-text") == "GPU lost"
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
