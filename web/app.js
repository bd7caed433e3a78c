// The chat page: model picker (manifest, URL, file, drag and drop), load progress, a streaming
// conversation with replies rendered as Markdown, the conversations kept in this browser (listed,
// renamed, deleted, exported: conversations.js stores, conversation_list.js shows them), sampling
// controls, and live time-to-first-token and tokens/s.
// Model output never reaches the DOM as HTML: replies are built into nodes by markdown.js, the
// user's messages are text nodes. A chat turn is chat.js's chatTurn (the widget's too).
//
// window.webgguf = {ready, engine, createEngine, load, chat, completions, conversation}: `ready`
// resolves to the engine once Python runs in the worker and the model named by ?model=NAME_OR_URL
// (if any) is loaded; conversation() is a copy of the open conversation (conversations.js).
import "./markdown.css";
import { answered, chatTurn, errorText, modelRecord, NO_REPLY, replyNotes } from "./chat.js";
import { ConversationList } from "./conversation_list.js";
import {
  ConversationStore,
  exportConversation,
  exportFileName,
  newConversation,
} from "./conversations.js";
import { MarkdownView, renderMarkdown } from "./markdown.js";
import { createEngine, Engine, fetchManifest } from "./webgguf.js";

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status-text"),
  dot: $("status-dot"),
  select: $("model-select"),
  url: $("model-url"),
  load: $("load-button"),
  fileButton: $("file-button"),
  fileInput: $("file-input"),
  progress: $("progress"),
  progressFill: $("progress-fill"),
  progressStage: $("progress-stage"),
  progressBytes: $("progress-bytes"),
  info: $("model-info"),
  title: $("chat-title"),
  alert: $("alert"),
  messages: $("messages"),
  empty: $("empty"),
  emptyTitle: $("empty-title"),
  emptyText: $("empty-text"),
  composer: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  newChat: $("new-chat"),
  ttft: $("stat-ttft"),
  speed: $("stat-speed"),
  tokens: $("stat-tokens"),
  drop: $("drop-overlay"),
  panelToggle: $("panel-toggle"),
  temperature: $("temperature"),
  topK: $("top-k"),
  topP: $("top-p"),
  maxTokens: $("max-tokens"),
  seed: $("seed"),
  system: $("system-prompt"),
  context: $("context-size"),
  cacheNote: $("cache-note"),
  cacheList: $("cache-list"),
  cacheEmpty: $("cache-empty"),
  gpuLost: $("gpu-lost"),
  gpuLostText: $("gpu-lost-text"),
  reloadEngine: $("reload-engine"),
  conversationList: $("conversation-list"),
  conversationNote: $("conversation-note"),
};

// Shown when the browser has no WebGPU: where it exists (mid-2025).
const WEBGPU_HELP =
  "WebGPU runs in Chrome and Edge 113+ (Windows, macOS, ChromeOS; Android 121+), Safari 26+ and " +
  "Firefox 141+ on Windows. On Linux, Chrome needs chrome://flags/#enable-unsafe-webgpu and " +
  "chrome://flags/#enable-vulkan. The page also needs a secure context (https:// or localhost).";

const page = {
  engine: null,
  manifest: { default: null, models: {} },
  conversation: newConversation(), // the open one (conversations.js; its messages: chat.js's transcript)
  store: null, // the ConversationStore, null where IndexedDB cannot be used
  follow: true, // the message list follows new text (the user has not scrolled up)
  loading: null, // AbortController of the running load
  reloading: false, // a reload of the engine after a lost GPU device is running
  generating: null, // AbortController of the running generation
};

// ---- small helpers

const megabytes = (n) => `${(n / 1e6).toFixed(n < 1e7 ? 1 : 0)} MB`;
// A model's name without ".gguf" (and, for a split model, without "-00001-of-00003").
const displayName = (info) => info.name.replace(/(-\d{5}-of-\d{5})?\.gguf$/i, "");

function setStatus(text, kind = "busy") {
  ui.status.textContent = text;
  ui.dot.className = `dot ${kind}`;
}

function showAlert(message) {
  ui.alert.textContent = message;
  ui.alert.hidden = !message;
}

function nearBottom() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollToBottom() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function updateControls() {
  const busy = Boolean(page.loading) || Boolean(page.reloading);
  const noGpu = !page.engine?.gpu;
  ui.load.disabled = busy || !page.engine || noGpu;
  ui.fileButton.disabled = busy || !page.engine || noGpu;
  ui.send.disabled = !page.engine?.model || Boolean(page.generating) || !ui.prompt.value.trim();
  ui.send.hidden = Boolean(page.generating);
  ui.stop.hidden = !page.generating;
}

// ---- models

function fillModelList(manifest, requested) {
  ui.select.replaceChildren();
  const names = Object.keys(manifest.models);
  if (!names.length) {
    ui.select.append(new Option("No models on this server", ""));
    ui.select.disabled = true;
    return;
  }
  for (const name of names) {
    const entry = manifest.models[name];
    const label = `${name} (${megabytes(entry.size)}${entry.cached ? "" : ", not downloaded"})`;
    const option = new Option(label, name);
    option.disabled = !entry.cached;
    ui.select.append(option);
  }
  const preferred = requested in manifest.models ? requested : manifest.default;
  if (preferred in manifest.models) ui.select.value = preferred;
}

function chosenModel() {
  return ui.url.value.trim() || ui.select.value;
}

async function loadModel(model) {
  page.loading?.abort();
  const controller = new AbortController();
  page.loading = controller;
  const label = Array.isArray(model) ? `${model.length} files (${model[0].name}, …)` : model instanceof Blob ? model.name : model;
  setStatus(`Loading ${label}…`);
  showAlert("");
  ui.progress.hidden = false;
  ui.info.hidden = true;
  ui.progressFill.style.width = "0%";
  ui.progressStage.textContent = "Connecting";
  ui.progressBytes.textContent = "";
  updateControls();
  showCacheNote("");
  const onProgress = ({ loaded, total, stage, cache }) => {
    if (cache) showCacheNote(cache);
    if (stage) ui.progressStage.textContent = stage;
    if (loaded === undefined) return;
    const percent = total ? Math.min(100, (100 * loaded) / total) : null;
    ui.progressFill.style.width = percent === null ? "100%" : `${percent.toFixed(1)}%`;
    ui.progressBytes.textContent =
      percent === null ? megabytes(loaded) : `${megabytes(loaded)} / ${megabytes(total)} · ${Math.floor(percent)}%`;
  };
  try {
    const n_ctx = Number(ui.context.value) || undefined;
    const info = await page.engine.load(model, { onProgress, signal: controller.signal, n_ctx });
    showModelInfo(info);
    if (info.cache?.message) showCacheNote(info.cache.message);
    setStatus(`${displayName(info)} · ready`, "ok");
    ui.progressStage.textContent = `Loaded in ${info.load_seconds.toFixed(1)} s`;
    ui.progressFill.style.width = "100%";
    return info;
  } catch (error) {
    if (controller.signal.aborted) return null;
    setStatus("Loading failed", "error");
    showAlert(`Could not load ${label}: ${errorText(error)}`);
    ui.progress.hidden = true;
    throw error;
  } finally {
    if (page.loading === controller) page.loading = null;
    updateControls();
    refreshCacheList();
  }
}

// ---- the model cache (web/cache.js)

function showCacheNote(text) {
  ui.cacheNote.textContent = text;
  ui.cacheNote.hidden = !text;
}

async function refreshCacheList() {
  if (!page.engine) return;
  let entries;
  try {
    entries = await page.engine.listCachedModels();
  } catch (error) {
    ui.cacheEmpty.textContent = `The cache cannot be read: ${errorText(error)}`;
    ui.cacheEmpty.hidden = false;
    ui.cacheList.replaceChildren();
    return;
  }
  ui.cacheList.replaceChildren();
  for (const entry of entries) {
    const row = document.createElement("li");
    row.dataset.id = entry.id;
    const name = document.createElement("span");
    name.className = "cache-name";
    name.textContent = entry.name;
    name.title = entry.url;
    const size = document.createElement("span");
    size.className = "cache-size";
    size.textContent = entry.complete
      ? megabytes(entry.size)
      : `${megabytes(entry.valid)} of ${megabytes(entry.size)} (partial: resumes on the next load)`;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "button ghost";
    remove.textContent = "Delete";
    remove.setAttribute("aria-label", `Delete ${entry.name} from the cache`);
    remove.addEventListener("click", async () => {
      remove.disabled = true;
      try {
        await page.engine.deleteCachedModel(entry.id);
      } catch (error) {
        showAlert(`Could not delete ${entry.name}: ${errorText(error)}`);
      }
      refreshCacheList();
    });
    row.append(name, size, remove);
    ui.cacheList.append(row);
  }
  ui.cacheEmpty.hidden = entries.length > 0;
}

// ---- a lost GPU device: the engine is reloaded in place (new device, the model again from the cache)

function showDeviceLost(message) {
  setStatus("GPU lost", "error");
  ui.gpuLostText.textContent = `The GPU device was lost (${message}). The page keeps your conversation; reload the engine to continue.`;
  ui.gpuLost.hidden = false;
  ui.info.hidden = true;
  updateControls();
}

async function reloadEngine() {
  if (page.reloading) return;
  page.reloading = true;
  ui.reloadEngine.disabled = true;
  setStatus("Reloading the engine…");
  updateControls();
  try {
    const info = await page.engine.reloadEngine();
    ui.gpuLost.hidden = true;
    if (info) {
      showModelInfo(info);
      setStatus(`${displayName(info)} · ready`, "ok");
    } else {
      setStatus(`Ready · ${page.engine.gpu?.adapter ?? "WebGPU"}`, "ok");
    }
  } catch (error) {
    setStatus("Reloading failed", "error");
    ui.gpuLostText.textContent = `Reloading the engine failed: ${errorText(error)}`;
  } finally {
    page.reloading = false;
    ui.reloadEngine.disabled = false;
    updateControls();
  }
}

function showModelInfo(info) {
  const rows = [
    ["File", info.files?.length > 1 ? `${info.name} and ${info.files.length - 1} more` : info.name],
    ["Name", info.model_name ?? "–"],
    ["Architecture", info.architecture],
    ["Parameters", `${(info.n_params / 1e6).toFixed(0)} M`],
    ["Layers × width", `${info.n_layer} × ${info.d_model}`],
    ["Vocabulary", info.n_vocab.toLocaleString("en")],
    ["Context", `${info.n_ctx.toLocaleString("en")} (trained: ${info.n_ctx_train.toLocaleString("en")})`],
    ["Weights", Object.keys(info.tensor_types).join(", ")],
    ["GPU memory", megabytes(info.gpu_bytes)],
    ["Adapter", page.engine.gpu?.adapter ?? "–"],
  ];
  ui.info.replaceChildren();
  for (const [name, value] of rows) {
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = name;
    dd.textContent = value;
    ui.info.append(dt, dd);
  }
  ui.info.hidden = false;
  ui.title.textContent = displayName(info);
  ui.emptyTitle.textContent = `${displayName(info)} is ready`;
  ui.emptyText.textContent = "Ask it something. The answer streams in as the GPU generates it.";
}

// ---- the open conversation

function bubbleElement(role) {
  ui.empty.hidden = true;
  const bubble = document.createElement("div");
  bubble.className = `message ${role}`;
  ui.messages.append(bubble);
  return bubble;
}

function addNote(bubble, text) {
  const note = document.createElement("span");
  note.className = "note";
  note.textContent = text;
  bubble.append(note);
}

function addUserBubble(text) {
  const bubble = bubbleElement("user");
  bubble.textContent = text;
  return bubble;
}

// The bubble of a reply and the view its Markdown streams into.
function addReplyBubble() {
  const bubble = bubbleElement("assistant");
  const body = document.createElement("div");
  bubble.append(body);
  const view = new MarkdownView(body, { onDraw: followOutput });
  return { bubble, view };
}

// A reply of the transcript, when it has ended: the model that answered, its notes, its error.
function finishReply(bubble, reply) {
  if (reply.model) {
    const { name, file, size } = reply.model;
    const where = [file !== name && file, size && megabytes(size)].filter(Boolean).join(", ");
    bubble.title = `Answered by ${name}${where ? ` (${where})` : ""}`;
  }
  for (const note of replyNotes(reply)) addNote(bubble, note);
  if (reply.error) {
    if (!reply.content) bubble.classList.add("error");
    addNote(bubble, reply.error);
  }
}

// The whole transcript of a conversation (opened, or restored after a reload).
function showTranscript(messages) {
  for (const bubble of [...ui.messages.querySelectorAll(".message")]) bubble.remove();
  ui.empty.hidden = messages.length > 0;
  messages.forEach((message, i) => {
    if (message.role === "user") {
      const bubble = addUserBubble(message.content);
      if (!answered(messages, i)) addNote(bubble, NO_REPLY);
    } else if (message.role === "assistant") {
      const bubble = bubbleElement("assistant");
      if (message.content) bubble.append(renderMarkdown(message.content));
      finishReply(bubble, message);
    }
  });
  scrollToBottom();
  page.follow = true;
}

// After the reply's view drew new text: keep the newest text in sight, unless the user scrolled up.
function followOutput() {
  if (page.follow) scrollToBottom();
}

function samplingParams() {
  const number = (input) => (input.value === "" ? undefined : Number(input.value));
  return {
    temperature: number(ui.temperature),
    top_k: number(ui.topK),
    top_p: number(ui.topP),
    max_tokens: number(ui.maxTokens),
    seed: number(ui.seed) ?? Math.floor(Math.random() * 2 ** 32),
  };
}

function showStats({ ttft, speed, tokens }) {
  ui.ttft.textContent = `TTFT ${ttft === null ? "–" : `${Math.round(ttft * 1000)} ms`}`;
  ui.speed.textContent = `${speed === null ? "–" : speed.toFixed(1)} tok/s`;
  ui.tokens.textContent = `${tokens} tokens`;
}

async function send(text) {
  if (!text || page.generating || !page.engine?.model) return;
  ui.prompt.value = "";
  autosize();
  const conversation = page.conversation; // the turn stays in it even if another one is opened meanwhile
  conversation.system = ui.system.value.trim();
  const userBubble = addUserBubble(text);
  const { bubble, view } = addReplyBubble();
  bubble.classList.add("streaming");
  page.follow = true;
  scrollToBottom();
  const controller = new AbortController();
  page.generating = controller;
  updateControls();

  const started = performance.now();
  let firstAt = null; // when the first text arrived
  showStats({ ttft: null, speed: null, tokens: 0 });
  const onChunk = (chunk) => {
    // Token counts and speed come with the last chunk (the worker streams text, not ids).
    const ttft = chunk.timings?.time_to_first_token ?? (firstAt === null ? null : (firstAt - started) / 1000);
    showStats({ ttft, speed: chunk.timings?.tokens_per_second ?? null, tokens: chunk.usage?.completion_tokens ?? "…" });
  };
  const turn = chatTurn(page.engine, conversation.messages, text, {
    system: conversation.system,
    params: samplingParams(),
    signal: controller.signal,
    model: modelRecord(page.engine.model, page.manifest),
    onText: (delta) => {
      firstAt ??= performance.now();
      view.append(delta);
    },
    onChunk,
  });
  conversation.updated = Date.now();
  saveConversation(conversation); // the user's message, before the reply: a reload keeps it
  const { reply } = await turn;
  view.finish();
  bubble.classList.remove("streaming");
  if (reply) {
    finishReply(bubble, reply);
  } else {
    bubble.remove();
    addNote(userBubble, NO_REPLY);
  }
  page.generating = null;
  updateControls();
  conversation.updated = Date.now();
  await saveConversation(conversation);
}

// A new, empty conversation (stored from its first message on).
function newChat() {
  page.generating?.abort();
  page.conversation = newConversation(ui.system.value.trim());
  rememberOpen(null);
  showTranscript([]);
  showStats({ ttft: null, speed: null, tokens: 0 });
  refreshConversationList();
}

// ---- conversations kept in this browser (conversations.js)

const OPEN_KEY = "webgguf.conversation"; // localStorage: the id of the open conversation

function rememberOpen(id) {
  try {
    if (id) localStorage.setItem(OPEN_KEY, id);
    else localStorage.removeItem(OPEN_KEY);
  } catch {
    // no localStorage (a sandboxed page): a reload opens a new chat
  }
}

const conversationList = new ConversationList(ui.conversationList, ui.conversationNote, {
  open: (id) => openConversation(id),
  rename: (id, title) => renameConversation(id, title),
  export: (id) => exportConversationFile(id),
  delete: (id) => deleteConversation(id),
});
const showConversationNote = (text) => conversationList.showNote(text);

// Opens the store and the conversation that was open before the reload (if any).
async function restoreConversations() {
  try {
    page.store = await ConversationStore.open();
  } catch (error) {
    showConversationNote(`Conversations cannot be kept in this browser (${errorText(error)}): they last until a reload.`);
    return;
  }
  let id = null;
  try {
    id = localStorage.getItem(OPEN_KEY);
  } catch {
    // as in rememberOpen
  }
  const stored = id ? await page.store.get(id) : null;
  if (stored && !page.conversation.messages.length) {
    page.conversation = stored;
    ui.system.value = stored.system ?? "";
    showTranscript(stored.messages);
  }
  await refreshConversationList();
}

async function saveConversation(conversation) {
  if (!page.store || !conversation.messages.length) return;
  try {
    await page.store.save(conversation);
    if (conversation === page.conversation) rememberOpen(conversation.id);
  } catch (error) {
    showConversationNote(`This conversation could not be saved: ${errorText(error)}`);
  }
  await refreshConversationList();
}

async function openConversation(id) {
  if (!page.store || id === page.conversation.id) return;
  const conversation = await page.store.get(id);
  if (!conversation) return refreshConversationList(); // deleted in another tab
  page.generating?.abort();
  page.conversation = conversation;
  ui.system.value = conversation.system ?? "";
  rememberOpen(id);
  showTranscript(conversation.messages);
  showStats({ ttft: null, speed: null, tokens: 0 });
  document.body.classList.remove("panel-open"); // on a phone, back to the chat
  ui.panelToggle.setAttribute("aria-expanded", "false");
  refreshConversationList();
}

async function renameConversation(id, title) {
  if (id === page.conversation.id) {
    page.conversation.title = title.replace(/\s+/g, " ").trim();
    await saveConversation(page.conversation);
  } else {
    await page.store.rename(id, title);
    await refreshConversationList();
  }
}

async function deleteConversation(id) {
  await page.store.delete(id);
  if (id === page.conversation.id) newChat();
  else await refreshConversationList();
}

async function exportConversationFile(id) {
  const conversation = id === page.conversation.id ? page.conversation : await page.store.get(id);
  if (!conversation) return;
  const url = URL.createObjectURL(new Blob([exportConversation(conversation)], { type: "application/json" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = exportFileName(conversation);
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the download has read it by then
}

async function refreshConversationList() {
  if (!page.store) return;
  try {
    conversationList.show(await page.store.list(), page.conversation.id);
  } catch (error) {
    showConversationNote(`The stored conversations cannot be read: ${errorText(error)}`);
  }
}

function autosize() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = `${ui.prompt.scrollHeight}px`;
  updateControls();
}

// ---- events

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send(ui.prompt.value.trim());
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send(ui.prompt.value.trim());
  }
});
ui.prompt.addEventListener("input", autosize);
ui.messages.addEventListener("scroll", () => {
  page.follow = nearBottom();
});
ui.stop.addEventListener("click", () => page.generating?.abort());
ui.reloadEngine.addEventListener("click", reloadEngine);
ui.newChat.addEventListener("click", newChat);
ui.load.addEventListener("click", () => loadModel(chosenModel()).catch(() => {}));
ui.fileButton.addEventListener("click", () => ui.fileInput.click());
// One file, or every file of a split model.
const chosenFiles = (files) => (files.length > 1 ? [...files] : files[0]);
ui.fileInput.addEventListener("change", () => {
  const model = chosenFiles(ui.fileInput.files);
  ui.fileInput.value = "";
  if (model) loadModel(model).catch(() => {});
});
ui.select.addEventListener("change", () => {
  ui.url.value = "";
});
document.getElementById("suggestions").addEventListener("click", (event) => {
  if (!event.target.matches(".chip")) return;
  if (page.engine?.model) send(event.target.textContent);
  else ui.prompt.value = event.target.textContent;
  autosize();
});
ui.panelToggle.addEventListener("click", () => {
  const open = document.body.classList.toggle("panel-open");
  ui.panelToggle.setAttribute("aria-expanded", String(open));
});

// Drag and drop a .gguf anywhere. dragenter/dragleave fire for every child: count them.
let dragDepth = 0;
const hasFiles = (event) => [...(event.dataTransfer?.types ?? [])].includes("Files");
window.addEventListener("dragenter", (event) => {
  if (!hasFiles(event)) return;
  dragDepth += 1;
  ui.drop.hidden = false;
});
window.addEventListener("dragleave", () => {
  dragDepth = Math.max(0, dragDepth - 1);
  if (!dragDepth) ui.drop.hidden = true;
});
window.addEventListener("dragover", (event) => {
  if (hasFiles(event)) event.preventDefault();
});
window.addEventListener("drop", (event) => {
  event.preventDefault();
  dragDepth = 0;
  ui.drop.hidden = true;
  const model = chosenFiles(event.dataTransfer.files);
  if (model && page.engine && !page.loading) loadModel(model).catch(() => {});
});

// ---- start

// Why this browser cannot run models on WebGPU, or null when it can (an adapter is there).
async function webgpuProblem() {
  if (!navigator.gpu) return "this browser has no WebGPU (navigator.gpu is missing)";
  try {
    if (!(await navigator.gpu.requestAdapter())) return "no WebGPU adapter (WebGPU is disabled, or this GPU is blocked)";
  } catch (error) {
    return `requesting a WebGPU adapter failed (${error.message})`;
  }
  return null;
}

async function start() {
  // The stored conversations show at once; they need neither Python nor a model.
  restoreConversations().catch((error) => showConversationNote(errorText(error)));
  const requested = new URLSearchParams(location.search).get("model");
  page.manifest = await fetchManifest();
  fillModelList(page.manifest, requested);
  if (requested && !(requested in page.manifest.models)) ui.url.value = requested;
  page.engine = new Engine();
  window.webgguf.engine = page.engine;
  // Without WebGPU, say so at once: Python takes seconds to boot and cannot help.
  const problem = await webgpuProblem();
  if (problem) {
    showAlert(`WebGPU is not available here: ${problem}. ${WEBGPU_HELP}`);
    setStatus("No WebGPU: models cannot run", "error");
  }
  updateControls();
  page.engine.onDeviceLost = showDeviceLost;
  // The cached-models list follows every load of this engine, also those made through the API
  // (window.webgguf.engine.load), which bypass the page's own loadModel.
  const engineLoad = page.engine.load.bind(page.engine);
  page.engine.load = (...args) => engineLoad(...args).finally(refreshCacheList);
  try {
    await page.engine.ready;
  } catch (error) {
    setStatus("Python failed to start", "error");
    showAlert(errorText(error));
    throw error;
  }
  const { gpu, gpuError } = page.engine;
  if (gpuError) showAlert(`WebGPU is not available here: ${gpuError}. ${WEBGPU_HELP}`);
  setStatus(gpu ? `Ready · ${gpu.adapter}` : "No WebGPU: models cannot run", gpu ? "ok" : "error");
  updateControls();
  refreshCacheList();
  if (requested && gpu) await loadModel(requested);
  return page.engine;
}

// chat / completions: the page's engine's OpenAI-shaped calls (window.webgguf.completions.create(...)).
window.webgguf = {
  ready: null,
  engine: null,
  createEngine,
  load: loadModel,
  chat: { completions: { create: (request) => page.engine.chat.completions.create(request) } },
  completions: { create: (request) => page.engine.completions.create(request) },
  conversation: () => structuredClone(page.conversation),
};
window.webgguf.ready = start();
window.webgguf.ready.catch((error) => console.warn("webgguf:", errorText(error)));
