// One chat turn, for both chat UIs of webgguf: the page (app.js) and the widget (embed.js, through
// webgguf.js). What the model is sent, how the reply lands in the transcript, the notes under it.
//
// A transcript is what the user sees (and the page stores), oldest first:
//   {role: "user", content, at}
//   {role: "assistant", content, at, finish, model?, truncated?, error?}
// `finish` is the engine's finish_reason ("stop", "length"), "stopped" (the user stopped it) or
// "error"; `model` is the model that answered (modelRecord); `truncated` ({dropped_messages}) says
// the oldest messages were left out to fit the context; `error` is the failure's text.
//
// The rule for a turn that got no reply (stopped before its first word, failed, or answered with
// nothing): the user's message stays in the transcript, shown with NO_REPLY, but the model is not
// sent it again. Kept, because the user sees and keeps what they wrote; left out of the model's
// messages, because it would put two user messages in a row, which chat templates that require
// alternating roles refuse (Gemma's raises "Conversation roles must alternate"), and the next reply
// would answer a question the user gave up on. A reply that was stopped or failed after some text
// is kept whole: it is what the user saw.

export const NO_REPLY = "No reply: the model is not sent this message again.";

// "Type: message" of an engine error (its Python exception type), or the message alone.
export function errorText(error) {
  return error?.type && error.type !== "Error" ? `${error.type}: ${error.message}` : String(error?.message ?? error);
}

// Whether the user message transcript[i] got a reply with text.
export function answered(transcript, i) {
  const next = transcript[i + 1];
  return next?.role === "assistant" && Boolean(next.content);
}

// The messages the model is sent for `transcript`: the system prompt, then every reply with text
// and every user message that got one (see the rule above).
export function modelMessages(transcript, system = "") {
  const messages = system ? [{ role: "system", content: system }] : [];
  transcript.forEach((message, i) => {
    const keep = message.role === "user" ? answered(transcript, i) : message.role === "assistant" && message.content;
    if (keep) messages.push({ role: message.role, content: message.content });
  });
  return messages;
}

// The notes shown under a reply: how it ended, and whether old messages were left out.
export function replyNotes({ finish, truncated }) {
  const notes = [];
  if (finish === "length") notes.push("Stopped at the token limit.");
  if (finish === "stopped") notes.push("Stopped.");
  const n = truncated?.dropped_messages;
  if (n) notes.push(`The ${n} oldest message${n === 1 ? " was" : "s were"} left out to fit the context.`);
  return notes;
}

// What is recorded of the model that answered: from the engine's model info, and the sha256 of the
// server's manifest entry of the same file and size (when the page has a manifest).
export function modelRecord(info, manifest = null) {
  if (!info) return null;
  const record = { name: info.model_name ?? info.name, file: info.name, size: info.file_bytes ?? null, sha256: null };
  for (const entry of Object.values(manifest?.models ?? {})) {
    if (entry.file === info.name && entry.size === info.file_bytes) record.sha256 = entry.sha256 ?? null;
  }
  return record;
}

// One turn: `text` from the user, the reply streamed from `engine` (webgguf.js Engine, or anything
// with its chat.completions.create). The user message is pushed onto `transcript` before the first
// await (so the caller may store it at once), the reply when it ends (none without text or error).
// options: system (the system prompt), params (sampling: max_tokens, temperature, ...), signal (an
// AbortSignal: the user's Stop), onText(delta, content) as text arrives, onChunk(chunk) for every
// streamed chunk (timings, usage), model (the record of the answering model; by default from
// engine.model). Never throws for the engine's failures: they come back as finish "error".
// Resolves to {user, reply (the pushed record or null), finish, error, notes}.
export async function chatTurn(engine, transcript, text, options = {}) {
  const { system = "", params = {}, signal, onText, onChunk } = options;
  const user = { role: "user", content: text, at: Date.now() };
  const messages = [...modelMessages(transcript, system), { role: "user", content: text }];
  transcript.push(user);
  const model = options.model ?? modelRecord(engine.model);
  let content = "";
  let finish = "stop";
  let truncated = null;
  let error = null;
  try {
    const stream = await engine.chat.completions.create({ ...params, messages, stream: true, signal });
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      const delta = choice.delta?.content;
      if (delta) {
        content += delta;
        onText?.(delta, content);
      }
      finish = choice.finish_reason ?? finish;
      truncated = chunk.truncated ?? truncated;
      onChunk?.(chunk);
    }
  } catch (failure) {
    if (signal?.aborted) {
      finish = "stopped";
    } else {
      finish = "error";
      error = failure;
    }
  }
  let reply = null;
  if (content || error) {
    reply = { role: "assistant", content, at: Date.now(), finish, model };
    if (truncated) reply.truncated = truncated;
    if (error) reply.error = errorText(error);
    transcript.push(reply);
  }
  return { user, reply, finish, error, notes: replyNotes({ finish, truncated }) };
}
