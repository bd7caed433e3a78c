"""A page that lives for hours: 20 model switches in one page (SmolLM2 and two small synthetic models,
each synthetic one run after its load) return the engine's GPU memory to its baseline every time,
measured by the engine's own allocation counter (`engine.stats().gpu_bytes`: GpuModel.release frees every
buffer a model made), and no load stalls: each is bounded, and one that took too long would say what
the worker waits for (as a load held by the server does here).

One browser context for the module; the models come from `ModelServer` (test_cache.py), so the first load
of each downloads it into the page's model cache and the others read it from there."""

import importlib.util
import os
import time

import pytest
from browser_env import MODEL, ROOT
from page_calls import call
from test_cache import ModelServer, booted_page

SWITCHES = 20
LOAD_TIMEOUT_MS = 240_000  # a SmolLM2 load takes 6-20 s on the 2-core test machine
GENERATION_TIMEOUT_MS = 240_000
HEAP_SLACK = 4 << 20  # bytes the wasm heap may still grow over the last 9 switches
# Synthetic models (SmolLM2's tokenizer, random weights, ~40 MB): qwen3 has F32 and F16 matrices, a tied
# output and q/k norms; llama3 F16 matrices, a Q8_0 embedding and RoPE frequency factors.
SYNTHETIC = ("synthetic-qwen3", "synthetic-llama3")
# The order of the loads: a SmolLM2 load reads 98 MB from the cache (~20 s on SwiftShader here), a
# synthetic one ~4 s; each model is loaded again after the others (SmolLM2 at switches 0 and 10).
CYCLE = ("smollm2", *SYNTHETIC * 4, SYNTHETIC[0])


@pytest.fixture(scope="module")
def model_server(model_path, tmp_path_factory):
    """SmolLM2 and the synthetic models (rebuilt from their recipes, with SmolLM2's tokenizer) in one
    folder; name -> URL, and "server": the ModelServer."""
    smollm2 = model_path(MODEL)
    folder = tmp_path_factory.mktemp("switch")
    os.symlink(smollm2, folder / smollm2.name)
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_models", ROOT / "tools/make_synthetic_models.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for name in SYNTHETIC:
        tool.write_model(tool.RECIPES[name], folder / f"{name}.gguf", smollm2)
    server = ModelServer(folder)
    yield {
        "smollm2": f"{server.url}/m/{smollm2.name}",
        **{name: f"{server.url}/m/{name}.gguf" for name in SYNTHETIC},
        "held": f"{server.url}/held/{SYNTHETIC[0]}.gguf",  # another cache entry: a new download
        "server": server,
    }
    server.close()


@pytest.fixture(scope="module")
def page(browser, server_url):
    yield from booted_page(browser, server_url)


def stats(page) -> dict:
    return call(page, "() => window.webgguf.engine.stats()", what="engine.stats()")


def bounded(page, what: str, call_js: str, arg, timeout_ms: int):
    """Runs the async arrow `call_js(arg)` in the page, waiting at most timeout_ms; its value, or an
    assertion that names what the worker waits for (engine.stats().waiting) when it took longer."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    page.evaluate(
        """([code, arg]) => {
            window.outcome = null;
            (0, eval)(code)(arg).then(
                (value) => { window.outcome = { value: value ?? null }; },
                (error) => { window.outcome = { error: `${error.type ?? error.name}: ${error.message}` }; });
        }""",
        [call_js, arg],
    )
    try:
        page.wait_for_function("() => window.outcome", timeout=timeout_ms)
    except PlaywrightTimeoutError:
        waiting = stats(page)["waiting"]
        raise AssertionError(
            f"{what} did not finish in {timeout_ms / 1000:.0f} s; the worker waits for {waiting}"
        ) from None
    outcome = page.evaluate("() => window.outcome")
    assert "error" not in outcome, f"{what}: {outcome['error']}"
    return outcome["value"]


LOAD = "(url) => window.webgguf.engine.load(url)"
GENERATE = """(prompt) => window.webgguf.engine.completions.create({ prompt, max_tokens: 2 })
    .then((r) => r.usage.completion_tokens)"""
UNLOAD = "() => window.webgguf.engine.unload()"


def test_twenty_model_switches_return_gpu_memory_to_its_baseline(page, model_server):
    baseline = stats(page)["gpu_bytes"]  # no model yet
    loaded_bytes = {}  # model → gpu_bytes right after its first load
    heap, seconds = [], []
    for switch in range(SWITCHES):
        started = time.perf_counter()
        name = CYCLE[switch % len(CYCLE)]
        info = bounded(
            page, f"switch {switch}: the load of {name}", LOAD, model_server[name], LOAD_TIMEOUT_MS
        )
        now = stats(page)
        assert not now["waiting"], now  # nothing of the load is left pending
        # The model before it is gone, with the Params buffers of the plans it ran: the same model always
        # takes the same GPU memory.
        assert now["gpu_bytes"] == info["gpu_bytes"] == loaded_bytes.setdefault(name, info["gpu_bytes"])
        if name in SYNTHETIC or switch == 0:  # (SwiftShader prefills SmolLM2 in seconds: the first only)
            assert bounded(page, f"switch {switch}: a generation", GENERATE, "Hi", GENERATION_TIMEOUT_MS) >= 1
            assert stats(page)["gpu_bytes"] > info["gpu_bytes"]  # + the prefill plans' Params buffers
        if switch == SWITCHES // 2:
            bounded(page, "unload", UNLOAD, None, LOAD_TIMEOUT_MS)
            assert stats(page)["gpu_bytes"] == baseline
        heap.append(stats(page)["heap_bytes"])
        seconds.append(round(time.perf_counter() - started, 1))
    bounded(page, "unload", UNLOAD, None, LOAD_TIMEOUT_MS)
    assert stats(page)["gpu_bytes"] == baseline
    assert page.evaluate("() => window.webgguf.engine.model") is None
    # The wasm heap (it never shrinks) stops growing once each model has been loaded twice.
    assert heap[-1] - heap[len(CYCLE)] <= HEAP_SLACK, [h >> 20 for h in heap]
    print(
        f"\ngpu bytes per model: {loaded_bytes}; wasm heap after each switch (MiB): {[h >> 20 for h in heap]}"
    )
    print(f"seconds per switch: {seconds}")


def test_the_engine_loads_again_after_the_switches(page, model_server):
    info = bounded(page, "a load after the switches", LOAD, model_server["smollm2"], LOAD_TIMEOUT_MS)
    assert info["cache"]["state"] == "hit" and info["n_layer"] == 30
    assert bounded(page, "a generation", GENERATE, "Hi", GENERATION_TIMEOUT_MS) >= 1


def test_a_load_that_makes_no_progress_says_what_it_waits_for(page, model_server):
    """The server holds a download (ModelServer.hold_after): meanwhile `stats` names the pending network
    read of the running load, with its stage; released, the load completes and nothing stays pending."""
    server = model_server["server"]
    server.held.clear()
    server.resume.clear()
    server.hold_after = 8 << 20
    try:
        page.evaluate(
            """(url) => { window.heldLoad = null; window.webgguf.engine.load(url).then(
                (info) => { window.heldLoad = info.cache.state; },
                (e) => { window.heldLoad = e.message; }); }""",
            model_server["held"],
        )
        assert server.held.wait(120), "the download never reached the held byte"
        page.wait_for_function(
            """async () => (await window.webgguf.engine.stats()).waiting
                .some((w) => w.what.startsWith("network: read") && w.seconds > 2)""",
            timeout=120_000,
            polling=500,
        )
        now = stats(page)
        assert now["running"]["type"] == "load" and now["running"]["stage"] == "Uploading the weights", now
    finally:
        server.resume.set()
        server.hold_after = None
    page.wait_for_function("() => window.heldLoad", timeout=LOAD_TIMEOUT_MS)
    assert page.evaluate("() => window.heldLoad") == "stored"
    assert stats(page)["waiting"] == [] and stats(page)["running"] is None
