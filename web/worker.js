// The page's web worker: hosts Pyodide (Python 3.14 in wasm) running webgguf, so the page never
// freezes while Python parses a model or drives the GPU. web/worker.py is its Python half.
//
// Protocol (postMessage; every request has a numeric `id`, answered by exactly one "result" or
// "error" with that id, possibly preceded by "progress" / "delta" events with the same id):
//   worker → page, unasked: {type: "ready", gpu, gpu_error, timings} | {type: "fatal", error}
//                           {type: "device_lost", message}
//   load         {model: {url | blob | blobs, n_ctx?, batch?, f16?}} → progress {loaded, total} / {stage} / {cache};
//                                               result: model info with preflight, cache, heap_bytes_before
//                                               /after (a URL goes through the model cache, web/cache.js;
//                                               a split model: the URL of a shard, or the files of all)
//   reload_engine {}                          → after device_lost: a new device, the last model again;
//                                               result: {gpu, model}
//   cache_list   {}                           → result: the cached models;  cache_delete {entry}
//   unload       {}                           frees the model's GPU memory (no answer value)
//   generate     {request}                    → delta {text}...; result: {finish_reason, prompt_tokens,
//                                               completion_tokens, prompt_token_ids, token_ids, timings}
//   abort        {target}                     stops the generation `target` (no answer)
//   tokenize     {text, add_special, parse_special} → result: ids
//   detokenize   {ids}                        → result: text
//   apply_template {messages, add_generation_prompt} → result: text
//   stats        {}                           → result: {heap_bytes, gpu_bytes, waiting: [{what, seconds}],
//                                               running: {id, type, stage, seconds} | null}
//                                               (answered at once, also during the boot: the request
//                                               being handled and what the worker waits for outside
//                                               itself, web/waits.js)
//   python       {code}                       → result: the value of the code's last expression
//                                               (diagnostics and tests; runs in its own namespace)
// Errors carry {name, message} (the Python exception type and its message) and `detail` (traceback).
import * as gpuBridge from "./gpu_bridge.js";
import { deleteCached, listCached, openUrl } from "./cache.js";
import { BlobSource, SourceError, SplitSource } from "./sources.js";
import { pendingWaits, waitFor } from "./waits.js";
import workerPython from "./worker.py?raw";

// Relative to this script, not self.location: a worker started from a blob: URL (a page of another
// origin, see webgguf.js startWorker) has a blob: location.
const BASE = new URL(import.meta.env.BASE_URL, import.meta.url);
const PROGRESS_INTERVAL_MS = 100;
const GLUE_DIR = "/home/pyodide/webgguf_web";

let pyodide = null;
let glue = null; // the module webgguf_worker (web/worker.py)
let pythonNamespace = null; // globals of "python" requests
let queue = Promise.resolve(); // requests run one at a time, in arrival order (except abort / stats)
const sources = new Map(); // id of a running load → its byte source (cancelled by abort)
const aborted = new Set(); // ids of requests aborted before they finished
let generating = null; // id of the running generation
let running = null; // {id, type, since, stage}: the request being handled (not abort / stats)
let lastModel = null; // the model of the last load request (reload_engine loads it again)
let gpuInfo = null; // the adapter (worker.py gpu_info), or null without WebGPU
let gpuError = null; // why there is no GPU

const post = (message) => self.postMessage(message);

async function boot() {
  const timings = {};
  let started = performance.now();
  const { loadPyodide } = await waitFor(
    "boot: import pyodide.mjs",
    import(/* @vite-ignore */ new URL("pyodide/pyodide.mjs", BASE).href),
  );
  pyodide = await waitFor("boot: loadPyodide", loadPyodide({ indexURL: new URL("pyodide/", BASE).href }));
  timings.pyodide = performance.now() - started;

  started = performance.now();
  const wheels = await waitFor("boot: wheels/index.json", fetchJson("wheels/index.json"));
  const micropipUrl = new URL(`wheels/${wheels.micropip}`, BASE).href;
  await waitFor("boot: micropip", pyodide.loadPackage(micropipUrl, { messageCallback: () => {} }));
  const micropip = pyodide.pyimport("micropip");
  const urls = wheels.packages.map((name) => new URL(`wheels/${name}`, BASE).href);
  await waitFor("boot: wheels", micropip.install.callKwargs(urls, { deps: false }));
  micropip.destroy();
  timings.packages = performance.now() - started;

  started = performance.now();
  pyodide.registerJsModule("webgguf_gpu_bridge", gpuBridge);
  pyodide.FS.mkdirTree(GLUE_DIR);
  pyodide.FS.writeFile(`${GLUE_DIR}/webgguf_worker.py`, workerPython);
  pyodide.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(GLUE_DIR)})`);
  glue = pyodide.pyimport("webgguf_worker");
  const shaders = fetch(new URL("shaders.json", BASE)).then((response) => response.text());
  glue.set_shaders(await waitFor("boot: shaders.json", shaders)); // the engine's source_of
  timings.python = performance.now() - started;

  started = performance.now();
  if (!self.navigator?.gpu) {
    gpuError = "this browser has no WebGPU (navigator.gpu is missing)";
  } else {
    try {
      gpuInfo = JSON.parse(await waitFor("boot: the GPU device", glue.open_gpu(onDeviceLost)));
    } catch (error) {
      gpuError = describe(error).message;
    }
  }
  timings.gpu = performance.now() - started;
  post({ type: "ready", gpu: gpuInfo, gpu_error: gpuError, timings });
}

// The device is gone (driver reset, GPU process crash, device.destroy()): the model with it. The page
// offers "reload_engine".
function onDeviceLost(message) {
  glue?.forget_model();
  post({ type: "device_lost", message });
}

// {size, sha256} of the manifest's entry for `url` (models/manifest.json of the page's server), or {}.
async function manifestEntryFor(url) {
  try {
    const manifestUrl = new URL("models/manifest.json", BASE);
    const response = await fetch(manifestUrl, { cache: "no-store" });
    if (!response.ok) return {};
    const { models = {} } = await response.json();
    for (const entry of Object.values(models)) {
      if (new URL(entry.url, manifestUrl).href === url) return { size: entry.size, sha256: entry.sha256 };
    }
  } catch {
    // no manifest (a static deployment): the size comes from the server, there is no sha256
  }
  return {};
}

// The byte source of a model: a File, several Files (a split model's shards), or a URL (through the
// cache; Python says which files a URL stands for: a Hugging Face page URL, a split model's shards).
async function openModel(model, { signal, onBytes, onNote }) {
  if (model.blob) return new BlobSource(model.blob, { signal, onBytes });
  if (model.blobs) {
    // Any order works (web/sources.js SplitSource); by name, a split model's files are in shard order.
    const files = [...model.blobs].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    if (files.length === 1) return new BlobSource(files[0], { signal, onBytes });
    return SplitSource.open(files.length, (index, options) => new BlobSource(files[index], options), { signal, onBytes });
  }
  const urls = JSON.parse(glue.urls_of(new URL(model.url, BASE).href));
  const open = async (index, options) => {
    try {
      return await openUrl(urls[index], { ...options, onNote, expected: await manifestEntryFor(urls[index]) });
    } catch (error) {
      if (urls.length === 1 || error.name === "AbortError") throw error;
      throw new SourceError(`file ${index + 1} of the ${urls.length} of this split model: ${error.message}`);
    }
  };
  if (urls.length === 1) return open(0, { signal, onBytes });
  return SplitSource.open(urls.length, open, { signal, onBytes });
}

// The memory estimate of pre-flight: navigator.deviceMemory (GiB, rounded down, capped by the
// browser), or null where the browser does not say.
const deviceMemoryBytes = () => (self.navigator?.deviceMemory ? self.navigator.deviceMemory * 2 ** 30 : null);

async function fetchJson(path) {
  const response = await fetch(new URL(path, BASE));
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} (is the page built? tools/build_web.py)`);
  return response.json();
}

// A Python exception (a PythonError: its `type`, and a traceback that ends with the line
// "module.Type: message", the message possibly spanning lines) or a JS error, as {name, message, detail}.
function describe(error) {
  if (error?.constructor?.name === "PythonError") {
    const traceback = String(error.message).trimEnd();
    const start = new RegExp(`^(?:[\\w.]+\\.)?${error.type}: `, "gm");
    const found = [...traceback.matchAll(start)].pop();
    const message = found ? traceback.slice(found.index + found[0].length) : traceback.split("\n").pop();
    return { name: error.type, message, detail: traceback };
  }
  return { name: error?.name || "Error", message: String(error?.message ?? error), detail: error?.stack || "" };
}

// Size of the wasm memory that holds the Python heap (it grows, never shrinks); 0 before it exists.
const heapBytes = () => pyodide?._module.HEAP8.length ?? 0;

// Calls Python and returns its JSON string result parsed.
const json = (text) => JSON.parse(text);

const handlers = {
  async load(message) {
    const { id, model } = message;
    let lastPost = 0;
    const onBytes = (loaded, total) => {
      const now = performance.now();
      if (now - lastPost < PROGRESS_INTERVAL_MS && loaded !== total) return;
      lastPost = now;
      post({ id, type: "progress", loaded, total });
    };
    const onNote = (text) => post({ id, type: "progress", cache: text });
    const controller = new AbortController();
    sources.set(id, { source: null, controller });
    let source = null;
    let stage = "";
    try {
      source = await openModel(model, { signal: controller.signal, onBytes, onNote });
      const heapBefore = heapBytes();
      const options = JSON.stringify({ n_ctx: model.n_ctx ?? null, batch: model.batch ?? null, f16: model.f16 ?? false, memory_bytes: deviceMemoryBytes() });
      const onStage = (text) => {
        stage = text;
        if (running) running.stage = text;
        post({ id, type: "progress", stage: text });
      };
      const info = json(await glue.load_model(source, onStage, options));
      try {
        await source.finish?.(); // the cache entry: the rest of the file, the whole-file sha256
      } catch (error) {
        glue.unload_model(); // the bytes that were loaded are not the manifest's
        throw error;
      }
      const cache = source.cacheInfo?.() ?? null;
      lastModel = model; // what "reload_engine" loads again
      return { ...info, cache, heap_bytes_before: heapBefore, heap_bytes_after: heapBytes() };
    } catch (error) {
      // A partial download is kept for a resume only once the weights were being fetched: a file that
      // is not a model, or a model that does not fit, is not worth keeping.
      if (!controller.signal.aborted && stage !== "Uploading the weights") await source?.discard?.();
      throw error;
    } finally {
      sources.delete(id);
      source?.cancel(); // the rest of the body (if any) is not needed; cache files are closed
    }
  },

  // After a lost GPU device: a new device, and the last model loaded again (from the cache if it was
  // downloaded). The page does not reload.
  async reload_engine(message) {
    gpuInfo = JSON.parse(await glue.open_gpu(onDeviceLost));
    gpuError = null;
    if (!lastModel) return { gpu: gpuInfo, model: null };
    return { gpu: gpuInfo, model: await handlers.load({ ...message, model: lastModel }) };
  },

  // Frees the model's GPU memory (all of it: GpuModel.release); the device stays for the next load.
  unload() {
    glue.unload_model();
    lastModel = null;
  },

  cache_list: () => listCached(),
  cache_delete: ({ entry }) => deleteCached(entry),

  async generate({ id, request }) {
    const onDelta = (text) => post({ id, type: "delta", text });
    generating = id;
    try {
      return json(await glue.generate(JSON.stringify(request), onDelta));
    } finally {
      generating = null;
    }
  },

  tokenize: ({ text, add_special, parse_special }) => json(glue.tokenize(text, !!add_special, !!parse_special)),
  detokenize: ({ ids }) => glue.detokenize(JSON.stringify(ids)),
  apply_template: ({ messages, add_generation_prompt }) =>
    glue.apply_template(JSON.stringify(messages), add_generation_prompt !== false),

  async python({ code }) {
    pythonNamespace ??= pyodide.globals.get("dict")();
    const value = await pyodide.runPythonAsync(code, { globals: pythonNamespace });
    if (value?.toJs) {
      const converted = value.toJs({ dict_converter: Object.fromEntries });
      value.destroy();
      return converted;
    }
    return value;
  },
};

// Requests that must not wait behind a running load / generation.
const immediate = {
  abort({ target }) {
    aborted.add(target);
    sources.get(target)?.controller.abort();
    if (generating === target) glue.abort();
  },
  stats: () => ({
    heap_bytes: heapBytes(),
    gpu_bytes: glue ? glue.gpu_bytes() : 0,
    waiting: pendingWaits(),
    running: running && {
      id: running.id,
      type: running.type,
      stage: running.stage,
      seconds: (performance.now() - running.since) / 1000,
    },
  }),
};

async function run(message) {
  const { id, type } = message;
  const tracked = !(type in immediate);
  if (tracked) running = { id, type, since: performance.now(), stage: "" };
  try {
    if (aborted.delete(id)) throw new DOMException("aborted before it started", "AbortError");
    const value = await (immediate[type] ?? handlers[type])(message);
    if (type !== "abort") post({ id, type: "result", value });
  } catch (error) {
    post({ id, type: "error", error: describe(error) });
  } finally {
    if (type !== "abort") aborted.delete(id);
    if (tracked) running = null;
  }
}

const booted = boot().catch((error) => {
  post({ type: "fatal", error: describe(error) });
  throw error;
});

self.onmessage = ({ data: message }) => {
  if (!(message.type in handlers) && !(message.type in immediate)) {
    post({ id: message.id, type: "error", error: { name: "ValueError", message: `unknown request ${message.type}` } });
    return;
  }
  if (message.type === "stats") {
    run(message); // also while Python boots: what the boot waits for
    return;
  }
  if (message.type in immediate) {
    booted.then(() => run(message), () => {});
    return;
  }
  queue = queue.then(() => booted).then(() => run(message), () => post({ id: message.id, type: "error", error: { name: "Error", message: "the Python runtime failed to start" } }));
};
