"""The chat page in headless Chromium (WebGPU on SwiftShader) against the native run.

One page for the whole module (conftest.chat_page): Pyodide boots and SmolLM2 loads once. Tests run
in file order; the ones that provoke errors come last, after the clean-console checks.
"""

import asyncio
import inspect
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kernel_probe
import pytest
from browser_env import MODEL
from generation_gate import hold_next_generation, remove_gate
from page_calls import LOAD_TIMEOUT_MS, call

MAX_HEAP_GROWTH = 32 << 20  # bytes: weights must stream past the wasm heap, not through it

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\ttabbed",
    "Numbers: 3.14159, 2,718, 1e-9 and 123456789.",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "Emoji 👋🏽 and 🇫🇷 flags 🧑‍💻",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nHi<|im_end|>",
    "don't won't it's we'll they've I'M",
]

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And in words? Ünïcödé 👋"},
]


@pytest.fixture(scope="module")
def native_model(chat_page, model_path):
    from webgguf.engine import LoadedModel

    return LoadedModel.open(model_path(chat_page.model))


def run_native(coroutine_function, *args):
    """Run an async function natively, on its own thread (the Playwright driver owns this one)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine_function(*args)).result()


@pytest.fixture(scope="module")
def native_backend(require):
    """The native GPU backend the page is compared with (lavapipe here)."""
    try:
        from webgguf.gpu.native import NativeBackend

        backend, failure = NativeBackend(), ""
    except Exception as e:  # no wgpu, no Vulkan driver: nothing native to compare with
        backend, failure = None, f"no native GPU backend (NativeBackend failed: {e})"
    require(backend is not None, failure)
    return backend


def test_page_boots_python_and_webgpu(chat_page):
    assert chat_page.console_errors == []
    boot = chat_page.boot
    assert "swiftshader" in boot["gpu"]["adapter"].lower()
    versions = chat_page.python(
        "import sys, webgguf, jinja2; (sys.version_info[:2], webgguf.__name__, jinja2.__version__)"
    )
    assert versions[0] == [3, 14]
    assert versions[1] == "webgguf"
    seconds = chat_page.ready_ms / 1000
    print(f"\nnavigation → ready (Pyodide + {chat_page.model}): {seconds:.1f} s; boot (ms) {boot['timings']}")


def test_browser_backend_runs_kernels_like_native(chat_page, native_backend):
    """The probe's rmsnorm and GEMVs in the page (BrowserBackend on SwiftShader) and natively (lavapipe),
    each against numpy in float64 and against each other."""
    probe = inspect.getsource(kernel_probe)
    browser = chat_page.python(
        probe + "\nimport webgguf_worker as w\nawait run_kernels(w.session.backend, w.shader_source)"
    )
    native = run_native(kernel_probe.run_kernels, native_backend)

    import numpy as np

    from webgguf.quants import TYPE_BY_NAME, dequantize

    inputs = kernel_probe.make_inputs()
    x = np.array(inputs["x"], np.float32).astype(np.float64)  # as the GPU got them
    norm_w = np.array(inputs["norm_w"], np.float32).astype(np.float64)
    w = dequantize(
        np.frombuffer(inputs["raw"], np.uint8),
        TYPE_BY_NAME["Q4_1"].id,
        (kernel_probe.N_IN, kernel_probe.N_OUT),
    )
    w = w.reshape(kernel_probe.N_OUT, kernel_probe.N_IN).astype(np.float64)
    normed = x / np.sqrt(np.mean(x * x) + kernel_probe.EPS) * norm_w
    expected = {"rmsnorm": normed, "gemv": w @ x, "gemv_norm": w @ normed}
    # f32 rounding bounds: relative to the magnitudes summed (1e-5 of sum |w_i x_i| for a dot product)
    scales = {
        "rmsnorm": np.abs(normed),
        "gemv": np.abs(w) @ np.abs(x),
        "gemv_norm": np.abs(w) @ np.abs(normed),
    }
    for name, scale in scales.items():
        got, want = np.array(browser[name]), np.array(native[name])
        assert got.shape == want.shape == expected[name].shape, name
        assert np.max(np.abs(got - expected[name]) / scale) <= 1e-5, f"{name}: the page against numpy"
        assert np.max(np.abs(want - expected[name]) / scale) <= 1e-5, f"{name}: native against numpy"
        assert np.max(np.abs(got - want) / scale) <= 1e-5, f"{name}: the page against native"


def test_tokenizer_matches_native(chat_page, native_model):
    page = chat_page.page
    for text in TEXTS:
        for parse_special in (False, True):
            got = call(
                page,
                "([text, parse]) => window.webgguf.engine.tokenize(text, {parse_special: parse})",
                [text, parse_special],
            )
            want = native_model.tokenizer.encode(text, add_special=True, parse_special=parse_special)
            assert got == want, (text, parse_special)
    ids = native_model.tokenizer.encode(TEXTS[5], add_special=False)
    assert call(page, "(ids) => window.webgguf.engine.detokenize(ids)", ids) == TEXTS[5]


def test_chat_template_matches_native(chat_page, native_model):
    for add_generation_prompt in (True, False):
        got = call(
            chat_page.page,
            "([m, g]) => window.webgguf.engine.applyTemplate(m, {add_generation_prompt: g})",
            [MESSAGES, add_generation_prompt],
        )
        assert got == native_model.template.render(MESSAGES, add_generation_prompt=add_generation_prompt)


def test_model_streams_to_the_gpu_past_the_wasm_heap(chat_page, model_path):
    info = chat_page.boot["model"]
    header_bytes = native_header_bytes(model_path(chat_page.model))
    assert info["n_layer"] == 30 and info["d_model"] == 576 and info["n_vocab"] == 49152
    assert info["tensor_types"] == {"Q8_0": 1, "F32": 61, "Q4_1": 210}
    # every weight is on the GPU: the file's tensor data, repacked, is about as large as the file
    assert info["gpu_bytes"] >= model_path(chat_page.model).stat().st_size - header_bytes
    growth = info["heap_bytes_after"] - info["heap_bytes_before"]
    print(f"\nwasm heap: {info['heap_bytes_before'] / 2**20:.1f} MiB, +{growth / 2**20:.1f} MiB by the load")
    assert growth < MAX_HEAP_GROWTH


def native_header_bytes(path) -> int:
    from webgguf.gguf import read_header

    return read_header(path).data_offset


# GPU arrays compared with the native upload: the first and the last tensor in the file (the stream's
# two ends), a vector, and a matrix stacked from two tensors ([gate; up], repacked from Q4_1).
COMPARED_WEIGHTS = ["token_embd.weight", "blk.0.attn_norm.weight", "blk.15.ffn_gate_up", "output_norm.weight"]


async def weight_digests(gpu, names) -> dict:
    """sha256 of each GPU array of the named weights and vectors (runs natively and in the page)."""
    import hashlib

    from webgguf.weights import Weight

    out = {}
    for name in names:
        weight = gpu.weights.get(name) or gpu.vectors[name]
        if isinstance(weight, Weight):
            arrays = [(f"{p.row_begin}.{b}", a) for p in weight.parts for b, a in sorted(p.arrays.items())]
        else:
            arrays = [("vector", weight)]
        out[name] = {k: hashlib.sha256(await gpu.backend.read_async(a)).hexdigest() for k, a in arrays}
    return out


def native_engine(path, backend):
    """The native GPU engine of the model (weights uploaded from the memory-mapped file)."""
    from webgguf.engine import GpuEngine, LoadedModel

    engine = GpuEngine(LoadedModel.open(path), backend, n_ctx=64, max_chunk=8)
    engine.upload_from_file()
    return engine


def test_streamed_weights_equal_the_native_upload(chat_page, model_path, native_backend):
    digests = f"await weight_digests(webgguf_worker.session.engine.gpu, {COMPARED_WEIGHTS!r})"
    browser = chat_page.python(inspect.getsource(weight_digests) + "import webgguf_worker\n" + digests)
    native_gpu = native_engine(model_path(chat_page.model), native_backend).gpu
    assert browser == run_native(weight_digests, native_gpu, COMPARED_WEIGHTS)


def build_every_plan(gpu):
    """Every kind of plan the engine replays (so every kernel specialization it uses is compiled)."""
    for greedy in (True, False):
        gpu.decode_plan(greedy)
        gpu.prefill_plan(5, True, greedy)
    gpu.prefill_plan(5, False, True)
    gpu.score_plan(3)


ENGINE_KERNELS = """
import webgguf_worker
from webgguf.gpu import GpuError
from webgguf.kernels import Kernels

async def compile_all(specializations):
    session = webgguf_worker.session
    gpu = session.engine.gpu
    build_every_plan(gpu)  # the engine of this page (on SwiftShader: tuned for a CPU adapter)
    try:
        await session.backend.synchronize()
        failures = []
    except GpuError as e:
        failures = [str(e)]
    # the native engine's specializations: those of a GPU
    kernels = Kernels(session.backend, source_of=webgguf_worker.shader_source)
    for name, defines in specializations:
        try:
            kernels.get(name, **defines)
            await session.backend.synchronize()
        except GpuError as e:
            failures.append(str(e))
    return {"used": sorted(k.name for k in gpu.kernels._cache.values()), "failures": failures}
"""


def kernel_specializations(path, backend, cpu_shapes: bool) -> set[tuple]:
    """(kernel name, defines) of every pipeline the native engine builds for a model: the engine's own
    code (upload with its repacks, every plan) against a backend with the native adapter's limits,
    features and subgroups that compiles and runs nothing (lavapipe would compile each one first)."""
    from webgguf.engine import GpuEngine, LoadedModel
    from webgguf.explain import PlanningBackend

    class RecordingBackend(PlanningBackend):
        def replay(self, plan, repeat=1) -> None:
            pass  # the upload's repacks: their pipelines are made, nothing runs

    planning = RecordingBackend(backend.limits, backend.features, backend.subgroup_sizes, backend.cpu_adapter)
    engine = GpuEngine(LoadedModel.open(path), planning, n_ctx=64, max_chunk=8, cpu_shapes=cpu_shapes)
    engine.upload_from_file()
    build_every_plan(engine.gpu)
    return set(engine.gpu.kernels._cache)  # keyed by (name, sorted defines)


def integer_specializations(backend) -> set[tuple]:
    """(kernel name, defines) of the integer-dot kernels in every weight format and epilogue, as the
    engine picks them on a GPU (SwiftShader's plans keep the f32 kernels: selection.int8_linear)."""
    from webgguf import selection
    from webgguf.caps import AdapterCaps

    caps = AdapterCaps.of(backend, cpu_shapes=False, int8=True)
    choices = [selection.quantize_q8(caps, norm_w=norm_w) for norm_w in (False, True)]
    choices += [selection.attn_merge_q8(head_dim, caps) for head_dim in (64, 128, 256)]
    # The epilogues' code, each #if branch at least once (a plain store is RESIDUAL's without the add, NORM
    # alone a part of NORM + GATE_UP + GELU): Tint and SwiftShader take ~1 s per pipeline here.
    epilogues = [{"residual": True}, {"norm": True, "gate_up": True, "gelu": True}]
    for type_name in sorted(selection.INT8_WEIGHT_TYPES):
        for epilogue in epilogues:
            choices += [selection.gemv_q8(type_name, n_in, caps, **epilogue) for n_in in (4096, 14336)]
            choices += [selection.gemm_q8(type_name, n_tokens, caps, **epilogue) for n_tokens in (128, 512)]
    # A decode GEMV writing the next linear's blocks (QUANT_OUT, with and without NORM_OUT), as the 1-8B
    # models' o / gate-up / down GEMVs: the code is the same in every format.
    choices += [
        selection.gemv_q8("Q4_K", 4096, caps, residual=True, quant_out=True, norm_out=True),
        selection.gemv_q8("Q6_K", 4096, caps, norm=True, gate_up=True, quant_out=True),
    ]
    return {(choice.kernel, tuple(sorted(choice.defines.items()))) for choice in choices}


COMPILE_TIMEOUT_MS = 600_000  # Tint + SwiftShader compile a few hundred specializations, on 2 busy cores


def test_every_engine_kernel_compiles_in_chromium(chat_page, model_path, native_backend, tmp_path):
    """Chrome's WGSL compiler (Tint) is stricter than the native one (naga), e.g. on the uniformity of
    barriers: compile every specialization the engine uses, here (SwiftShader) and on a GPU, for SmolLM2,
    Gemma 3 and the synthetic qwen2, qwen3 and Llama 3 models (their bias, q/k norms, RoPE factors), and
    the integer-dot kernels of 1-8B models in every format.
    The CPU-adapter kernels of SmolLM2 and Gemma 3 are those this page (and test_gemma_browser.py's)
    runs; the others are listed here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import make_synthetic_models

    runs = [(model_path(chat_page.model), False), (model_path("gemma-3-270m"), False)]
    for recipe in make_synthetic_models.RECIPES.values():
        path = tmp_path / f"{recipe.name}.gguf"
        make_synthetic_models.write_model(recipe, path, model_path("smollm2-135m-instruct"))
        runs += [(path, True), (path, False)]
    specializations = integer_specializations(native_backend)
    for path, cpu_shapes in runs:
        specializations |= kernel_specializations(path, native_backend, cpu_shapes)
    listed = [(name, dict(defines)) for name, defines in sorted(specializations)]
    code = inspect.getsource(build_every_plan) + ENGINE_KERNELS + f"await compile_all({listed!r})"
    result = chat_page.python(code, timeout_ms=COMPILE_TIMEOUT_MS)
    assert result["failures"] == []
    families = {name for name, _ in listed}
    assert {"embed", "gemv", "gemm", "gemm_rows", "attn_decode", "attn_prefill", "repack"} <= families
    assert "attn_prefill_rows" in families  # the CPU adapters' prefill attention
    assert {"quantize_q8", "attn_merge_q8", "gemv_q8", "gemm_q8"} <= families
    assert any(name == "attn_decode" and defines.get("QK_NORM") for name, defines in listed)
    assert any(name == "gemv" and defines.get("GELU") for name, defines in listed)
    assert any(name == "gemv_q8" and defines.get("NORM_OUT") for name, defines in listed)


def test_reload_reports_progress(chat_page, model_path):
    events = call(
        chat_page.page,
        """async (model) => {
            const events = [];
            await window.webgguf.engine.load(model, { onProgress: (e) => events.push(e) });
            return events;
        }""",
        chat_page.model,
        timeout_ms=LOAD_TIMEOUT_MS,
        what="loading the model again",
    )
    size = model_path(chat_page.model).stat().st_size
    byte_events = [e for e in events if "loaded" in e]
    stages = [e["stage"] for e in events if "stage" in e]
    assert stages == ["Reading the header", "Building the tokenizer", "Uploading the weights"]
    assert len(byte_events) >= 3
    assert all(e["total"] == size for e in byte_events)
    assert [e["loaded"] for e in byte_events] == sorted(e["loaded"] for e in byte_events)
    assert byte_events[-1]["loaded"] == size


def test_screenshots(chat_page):
    page = chat_page.page
    chat_page.artifacts.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 800), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)  # the layout settles (transitions are 150-200 ms)
        path = chat_page.artifacts / f"chat-{width}x{height}.png"
        page.screenshot(path=str(path))
        assert path.stat().st_size > 10_000
    page.click("#panel-toggle")
    page.wait_for_timeout(300)
    page.screenshot(path=str(chat_page.artifacts / "chat-390x844-panel.png"))
    page.click("#panel-toggle")
    page.set_viewport_size({"width": 1280, "height": 800})
    assert page.locator("#alert").is_hidden()
    assert chat_page.console_errors == []


# ---- generation with the real engine (SwiftShader decodes a token in seconds: few tokens per test)

GENERATION_TIMEOUT_MS = 600_000
NOT_STREAMING = "() => !document.querySelector('.message.assistant.streaming')"
# Prose, a story and code, 16 greedy tokens each: the page's prefill and decode plans against the native
# CLI's (SwiftShader decodes SmolLM2 at ~3 tok/s here; the native replies take ~15 s of CPU each).
GREEDY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little",
    "def fibonacci(n):",
]
GREEDY_TOKENS = 16
CHAT_PROMPT = "What is the capital of France?"
CHAT_TOKENS = 10
WEBGGUF_CLI = Path(sys.executable).parent / "webgguf"
CLI_TIMEOUT_S = 900  # one native reply: ~30 s of CPU for 32 tokens of SmolLM2 on lavapipe, on 2 busy cores


def run_cli(path, *args) -> dict:
    """`webgguf generate PATH ARGS --backend gpu --json` (greedy): {"ids", "text", "finish_reason"}."""
    command = [
        str(WEBGGUF_CLI),
        "generate",
        str(path),
        *args,
        "--backend",
        "gpu",
        "--temperature",
        "0",
        "--json",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def cli_steps_reply(model, backend, prompt: str, max_tokens: int) -> dict:
    """run_cli(path, "--prompt", prompt, "--max-tokens", max_tokens) by the CLI's own steps (its prompt
    fitting, cli.gpu_generate) on `backend`, in this process: several replies then share one start of
    wgpu and one compile of the kernels (~5 s of CPU per CLI process on lavapipe)."""
    from webgguf.chat_fit import fit_prompt
    from webgguf.cli import gpu_generate
    from webgguf.sampling import SamplingParams

    n_ctx = model.config.n_ctx_train
    ids = fit_prompt(model, prompt, n_ctx).ids
    stream = gpu_generate(model, backend, ids, SamplingParams(temperature=0), max_tokens, n_ctx)
    return {"ids": stream.ids, "text": stream.text, "finish_reason": stream.finish_reason}


def native_greedy_replies(path, prompts, max_tokens: int, pool, require) -> dict:
    """prompt -> Future of cli_steps_reply's dict, on a native backend of their own (the tests' own
    native_backend stays on the main thread)."""
    from webgguf.engine import LoadedModel

    try:
        from webgguf.gpu.native import NativeBackend

        backend, failure = NativeBackend(), ""
    except Exception as e:  # no wgpu, no Vulkan driver: nothing native to compare with
        backend, failure = None, f"no native GPU backend (NativeBackend failed: {e})"
    require(backend is not None, failure)
    model = LoadedModel.open(path)
    return {prompt: pool.submit(cli_steps_reply, model, backend, prompt, max_tokens) for prompt in prompts}


@pytest.fixture(scope="module", autouse=True)
def native_replies(web_dist, model_path, require):
    """The native CLI's greedy replies to GREEDY_PROMPTS and to CHAT_PROMPT as a chat, started as the
    module starts: on a CPU device they take minutes, overlapping the browser tests before they are
    compared. prompt -> Future of run_cli's dict. The chat runs the CLI as a program; the raw prompts
    its steps in this process (cli_steps_reply)."""
    path = model_path(MODEL)
    pool = ThreadPoolExecutor(1)
    replies = {
        CHAT_PROMPT: pool.submit(
            run_cli, path, "--chat", "--prompt", CHAT_PROMPT, "--max-tokens", str(CHAT_TOKENS)
        )
    }
    replies |= native_greedy_replies(path, GREEDY_PROMPTS, GREEDY_TOKENS, pool, require)
    yield replies
    pool.shutdown(wait=False, cancel_futures=True)  # a stuck reply failed its test already


def native_reply(replies, prompt) -> dict:
    """The native CLI's reply to `prompt` (native_replies): each waits at most for the replies queued
    before it and its own, CLI_TIMEOUT_S each."""
    return replies[prompt].result(timeout=len(replies) * CLI_TIMEOUT_S)


def set_sampling(page, temperature: str, max_tokens: str):
    page.fill("#temperature", temperature)
    page.fill("#max-tokens", max_tokens)


def send(page, text: str):
    """Send a chat message and wait until its reply has finished streaming; the reply bubble."""
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function(NOT_STREAMING, timeout=GENERATION_TIMEOUT_MS)
    return page.locator(".message.assistant").last


def test_a_chat_turn_streams_the_models_reply(chat_page, native_replies):
    page = chat_page.page
    set_sampling(page, "0", str(CHAT_TOKENS))
    # Every text the reply showed while it streamed (it is drawn as Markdown, once per frame).
    page.evaluate(
        """() => {
            window.__shown = [];
            const messages = document.getElementById("messages");
            new MutationObserver(() => {
                const text = [...messages.querySelectorAll(".assistant .markdown")].pop()?.textContent;
                if (text && text !== window.__shown.at(-1)) window.__shown.push(text);
            }).observe(messages, { subtree: true, childList: true, characterData: true });
        }"""
    )
    reply = send(page, CHAT_PROMPT)
    native = native_reply(native_replies, CHAT_PROMPT)
    # The reply is kept as the model wrote it, shown rendered as Markdown (web/markdown.js).
    assert page.evaluate("() => window.webgguf.conversation().messages.at(-1).content") == native["text"]
    rendered = page.evaluate(
        "async (text) => (await import('/webgguf.js')).renderMarkdown(text).textContent", native["text"]
    )
    assert reply.locator(".markdown").text_content() == rendered
    assert len(page.evaluate("() => window.__shown")) >= 2, "the reply came in one piece: it was not streamed"
    notes = ["Stopped at the token limit."] if native["finish_reason"] == "length" else []
    assert reply.locator(".note").all_text_contents() == notes
    assert page.locator("#stat-tokens").text_content() == f"{len(native['ids'])} tokens"
    print(f"\nchat reply {native['text']!r}: {page.locator('#stat-ttft').text_content()}, ", end="")
    print(page.locator("#stat-speed").text_content())
    assert chat_page.console_errors == []


def test_stop_ends_a_reply_and_the_next_turn_works(chat_page):
    """Stop (the page's AbortController) reaches the engine: the reply ends within a batch or two
    instead of running on to 512 tokens, and the conversation goes on. The worker holds the reply after
    its first token until the abort arrived (generation_gate.py), so Stop lands while the reply streams
    on any GPU. (A short system prompt keeps the prompts short: SwiftShader takes seconds per prefill
    chunk.)"""
    page = chat_page.page
    page.click("#new-chat")
    page.fill("#system-prompt", "Be brief.")
    set_sampling(page, "0", "512")
    hold_next_generation(page, at_batch=1)
    try:
        page.fill("#prompt", "Tell me a long story about a dragon and a knight.")
        page.click("#send")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.message.assistant')].pop().textContent.length > 0",
            timeout=GENERATION_TIMEOUT_MS,
        )
        page.click("#stop")
        page.wait_for_function(NOT_STREAMING, timeout=GENERATION_TIMEOUT_MS)
    finally:
        remove_gate(page)
    stopped = page.locator(".message.assistant").last
    assert stopped.locator(".note").text_content() == "Stopped."
    # The first token, then at most two decode batches of engine.FIRST_BATCH (4) steps: the one the gate
    # held and the one in flight when the abort arrived.
    # (the reply as rendered: its Markdown nodes, without the note)
    text = stopped.evaluate(
        """(node) => { const reply = node.cloneNode(true);
            reply.querySelectorAll(".note").forEach((note) => note.remove());
            return reply.textContent; }"""
    )
    tokens = call(page, "(text) => window.webgguf.engine.tokenize(text, {add_special: false})", text)
    assert 1 <= len(tokens) <= 1 + 2 * 4, text
    assert page.locator("#send").is_visible() and page.locator("#stop").is_hidden()
    set_sampling(page, "0", "6")
    reply = send(page, "Thanks! Now in one sentence.")
    assert reply.locator(".note").text_content() == "Stopped at the token limit."
    assert len(reply.text_content()) > len("Stopped at the token limit.")
    assert page.locator(".message.user").count() == 2 and page.locator(".message.assistant").count() == 2
    for width, height in ((1280, 800), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)
        page.screenshot(path=str(chat_page.artifacts / f"chat-{width}x{height}-conversation.png"))
    page.set_viewport_size({"width": 1280, "height": 800})
    set_sampling(page, "0.7", "256")
    page.fill("#system-prompt", "")
    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    assert chat_page.console_errors == []


def test_greedy_tokens_equal_the_native_cli(chat_page, native_replies):
    for prompt in GREEDY_PROMPTS:
        result = call(
            chat_page.page,
            """(prompt) => window.webgguf.completions.create(
                { prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })""".replace(
                "MAX_TOKENS", str(GREEDY_TOKENS)
            ),
            prompt,
            timeout_ms=GENERATION_TIMEOUT_MS,
            what=f"a greedy completion of {prompt!r}",
        )
        native = native_reply(native_replies, prompt)
        choice = result["choices"][0]
        assert (choice["token_ids"], choice["text"]) == (native["ids"], native["text"]), prompt
        assert choice["finish_reason"] == native["finish_reason"]
        print(f"\n{prompt!r} → {choice['text']!r}: {result['timings']}")


# ---- the JS API and the page with a scripted stand-in for the engine
# It replies a fixed text's ids in batches of 3, whatever the prompt, through the engine's generate
# interface, so the OpenAI shapes, stop strings, token limits, abort and text-only rendering (the reply
# holds HTML) are checked on known text in milliseconds instead of minutes of SwiftShader decoding.
REPLY = "The capital of France is <b>Paris</b> & 🇫🇷."
SCRIPTED_ENGINE = """
import asyncio, webgguf_worker
from webgguf.textstream import TokenStream

class ScriptedEngine:
    def __init__(self, tokenizer, ids, hold_at):
        self.tokenizer, self.ids = tokenizer, ids
        self.hold_at = hold_at  # batches after which it waits for an abort (None: never)
        self.batches = 0  # batches generated
        self.aborted_at = None  # batches generated when should_abort() first said yes
        self.closed = False  # the generation ended (finished or stopped)

    async def generate(
        self, prompt_ids, params, max_tokens, stop=(), on_text=None, should_abort=None, ignore_eos=False
    ):
        stream = TokenStream(self.tokenizer, max_tokens, stop, ignore_eos)
        at = 0  # index of the next id (of the reply, repeated)
        while not stream.finished:
            if self.batches == self.hold_at:  # the consumer's abort comes before any more batches
                for _ in range(12_000):  # 120 s at most
                    if should_abort():
                        break
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)
            for _ in range(3):
                text = stream.feed(self.ids[at % len(self.ids)])
                at += 1
                if text:
                    on_text(text)
            self.batches += 1
            if should_abort():
                self.aborted_at = self.aborted_at or self.batches
                stream.finish_reason = stream.finish_reason or "abort"
        self.closed = True
        return stream

session = webgguf_worker.session
real_engine = session.engine  # put back after the test
tokenizer = session.model.tokenizer
reply_ids = tokenizer.encode(REPLY, add_special=False)
# forever: the reply over and over, never an end-of-generation token, holding after HOLD_AT batches
ids = reply_ids + ([] if FOREVER else [tokenizer.eos_id])
session.engine = ScriptedEngine(tokenizer, ids, HOLD_AT if FOREVER else None)
reply_ids
"""
# Batches of 3 tokens the endless reply runs before it waits for the consumer's abort: the test aborts
# after 2 replies (~10 batches), so this is only reached when the page is slow to consume.
HOLD_AT = 40
ENGINE_STATE = "[session.engine.batches, session.engine.aborted_at, session.engine.closed]"


@pytest.fixture
def scripted_engine(chat_page):
    """Install the scripted engine (forever=True: it never ends by itself); yields the reply's ids."""

    def install(forever=False):
        code = (
            SCRIPTED_ENGINE.replace("REPLY", json.dumps(REPLY, ensure_ascii=False))
            .replace("FOREVER", str(forever))
            .replace("HOLD_AT", str(HOLD_AT))
        )
        return chat_page.python(code)

    yield install
    chat_page.python("session.engine = real_engine")


def test_chat_completion_shapes(chat_page, scripted_engine, native_model):
    reply_ids = scripted_engine()
    messages = MESSAGES[:2]
    result = call(
        chat_page.page,
        """async (messages) => {
            const engine = window.webgguf.engine;
            const whole = await engine.chat.completions.create({ messages, max_tokens: 64, seed: 7 });
            const chunks = [];
            const stream = await engine.chat.completions.create({ messages, stream: true, max_tokens: 64 });
            for await (const chunk of stream) chunks.push(chunk);
            return { whole, chunks };
        }""",
        messages,
    )
    whole, chunks = result["whole"], result["chunks"]
    prompt_tokens = len(native_model.chat_ids(messages))
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(reply_ids)}
    usage["total_tokens"] = prompt_tokens + len(reply_ids)
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert whole["model"] == native_model.path.name
    assert whole["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": REPLY},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert whole["usage"] == usage
    assert whole["timings"]["time_to_first_token"] > 0
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert chunks[-1]["usage"] == usage


def test_text_completion_limits_stops_and_token_ids(chat_page, scripted_engine):
    reply_ids = scripted_engine()
    results = call(
        chat_page.page,
        """async () => {
            const prompt = "Q: the capital of France?";
            const create = (r) => window.webgguf.completions.create({ prompt, ...r });
            const streamed = [];
            for await (const chunk of await create({ max_tokens: 5, stream: true, return_token_ids: true })) {
                streamed.push(chunk);
            }
            const limited = await create({ max_tokens: 4, return_token_ids: true });
            // a prompt of token ids goes to the model as it is (OpenAI's completions API); bad ids: refused
            const ids = limited.prompt_token_ids.slice(1);
            const options = { max_tokens: 2, return_token_ids: true, ignore_eos: true };
            const fromIds = await create({ prompt: ids, ...options });
            const refused = await create({ prompt: [...ids, 1e9] }).catch((e) => e.message);
            const notIds = await create({ prompt: [1.5] }).catch((e) => e.message);
            return [
                limited,
                await create({ stop: "Paris" }),
                await create({ stop: ["</b>", "nowhere"], stream: false }),
                streamed,
                [ids, fromIds, refused, notIds],
            ];
        }""",
    )
    limited, stopped, stopped_later, streamed, (ids, from_ids, refused, not_ids) = results
    assert from_ids["prompt_token_ids"] == ids and from_ids["choices"][0]["token_ids"] == reply_ids[:2]
    assert "prompt ids must be integers in [0, " in refused and "got 1000000000" in refused
    assert not_ids == "prompt must be a string or an array of token ids"
    assert limited["object"] == "text_completion" and limited["id"].startswith("cmpl-")
    assert limited["choices"][0]["finish_reason"] == "length"
    assert limited["choices"][0]["token_ids"] == reply_ids[:4]
    assert limited["usage"]["completion_tokens"] == 4
    assert isinstance(limited["prompt_token_ids"], list) and limited["prompt_token_ids"]
    assert stopped["choices"][0]["text"] == "The capital of France is <b>"
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped_later["choices"][0]["text"] == "The capital of France is <b>Paris"
    # streamed: the last chunk carries the ids of the whole completion
    assert streamed[-1]["choices"][0]["token_ids"] == reply_ids[:5]
    assert streamed[-1]["prompt_token_ids"] == limited["prompt_token_ids"]
    assert all("token_ids" not in c["choices"][0] for c in streamed[:-1])


def test_abort_stops_a_generation(chat_page, scripted_engine):
    """The stream's consumer aborts from inside the stream after two replies' text; the engine stops at
    its next check (once per batch). The endless scripted reply waits after HOLD_AT batches until the
    abort came, so the test does not depend on how fast the page consumes."""
    scripted_engine(forever=True)
    outcome = call(
        chat_page.page,
        """async (reply) => {
            const controller = new AbortController();
            const stream = await window.webgguf.chat.completions.create({
                messages: [{ role: "user", content: "Talk forever." }],
                stream: true,
                max_tokens: 8000,
                signal: controller.signal,
            });
            let text = "";
            try {
                for await (const chunk of stream) {
                    text += chunk.choices[0].delta.content ?? "";
                    if (text.length > 2 * reply.length) controller.abort();
                }
                return "not aborted";
            } catch (error) {
                return { name: error.name, text };
            }
        }""",
        REPLY,
    )
    assert outcome != "not aborted"
    assert outcome["name"] == "AbortError" and outcome["text"].startswith(REPLY + REPLY)
    # The worker answers this only after the generation ended (8000 tokens would be 2667 batches): the
    # abort reached the engine before it went past its hold.
    batches, aborted_at, closed = chat_page.python(ENGINE_STATE)
    assert closed and aborted_at is not None and batches <= HOLD_AT + 1


def test_page_renders_the_reply_as_text(chat_page, scripted_engine):
    scripted_engine()
    page = chat_page.page
    reply = send(page, "What is the capital of France?")
    markdown = reply.locator(".markdown")
    assert markdown.text_content() == REPLY
    # One paragraph of text: "<b>" stayed text (tests/e2e/test_chat_page.py feeds it worse).
    assert markdown.evaluate("(node) => [...node.querySelectorAll('*')].map((e) => e.tagName)") == ["P"]
    assert page.locator(".message.user").last.text_content() == "What is the capital of France?"
    page.click("#new-chat")
    assert page.locator(".message").count() == 0
    assert chat_page.console_errors == []


def test_completion_request_shapes_are_checked(chat_page):
    error = call(
        chat_page.page,
        """() => window.webgguf.engine.chat.completions.create({ messages: [] })
                .then(() => null, (e) => `${e.name}: ${e.message}`)""",
    )
    assert error == "TypeError: messages must be a non-empty array of {role, content}"


def test_gpu_errors_name_the_kernel(chat_page):
    result = chat_page.python(
        """
import webgguf_worker
from webgguf.gpu import GpuError
backend = webgguf_worker.session.backend
backend.create_pipeline("broken_kernel[TEST]", "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }")
try:
    await backend.synchronize()
    outcome = None
except GpuError as e:
    outcome = [e.operation, e.name, str(e)]
outcome
"""
    )
    assert result is not None, "an invalid shader raised nothing"
    operation, name, message = result
    assert (operation, name) == ("create_pipeline", "broken_kernel[TEST]")
    assert "broken_kernel[TEST]" in message


@pytest.mark.parametrize(
    "url,expected",
    [
        ("/models/no-such-model.gguf", "HTTP 404"),
        ("/favicon.svg", "magic"),
    ],
)
def test_bad_models_give_readable_errors_and_keep_the_current_one(chat_page, url, expected):
    error = call(
        chat_page.page,
        "(url) => window.webgguf.engine.load(url).then(() => null, (e) => ({type: e.type, text: e.message}))",
        url,
        timeout_ms=LOAD_TIMEOUT_MS,
        what=f"loading {url}",
    )
    assert error is not None and expected in error["text"], error
    still_loaded = call(chat_page.page, "() => window.webgguf.engine.tokenize('still here')")
    assert len(still_loaded) >= 2


def test_a_load_can_be_aborted_and_loading_again_works(chat_page):
    outcome = call(
        chat_page.page,
        """async (model) => {
            const engine = window.webgguf.engine;
            const controller = new AbortController();
            const onProgress = (e) => { if (e.loaded > 20e6) controller.abort(); };
            const aborted = await engine.load(model, { onProgress, signal: controller.signal })
                .then(() => "loaded", (e) => e.name);
            const info = await engine.load(model);
            return { aborted, layers: info.n_layer, tokens: await engine.tokenize("ok") };
        }""",
        chat_page.model,
        timeout_ms=2 * LOAD_TIMEOUT_MS,
        what="an aborted load, then a load",
    )
    assert outcome["aborted"] == "AbortError"
    assert outcome["layers"] == 30 and outcome["tokens"]
