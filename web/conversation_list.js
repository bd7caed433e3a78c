// The "Conversations" card of the chat page: the stored conversations, one row each (title, number of
// messages, when), which opens its conversation, with Rename, Export and Delete. app.js does the work
// behind them (conversations.js stores); this module builds the rows and says what failed.
import { errorText } from "./chat.js";

export class ConversationList {
  // list: the card's <ul>; note: its hint; actions: {open(id), rename(id, title), export(id),
  // delete(id)}, each may be async and may throw (the card then says so).
  constructor(list, note, actions) {
    this.list = list;
    this.note = note;
    this.actions = actions;
    this.summaries = [];
    this.current = null; // the id of the open conversation
  }

  showNote(text) {
    this.note.textContent = text;
    this.note.hidden = !text;
  }

  // summaries: ConversationStore.list()'s; current: the id of the open conversation.
  show(summaries, current) {
    this.summaries = summaries;
    this.current = current;
    this.list.replaceChildren(...summaries.map((summary) => this.row(summary)));
    if (!summaries.length) this.showNote("None yet: each conversation is kept here, in this browser.");
    else if (this.note.textContent.startsWith("None yet")) this.showNote("");
  }

  // Runs an action; a failure (the store refused) is said in the card, not thrown.
  run(name, ...args) {
    return async () => {
      try {
        await this.actions[name](...args);
      } catch (error) {
        this.showNote(`That did not work: ${errorText(error)}`);
      }
    };
  }

  row({ id, title, updated, count }) {
    const row = document.createElement("li");
    row.dataset.id = id;
    const open = document.createElement("button");
    open.type = "button";
    open.className = "conversation-open";
    const name = document.createElement("span");
    name.className = "conversation-title";
    name.textContent = title;
    const meta = document.createElement("span");
    meta.className = "conversation-meta";
    const when = new Date(updated).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
    meta.textContent = `${count} message${count === 1 ? "" : "s"} · ${when}`;
    open.append(name, meta);
    open.addEventListener("click", this.run("open", id));
    if (id === this.current) {
      row.classList.add("current");
      open.setAttribute("aria-current", "true");
    }
    const rename = smallButton("Rename", `Rename ${title}`, () => this.startRename(row, id, title));
    const exporter = smallButton("Export", `Export ${title} as JSON`, this.run("export", id));
    // Delete asks once more: the first click arms it, the second deletes; leaving it disarms it.
    const remove = smallButton("Delete", `Delete ${title}`, () => {
      if (remove.classList.contains("armed")) return this.run("delete", id)();
      remove.classList.add("armed", "danger");
      remove.textContent = "Delete?";
      remove.setAttribute("aria-label", `Confirm: delete ${title}`);
    });
    remove.addEventListener("blur", () => {
      remove.classList.remove("armed", "danger");
      remove.textContent = "Delete";
      remove.setAttribute("aria-label", `Delete ${title}`);
    });
    const actions = document.createElement("div");
    actions.className = "conversation-actions";
    actions.append(rename, exporter, remove);
    row.append(open, actions);
    return row;
  }

  // The row becomes a text field: Enter (or leaving it) saves, Escape cancels.
  startRename(row, id, title) {
    const form = document.createElement("form");
    form.className = "conversation-rename";
    const input = document.createElement("input");
    input.type = "text";
    input.value = title;
    input.maxLength = 200;
    input.setAttribute("aria-label", "New name of the conversation");
    form.append(input);
    let done = false;
    const finish = (save) => {
      if (done) return;
      done = true;
      const name = input.value.trim();
      if (save && name && name !== title) this.run("rename", id, name)();
      else this.show(this.summaries, this.current);
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      finish(true);
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener("blur", () => finish(true));
    row.replaceChildren(form);
    input.focus();
    input.select();
  }
}

function smallButton(text, label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "button ghost small";
  button.textContent = text;
  button.setAttribute("aria-label", label);
  button.addEventListener("click", onClick);
  return button;
}
