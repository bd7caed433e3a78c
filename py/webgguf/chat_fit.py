"""Prompts made to fit the context: the one policy of the chat page, the JS API and the CLI.

A chat keeps room for the reply: its prompt may take the context less `reply_room` tokens (the
requested max_tokens, at most a quarter of the context). While the rendered chat is longer, the oldest
turn goes: a user message together with the assistant reply after it (so roles keep alternating, which
many templates require), or one message where they do not pair. A leading system prompt and the last
message always stay; when those alone do not fit, that is a ContextError that says how long they are.

A raw completion prompt is never truncated (cutting text in front of a completion changes what it
continues): longer than the context is a ContextError.
"""

from typing import NamedTuple


class ContextError(ValueError):
    """A prompt that does not fit the context."""


class FittedPrompt(NamedTuple):
    ids: list[int]  # the prompt's token ids
    dropped: int  # messages left out, oldest first (0 for a raw prompt)


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens of the context a chat keeps free for the reply."""
    return max(1, min(max_tokens, n_ctx // 4))


def check_messages(messages) -> list[dict]:
    """`messages` as a chat: a non-empty list of {"role": str, "content": str} (other keys are ignored)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] is not an object with role and content")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise ValueError(f"messages[{i}].{key} must be a string")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def fit_chat(model, messages: list[dict], n_ctx: int, max_tokens: int) -> FittedPrompt:
    """The chat's prompt ids (model.chat_ids: the model's template), the oldest turns left out as the
    policy above says. Searches the cut points by bisection: a chat shorter at the front renders
    shorter, so it tokenizes the chat O(log turns) times, not once per turn."""
    messages = check_messages(messages)
    if model.template is None:
        raise ValueError(f"{model.path.name} has no chat template: give a raw prompt")
    limit = n_ctx - reply_room(n_ctx, max_tokens)
    system = messages[:1] if messages[0]["role"] == "system" else []
    rest = messages[len(system) :]
    cuts = _cut_points(rest)  # cuts[i]: messages dropped by the i-th step of the policy
    rendered: dict[int, list[int]] = {}

    def ids_after(cut: int) -> list[int]:
        if cut not in rendered:
            rendered[cut] = model.chat_ids(system + rest[cut:])
        return rendered[cut]

    last = ids_after(cuts[-1])
    if len(last) > limit:
        what = "the last message and the system prompt take" if system else "the last message takes"
        raise ContextError(
            f"{what} {len(last)} tokens; the context holds {n_ctx}, "
            f"{n_ctx - limit} of them kept for the reply: shorten it"
        )
    low, high = 0, len(cuts) - 1  # cuts[high] fits; find the first cut that does
    while low < high:
        middle = (low + high) // 2
        if len(ids_after(cuts[middle])) <= limit:
            high = middle
        else:
            low = middle + 1
    return FittedPrompt(ids_after(cuts[low]), cuts[low])


def _cut_points(rest: list[dict]) -> list[int]:
    """How many of the messages after the system prompt each step of the policy has dropped: 0 first,
    then one user/assistant pair (or one message) more per step, until one message is left."""
    cuts = [0]
    while len(rest) - cuts[-1] > 1:
        at = cuts[-1]
        pair = len(rest) - at > 2 and rest[at]["role"] == "user" and rest[at + 1]["role"] == "assistant"
        cuts.append(at + (2 if pair else 1))
    return cuts


def fit_prompt(model, prompt: str | list[int], n_ctx: int) -> FittedPrompt:
    """A raw completion prompt's ids; never truncated. `prompt`: text, or token ids as they are (as in
    OpenAI's completions API: a benchmark feeds the page the ids the native run feeds the engine)."""
    if isinstance(prompt, str):
        ids = model.tokenizer.encode(prompt, add_special=True, parse_special=True)
    else:
        ids = list(prompt)
        n_vocab = model.tokenizer.n_vocab
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_vocab]
        if bad:
            raise ValueError(f"prompt ids must be integers in [0, {n_vocab}): got {bad[0]!r}")
        if not ids:
            raise ValueError("the prompt is empty (no token ids)")
    if len(ids) >= n_ctx:
        raise ContextError(
            f"the prompt has {len(ids)} tokens and the context holds {n_ctx}: shorten it "
            "(a raw completion is never truncated)"
        )
    return FittedPrompt(ids, 0)
