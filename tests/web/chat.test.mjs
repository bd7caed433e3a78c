// web/chat.js, the chat turn of the page and the widget, against a scripted engine (no browser).
import assert from "node:assert/strict";
import { test } from "node:test";

import { answered, chatTurn, modelMessages, modelRecord, NO_REPLY, replyNotes } from "../../web/chat.js";

const MODEL_INFO = { name: "tiny.Q4_1.gguf", model_name: "Tiny", file_bytes: 1234 };

// An engine whose chat.completions.create streams `pieces` as OpenAI chunks, the last one with
// `finish` and `truncated`; `fail` (an Error) is thrown after the pieces; the requests it got are kept.
function scriptedEngine({ pieces = [], finish = "stop", truncated = null, fail = null } = {}) {
  const engine = { model: MODEL_INFO, requests: [] };
  engine.chat = {
    completions: {
      create: async (request) => {
        engine.requests.push(request);
        return (async function* () {
          yield { choices: [{ delta: { role: "assistant", content: "" }, finish_reason: null }] };
          for (const piece of pieces) {
            request.signal?.throwIfAborted();
            yield { choices: [{ delta: { content: piece }, finish_reason: null }] };
          }
          if (fail) throw fail;
          yield { choices: [{ delta: {}, finish_reason: finish }], ...(truncated ? { truncated } : {}) };
        })();
      },
    },
  };
  return engine;
}

test("a turn sends the system prompt and the history, streams the reply into the transcript", async () => {
  const engine = scriptedEngine({ pieces: ["Hel", "lo", "!"] });
  const transcript = [
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hey." },
  ];
  const seen = [];
  const turn = await chatTurn(engine, transcript, "How are you?", {
    system: "Be brief.",
    params: { max_tokens: 8, temperature: 0 },
    onText: (delta, content) => seen.push([delta, content]),
  });
  const [request] = engine.requests;
  assert.deepEqual(request.messages, [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hey." },
    { role: "user", content: "How are you?" },
  ]);
  assert.equal(request.stream, true);
  assert.equal(request.max_tokens, 8);
  assert.equal(request.temperature, 0);
  assert.deepEqual(seen, [["Hel", "Hel"], ["lo", "Hello"], ["!", "Hello!"]]);
  assert.equal(turn.finish, "stop");
  assert.deepEqual(turn.notes, []);
  assert.equal(transcript.length, 4);
  assert.equal(transcript[2], turn.user);
  assert.equal(transcript[3], turn.reply);
  assert.equal(turn.reply.content, "Hello!");
  assert.deepEqual(turn.reply.model, { name: "Tiny", file: "tiny.Q4_1.gguf", size: 1234, sha256: null });
});

test("the user message is in the transcript before the reply starts", async () => {
  const engine = scriptedEngine({ pieces: ["ok"] });
  const transcript = [];
  const turn = chatTurn(engine, transcript, "first");
  assert.deepEqual(transcript.map((m) => m.content), ["first"]);
  await turn;
  assert.deepEqual(transcript.map((m) => m.content), ["first", "ok"]);
});

test("a turn stopped before any text keeps the user message, and the model is not sent it again", async () => {
  const controller = new AbortController();
  controller.abort();
  const transcript = [];
  const stopped = await chatTurn(scriptedEngine({ pieces: ["never"] }), transcript, "Tell me a story", {
    signal: controller.signal,
  });
  assert.equal(stopped.finish, "stopped");
  assert.equal(stopped.reply, null);
  assert.deepEqual(transcript, [stopped.user]);
  assert.equal(answered(transcript, 0), false);

  const engine = scriptedEngine({ pieces: ["Sure."] });
  await chatTurn(engine, transcript, "Something else");
  // Roles alternate: the unanswered message is left out of the request, not of the transcript.
  assert.deepEqual(engine.requests[0].messages, [{ role: "user", content: "Something else" }]);
  assert.deepEqual(transcript.map((m) => [m.role, m.content]), [
    ["user", "Tell me a story"],
    ["user", "Something else"],
    ["assistant", "Sure."],
  ]);
  assert.equal(NO_REPLY, "No reply: the model is not sent this message again.");
});

test("a failed turn records the error; its user message is not sent again either", async () => {
  const failure = Object.assign(new Error("the GPU device was lost"), { type: "GpuError" });
  const transcript = [];
  const turn = await chatTurn(scriptedEngine({ fail: failure }), transcript, "Hi");
  assert.equal(turn.finish, "error");
  assert.equal(turn.error, failure);
  assert.equal(turn.reply.content, "");
  assert.equal(turn.reply.error, "GpuError: the GPU device was lost");
  assert.deepEqual(modelMessages(transcript, "sys"), [{ role: "system", content: "sys" }]);
});

test("a reply stopped or broken after some text is kept whole", async () => {
  const transcript = [];
  const failure = new Error("worker died");
  const turn = await chatTurn(scriptedEngine({ pieces: ["Half an ans"], fail: failure }), transcript, "Q");
  assert.equal(turn.reply.content, "Half an ans");
  assert.equal(turn.reply.error, "worker died");
  assert.deepEqual(modelMessages(transcript), [
    { role: "user", content: "Q" },
    { role: "assistant", content: "Half an ans" },
  ]);

  const controller = new AbortController();
  const stopping = await chatTurn(scriptedEngine({ pieces: ["One", " two", " three"] }), transcript, "Count", {
    signal: controller.signal,
    onText: (delta) => delta === " two" && controller.abort(),
  });
  assert.equal(stopping.finish, "stopped");
  assert.equal(stopping.reply.content, "One two");
  assert.deepEqual(stopping.notes, ["Stopped."]);
});

test("the notes of a reply: the token limit and the messages left out to fit the context", async () => {
  const engine = scriptedEngine({ pieces: ["abc"], finish: "length", truncated: { dropped_messages: 4 } });
  const turn = await chatTurn(engine, [], "Q");
  assert.deepEqual(turn.notes, ["Stopped at the token limit.", "The 4 oldest messages were left out to fit the context."]);
  assert.deepEqual(turn.reply.truncated, { dropped_messages: 4 });
  assert.deepEqual(replyNotes(turn.reply), turn.notes); // the same notes for a stored reply
  assert.deepEqual(replyNotes({ finish: "stop", truncated: { dropped_messages: 1 } }), [
    "The 1 oldest message was left out to fit the context.",
  ]);
  assert.deepEqual(replyNotes({ finish: "stop" }), []);
});

test("modelMessages keeps answered turns only, in order", () => {
  const transcript = [
    { role: "user", content: "a" },
    { role: "user", content: "b" },
    { role: "assistant", content: "B" },
    { role: "user", content: "c" },
    { role: "assistant", content: "", error: "failed" },
    { role: "user", content: "d" },
    { role: "assistant", content: "D" },
    { role: "user", content: "e" },
  ];
  assert.deepEqual(modelMessages(transcript), [
    { role: "user", content: "b" },
    { role: "assistant", content: "B" },
    { role: "user", content: "d" },
    { role: "assistant", content: "D" },
  ]);
  // only role and content reach the engine
  assert.deepEqual(Object.keys(modelMessages([{ role: "assistant", content: "x", model: {} }])[0]), ["role", "content"]);
});

test("modelRecord takes the sha256 of the manifest entry of the same file and size", () => {
  const manifest = {
    models: {
      tiny: { file: "tiny.Q4_1.gguf", size: 1234, sha256: "ab".repeat(32) },
      other: { file: "tiny.Q4_1.gguf", size: 999, sha256: "cd".repeat(32) },
    },
  };
  assert.equal(modelRecord(MODEL_INFO, manifest).sha256, "ab".repeat(32));
  assert.equal(modelRecord({ ...MODEL_INFO, file_bytes: 5 }, manifest).sha256, null);
  assert.equal(modelRecord({ name: "x.gguf" }).name, "x.gguf");
  assert.equal(modelRecord(null), null);
});
