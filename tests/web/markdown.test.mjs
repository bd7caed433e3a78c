// web/markdown.js without a browser: the trees it builds (what becomes DOM nodes) for replies and for
// a corpus of XSS payloads, and the property streaming relies on (blocks before the last are final).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { BlockStream, codeGrowth, firstChange, markdownBlocks, safeUrl } from "../../web/markdown.js";

const XSS = JSON.parse(readFileSync(new URL("./xss_corpus.json", import.meta.url), "utf8"));
const TAGS = new Set([
  "p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol", "li", "hr", "div",
  "table", "thead", "tbody", "tr", "th", "td", "em", "strong", "s", "code", "a", "br", "span", "code-block",
]);
const ATTRIBUTES = new Set(["href", "title", "target", "rel", "start", "class"]);

// Every element node of the blocks, depth first.
function* elements(nodes) {
  for (const node of nodes) {
    if (typeof node === "string") continue;
    yield node;
    yield* elements(node.children ?? []);
  }
}

// The text a block shows (code included).
function text(node) {
  if (typeof node === "string") return node;
  if (node.tag === "code-block") return node.code;
  return (node.children ?? []).map(text).join(node.tag === "br" ? "\n" : "");
}

const blockNodes = (source) => markdownBlocks(source).map((b) => b.node);
const only = (source) => {
  const nodes = blockNodes(source);
  assert.equal(nodes.length, 1, source);
  return nodes[0];
};

// Checks the blocks of `source` (a string, parsed whole) or the given block nodes.
function assertSafe(source) {
  const nodes = typeof source === "string" ? blockNodes(source) : source;
  for (const node of elements(nodes)) {
    assert.ok(TAGS.has(node.tag), `${node.tag} from ${JSON.stringify(source)}`);
    for (const [name, value] of Object.entries(node.attrs ?? {})) {
      assert.ok(ATTRIBUTES.has(name), `${name} from ${JSON.stringify(source)}`);
      if (name === "href") assert.match(value, /^(https?:\/\/|mailto:)/, source);
      if (name === "class") assert.match(value, /^(md-table|md-image|align-(left|center|right))$/, source);
      if (name === "start") assert.match(value, /^\d+$/, source);
    }
    if (node.tag === "a") {
      assert.equal(node.attrs.target, "_blank");
      assert.equal(node.attrs.rel, "noopener noreferrer");
    }
  }
}

test("no payload of the XSS corpus gives a tag, attribute or URL outside the allowed ones", () => {
  for (const payload of XSS) assertSafe(payload);
});

test("the XSS corpus as one reply is safe at every step of its stream, and whole", () => {
  const reply = XSS.join("\n\n");
  const stream = new BlockStream(); // what MarkdownView draws while the reply streams
  for (let end = 1; end <= reply.length; end += 1) assertSafe(stream.blocks(reply.slice(0, end)).map((b) => b.node));
  assertSafe(markdownBlocks(reply).map((b) => b.node)); // the drawing when it ends
});

test("HTML in a reply is shown as the text it is", () => {
  assert.equal(text(only("<script>xss(1)</script>")), "<script>xss(1)</script>");
  assert.equal(text(only("a <img src=x onerror=xss(2)> b")), "a <img src=x onerror=xss(2)> b");
  assert.equal(text(only("&lt;b&gt; &amp; &#60;i&#62;")), "<b> & <i>"); // entities are decoded into text
  const code = only("```html\n<script>xss(38)</script>\n```");
  assert.deepEqual(code, { tag: "code-block", language: "html", code: "<script>xss(38)</script>" });
});

test("links are kept for http, https and mailto only; images become links, never loaded", () => {
  assert.equal(safeUrl("https://example.com/a?b=1#c"), "https://example.com/a?b=1#c");
  assert.equal(safeUrl("mailto:someone@example.com"), "mailto:someone@example.com");
  for (const url of ["javascript:alert(1)", " java\tscript:alert(1)", "data:text/html,x", "/relative", "#top", "file:///x"]) {
    assert.equal(safeUrl(url), null, url);
  }
  const [link] = only("[the docs](https://example.com/docs \"Docs\")").children;
  assert.deepEqual(link, {
    tag: "a",
    attrs: { href: "https://example.com/docs", target: "_blank", rel: "noopener noreferrer", title: "Docs" },
    children: ["the docs"],
  });
  assert.deepEqual(only("[x](javascript:xss(1))").children, ["[x](javascript:xss(1))"]); // not a link at all
  const [image] = only("![a *cat*](https://example.com/cat.png)").children;
  assert.equal(image.tag, "a");
  assert.equal(image.attrs.href, "https://example.com/cat.png");
  assert.equal(image.attrs.class, "md-image");
  assert.deepEqual(image.children, ["a cat"]);
  // Bare URLs written out become links; a bare domain or address stays text.
  const linked = only("see https://example.com/x or example.com or a@b.com");
  assert.deepEqual(
    linked.children.map((c) => (typeof c === "string" ? c : c.attrs.href)),
    ["see ", "https://example.com/x", " or example.com or a@b.com"],
  );
});

test("code blocks, inline code, lists, emphasis, headings, tables", () => {
  const blocks = blockNodes(
    "# Title\n\nSome *em*, **strong**, ~~gone~~ and `x = 1`.\n\n" +
      "```python\nprint('hi')\n```\n\n    indented\n\n3. three\n4. four\n\n- a\n  - nested\n\n" +
      "| left | mid | right |\n|:---|:---:|---:|\n| 1 | 2 | 3 |\n\n> quoted\n\n---\nline one\nline two",
  );
  assert.deepEqual(
    blocks.map((b) => b.tag),
    ["h1", "p", "code-block", "code-block", "ol", "ul", "div", "blockquote", "hr", "p"],
  );
  const [, paragraph, fence, indented, ordered, bullets, table, , , lines] = blocks;
  assert.deepEqual(
    paragraph.children.map((c) => (typeof c === "string" ? c : c.tag)),
    ["Some ", "em", ", ", "strong", ", ", "s", " and ", "code", "."],
  );
  assert.deepEqual(fence, { tag: "code-block", language: "python", code: "print('hi')" });
  assert.deepEqual(indented, { tag: "code-block", language: "", code: "indented" });
  assert.deepEqual(ordered.attrs, { start: "3" });
  assert.deepEqual(ordered.children.map(text), ["three", "four"]); // a tight list: no <p> in the items
  assert.equal(bullets.children[0].children[1].tag, "ul");
  assert.equal(table.attrs.class, "md-table");
  const cells = [...elements([table])].filter((n) => n.tag === "th" || n.tag === "td");
  assert.deepEqual(
    cells.map((c) => c.attrs.class ?? ""),
    ["align-left", "align-center", "align-right", "align-left", "align-center", "align-right"],
  );
  assert.deepEqual(lines.children, ["line one", { tag: "br", attrs: {}, children: [] }, "line two"]);
});

// Replies as models write them: streamed a character at a time, no block before the last changes
// (MarkdownView keeps their nodes), and code being written only grows.
const REPLIES = [
  "Here is a function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nCall it with `add(1, 2)`.\n",
  "Steps:\n\n1. Install it.\n2. Run **make**.\n   - it builds\n   - it tests\n3. Done.\n\nThat's all.",
  "| name | size |\n|---|---:|\n| a | 1 |\n| b | 22 |\n\nA *table* above.\n\n> A quote\n> on two lines\n\n---\n\n# End",
  "Text with a [link](https://example.com) and an image ![x](https://example.com/x.png).\nNext line\n\n  \n\nAfter blank lines.",
  "~~~\nraw <b>html</b>\n~~~\nSetext\n======\n\nPara\n---\n\n* a\n\n* b\n\nlast",
  // XSS payloads are tricky Markdown too (not the link reference definition: see the test of those).
  XSS.slice(20, 40).filter((payload) => !payload.includes("]:")).join("\n\n"),
];

test("while a reply streams, every block before the last is final", () => {
  for (const reply of REPLIES) {
    let before = markdownBlocks("");
    for (let end = 1; end <= reply.length; end++) {
      const after = markdownBlocks(reply.slice(0, end));
      const final = before.slice(0, -1).map((b) => b.key);
      assert.equal(
        firstChange(final, after.map((b) => b.key)),
        final.length,
        `a finished block changed at ${JSON.stringify(reply.slice(0, end))}`,
      );
      before = after;
    }
  }
});

test("BlockStream, parsing from the last block only, gives the blocks of a whole parse", () => {
  for (const reply of [...REPLIES, REPLIES[1].replaceAll("\n", "\r\n")]) {
    const stream = new BlockStream();
    for (let end = 1; end <= reply.length; end++) {
      const text = reply.slice(0, end);
      assert.deepEqual(stream.blocks(text), markdownBlocks(text), JSON.stringify(text));
    }
    assert.ok(stream.line > 0, "it never parsed from a later block"); // it did skip the final blocks
  }
  // Another text than a continuation starts over.
  const stream = new BlockStream();
  stream.blocks("# One\n\nTwo\n\nThree");
  assert.deepEqual(stream.blocks("Other\n\n- x"), markdownBlocks("Other\n\n- x"));
});

test("a link reference definition reaches the blocks after it while streaming, and all at the end", () => {
  const reply = "Intro [early][r].\n\n[r]: https://example.com/r\n\nThen [late][r].\n\nEnd.";
  const stream = new BlockStream();
  for (let end = 1; end < reply.length; end++) stream.blocks(reply.slice(0, end));
  const streamed = stream.blocks(reply);
  const link = (block) => block.node.children.find((c) => c.tag === "a")?.attrs.href ?? null;
  assert.deepEqual(streamed.map(link), [null, "https://example.com/r", null]); // "early" was final first
  assert.deepEqual(markdownBlocks(reply).map(link), ["https://example.com/r", "https://example.com/r", null]);
});

test("a code block being written grows at its end", () => {
  const reply = "```js\nconst x = 1;\nconsole.log(x);\n```";
  let grew = 0;
  let before = only("```js\n");
  for (let end = "```js\n".length + 1; end <= reply.length; end++) {
    const after = only(reply.slice(0, end));
    const growth = codeGrowth(before, after);
    if (growth !== null) {
      assert.equal(before.code + growth, after.code);
      grew += 1;
    }
    before = after;
  }
  // All but the steps of the closing fence, whose backticks are code until the fence is whole.
  assert.ok(grew >= reply.length - "```js\n".length - 4, grew);
  assert.equal(codeGrowth(only("```js\nab"), only("```py\nabc")), null); // another language: built again
  assert.equal(codeGrowth({ tag: "p" }, only("```\nx")), null);
  assert.equal(firstChange(["a", "b", "c"], ["a", "b", "x", "y"]), 2);
  assert.equal(firstChange(["a"], ["a", "b"]), 1);
});
