"""The Python half of the page's web worker (web/worker.js is the JS half).

worker.js boots Pyodide, installs the wheels, writes this file into Pyodide's file system as the
module `webgguf_worker` and calls the functions below. Arguments that are JS objects (byte sources,
callbacks) stay JS objects; results go back as JSON strings, so no Python object leaks into JS.

This module relays: what a model is, how it loads, how a chat fits the context and how tokens are
generated is decided by the webgguf package (gguf_split, engine, chat_fit, model_urls), the same code
the native CLI runs. A model is loaded in three steps: the header of each of its files is parsed from
the first bytes of its source (the only part of a file that enters the Python heap) and merged
(gguf_split.merge: one file, or the shards of a split model), LoadedModel.from_header builds the config,
tokenizer and chat template, and the GPU engine (engine.GpuEngine, as natively) is created and its
weights streamed into GPU buffers by JS in file order (GpuModel.upload_from through JsByteSource).
"""

import json
import time

from webgguf import gguf_split, model_urls, preflight
from webgguf.chat_fit import ContextError, fit_chat, fit_prompt  # noqa: F401 (ContextError: for callers)
from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gguf import GGUFHeader
from webgguf.gpu.browser import BrowserBackend, JsByteSource
from webgguf.sampling import SamplingParams

FIRST_HEADER_READ = 4 << 20  # bytes of the file parsed first (SmolLM2's header is 1.8 MB)
N_CTX = 2048  # positions of the KV cache (at most the model's training context)
# The most decode steps per readback of token ids (batches grow to it, held to ~0.1 s of decoding each:
# engine.next_batch_size): text arrives in pieces of at most this many tokens, and a stop (end of
# generation, stop string, abort) wastes at most one batch of GPU work. Each readback costs Chromium a
# round trip of milliseconds, which small batches pay per token (docs/PERF.md "The page on a GPU").
BATCH = 32


class Session:
    """What the worker holds: one GPU device and at most one model."""

    def __init__(self):
        self.backend: BrowserBackend | None = None
        self.model: LoadedModel | None = None
        self.engine: GpuEngine | None = None  # the model on the GPU
        self.abort_requested = False
        self.n_ctx = 0  # the context of the loaded model (the engine's KV cache length)
        self.shaders: dict[str, str] = {}  # relative path -> WGSL (the page's shaders.json)


session = Session()


def set_shaders(sources_json: str) -> None:
    """The shaders (shaders.json: relative path -> WGSL) the engine compiles; see shader_source."""
    session.shaders = json.loads(sources_json)


def shader_source(path: str) -> str:
    """WGSL by path relative to shaders/: the `source_of` of the engine's kernels."""
    try:
        return session.shaders[path]
    except KeyError:
        raise FileNotFoundError(f"no shader {path} in the page's shaders.json (rebuild the page)") from None


def urls_of(url: str) -> str:
    """The URLs of the files of the model at `url` (model_urls.model_urls), as JSON."""
    return json.dumps(model_urls.model_urls(url))


async def open_gpu(on_lost) -> str:
    """Open the WebGPU device (once); `on_lost(message)`: a JS function called if it is lost."""
    if session.backend is None or session.backend.lost:
        session.backend = await BrowserBackend.create(on_lost=on_lost)
    return json.dumps(gpu_info())


def gpu_info() -> dict:
    backend = session.backend
    return {
        "adapter": backend.adapter_name,
        "features": sorted(backend.features),
        "subgroup_sizes": backend.subgroup_sizes,
        "fallback_adapter": backend.fallback_adapter,
        "max_storage_buffer_binding_size": backend.limits.max_storage_buffer_binding_size,
        "max_buffer_size": backend.limits.max_buffer_size,
    }


async def load_model(js_source, on_stage, options_json: str = "{}") -> str:
    """Load the GGUF behind a JS byte source (web/sources.js, web/cache.js); `on_stage(text)` reports
    each step. options: {n_ctx: context length or null (N_CTX), memory_bytes: the device's memory
    estimate for pre-flight, or null; for benchmarks: batch, the most decode steps per readback or null
    (BATCH), f16: f16 GEMM tiles and KV cache where the adapter has shader-f16 (GpuEngine)}."""
    started = time.perf_counter()
    options = json.loads(options_json)
    if session.backend is None or session.backend.lost:
        raise RuntimeError(
            "no WebGPU device: " + (session.backend.lost if session.backend else "none was opened")
        )
    source = JsByteSource(session.backend, js_source)
    on_stage("Reading the header")
    header = await read_model_header(js_source)
    on_stage("Building the tokenizer")
    model = LoadedModel.from_header(header, source.name)
    n_ctx = min(int(options.get("n_ctx") or N_CTX), model.config.n_ctx_train)
    if n_ctx < 16:
        raise ValueError(f"a context of {n_ctx} tokens is too short (16 at least)")
    batch = int(options.get("batch") or BATCH)
    if not 1 <= batch <= 256:
        raise ValueError(f"batch {batch}: decode steps per readback must be in 1..256")
    # Pre-flight: before any weight byte moves (only the header has been read), does it fit this GPU?
    backend = session.backend
    report = preflight.check(
        header,
        backend.limits,
        n_ctx,
        batch=batch,
        memory_bytes=options.get("memory_bytes"),
        features=backend.features,
        subgroup_sizes=backend.subgroup_sizes,
        cpu_adapter=backend.cpu_adapter,
    )
    if not report.fits:
        raise preflight.PreflightError(report.message())
    unload_model()  # only now: a file that fails above leaves the current model in place
    on_stage("Uploading the weights")
    # On SwiftShader (a CPU adapter) the engine picks kernel shapes for CPUs by itself (plan.GpuModel).
    engine = GpuEngine(
        model,
        session.backend,
        n_ctx=n_ctx,
        batch=batch,
        f16=bool(options.get("f16")),
        source_of=shader_source,
    )
    try:
        await engine.gpu.upload_from(header.tensors, source)
        await session.backend.synchronize()
    except BaseException:
        engine.release()  # what was uploaded so far
        raise
    session.model, session.engine, session.n_ctx = model, engine, engine.n_ctx
    info = model_info(model, source.size)
    info["load_seconds"] = time.perf_counter() - started
    info["preflight"] = report.to_dict()
    return json.dumps(info)


def unload_model() -> None:
    """Free the GPU memory of the loaded model (all of it: GpuEngine.release)."""
    if session.engine is not None and not session.backend.lost:
        session.engine.release()
    session.model = session.engine = None


def forget_model() -> None:
    """The device is lost: its buffers went with it; drop the model without touching them."""
    session.model = session.engine = None


async def read_model_header(js_source) -> GGUFHeader:
    """The model's header: of its one file, or of a split model's files merged (web/sources.js
    SplitSource: `shards`, in the order its byte sequence lays them out)."""
    parts = list(js_source.shards) if getattr(js_source, "shards", None) else [js_source]
    sources = [JsByteSource(session.backend, part) for part in parts]
    return await gguf_split.read_sources_header(sources, FIRST_HEADER_READ)


def gpu_bytes() -> int:
    """Bytes of GPU buffers alive now."""
    return 0 if session.backend is None else session.backend.live_bytes


def model_info(model: LoadedModel, size: int | None) -> dict:
    config, header = model.config, model.header
    types: dict[str, int] = {}
    for tensor in header.tensors.values():
        types[tensor.type.name] = types.get(tensor.type.name, 0) + 1
    dispatches = session.engine.dispatches_per_decode_step()  # builds the decode plan (its Params buffers)
    return {
        "name": model.path.name,
        "file_bytes": size,
        "files": [shard.name for shard in header.shards] or [model.path.name],
        "architecture": config.arch,
        "model_name": header.metadata.get("general.name"),
        "n_params": sum(t.n_elements for t in header.tensors.values()),
        "n_layer": config.n_layer,
        "d_model": config.d_model,
        "n_vocab": config.n_vocab,
        "n_ctx_train": config.n_ctx_train,
        "tensor_types": types,
        "chat_template": model.template is not None,
        "gpu_bytes": session.backend.live_bytes,
        "n_ctx": session.engine.n_ctx,
        "dispatches_per_token": dispatches,
    }


def require_model() -> LoadedModel:
    if session.model is None:
        if session.backend is not None and session.backend.lost:
            raise RuntimeError(f"the GPU device was lost ({session.backend.lost}): reload the engine")
        raise RuntimeError("no model is loaded")
    return session.model


def tokenize(text: str, add_special: bool, parse_special: bool) -> str:
    ids = require_model().tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
    return json.dumps(ids)


def detokenize(ids_json: str) -> str:
    return require_model().tokenizer.decode(json.loads(ids_json))


def apply_template(messages_json: str, add_generation_prompt: bool) -> str:
    model = require_model()
    if model.template is None:
        raise ValueError(f"{model.path.name} has no chat template")
    return model.template.render(json.loads(messages_json), add_generation_prompt=add_generation_prompt)


def abort() -> None:
    session.abort_requested = True


async def generate(request_json: str, on_delta) -> str:
    """One completion. request: {messages | prompt (text or token ids), max_tokens, temperature, top_k,
    top_p, min_p, repeat_penalty, seed, stop, ignore_eos}; `on_delta(text)` gets the text as it becomes final.
    Returns {finish_reason, prompt_tokens, completion_tokens, prompt_token_ids, token_ids, timings}."""
    model, engine = require_model(), session.engine
    request = json.loads(request_json)
    max_tokens = int(request.get("max_tokens", 256))
    if "messages" in request:
        prompt_ids, dropped = fit_chat(model, request["messages"], session.n_ctx, max_tokens)
    else:
        prompt_ids, dropped = fit_prompt(model, request.get("prompt", ""), session.n_ctx)
    params = SamplingParams(
        **{key: request[key] for key in SamplingParams.__dataclass_fields__ if request.get(key) is not None}
    )
    session.abort_requested = False
    started = time.perf_counter()
    first_at = None  # when the first text arrived

    def on_text(text: str) -> None:
        nonlocal first_at
        first_at = first_at or time.perf_counter()
        on_delta(text)

    stream = await engine.generate(
        prompt_ids,
        params,
        max_tokens,
        request.get("stop") or [],
        on_text,
        lambda: session.abort_requested,
        ignore_eos=bool(request.get("ignore_eos")),
    )
    ended = time.perf_counter()
    n_after_first = len(stream.ids) - 1  # tokens decoded after the first one: the decode speed
    decode_seconds = ended - first_at if first_at else 0.0
    return json.dumps(
        {
            "finish_reason": stream.finish_reason,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(stream.ids),
            "prompt_token_ids": prompt_ids,
            "token_ids": stream.ids,
            "truncated": {"dropped_messages": dropped} if dropped else None,
            "timings": {
                "time_to_first_token": (first_at or ended) - started,
                "seconds": ended - started,
                "tokens_per_second": n_after_first / decode_seconds if decode_seconds > 0 else None,
            },
        }
    )
