// Markdown of model replies, rendered into DOM nodes, safely and incrementally. The chat page
// (app.js) and the widget (embed.js, through webgguf.js) render with this module.
//
// Model output is untrusted. markdown-it, with HTML disabled, parses it into tokens; this module
// turns the tokens into a small tree of fixed tags and attributes (markdownBlocks) and builds DOM
// nodes from that tree with createElement / createTextNode only. No string of the model is ever
// parsed as HTML: "<script>" in a reply is the text "<script>". Links are kept for http:, https: and
// mailto: only (checked by the browser's own URL parser), open in a new tab with rel="noopener
// noreferrer"; images are never loaded but shown as a link to them (an image URL is a way to send
// what the page holds to another server, and the page's COEP blocks most of them anyway).
//
// Streaming (MarkdownView): CommonMark never reopens a block once another follows it, so while a
// reply streams only its last top-level block changes. BlockStream parses from the start of that
// block only (the blocks before it are final: their parse is kept), so a drawing costs the size of
// the last block, not of the reply; MarkdownView then builds again only the blocks whose source
// changed (in practice the last one): the blocks before it keep their nodes (no flicker, no re-layout
// of earlier text), and a code block being written grows by appending to its text node. Drawings
// come once per animation frame; the last one, when the reply ends, parses it whole (a link reference
// definition may change an earlier block that uses it).
import MarkdownIt from "markdown-it";

const parser = new MarkdownIt({ html: false, linkify: true });
// Only URLs written out (https://…, mailto:…) become links; "example.com" or "a@b.c" stay text.
parser.linkify.set({ fuzzyLink: false, fuzzyEmail: false });

// The tags and attributes the tree may hold: toDom refuses anything else.
const TAGS = new Set([
  "p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol", "li", "hr", "div",
  "table", "thead", "tbody", "tr", "th", "td", "em", "strong", "s", "code", "a", "br", "span",
]);
const ATTRIBUTES = new Set(["href", "title", "target", "rel", "start", "class"]);
const LINK_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);
const ALIGNMENTS = { "text-align:left": "align-left", "text-align:center": "align-center", "text-align:right": "align-right" };
const MAX_LANGUAGE = 40; // characters of a code block's language label

// An absolute http(s) or mailto URL, as the browser parses it; null for anything else.
export function safeUrl(url) {
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    return null; // relative, or not a URL
  }
  return LINK_PROTOCOLS.has(parsed.protocol) ? parsed.href : null;
}

// ---- text → blocks (plain data: no DOM, so node tests it)

// markdown-it reads "\r\n" and "\r" as line ends: so does the line counting here.
const normalize = (text) => text.replace(/\r\n?/g, "\n");

// The top-level blocks of `text`: [{key, line, node}]. `node` is a tree of {tag, attrs, children}
// with strings for text, or {tag: "code-block", language, code} for fenced and indented code; `line`
// is the block's first line. `key` changes whenever the block's rendering may: its kind, first line
// and source (and, for a block with brackets, the link reference definitions, which it may use).
export function markdownBlocks(text) {
  return parseBlocks(normalize(text), 0, {}).blocks;
}

// Blocks of `text` as markdownBlocks, for text that starts at line `firstLine` of the reply, where
// the text before it defined `references`. Also returns the references known after `text`.
function parseBlocks(text, firstLine, references) {
  const env = { references: { ...references } };
  const tokens = parser.parse(text, env);
  const lines = text.split("\n");
  const known = JSON.stringify(env.references);
  const blocks = [];
  for (let i = 0; i < tokens.length; ) {
    const first = tokens[i];
    let end = i + 1; // one past the block's last token
    if (first.nesting === 1) {
      let depth = 1;
      while (depth > 0 && end < tokens.length) depth += tokens[end++].nesting;
    }
    const [begin, stop] = first.map ?? [0, 0];
    const source = lines.slice(begin, stop).join("\n");
    const line = firstLine + begin;
    const key = `${first.type}@${line}\n${source}${source.includes("]") ? `\n${known}` : ""}`;
    const node = blockTree(tokens, i, end);
    if (node) blocks.push({ key, line, node });
    i = end;
  }
  return { blocks, references: env.references };
}

// The blocks of a text that grows (a streaming reply), parsing from the start of its last block only.
// blocks(text) equals markdownBlocks(text) for a text without link reference definitions; with one,
// a block before it that uses it shows its text until markdownBlocks parses the reply whole.
export class BlockStream {
  constructor() {
    this.text = ""; // the text of the last call, normalized
    this.final = []; // the blocks before the last one
    this.offset = 0; // where the last block's first line starts in `text`
    this.line = 0; // that line's number
    this.references = {}; // those defined before `offset`
  }

  blocks(text) {
    text = normalize(text);
    if (!text.startsWith(this.text)) Object.assign(this, new BlockStream()); // not a continuation
    this.text = text;
    const { blocks } = parseBlocks(text.slice(this.offset), this.line, this.references);
    if (blocks.length > 1) {
      // Every block but the last is final: keep it, and parse from the last one's line from now on.
      const last = blocks[blocks.length - 1];
      let offset = this.offset;
      for (let line = this.line; line < last.line; line++) offset = text.indexOf("\n", offset) + 1;
      const settled = text.slice(this.offset, offset);
      if (settled.includes("]:")) this.references = parseBlocks(settled, this.line, this.references).references;
      this.final.push(...blocks.slice(0, -1));
      this.offset = offset;
      this.line = last.line;
      return [...this.final, last];
    }
    return [...this.final, ...blocks];
  }
}

// The tree of tokens[begin, end): one top-level block.
function blockTree(tokens, begin, end) {
  const root = { tag: "div", attrs: {}, children: [] };
  const stack = [root];
  for (let i = begin; i < end; i++) {
    const token = tokens[i];
    const parent = stack[stack.length - 1];
    if (token.nesting === 1) {
      // A tight list's paragraphs are hidden: their text goes straight into the list item.
      const node = token.hidden ? { tag: null, children: parent.children } : openBlock(token);
      if (!token.hidden) parent.children.push(node);
      stack.push(node);
    } else if (token.nesting === -1) {
      stack.pop();
    } else {
      parent.children.push(...leafBlock(token));
    }
  }
  const [node] = root.children;
  if (node?.tag === "table") return { tag: "div", attrs: { class: "md-table" }, children: [node] }; // scrolls sideways
  return node ?? null;
}

function openBlock(token) {
  const attrs = {};
  if (token.tag === "ol") {
    const start = Number.parseInt(token.attrGet("start") ?? "1", 10);
    if (Number.isSafeInteger(start) && start !== 1) attrs.start = String(start);
  }
  if (token.tag === "th" || token.tag === "td") {
    const align = ALIGNMENTS[token.attrGet("style") ?? ""];
    if (align) attrs.class = align;
  }
  // Every block tag markdown-it opens is in TAGS; anything else (a plugin's) becomes a div.
  return { tag: TAGS.has(token.tag) ? token.tag : "div", attrs, children: [] };
}

// The nodes of a token without children of its own: inline content, code, a rule.
function leafBlock(token) {
  switch (token.type) {
    case "inline":
      return inlineNodes(token.children ?? []);
    case "fence": {
      const language = token.info.trim().split(/\s+/)[0].slice(0, MAX_LANGUAGE);
      return [{ tag: "code-block", language, code: token.content.replace(/\n$/, "") }];
    }
    case "code_block":
      return [{ tag: "code-block", language: "", code: token.content.replace(/\n$/, "") }];
    case "hr":
      return [{ tag: "hr", attrs: {}, children: [] }];
    default:
      // html_block cannot occur (HTML is off); anything else is shown as the text it is.
      return token.content ? [{ tag: "p", attrs: {}, children: [token.content] }] : [];
  }
}

const INLINE_TAGS = { em_open: "em", strong_open: "strong", s_open: "s" };

function inlineNodes(tokens) {
  const root = { children: [] };
  const stack = [root];
  for (const token of tokens) {
    const parent = stack[stack.length - 1];
    if (token.type in INLINE_TAGS) {
      const node = { tag: INLINE_TAGS[token.type], attrs: {}, children: [] };
      parent.children.push(node);
      stack.push(node);
    } else if (token.type === "link_open") {
      const href = safeUrl(token.attrGet("href"));
      // A link to anything else keeps its text, without the link.
      const node = href ? { tag: "a", attrs: linkAttributes(href, token.attrGet("title")), children: [] } : { tag: "span", attrs: {}, children: [] };
      parent.children.push(node);
      stack.push(node);
    } else if (token.nesting === -1) {
      if (stack.length > 1) stack.pop();
    } else if (token.type === "softbreak" || token.type === "hardbreak") {
      // A single newline breaks the line too: models write line by line, not for a reflowing reader.
      parent.children.push({ tag: "br", attrs: {}, children: [] });
    } else if (token.type === "code_inline") {
      parent.children.push({ tag: "code", attrs: {}, children: [token.content] });
    } else if (token.type === "image") {
      parent.children.push(imageLink(token));
    } else if (token.content) {
      parent.children.push(token.content); // text (and html_inline, which cannot occur: HTML is off)
    }
  }
  return root.children;
}

function linkAttributes(href, title) {
  const attrs = { href, target: "_blank", rel: "noopener noreferrer" };
  if (title) attrs.title = title;
  return attrs;
}

// An image is shown as a link to it, labelled with its alt text: never loaded.
function imageLink(token) {
  const alt = (token.children ?? []).map((child) => child.content).join("") || "image";
  const href = safeUrl(token.attrGet("src"));
  if (!href) return { tag: "span", attrs: { class: "md-image" }, children: [alt] };
  return { tag: "a", attrs: { ...linkAttributes(href, token.attrGet("title")), class: "md-image" }, children: [alt] };
}

// ---- streaming: which blocks to build again

// The index of the first block whose key differs (all of `shown` when `next` only adds blocks).
export function firstChange(shown, next) {
  let i = 0;
  while (i < shown.length && i < next.length && shown[i] === next[i]) i++;
  return i;
}

// The text a code block being written gained, when `next` is `shown` with more code at its end
// (same language); null when the block must be built again.
export function codeGrowth(shown, next) {
  if (shown?.tag !== "code-block" || next?.tag !== "code-block" || shown.language !== next.language) return null;
  return next.code.startsWith(shown.code) ? next.code.slice(shown.code.length) : null;
}

// ---- blocks → DOM

function toDom(node) {
  if (typeof node === "string") return document.createTextNode(node);
  if (node.tag === "code-block") return codeBlock(node);
  if (!TAGS.has(node.tag)) throw new Error(`markdown: the tag ${node.tag} is not allowed`);
  const element = document.createElement(node.tag);
  for (const [name, value] of Object.entries(node.attrs ?? {})) {
    if (!ATTRIBUTES.has(name)) throw new Error(`markdown: the attribute ${name} is not allowed`);
    element.setAttribute(name, value);
  }
  for (const child of node.children ?? []) element.append(toDom(child));
  return element;
}

// <div class="md-code"><div class="md-code-bar"><span class="md-code-language">py</span>
// <button class="md-copy">Copy</button></div><pre><code>…</code></pre></div>
function codeBlock({ language, code }) {
  const box = document.createElement("div");
  box.className = "md-code";
  const bar = document.createElement("div");
  bar.className = "md-code-bar";
  const label = document.createElement("span");
  label.className = "md-code-language";
  label.textContent = language || "code";
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "md-copy";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", `Copy the ${language || "code"} code`);
  const pre = document.createElement("pre");
  const element = document.createElement("code");
  element.append(document.createTextNode(code));
  pre.append(element);
  copy.addEventListener("click", () => copyCode(copy, element.textContent));
  bar.append(label, copy);
  box.append(bar, pre);
  return box;
}

async function copyCode(button, text) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
  } catch {
    button.textContent = "Copy failed"; // no clipboard access (an insecure page, a denied permission)
  }
  setTimeout(() => (button.textContent = "Copy"), 1500);
}

// A reply rendered into `element` (class "markdown"), as it streams: append(delta) as text arrives,
// finish() when it ends (draws at once). set(text) replaces the whole text. onDraw() is called
// after each drawing (e.g. to keep the newest text in sight).
export class MarkdownView {
  constructor(element, { onDraw = null } = {}) {
    this.element = element;
    this.onDraw = onDraw;
    this.element.classList.add("markdown");
    this.text = "";
    this.stream = new BlockStream();
    this.shown = []; // [{key, line, node: tree node, dom: its DOM node}], one per top-level block
    this.frame = 0; // the pending animation frame, 0 when none
  }

  append(delta) {
    this.text += delta;
    this.frame ||= requestAnimationFrame(() => this.draw(this.stream.blocks(this.text)));
  }

  set(text) {
    this.text = text;
    this.finish();
  }

  finish() {
    this.draw(markdownBlocks(this.text));
  }

  draw(blocks) {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    let i = firstChange(this.shown.map((b) => b.key), blocks.map((b) => b.key));
    const last = this.shown[this.shown.length - 1];
    if (i === this.shown.length - 1 && i < blocks.length) {
      const growth = codeGrowth(last.node, blocks[i].node);
      if (growth !== null) {
        if (growth) last.dom.querySelector("code").firstChild.appendData(growth);
        Object.assign(last, blocks[i]);
        i += 1;
      }
    }
    // From the end, so that the blocks before `i` are never touched.
    while (this.shown.length > i) this.shown.pop().dom.remove();
    for (const block of blocks.slice(i)) {
      const dom = toDom(block.node);
      this.element.append(dom);
      this.shown.push({ ...block, dom });
    }
    this.onDraw?.();
  }
}

// `text` rendered at once into a new <div class="markdown"> (a stored reply).
export function renderMarkdown(text) {
  const view = new MarkdownView(document.createElement("div"));
  view.set(text);
  return view.element;
}
