// embed.js: a chat widget for any page, from one script tag:
//
//   <script src="https://host/embed.js" data-model="smollm2-135m-instruct" defer></script>
//
// adds a launcher button (bottom right) that opens a chat panel; with data-target="#id" the panel is
// rendered inline into that element instead. Other attributes: data-title (the panel's heading),
// data-max-tokens (per reply, default 256), data-system (a system prompt), data-preload (start
// loading the model at once instead of when the launcher is first opened).
//
// The widget's DOM and styles live in a shadow root of one host element, so the page's CSS and the
// widget's do not touch. It defines one global, `window.webggufEmbed` (`window.webgguf` is the chat
// page's): {version, widgets, mount(options)}. Everything else (the engine, its worker, Pyodide, the
// wheels, the shaders, the models of the manifest) is loaded relative to this script's URL, so the
// page may be of another origin: the asset server must send CORS headers (`webgguf serve` does);
// see docs/BROWSER.md "Embedding: embed.js".
//
// This is a classic script (the tag has no type="module"): no static import, no import.meta, one
// function scope. The engine (webgguf.js, an ES module) comes by a dynamic import(), and with it
// what the chat page uses too: chatTurn (one chat turn: what the model is sent, the rule for a turn
// without a reply, the notes) and MarkdownView (replies rendered as Markdown into DOM nodes: model
// output never reaches the DOM as HTML) with its style sheet.
(function () {
  "use strict";

  const script = document.currentScript; // null once this first run is over: read it now
  const DEFAULT_MAX_TOKENS = 256;
  const VERSION = 1;

  // ---- the namespace: created by the first embed.js on the page. A later one (another tag) hands
  // its tag to the first one's mount(), so that all widgets share its engines (see sharedEngine).

  const earlier = window.webggufEmbed;
  const namespace = earlier || {
    version: VERSION,
    widgets: [], // every widget on the page, in the order they were mounted
    // mount({model, src, target, title, maxTokens, system, preload}): a widget from code; `src` is
    // the URL of embed.js (where the engine's files are), by default the first embed.js's.
    mount: (options) => mount(options),
    base: null, // the URL of the first embed.js
  };
  window.webggufEmbed = namespace;

  // Security-policy violations the page reports (a blocked import, worker or fetch): the widget
  // names them in its error message, since the error thrown (e.g. "Failed to fetch") does not say.
  const violations = [];
  if (!earlier) {
    document.addEventListener("securitypolicyviolation", (event) => {
      violations.push({ directive: event.violatedDirective, uri: event.blockedURI || "inline" });
    });
  }

  function mountFromTag(options) {
    try {
      (earlier ? earlier.mount : mount)(options);
    } catch (error) {
      console.error(`webgguf embed.js: ${error.message}`);
    }
  }

  // ---- one widget

  function mount(given) {
    if (!given.src && !namespace.base) throw new Error("mount() needs `src`: the URL of embed.js");
    const src = new URL(given.src || namespace.base, document.baseURI).href;
    const settings = {
      src,
      model: modelReference(given.model),
      title: given.title || "Chat",
      maxTokens: positiveInteger(given.maxTokens, DEFAULT_MAX_TOKENS),
      system: given.system || "",
    };
    let target = null;
    if (given.target) {
      target = typeof given.target === "string" ? document.querySelector(given.target) : given.target;
      if (!target) throw new Error(`data-target ${given.target} matches no element of this page`);
    }
    const widget = new Widget(settings, target);
    namespace.widgets.push(widget);
    if (target || given.preload) widget.load();
    return widget;
  }

  // A manifest name stays a name (webgguf.js looks it up on the asset server); a URL is made
  // absolute against the host page, as any URL written in its HTML.
  function modelReference(model) {
    if (!model) return "";
    if (/^[a-z0-9][a-z0-9._-]*$/i.test(model) && !/\.gguf$/i.test(model)) return model;
    return new URL(model, document.baseURI).href;
  }

  function positiveInteger(value, fallback) {
    const n = Number.parseInt(value, 10);
    return Number.isFinite(n) && n > 0 ? n : fallback;
  }

  class Widget {
    constructor(settings, target) {
      this.settings = settings;
      this.inline = !!target;
      this.engine = null;
      this.api = null; // the webgguf.js module: chatTurn, MarkdownView, markdownCss
      this.state = "idle"; // idle → loading → ready ⇄ generating; error
      this.history = []; // the conversation: the transcript of chatTurn (webgguf.js)
      this.generating = null; // AbortController of the running reply
      this.loading = null; // the promise of load()
      this.ready = new Promise((resolve, reject) => {
        this.loaded = { resolve, reject };
      });
      this.ready.catch(() => {}); // shown in the widget; not an unhandled rejection of the page

      this.element = document.createElement("div"); // the host of the shadow root
      this.element.setAttribute("data-webgguf-embed", "");
      if (this.inline) this.element.setAttribute("data-inline", ""); // fills the target (see CSS)
      const root = this.element.attachShadow({ mode: "open" });
      this.root = root;
      adoptStyles(root, CSS);
      this.ui = build(root, settings.title, this.inline);
      this.bind();
      if (this.inline) target.append(this.element);
      else document.body.append(this.element);
      this.setState("idle");
    }

    bind() {
      const ui = this.ui;
      ui.form.addEventListener("submit", (event) => {
        event.preventDefault();
        this.send(ui.input.value);
      });
      ui.input.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          this.send(ui.input.value);
        }
      });
      ui.input.addEventListener("input", () => this.updateControls());
      ui.stop.addEventListener("click", () => this.stop());
      if (this.inline) return;
      ui.launcher.addEventListener("click", () => (ui.panel.hidden ? this.open() : this.close()));
      ui.close.addEventListener("click", () => this.close());
      ui.panel.addEventListener("keydown", (event) => {
        if (event.key === "Escape") {
          event.stopPropagation();
          this.close();
        }
      });
    }

    open() {
      if (this.inline) return;
      this.ui.panel.hidden = false;
      this.ui.launcher.setAttribute("aria-expanded", "true");
      this.ui.input.focus();
      this.load();
    }

    close() {
      if (this.inline) return;
      this.ui.panel.hidden = true;
      this.ui.launcher.setAttribute("aria-expanded", "false");
      this.ui.launcher.focus();
    }

    // Start the engine and load the model (once); resolves like `ready`.
    load() {
      this.loading = this.loading || this.start();
      return this.ready;
    }

    async start() {
      const { src, model } = this.settings;
      this.setState("loading");
      try {
        if (!model) throw new Error("no model: add data-model=\"NAME_OR_URL\" to the script tag");
        const { engine, api } = await sharedEngine(src, model, {
          onProgress: (event) => this.onProgress(event),
          onLost: (message) => this.fail(`The GPU device was lost (${message}). Reload the page to continue.`),
        });
        this.engine = engine;
        this.api = api;
        adoptStyles(this.root, api.markdownCss);
        this.setState("ready");
        if (document.activeElement === this.element) this.ui.input.focus(); // it was disabled until now
        this.loaded.resolve(this);
      } catch (error) {
        // A policy violation is reported by an event that may come a moment after the error.
        await new Promise((resolve) => setTimeout(resolve, 100));
        this.fail(describe(error, `Could not start the chat (${model || "no model"})`, src));
        this.loaded.reject(error);
      }
    }

    onProgress({ loaded, total, stage }) {
      if (stage) {
        this.progress(`${stage}…`);
        return;
      }
      const mb = (n) => (n / 1e6).toFixed(1);
      if (total) this.progress(`Downloading the model: ${mb(loaded)} of ${mb(total)} MB`, loaded / total);
      else this.progress(`Downloading the model: ${mb(loaded)} MB`);
    }

    progress(text, fraction = null) {
      this.ui.progressText.textContent = text;
      if (fraction === null) this.ui.progressBar.removeAttribute("value");
      else this.ui.progressBar.value = fraction;
    }

    fail(message) {
      this.generating?.abort();
      this.ui.alert.textContent = message;
      this.ui.alert.hidden = false;
      if (!this.inline) {
        // A closed panel shows nothing: the launcher gets a mark and says so.
        this.ui.launcher.classList.add("error");
        this.ui.launcher.setAttribute("aria-label", `Open the chat: ${this.settings.title} (it failed to start)`);
      }
      this.setState("error");
    }

    setState(state) {
      this.state = state;
      this.ui.panel.dataset.state = state;
      this.ui.progressBox.hidden = state !== "loading";
      const status = { idle: "", loading: "Loading…", ready: "Ready", generating: "Writing…", error: "Error" };
      this.ui.status.textContent = status[state];
      this.updateControls();
    }

    updateControls() {
      const { input, send, stop } = this.ui;
      const usable = this.state === "ready" || this.state === "generating";
      input.disabled = !usable;
      send.disabled = this.state !== "ready" || !input.value.trim();
      send.hidden = this.state === "generating";
      stop.hidden = this.state !== "generating";
    }

    // Send a user message and stream the reply; resolves with the reply's text when it ends.
    async send(text) {
      text = String(text ?? "").trim();
      if (!text || this.state !== "ready") return null;
      const { ui, settings } = this;
      const { chatTurn, MarkdownView, NO_REPLY } = this.api;
      ui.input.value = "";
      ui.empty.hidden = true;
      const user = addMessage(ui.messages, "user", text);
      const reply = addMessage(ui.messages, "assistant", "");
      reply.classList.add("pending");
      const follow = () => {
        if (nearBottom(ui.messages)) ui.messages.scrollTop = ui.messages.scrollHeight;
      };
      const view = new MarkdownView(reply.firstChild, { onDraw: follow });
      const controller = new AbortController();
      this.generating = controller;
      this.setState("generating");
      const turn = await chatTurn(this.engine, this.history, text, {
        system: settings.system,
        params: { max_tokens: settings.maxTokens },
        signal: controller.signal,
        onText: (delta) => view.append(delta),
      });
      this.generating = null;
      view.finish();
      reply.classList.remove("pending");
      reply.dataset.finish = turn.finish;
      for (const note of turn.notes) addNote(reply, note);
      if (turn.error) addNote(reply, describe(turn.error, "The reply failed", settings.src), true);
      if (!turn.reply) {
        reply.remove();
        addNote(user, NO_REPLY);
      }
      if (this.state === "generating") this.setState("ready");
      if (document.activeElement === this.element) ui.input.focus(); // only when focus is in the widget
      return turn.reply?.content ?? "";
    }

    stop() {
      this.generating?.abort();
    }
  }

  // ---- the engine

  // Widgets of the same engine URL and model share one engine (one worker, one copy of the weights
  // on the GPU); their requests queue in the worker. A failed start is forgotten, so a later widget
  // tries again. `onProgress({loaded, total} | {stage})`, `onLost(message)`: per widget.
  // Resolves to {engine, api}: api is the webgguf.js module.
  const engines = new Map(); // "webgguf.js URL + model" → {promise, progress: Set, lost: Set}
  function sharedEngine(src, model, { onProgress, onLost }) {
    const api = new URL("webgguf.js", src).href;
    const key = `${api} ${model}`;
    let entry = engines.get(key);
    if (!entry) {
      entry = { progress: new Set(), lost: new Set() };
      entry.promise = startEngine(api, model, entry);
      entry.promise.catch(() => engines.delete(key));
      engines.set(key, entry);
    }
    entry.progress.add(onProgress);
    entry.lost.add(onLost);
    return entry.promise.finally(() => entry.progress.delete(onProgress));
  }

  async function startEngine(api, model, entry) {
    const progress = (event) => entry.progress.forEach((listener) => listener(event));
    progress({ stage: "Loading the chat engine" });
    const module = await import(api);
    const { Engine } = module;
    progress({ stage: "Starting Python" });
    const engine = new Engine();
    engine.onDeviceLost = (message) => entry.lost.forEach((listener) => listener(message));
    try {
      await engine.ready;
      if (engine.gpuError) {
        throw new Error(
          `WebGPU is not available here (${engine.gpuError}). It needs a browser with WebGPU ` +
            "(Chrome or Edge 113+ on desktop, Safari 26, Firefox 141+ on Windows) and a secure (https) page.",
        );
      }
      progress({ stage: "Downloading the model" });
      await engine.load(model, { onProgress: progress });
    } catch (error) {
      engine.terminate(); // its worker and GPU memory: nobody will use this one
      throw error;
    }
    return { engine, api: module };
  }

  // A readable message for an error of the engine, the network or the page's policies.
  // `src`: the URL of embed.js (the page's own violations elsewhere are not the widget's business).
  function describe(error, context, src) {
    const type = error && error.type && error.type !== "Error" ? `${error.type}: ` : "";
    const text = `${type}${error && error.message ? error.message : String(error)}`;
    const origin = new URL(src).origin;
    const ours = violations.filter(({ uri }) => ["blob", "eval", "wasm-eval"].includes(uri) || uri.startsWith(origin));
    if (ours.length) {
      const what = ours.slice(-3).map(({ directive, uri }) => `${directive} blocked ${uri}`);
      return (
        `${context}: this page's Content-Security-Policy blocks what the chat needs (${what.join("; ")}); ` +
        `see "Embedding: embed.js" in webgguf's docs/BROWSER.md. (${text})`
      );
    }
    let message = `${context}: ${text}`;
    if ((error?.name === "TypeError" || error?.type === "TypeError") && /fetch|import/i.test(text)) {
      message +=
        `. The chat's files could not be fetched from ${origin}: is that server up, does it send ` +
        "Access-Control-Allow-Origin, and does this page's Content-Security-Policy allow connect-src to it?";
    } else if (error && error.name === "SecurityError") {
      message += ". The page does not allow this (its Content-Security-Policy: worker-src must allow blob:).";
    }
    return message;
  }

  // ---- DOM (inside the shadow root)

  function element(tag, attributes = {}, children = []) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) {
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, value);
    }
    node.append(...children);
    return node;
  }

  let nextId = 0;
  function build(root, title, inline) {
    const id = `webgguf-embed-${nextId++}`; // ids are scoped to the shadow root; unique anyway
    const ui = {};
    ui.status = element("span", { class: "status", role: "status", "aria-live": "polite" });
    ui.close = element("button", { class: "icon close", type: "button", "aria-label": "Close the chat", text: "×" });
    const header = element("header", {}, [element("h2", { id: `${id}-title`, text: title }), ui.status]);
    if (!inline) header.append(ui.close);
    ui.progressBar = element("progress", { "aria-labelledby": `${id}-progress` });
    ui.progressText = element("span", { id: `${id}-progress` });
    ui.progressBox = element("div", { class: "progress" }, [ui.progressText, ui.progressBar]);
    ui.alert = element("p", { class: "alert", role: "alert" });
    ui.alert.hidden = true;
    const hint = "The model runs in your browser: what you type stays on this device.";
    ui.empty = element("p", { class: "empty", text: hint });
    const log = { class: "messages", role: "log", "aria-live": "polite", "aria-label": "Messages" };
    ui.messages = element("div", log, [ui.empty]);
    ui.input = element("textarea", { rows: "1", placeholder: "Message…", "aria-label": "Message" });
    ui.send = element("button", { class: "send", type: "submit", text: "Send" });
    ui.stop = element("button", { class: "stop", type: "button", text: "Stop" });
    ui.form = element("form", { class: "composer" }, [ui.input, ui.send, ui.stop]);
    const kind = inline ? "panel inline" : "panel floating";
    const panel = { class: kind, id: `${id}-panel`, "aria-labelledby": `${id}-title` };
    ui.panel = element("section", panel, [header, ui.progressBox, ui.alert, ui.messages, ui.form]);
    if (inline) {
      root.append(ui.panel);
      return ui;
    }
    ui.panel.setAttribute("role", "dialog");
    ui.panel.hidden = true;
    ui.launcher = element("button", {
      class: "launcher",
      type: "button",
      "aria-expanded": "false",
      "aria-controls": `${id}-panel`,
      "aria-label": `Open the chat: ${title}`,
    });
    ui.launcher.append(chatIcon());
    root.append(ui.panel, ui.launcher);
    return ui;
  }

  function chatIcon() {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("aria-hidden", "true");
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", "M4 5h16v10H9l-5 4z");
    svg.append(path);
    return svg;
  }

  // A message: its text in .text (a reply's is the element its MarkdownView renders into).
  function addMessage(list, role, text) {
    const bubble = element("div", { class: `message ${role}` }, [element("div", { class: "text", text })]);
    bubble.setAttribute("aria-label", role === "user" ? "You" : "Assistant");
    list.append(bubble);
    list.scrollTop = list.scrollHeight;
    return bubble;
  }

  function addNote(bubble, text, error = false) {
    bubble.append(element("span", { class: error ? "note error" : "note", text }));
  }

  function nearBottom(list) {
    return list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  }

  // Adds a style sheet to the shadow root. Constructable style sheets are not "inline styles" for a
  // Content-Security-Policy, so a page without style-src 'unsafe-inline' still styles the widget; a
  // <style> element where they are missing.
  function adoptStyles(root, css) {
    if ("adoptedStyleSheets" in root && typeof CSSStyleSheet === "function") {
      try {
        const sheet = new CSSStyleSheet();
        sheet.replaceSync(css);
        root.adoptedStyleSheets = [...root.adoptedStyleSheets, sheet];
        return;
      } catch {
        // an old browser: fall through
      }
    }
    root.append(element("style", { text: css }));
  }

  const CSS = `
:host { all: initial; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330;
  --accent: #3b5bdb; --bg: #fff; --muted: #667085; --line: #d9dee8; --user: #e8edff; --bot: #f3f4f7; }
:host(:not([hidden])) { display: block; }
:host([data-inline]) { height: 100%; }
@media (prefers-color-scheme: dark) {
  :host { color: #e6e8ee; --bg: #171a21; --muted: #9aa3b5; --line: #2e3442; --user: #263156; --bot: #222733;
    --accent: #7d95ff; }
}
* { box-sizing: border-box; }
[hidden] { display: none !important; }
button, textarea { font: inherit; color: inherit; }
button:focus-visible, textarea:focus-visible { outline: 2px solid var(--accent); outline-offset: 2px; }
.launcher { position: fixed; right: 20px; bottom: 20px; z-index: 2147483000; width: 56px; height: 56px;
  border: 0; border-radius: 50%; background: var(--accent); color: #fff; cursor: pointer;
  box-shadow: 0 6px 20px rgba(0, 0, 0, 0.25); display: grid; place-items: center; }
.launcher.error::after { content: ""; position: absolute; top: 2px; right: 2px; width: 14px; height: 14px;
  border-radius: 50%; background: #e03131; border: 2px solid #fff; }
.empty { margin: auto; max-width: 260px; text-align: center; color: var(--muted); font-size: 13px; }
.launcher svg { width: 26px; height: 26px; fill: none; stroke: currentColor; stroke-width: 2; stroke-linejoin: round; }
.panel { display: flex; flex-direction: column; background: var(--bg); border: 1px solid var(--line);
  border-radius: 12px; overflow: hidden; }
.panel.floating { position: fixed; right: 20px; bottom: 88px; z-index: 2147483000;
  width: min(380px, calc(100vw - 40px));
  height: min(560px, calc(100vh - 120px)); box-shadow: 0 12px 40px rgba(0, 0, 0, 0.25); }
.panel.inline { height: 100%; min-height: 320px; }
header { display: flex; align-items: center; gap: 8px; padding: 10px 12px; border-bottom: 1px solid var(--line); }
h2 { margin: 0; font-size: 15px; font-weight: 600; flex: 1; }
.status { color: var(--muted); font-size: 12px; }
.icon { border: 0; background: none; cursor: pointer; font-size: 20px; line-height: 1; padding: 2px 6px;
  border-radius: 6px; }
.progress { padding: 10px 12px; display: grid; gap: 6px; color: var(--muted); font-size: 13px; }
progress { width: 100%; height: 6px; accent-color: var(--accent); }
.alert { margin: 8px 12px; padding: 8px 10px; border-radius: 8px; background: #fdecec; color: #8a1c1c;
  font-size: 13px; white-space: pre-wrap; }
.messages { flex: 1; overflow-y: auto; padding: 12px; display: flex; flex-direction: column; gap: 8px; }
.message { max-width: 85%; min-width: 0; padding: 8px 10px; border-radius: 10px; overflow-wrap: anywhere; }
.message.user { align-self: flex-end; background: var(--user); white-space: pre-wrap; }
.message.assistant { align-self: flex-start; background: var(--bot);
  --md-border: var(--line); --md-muted: var(--muted); --md-code-bg: var(--bg); --md-link: var(--accent); }
.message.pending .text:empty::after { content: "…"; color: var(--muted); }
.note { display: block; margin-top: 4px; font-size: 12px; color: var(--muted); }
.note.error { color: #c92a2a; }
.composer { display: flex; gap: 8px; padding: 10px 12px; border-top: 1px solid var(--line); }
textarea { flex: 1; resize: none; min-height: 38px; max-height: 120px; padding: 8px 10px; border: 1px solid var(--line);
  border-radius: 8px; background: transparent; }
.send, .stop { border: 0; border-radius: 8px; padding: 0 14px; cursor: pointer; background: var(--accent);
  color: #fff; }
.stop { background: #c92a2a; }
button:disabled, textarea:disabled { opacity: 0.5; cursor: default; }
`;

  // ---- start: last, so that every class and constant above is initialized

  if (!script || !script.src) {
    console.error("webgguf embed.js: load it with <script src=\".../embed.js\" data-model=...> (a classic script)");
    return;
  }
  namespace.base = namespace.base || script.src;

  const options = {
    src: script.src,
    model: script.dataset.model,
    target: script.dataset.target,
    title: script.dataset.title,
    maxTokens: script.dataset.maxTokens,
    system: script.dataset.system,
    preload: script.dataset.preload !== undefined && script.dataset.preload !== "false",
  };
  // A deferred script runs after parsing; an async or injected one may run before <body> exists.
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => mountFromTag(options), { once: true });
  } else {
    mountFromTag(options);
  }
})();
