"""webgguf.chat_fit: the one policy that fits a prompt into the context, for the page (web/worker.py),
the JS API and the CLI: on a stand-in model whose rendered length is known, and on SmolLM2's template."""

import argparse
import json
import random
from pathlib import Path

import pytest

from webgguf.chat_fit import ContextError, check_messages, fit_chat, fit_prompt, reply_room
from webgguf.cli import fitted_prompt, main
from webgguf.engine import LoadedModel

SMOLLM2 = "smollm2-135m-instruct"


class CountingModel:
    """Renders a chat as one token per word, plus 3 per message (as role markers would be)."""

    def __init__(self):
        self.path = Path("counting.gguf")
        self.template = object()
        self.renders = 0

    def chat_ids(self, messages):
        self.renders += 1
        ids = []
        for m in messages:
            ids += [1, 2] + [len(word) for word in m["content"].split()] + [3]
        return ids


def chat(*turns, system=None):
    roles = {"u": "user", "a": "assistant", "s": "system"}
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": roles[role], "content": text} for role, text in turns]


def linear_policy(model, messages, n_ctx, max_tokens):
    """The policy read literally: drop the oldest turn (a user/assistant pair, else one message) until
    the chat fits. fit_chat must give the same result."""
    limit = n_ctx - reply_room(n_ctx, max_tokens)
    system = messages[:1] if messages[0]["role"] == "system" else []
    rest, dropped = messages[len(system) :], 0
    while True:
        ids = model.chat_ids(system + rest)
        if len(ids) <= limit:
            return ids, dropped
        if len(rest) <= 1:
            return None, None
        pair = len(rest) > 2 and rest[0]["role"] == "user" and rest[1]["role"] == "assistant"
        rest = rest[2 if pair else 1 :]
        dropped += 2 if pair else 1


def test_reply_room():
    assert reply_room(2048, 256) == 256
    assert reply_room(2048, 4096) == 512  # at most a quarter of the context
    assert reply_room(2048, 0) == 1


def test_a_chat_that_fits_is_whole():
    model = CountingModel()
    messages = chat(("u", "hello there"), ("a", "hi"), ("u", "how are you"), system="be brief")
    ids, dropped = fit_chat(model, messages, 64, 16)
    assert dropped == 0 and ids == model.chat_ids(messages)


def test_oldest_turns_go_first_and_the_system_prompt_stays():
    model = CountingModel()
    long = "word " * 10
    messages = chat(("u", long), ("a", long), ("u", long), ("a", long), ("u", "last"), system="sys")
    # 4 (system) + 13 per long turn + 4 (last): 60 in all, 34 without the first pair, 8 without both
    ids, dropped = fit_chat(model, messages, 40, 12)  # 40 - min(12, 40 // 4) = 30 for the prompt
    assert dropped == 4 and ids == model.chat_ids(messages[:1] + messages[5:])
    ids, dropped = fit_chat(model, messages, 48, 12)  # 36 for the prompt
    assert dropped == 2 and ids == model.chat_ids(messages[:1] + messages[3:])  # a whole pair


def test_messages_that_do_not_pair_go_one_at_a_time():
    model = CountingModel()
    long = "word " * 10
    messages = chat(("a", long), ("u", long), ("u", long), ("u", "last"))  # no user/assistant pair first
    ids, dropped = fit_chat(model, messages, 40, 12)  # 43 in all; 30 for the prompt
    assert dropped == 1 and ids == model.chat_ids(messages[1:])
    ids, dropped = fit_chat(model, messages, 32, 12)  # 24 for the prompt: a user message after a user
    assert dropped == 2 and ids == model.chat_ids(messages[2:])


def test_a_last_message_too_long_is_an_error():
    model = CountingModel()
    with pytest.raises(ContextError, match="the last message and the system prompt take 38 tokens; the "):
        fit_chat(model, chat(("u", "x " * 30), system="be brief"), 40, 12)
    with pytest.raises(ContextError, match=r"the last message takes 33 tokens; the context holds 40, 10 of"):
        fit_chat(model, chat(("u", "x " * 30)), 40, 60)


def test_bisection_gives_what_the_policy_says_and_renders_log_times():
    rng = random.Random(0)
    for _ in range(200):
        turns = []
        for _ in range(rng.randrange(1, 40)):
            role = rng.choice("uuaa" if rng.random() < 0.9 else "uas")
            turns.append((role, "w " * rng.randrange(0, 30)))
        messages = chat(*turns, system="s " * rng.randrange(0, 5) or None)
        n_ctx, max_tokens = rng.randrange(16, 400), rng.randrange(0, 200)
        expected_ids, expected_dropped = linear_policy(CountingModel(), messages, n_ctx, max_tokens)
        model = CountingModel()
        if expected_ids is None:
            with pytest.raises(ContextError):
                fit_chat(model, messages, n_ctx, max_tokens)
            continue
        assert tuple(fit_chat(model, messages, n_ctx, max_tokens)) == (expected_ids, expected_dropped)
        assert model.renders <= 2 + len(messages).bit_length()


def test_a_raw_prompt_is_never_truncated():
    class Tokens:
        path = Path("m.gguf")

        class tokenizer:
            @staticmethod
            def encode(text, add_special, parse_special):
                return [1] + [len(w) for w in text.split()]

    assert fit_prompt(Tokens, "a b c", 5) == ([1, 1, 1, 1], 0)
    with pytest.raises(ContextError, match=r"the prompt has 5 tokens and the context holds 5: .*never trunc"):
        fit_prompt(Tokens, "a b c d", 5)


def test_a_raw_prompt_of_token_ids_is_taken_as_it_is():
    class Tokens:
        path = Path("m.gguf")

        class tokenizer:
            n_vocab = 10

    assert fit_prompt(Tokens, [3, 9, 0], 5) == ([3, 9, 0], 0)
    with pytest.raises(ContextError, match="the prompt has 5 tokens"):
        fit_prompt(Tokens, [1, 2, 3, 4, 5], 5)
    for bad, shown in (([3, 10], "10"), ([-1], "-1"), ([2.0], "2.0"), (["1"], "'1'"), ([True], "True")):
        with pytest.raises(ValueError, match=rf"integers in \[0, 10\): got {shown}"):
            fit_prompt(Tokens, bad, 5)
    with pytest.raises(ValueError, match="empty"):
        fit_prompt(Tokens, [], 5)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], r"messages\[0\] is not an object"),
        ([{"role": "user"}], r"messages\[0\].content must be a string"),
        ([{"role": 1, "content": "x"}], r"messages\[0\].role must be a string"),
    ],
)
def test_malformed_messages(messages, message):
    with pytest.raises(ValueError, match=message):
        check_messages(messages)


# ---- on SmolLM2's template and tokenizer, and through the CLI


@pytest.fixture(scope="module")
def smollm2(model_path):
    return LoadedModel.open(model_path(SMOLLM2))


def long_chat():
    turn = "Tell me more about the history of the city, its rivers and its bridges, please. " * 2
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(6):
        messages.append({"role": "user", "content": f"{i}: {turn}"})
        messages.append({"role": "assistant", "content": f"Answer {i}."})
    return messages + [{"role": "user", "content": "Last question?"}]


def test_on_smollm2_the_oldest_whole_turns_go(smollm2):
    messages = long_chat()
    assert len(smollm2.chat_ids(messages)) > 256  # the whole chat does not fit a context of 256
    ids, dropped = fit_chat(smollm2, messages, 256, 16)
    assert len(ids) <= 256 - 16 and dropped > 0 and dropped % 2 == 0
    assert ids == smollm2.chat_ids(messages[:1] + messages[1 + dropped :])  # system prompt + newest turns
    assert len(smollm2.chat_ids(messages[:1] + messages[dropped - 1 :])) > 256 - 16  # no more than needed
    with pytest.raises(ContextError, match="the context holds 256, 16 of them kept for the reply: shorten"):
        fit_chat(smollm2, [{"role": "user", "content": "word " * 400}], 256, 16)


def test_the_cli_fits_a_chat_by_the_same_policy(smollm2, tmp_path, capsys):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(long_chat()))
    args = argparse.Namespace(messages=str(path), chat=False, prompt=None, max_tokens=16)
    ids = fitted_prompt(smollm2, args, 256)
    assert ids == fit_chat(smollm2, long_chat(), 256, 16).ids
    dropped = fit_chat(smollm2, long_chat(), 256, 16).dropped
    note = f"note: the {dropped} oldest messages were left out to fit the context of 256 tokens"
    assert note in capsys.readouterr().err
    args = argparse.Namespace(messages=None, chat=True, prompt="Hi", max_tokens=16)
    assert fitted_prompt(smollm2, args, 256) == smollm2.prompt_ids("Hi", chat=True)


def test_the_cli_reports_a_chat_that_cannot_fit(tmp_path, capsys):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "user", "content": "word " * 400}]))
    code = main(["generate", SMOLLM2, "--messages", str(path), "--ctx", "256", "--max-tokens", "16"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: the last message takes") and err.count("\n") == 1
    path.write_text("[{")
    assert main(["generate", SMOLLM2, "--messages", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --messages {path}: not JSON") and err.count("\n") == 1
    code = main(["generate", SMOLLM2, "--prompt", "x", "--ctx", "8"])
    assert code == 2 and "--ctx must be in 16.." in capsys.readouterr().err
