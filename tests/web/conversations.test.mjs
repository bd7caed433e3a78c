// web/conversations.js without a browser: titles, the export's JSON and file name. (The IndexedDB
// store itself is tested in Chromium: tests/e2e/test_chat_page.py.)
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  conversationTitle,
  EXPORT_FORMAT,
  exportConversation,
  exportFileName,
  newConversation,
} from "../../web/conversations.js";

const model = { name: "Tiny", file: "tiny.Q4_1.gguf", size: 1234, sha256: "ab".repeat(32) };

function conversation() {
  const c = newConversation("Be brief.");
  c.created = Date.UTC(2025, 4, 6, 7, 8, 9);
  c.updated = Date.UTC(2025, 4, 7, 7, 8, 9);
  c.messages.push({ role: "user", content: "  What is\nWebGPU, in   short?  ", at: c.created });
  c.messages.push({ role: "assistant", content: "A **GPU** API.", at: c.created + 1, finish: "stop", model });
  return c;
}

test("a new conversation is empty, with a fresh id", () => {
  const a = newConversation();
  const b = newConversation("sys");
  assert.notEqual(a.id, b.id);
  assert.deepEqual([a.title, a.system, a.messages, b.system], ["", "", [], "sys"]);
  assert.equal(conversationTitle(a), "New chat");
});

test("the title is the start of the first message on one line, unless it was renamed", () => {
  const c = conversation();
  assert.equal(conversationTitle(c), "What is WebGPU, in short?");
  c.messages[0].content = "word ".repeat(40);
  const long = conversationTitle(c);
  assert.ok(long.length <= 60 && long.endsWith("…"), long);
  c.title = "Renamed";
  assert.equal(conversationTitle(c), "Renamed");
});

test("the export holds the transcript with the model that answered, as JSON", () => {
  const c = conversation();
  const exported = JSON.parse(exportConversation(c));
  assert.equal(exported.format, EXPORT_FORMAT);
  assert.equal(exported.version, 1);
  assert.equal(exported.id, c.id);
  assert.equal(exported.title, "What is WebGPU, in short?");
  assert.equal(exported.system, "Be brief.");
  assert.equal(exported.created, "2025-05-06T07:08:09.000Z");
  assert.equal(exported.updated, "2025-05-07T07:08:09.000Z");
  assert.deepEqual(exported.messages, c.messages);
  assert.deepEqual(exported.messages[1].model, model);
});

test("the export's file name: the title's words and the date", () => {
  const c = conversation();
  assert.equal(exportFileName(c), "chat-what-is-webgpu-in-short-2025-05-07.json");
  c.title = "<script>../../etc</script> Ünïcödé";
  assert.equal(exportFileName(c), "chat-script-etc-script-ünïcödé-2025-05-07.json");
  c.title = "!!!";
  assert.equal(exportFileName(c), "chat-untitled-2025-05-07.json");
});
