"""Gemma 3 270M in the browser: the page loads it (262k vocabulary: its Q8_0 embedding is split over two
bindings; mixed quant types; the gemma3 forward pass) and its greedy tokens equal the native CLI's.

3 prompts x 16 greedy tokens (prose, a story, code: the page's prefill and decode plans, each token through
the split head): SwiftShader decodes Gemma at ~2.2 tok/s on the 2-core test machine (docs/PERF.md); the
native replies run meanwhile, in a thread, through the CLI's own steps (`webgguf generate --prompt P
--max-tokens 16 --temperature 0`, test_browser.cli_steps_reply) in this process: the three replies share
one start of wgpu and one compile of the kernels."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from page_calls import call, wait_ready
from test_browser import CLI_TIMEOUT_S, GENERATION_TIMEOUT_MS, native_greedy_replies

MODEL = "gemma-3-270m"
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
]
GREEDY_TOKENS = 16


@pytest.fixture(scope="module")
def native_replies(model_path, require):
    pool = ThreadPoolExecutor(1)
    replies = native_greedy_replies(model_path(MODEL), PROMPTS, GREEDY_TOKENS, pool, require)
    yield replies
    pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def gemma_page(browser, server_url, model_path, native_replies):
    """The page in the session's browser, after the rest of the e2e suite (where this load used to stall:
    docs/BROWSER.md "A load that never finished")."""
    model_path(MODEL)  # in the cache, so the server has it
    page = browser.new_page()
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server_url}/?model={MODEL}")
    wait_ready(page)
    yield page, errors
    page.close()


def test_gemma_greedy_tokens_equal_the_native_cli(gemma_page, native_replies):
    page, errors = gemma_page
    model = page.evaluate("() => window.webgguf.engine.model")
    assert model["architecture"] == "gemma3"
    for prompt in PROMPTS:
        started = time.perf_counter()
        result = call(
            page,
            """(prompt) => window.webgguf.completions.create(
                { prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })""".replace(
                "MAX_TOKENS", str(GREEDY_TOKENS)
            ),
            prompt,
            timeout_ms=GENERATION_TIMEOUT_MS,
            what=f"a greedy completion of {prompt!r}",
        )
        native = native_replies[prompt].result(timeout=len(PROMPTS) * CLI_TIMEOUT_S)
        choice = result["choices"][0]
        assert (choice["token_ids"], choice["text"]) == (native["ids"], native["text"]), prompt
        seconds = time.perf_counter() - started
        print(f"\n{prompt!r} → {choice['text']!r} in {seconds:.1f} s: {result['timings']}")
    assert errors == []
