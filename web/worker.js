// The page's web worker: hosts Pyodide (Python 3.14 in wasm) running webgguf, so the page never
// freezes while Python parses a model or drives the GPU. web/worker.py is its Python half.
//
// Protocol (postMessage; every request has a numeric `id`, answered by exactly one "result" or
// "error" with that id, possibly preceded by "progress" / "delta" events with the same id):
//   worker → page, unasked: {type: "ready", gpu, gpu_error, timings} | {type: "fatal", error}
//                           {type: "device_lost", message}
//   load         {model: {url} | {blob}}      → progress {loaded, total} / {stage}; result: model info
//                                               with heap_bytes_before / heap_bytes_after the load
//   generate     {request}                    → delta {text}...; result: {finish_reason, prompt_tokens,
//                                               completion_tokens, prompt_token_ids, token_ids, timings}
//   abort        {target}                     stops the generation `target` (no answer)
//   tokenize     {text, add_special, parse_special} → result: ids
//   detokenize   {ids}                        → result: text
//   apply_template {messages, add_generation_prompt} → result: text
//   stats        {}                           → result: {heap_bytes, gpu_bytes}
//   python       {code}                       → result: the value of the code's last expression
//                                               (diagnostics and tests; runs in its own namespace)
// Errors carry {name, message} (the Python exception type and its message) and `detail` (traceback).
import * as gpuBridge from "./gpu_bridge.js";
import { BlobSource, StreamSource } from "./sources.js";
import workerPython from "./worker.py?raw";

const BASE = new URL(import.meta.env.BASE_URL, self.location.href);
const PROGRESS_INTERVAL_MS = 100;
const GLUE_DIR = "/home/pyodide/webgguf_web";

let pyodide = null;
let glue = null; // the module webgguf_worker (web/worker.py)
let pythonNamespace = null; // globals of "python" requests
let queue = Promise.resolve(); // requests run one at a time, in arrival order (except abort / stats)
const sources = new Map(); // id of a running load → its byte source (cancelled by abort)
const aborted = new Set(); // ids of requests aborted before they finished
let generating = null; // id of the running generation

const post = (message) => self.postMessage(message);

async function boot() {
  const timings = {};
  let started = performance.now();
  const { loadPyodide } = await import(/* @vite-ignore */ new URL("pyodide/pyodide.mjs", BASE).href);
  pyodide = await loadPyodide({ indexURL: new URL("pyodide/", BASE).href });
  timings.pyodide = performance.now() - started;

  started = performance.now();
  const wheels = await fetchJson("wheels/index.json");
  await pyodide.loadPackage(new URL(`wheels/${wheels.micropip}`, BASE).href, { messageCallback: () => {} });
  const micropip = pyodide.pyimport("micropip");
  const urls = wheels.packages.map((name) => new URL(`wheels/${name}`, BASE).href);
  await micropip.install.callKwargs(urls, { deps: false });
  micropip.destroy();
  timings.packages = performance.now() - started;

  started = performance.now();
  pyodide.registerJsModule("webgguf_gpu_bridge", gpuBridge);
  pyodide.FS.mkdirTree(GLUE_DIR);
  pyodide.FS.writeFile(`${GLUE_DIR}/webgguf_worker.py`, workerPython);
  pyodide.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(GLUE_DIR)})`);
  glue = pyodide.pyimport("webgguf_worker");
  glue.install_shaders(await (await fetch(new URL("shaders.json", BASE))).text());
  timings.python = performance.now() - started;

  started = performance.now();
  let gpu = null;
  let gpuError = null;
  try {
    gpu = JSON.parse(await glue.open_gpu((message) => post({ type: "device_lost", message })));
  } catch (error) {
    gpuError = describe(error).message;
  }
  timings.gpu = performance.now() - started;
  post({ type: "ready", gpu, gpu_error: gpuError, timings });
}

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

// Size of the wasm memory that holds the Python heap (it grows, never shrinks).
const heapBytes = () => pyodide._module.HEAP8.length;

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
    const controller = new AbortController();
    const source = model.blob
      ? new BlobSource(model.blob, { signal: controller.signal, onBytes })
      : await StreamSource.open(new URL(model.url, BASE).href, { signal: controller.signal, onBytes });
    sources.set(id, { source, controller });
    try {
      const heapBefore = heapBytes();
      const info = json(await glue.load_model(source, (stage) => post({ id, type: "progress", stage })));
      return { ...info, heap_bytes_before: heapBefore, heap_bytes_after: heapBytes() };
    } finally {
      sources.delete(id);
      source.cancel(); // the rest of the body (if any) is not needed
    }
  },

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
  }),
};

async function run(message) {
  const { id, type } = message;
  try {
    if (aborted.delete(id)) throw new DOMException("aborted before it started", "AbortError");
    const value = await (immediate[type] ?? handlers[type])(message);
    if (type !== "abort") post({ id, type: "result", value });
  } catch (error) {
    post({ id, type: "error", error: describe(error) });
  } finally {
    if (type !== "abort") aborted.delete(id);
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
  if (message.type in immediate) {
    booted.then(() => run(message), () => {});
    return;
  }
  queue = queue.then(() => booted).then(() => run(message), () => post({ id: message.id, type: "error", error: { name: "Error", message: "the Python runtime failed to start" } }));
};
