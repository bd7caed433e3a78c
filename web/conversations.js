// The chat page's conversations, kept in this browser (IndexedDB), so that they survive a reload.
//
// One record per conversation, in the object store "conversations" of the database
// "webgguf-conversations" (keyPath "id", index "updated"):
//   {id, title, created, updated (ms since 1970), system (the system prompt of its turns),
//    messages: the transcript of web/chat.js, each reply with the model that answered it}
// A conversation is written whole after each change (they are small: text). A conversation is
// stored from its first message on: "New chat" alone stores nothing.
// Export: exportConversation(conversation) → the JSON text of a download (format EXPORT_FORMAT).

const DATABASE = "webgguf-conversations";
const STORE = "conversations";
const VERSION = 1;
export const EXPORT_FORMAT = "webgguf-conversation";
const TITLE_LENGTH = 60; // characters of a title made from the first message

// A new, empty conversation (not stored until it is saved).
export function newConversation(system = "") {
  const now = Date.now();
  return { id: crypto.randomUUID(), title: "", created: now, updated: now, system, messages: [] };
}

// A conversation's title: its own, or the start of its first message, on one line.
export function conversationTitle(conversation) {
  if (conversation.title) return conversation.title;
  const first = conversation.messages.find((m) => m.role === "user")?.content ?? "";
  const line = first.replace(/\s+/g, " ").trim();
  if (!line) return "New chat";
  return line.length > TITLE_LENGTH ? `${line.slice(0, TITLE_LENGTH - 1).trimEnd()}…` : line;
}

// The JSON text of a conversation's download: the stored record, with its format and title.
export function exportConversation(conversation) {
  const { id, created, updated, system, messages } = conversation;
  const record = { format: EXPORT_FORMAT, version: VERSION, id, title: conversationTitle(conversation) };
  Object.assign(record, { created: new Date(created).toISOString(), updated: new Date(updated).toISOString() });
  Object.assign(record, { system, messages });
  return `${JSON.stringify(record, null, 2)}\n`;
}

// A file name for the download: the title's letters and digits, and the date.
export function exportFileName(conversation) {
  const words = conversationTitle(conversation).toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
  const date = new Date(conversation.updated).toISOString().slice(0, 10);
  return `chat-${words.slice(0, 6).join("-") || "untitled"}-${date}.json`;
}

// A request's result as a promise.
function settle(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

export class ConversationStore {
  // Opens (creating on first use) the database. Rejects where IndexedDB is missing or refused (some
  // private windows): the page then keeps its conversation in memory only and says so.
  static async open(name = DATABASE) {
    if (!globalThis.indexedDB) throw new Error("this browser has no IndexedDB");
    const request = indexedDB.open(name, VERSION);
    request.onupgradeneeded = () => {
      const store = request.result.createObjectStore(STORE, { keyPath: "id" });
      store.createIndex("updated", "updated");
    };
    return new ConversationStore(await settle(request));
  }

  constructor(db) {
    this.db = db;
    db.onversionchange = () => db.close(); // a newer page wants to upgrade: let it
  }

  transaction(mode) {
    return this.db.transaction(STORE, mode).objectStore(STORE);
  }

  // Summaries of every conversation, the last updated first: [{id, title, updated, count}].
  async list() {
    const all = await settle(this.transaction("readonly").index("updated").getAll());
    return all.reverse().map((c) => ({ id: c.id, title: conversationTitle(c), updated: c.updated, count: c.messages.length }));
  }

  async get(id) {
    return (await settle(this.transaction("readonly").get(id))) ?? null;
  }

  // Stores `conversation` as it is now (a copy). Its `updated` is the caller's: a new message sets it,
  // a new title does not.
  async save(conversation) {
    await settle(this.transaction("readwrite").put(structuredClone(conversation)));
  }

  async rename(id, title) {
    const conversation = await this.get(id);
    if (!conversation) throw new Error("this conversation is no longer stored");
    conversation.title = title.replace(/\s+/g, " ").trim();
    await this.save(conversation);
    return conversation;
  }

  async delete(id) {
    await settle(this.transaction("readwrite").delete(id));
  }
}
