// webgguf's JS API: a GGUF model in a web worker (Pyodide + WebGPU), with OpenAI-shaped calls.
//
//   import { createEngine } from "/webgguf.js";
//   const engine = await createEngine({ model: "smollm2-135m-instruct", onProgress: (p) => ... });
//   const stream = await engine.chat.completions.create({ messages, stream: true, max_tokens: 128 });
//   for await (const chunk of stream) out.textContent += chunk.choices[0].delta.content ?? "";
//
// `model` is a name from the server's models/manifest.json, a URL of a .gguf file (a Hugging Face file
// page's URL too; of a split model, the URL of its first file), a File/Blob, or the Files of a split model.
// Sampling parameters left out take the engine's defaults (greedy). `signal` (an AbortSignal) stops
// a generation: the call (or the stream's iteration) then rejects with the signal's reason.
import workerUrl from "./worker.js?worker&url";

// For chat UIs (the page's and the widget's, and anyone's): one chat turn over a transcript
// (chat.js), and replies rendered as Markdown into DOM nodes, safely, as they stream (markdown.js),
// with the style sheet of that rendering as text (for a shadow root's adoptedStyleSheets).
export { answered, chatTurn, errorText, modelMessages, modelRecord, NO_REPLY, replyNotes } from "./chat.js";
export { MarkdownView, renderMarkdown } from "./markdown.js";
export { default as markdownCss } from "./markdown.css?inline";

// Where the page's files live (manifest, worker, Pyodide, wheels, shaders): relative to this module's
// own URL, not the page that imports it, so a page of another origin (embed.js) can use the engine.
const BASE = new URL(import.meta.env.BASE_URL, import.meta.url);
// The worker's bundled URL (Vite: "?worker&url"), made absolute against this module's URL.
const WORKER_URL = new URL(workerUrl, import.meta.url);

export class WebggufError extends Error {
  constructor({ name, message, detail }) {
    super(message);
    this.name = "WebggufError";
    this.type = name; // the Python exception type, e.g. "GGUFError"
    this.detail = detail || "";
  }
}

export async function createEngine({ model, onProgress, signal } = {}) {
  const engine = new Engine();
  await engine.ready;
  if (model) await engine.load(model, { onProgress, signal });
  return engine;
}

// The known models: {default, models: {name: {file, size, url, cached, license}}}; an empty list
// when the page is served without a manifest.
export async function fetchManifest() {
  try {
    const response = await fetch(new URL("models/manifest.json", BASE), { cache: "no-store" });
    if (response.ok) return await response.json();
  } catch {
    // no manifest: a static deployment; models come by URL or file
  }
  return { default: null, models: {} };
}

export class Engine {
  constructor() {
    this.worker = startWorker();
    this.calls = new Map(); // request id → {resolve, reject, onEvent}
    this.nextId = 1;
    this.model = null; // info of the loaded model (worker.py model_info)
    this.gpu = null; // adapter info, or null without WebGPU (see gpuError)
    this.gpuError = null;
    this.timings = null; // boot timings (ms)
    this.onDeviceLost = null; // (message) => void
    this.ready = new Promise((resolve, reject) => {
      this.booted = { resolve, reject };
    });
    this.worker.onmessage = ({ data }) => this.receive(data);
    // A module worker that fails to load (network, CORS, CSP) fires a bare Event without a message.
    this.worker.onerror = (event) =>
      this.booted.reject(
        new Error(
          event.message
            ? `the worker failed: ${event.message}`
            : `the worker script ${WORKER_URL.href} could not be loaded (network error, missing CORS ` +
              "headers on its server, or the page's Content-Security-Policy)",
        ),
      );
    this.chat = { completions: { create: (request) => this.create("chat", request) } };
    this.completions = { create: (request) => this.create("text", request) };
  }

  receive(message) {
    if (message.type === "ready") {
      this.gpu = message.gpu;
      this.gpuError = message.gpu_error;
      this.timings = message.timings;
      this.booted.resolve(this);
      return;
    }
    if (message.type === "fatal") {
      this.booted.reject(new WebggufError(message.error));
      return;
    }
    if (message.type === "device_lost") {
      this.model = null;
      this.onDeviceLost?.(message.message);
      return;
    }
    const call = this.calls.get(message.id);
    if (!call) return;
    if (message.type === "result" || message.type === "error") {
      this.calls.delete(message.id);
      if (message.type === "result") call.resolve(message.value);
      else call.reject(new WebggufError(message.error));
    } else {
      call.onEvent?.(message);
    }
  }

  // Send a request to the worker; resolves with its result. `onEvent` gets progress / delta events.
  request(type, fields = {}, onEvent = null) {
    const id = this.nextId++;
    return {
      id,
      promise: new Promise((resolve, reject) => {
        this.calls.set(id, { resolve, reject, onEvent });
        this.worker.postMessage({ id, type, ...fields });
      }),
    };
  }

  async call(type, fields) {
    await this.ready;
    return this.request(type, fields).promise;
  }

  // Load a model (replacing the current one): a name, a URL, a File, or a list of Files (the shards
  // of a split model). onProgress({loaded, total, stage}) as bytes arrive.
  // n_ctx: the context length (default 2048, at most the model's training context). For benchmarks:
  // batch, the most decode steps per readback of token ids (default: the worker's); f16: f16 GEMM tiles
  // and KV cache where the adapter has shader-f16 (default off).
  async load(model, { onProgress, signal, n_ctx, batch, f16 } = {}) {
    await this.ready;
    signal?.throwIfAborted();
    const isList = Array.isArray(model) || (typeof FileList !== "undefined" && model instanceof FileList);
    const files = isList ? [...model] : null;
    if (files && (!files.length || !files.every((file) => file instanceof Blob))) {
      throw new TypeError("model files must be a non-empty list of File objects");
    }
    const what = files ? { blobs: files } : model instanceof Blob ? { blob: model } : { url: await resolveModelUrl(model) };
    if (n_ctx) what.n_ctx = Number(n_ctx);
    if (batch) what.batch = Number(batch);
    if (f16) what.f16 = true;
    const { id, promise } = this.request("load", { model: what }, (event) => onProgress?.(event));
    const abort = () => this.worker.postMessage({ id: this.nextId++, type: "abort", target: id });
    signal?.addEventListener("abort", abort, { once: true });
    try {
      this.model = await promise;
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      throw error;
    } finally {
      signal?.removeEventListener("abort", abort);
    }
    return this.model;
  }

  // Frees the model's GPU memory (every buffer it made); the engine stays ready for the next load.
  async unload() {
    await this.call("unload", {});
    this.model = null;
  }

  tokenize(text, { add_special = true, parse_special = false } = {}) {
    return this.call("tokenize", { text, add_special, parse_special });
  }

  detokenize(ids) {
    return this.call("detokenize", { ids });
  }

  applyTemplate(messages, { add_generation_prompt = true } = {}) {
    return this.call("apply_template", { messages, add_generation_prompt });
  }

  // {heap_bytes: the wasm heap of the Python runtime, gpu_bytes: GPU buffers alive, waiting: what the
  // worker waits for now, [{what, seconds}]}. Answered at once, also while a load runs or Python boots.
  stats() {
    return this.request("stats", {}).promise;
  }

  // Run Python in the worker (diagnostics, tests); resolves with the last expression's value.
  runPython(code) {
    return this.call("python", { code });
  }

  // ---- the model cache, and recovery from a lost GPU device (web/cache.js, docs/BROWSER.md)

  // Models cached in this browser: [{id, url, name, size, valid, complete, used}], newest use first.
  listCachedModels() {
    return this.call("cache_list", {});
  }

  // Deletes a cached model (by its id from listCachedModels).
  deleteCachedModel(id) {
    return this.call("cache_delete", { entry: id }); // not "id": that names the request
  }

  // After onDeviceLost: opens a new GPU device and loads the last model again (from the cache when
  // it was downloaded), without reloading the page. Resolves with the model info (null if none).
  async reloadEngine({ onProgress } = {}) {
    await this.ready;
    const { promise } = this.request("reload_engine", {}, (event) => onProgress?.(event));
    const { gpu, model } = await promise;
    this.gpu = gpu;
    this.gpuError = null;
    this.model = model;
    return model;
  }

  terminate() {
    this.worker.terminate();
    for (const call of this.calls.values()) call.reject(new Error("the engine was terminated"));
    this.calls.clear();
  }

  // chat.completions.create / completions.create
  async create(kind, request) {
    const { stream = false, signal, return_token_ids = false } = request;
    const body = generationRequest(kind, request);
    const meta = {
      id: `${kind === "chat" ? "chatcmpl" : "cmpl"}-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
      created: Math.floor(Date.now() / 1000),
      model: this.model?.name ?? "",
    };
    await this.ready;
    const events = this.generate(body, signal);
    if (stream) return chunks(kind, meta, events, return_token_ids);
    let text = "";
    let final;
    for (;;) {
      const { value, done } = await events.next();
      if (done) {
        final = value;
        break;
      }
      text += value.text;
    }
    return completion(kind, meta, text, final, return_token_ids);
  }

  // Yields {text} deltas; returns the worker's final result.
  async *generate(body, signal) {
    signal?.throwIfAborted();
    const queue = [];
    let wake = null;
    const { id, promise } = this.request("generate", { request: body }, (event) => {
      queue.push(event);
      wake?.();
    });
    let settled = false;
    let final;
    let failure;
    promise.then(
      (value) => (final = value),
      (error) => (failure = error),
    ).finally(() => {
      settled = true;
      wake?.();
    });
    const abort = () => this.worker.postMessage({ id: this.nextId++, type: "abort", target: id });
    signal?.addEventListener("abort", abort, { once: true });
    try {
      for (;;) {
        while (queue.length) yield queue.shift();
        if (settled) break;
        await new Promise((resolve) => (wake = resolve));
        wake = null;
      }
      if (signal?.aborted) throw signal.reason;
      if (failure) throw failure;
      return final;
    } finally {
      signal?.removeEventListener("abort", abort);
      if (!settled) abort(); // the consumer stopped iterating early
    }
  }
}

// The worker, as a module worker. `new Worker(url)` needs a URL of the page's own origin: when this
// module was imported from another origin (a page embedding embed.js), the worker starts from a
// same-origin blob: module that imports the real one (a cross-origin module import: CORS, which
// `webgguf serve` sends). The worker finds its files through its own import.meta.url.
function startWorker() {
  const options = { type: "module", name: "webgguf" };
  if (WORKER_URL.origin === globalThis.location?.origin) return new Worker(WORKER_URL, options);
  const source = `(${crossOriginBootstrap})(${JSON.stringify(WORKER_URL.href)});\n`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const worker = new Worker(url, options);
  // Freed once the worker has run (its first message) or failed: by then it no longer needs the URL.
  const revoke = () => URL.revokeObjectURL(url);
  worker.addEventListener("message", revoke, { once: true });
  worker.addEventListener("error", revoke, { once: true });
  return worker;
}

// Runs inside the blob: worker (stringified: it may use nothing from this module). A blob: worker
// lives under the embedding page's Content-Security-Policy, and Pyodide hangs (never rejects) when
// that policy stops its wasm or its fetches: so check both first and say plainly what is missing.
function crossOriginBootstrap(workerUrl) {
  const origin = new URL(workerUrl).origin;
  const fail = (message) => self.postMessage({ type: "fatal", error: { name: "Error", message, detail: "" } });
  (async () => {
    try {
      new WebAssembly.Module(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0])); // the empty module
    } catch (error) {
      return fail(
        "this page does not allow WebAssembly: its Content-Security-Policy needs script-src " +
          `'wasm-unsafe-eval' (${error.message})`,
      );
    }
    try {
      await fetch(workerUrl, { method: "HEAD", cache: "no-store" });
    } catch (error) {
      return fail(
        `cannot fetch from ${origin} (${error.message}): this page's Content-Security-Policy must allow ` +
          `connect-src ${origin}, and that server must send Access-Control-Allow-Origin`,
      );
    }
    try {
      await import(workerUrl);
    } catch (error) {
      return fail(`cannot load the worker ${workerUrl}: ${error.message}`);
    }
  })();
}

async function resolveModelUrl(model) {
  if (typeof model !== "string" || !model) throw new TypeError("model must be a name, a URL or a File");
  if (/^[a-z0-9][a-z0-9._-]*$/i.test(model) && !model.endsWith(".gguf")) {
    const manifest = await fetchManifest();
    const entry = manifest.models[model];
    if (!entry) {
      const known = Object.keys(manifest.models).join(", ") || "none here";
      throw new WebggufError({ name: "ModelError", message: `unknown model ${model} (known: ${known})` });
    }
    return new URL(entry.url, BASE).href; // the manifest's URLs are relative to its server
  }
  return model;
}

// The worker's request from an OpenAI-shaped one.
function generationRequest(kind, request) {
  const body = {};
  if (kind === "chat") {
    if (!Array.isArray(request.messages) || request.messages.length === 0) {
      throw new TypeError("messages must be a non-empty array of {role, content}");
    }
    body.messages = request.messages.map(({ role, content }) => ({ role, content }));
  } else {
    // text, or token ids (as OpenAI's completions API; ids go to the model as they are)
    const ids = Array.isArray(request.prompt) && request.prompt.every((id) => Number.isInteger(id));
    if (typeof request.prompt !== "string" && !ids) {
      throw new TypeError("prompt must be a string or an array of token ids");
    }
    body.prompt = ids ? [...request.prompt] : request.prompt;
  }
  for (const key of ["max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed"]) {
    if (request[key] !== undefined && request[key] !== null) body[key] = Number(request[key]);
  }
  if (request.ignore_eos) body.ignore_eos = true; // end-of-generation tokens do not stop it (benchmarks)
  if (request.stop) body.stop = typeof request.stop === "string" ? [request.stop] : [...request.stop];
  return body;
}

function usage(final) {
  return {
    prompt_tokens: final.prompt_tokens,
    completion_tokens: final.completion_tokens,
    total_tokens: final.prompt_tokens + final.completion_tokens,
  };
}

async function* chunks(kind, meta, events, withIds) {
  const object = kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const choice = (fields) => ({ ...meta, object, choices: [{ index: 0, ...fields }] });
  if (kind === "chat") yield choice({ delta: { role: "assistant", content: "" }, finish_reason: null });
  for (;;) {
    const { value, done } = await events.next();
    if (done) {
      const ids = withIds ? { token_ids: value.token_ids } : {};
      const last =
        kind === "chat"
          ? choice({ delta: {}, finish_reason: value.finish_reason, ...ids })
          : choice({ text: "", logprobs: null, finish_reason: value.finish_reason, ...ids });
      const promptIds = withIds ? { prompt_token_ids: value.prompt_token_ids } : {};
      const truncated = value.truncated ? { truncated: value.truncated } : {}; // chat turns dropped to fit
      yield { ...last, ...promptIds, usage: usage(value), timings: value.timings, ...truncated };
      return;
    }
    yield kind === "chat"
      ? choice({ delta: { content: value.text }, finish_reason: null })
      : choice({ text: value.text, logprobs: null, finish_reason: null });
  }
}

function completion(kind, meta, text, final, withIds) {
  const ids = withIds ? { token_ids: final.token_ids } : {};
  const result =
    kind === "chat"
      ? {
          ...meta,
          object: "chat.completion",
          choices: [{ index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason: final.finish_reason, ...ids }],
        }
      : {
          ...meta,
          object: "text_completion",
          choices: [{ index: 0, text, logprobs: null, finish_reason: final.finish_reason, ...ids }],
        };
  if (withIds) result.prompt_token_ids = final.prompt_token_ids;
  const truncated = final.truncated ? { truncated: final.truncated } : {}; // chat turns dropped to fit
  return { ...result, usage: usage(final), timings: final.timings, ...truncated };
}
