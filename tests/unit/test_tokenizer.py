"""webgguf.tokenizer against llama.cpp (tests/refs/tokenizer_*.json, made by tools/make_tokenizer_refs.py)."""

import json
import random
from pathlib import Path

import pytest

from webgguf.gguf import read_header
from webgguf.pretokenize import PRE_TOKENIZERS, pre_tokenize
from webgguf.tokenizer import Tokenizer, TokenizerError, clean_spaces

REFS = Path(__file__).resolve().parents[1] / "refs"
MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]


def load_ref(name: str) -> dict:
    return json.loads((REFS / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


def as_bytes(value) -> bytes:
    """A reference byte string: text, or {"hex": ...} where it is not valid UTF-8."""
    return bytes.fromhex(value["hex"]) if isinstance(value, dict) else value.encode("utf-8")


def expected_ids(case: dict, parse_special: bool) -> list[int]:
    return case.get("ids_special", case["ids"]) if parse_special else case["ids"]


def detok_checks(case: dict) -> list[tuple[list[int], bool, bytes]]:
    """(ids, special, llama.cpp's bytes) for each detokenization the reference recorded."""
    ids_special = case.get("ids_special", case["ids"])
    detok_special = case.get("detok_special", case["detok"])
    return [
        (case["ids"], False, as_bytes(case["detok"])),
        (ids_special, False, as_bytes(detok_special)),
        (ids_special, True, as_bytes(case.get("detok_unparsed", detok_special))),
    ]


@pytest.fixture(scope="module")
def metadata(model_path):
    cache = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = read_header(model_path(name)).metadata
        return cache[name]

    return get


@pytest.fixture(scope="module")
def tokenizer(metadata):
    cache = {}

    def get(name: str) -> Tokenizer:
        if name not in cache:
            cache[name] = Tokenizer.from_metadata(metadata(name))
        return cache[name]

    return get


@pytest.mark.parametrize("name", MODELS)
def test_special_ids_match_llama_cpp(name, tokenizer):
    tok, ref = tokenizer(name), load_ref(name)
    assert tok.n_vocab == ref["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (ref["bos_id"], ref["eos_id"], ref["add_bos"])
    assert sorted(tok.eog_ids) == ref["eog_ids"]


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_encode_matches_llama_cpp(name, parse_special, tokenizer):
    tok, cases = tokenizer(name), load_ref(name)["cases"]
    assert len(cases) >= 40
    wrong = []
    for case in cases:
        ids = tok.encode(case["text"], add_special=True, parse_special=parse_special)
        if ids != expected_ids(case, parse_special):
            wrong.append((case["text"][:60], ids))
    assert wrong == []


@pytest.mark.parametrize("name", MODELS)
def test_special_parsing_changes_ids_where_special_text_appears(name, tokenizer):
    tok = tokenizer(name)
    chat = {
        "smollm2-135m-instruct": "<|im_start|>user\nhi<|im_end|>",
        "gemma-3-270m": "<start_of_turn>user\nhi",
    }[name]
    parsed = tok.encode(chat, add_special=False, parse_special=True)
    assert parsed[0] == tok.token_to_id[chat[: chat.index(">") + 1]]
    assert tok.encode(chat, add_special=False, parse_special=False) != parsed


@pytest.mark.parametrize("name", MODELS)
def test_detokenize_matches_llama_cpp(name, tokenizer):
    tok, cases = tokenizer(name), load_ref(name)["cases"]
    wrong = [
        (case["text"][:60], special)
        for case in cases
        for ids, special, expected in detok_checks(case)
        if tok.detokenize(ids, special=special) != expected
    ]
    assert wrong == []


@pytest.mark.parametrize("name", MODELS)
def test_decode_gives_back_the_text_where_llama_cpp_does(name, tokenizer):
    tok, cases = tokenizer(name), load_ref(name)["cases"]
    round_trips = [case for case in cases if as_bytes(case["detok"]) == case["text"].encode("utf-8")]
    assert len(round_trips) >= 40
    assert [case["text"] for case in round_trips if tok.decode(case["ids"]) != case["text"]] == []


@pytest.mark.parametrize("name", MODELS)
def test_token_pieces_match_llama_cpp(name, tokenizer):
    tok, pieces = tokenizer(name), load_ref(name)["pieces"]
    wrong = [
        token_id
        for token_id, piece, special_piece in pieces
        if tok.token_bytes(token_id, special=False) != as_bytes(piece)
        or tok.token_bytes(token_id, special=True) != as_bytes(special_piece)
    ]
    assert wrong == []


@pytest.mark.parametrize("name", MODELS)
def test_long_english_and_code_prompt_tokenizes(name, tokenizer):
    tok = tokenizer(name)
    case = max(load_ref(name)["cases"], key=lambda c: len(c["text"]))
    assert "def step_" in case["text"] and "Section" in case["text"]
    ids = tok.encode(case["text"], add_special=True)
    assert len(ids) >= 3900
    assert ids == case["ids"]


@pytest.mark.parametrize("name", MODELS)
def test_incremental_decoder_never_splits_a_character(name, tokenizer):
    tok, cases = tokenizer(name), load_ref(name)["cases"]
    multibyte = [case for case in cases if any(ord(ch) > 0x7FF for ch in case["text"])]
    assert len(multibyte) >= 10
    held_back = 0
    for case in multibyte:
        ids = expected_ids(case, parse_special=True)
        decoder = tok.incremental_decoder()
        chunks = [decoder.feed(token_id) for token_id in ids] + [decoder.flush()]
        assert "".join(chunks) == tok.decode(ids)
        if "\ufffd" not in tok.decode(ids):
            assert not any("\ufffd" in chunk for chunk in chunks), case["text"]
        held_back += sum(
            1
            for token_id, chunk in zip(ids, chunks[:-1], strict=True)
            if tok.token_bytes(token_id, False) and not chunk
        )
    if name == "smollm2-135m-instruct":
        assert held_back > 0  # byte-level BPE splits characters across tokens: the decoder had to wait


@pytest.mark.parametrize("name", MODELS)
def test_incremental_decoder_concatenation_equals_decode(name, tokenizer):
    tok, cases = tokenizer(name), load_ref(name)["cases"]
    for case in cases:
        for ids, special, _ in detok_checks(case):
            decoder = tok.incremental_decoder(special=special)
            streamed = "".join(decoder.feed(token_id) for token_id in ids) + decoder.flush()
            assert streamed == tok.decode(ids, special=special), case["text"][:60]


@pytest.fixture(scope="module")
def variants(metadata):
    """SmolLM2's vocabulary under other pre-tokenizers, as the reference GGUFs were made."""
    ref = load_ref("bpe_variants")
    base = {k: v for k, v in metadata(ref["base_model"]).items() if k not in ref["removed_keys"]}
    tokenizers = {
        pre: Tokenizer.from_metadata({**base, "tokenizer.ggml.pre": pre})
        for pre in ("gpt-2", "default", "llama-bpe", "qwen2")
    }
    return tokenizers, ref["cases"]


@pytest.mark.parametrize("pre", ["gpt-2", "default", "llama-bpe", "qwen2"])
def test_bpe_pre_tokenizer_variants_match_llama_cpp(pre, variants):
    tokenizers, all_cases = variants
    tok = tokenizers[pre]
    cases = [case for case in all_cases if case["pre"] == pre]
    assert len(cases) >= 40
    assert tok.add_bos == cases[0]["add_bos"]
    wrong = [
        (case["text"][:60], parse_special)
        for case in cases
        for parse_special in (False, True)
        if tok.encode(case["text"], add_special=True, parse_special=parse_special)
        != expected_ids(case, parse_special)
    ]
    wrong += [
        (case["text"][:60], "detok", special)
        for case in cases
        for ids, special, expected in detok_checks(case)
        if tok.detokenize(ids, special=special) != expected
    ]
    assert wrong == []


def test_clean_spaces_streams_like_the_whole_text(variants):
    """The gpt-2 pre-tokenizer cleans spaces on decode; the incremental decoder must give the same text."""
    tok = variants[0]["gpt-2"]
    assert tok.clean_spaces
    pieces = [" ", "  ", "'", " '", " ,", "re", "ve", "ll", *"s m t d e ? ! . , a x".split()]
    pool = [tok.encode(p, add_special=False) for p in pieces] + [tok.encode("é😀", add_special=False)]
    rng = random.Random(7)
    for _ in range(1000):
        ids = [i for _ in range(rng.randint(1, 30)) for i in rng.choice(pool)]
        decoder = tok.incremental_decoder()
        streamed = "".join(decoder.feed(token_id) for token_id in ids) + decoder.flush()
        assert streamed == tok.decode(ids)
        assert tok.detokenize(ids) == clean_spaces(b"".join(tok.token_bytes(i, False) for i in ids))


def test_pre_tokenizer_splits_match_the_original_regexes():
    ref = load_ref("pretokenizers")
    for pre in ref["regexes"]:
        cases = [case for case in ref["cases"] if case["pre"] == pre]
        assert len(cases) >= 40
        wrong = [
            case["text"] for case in cases if pre_tokenize(case["text"], PRE_TOKENIZERS[pre]) != case["words"]
        ]
        assert wrong == [], pre


def test_unsupported_tokenizers_are_refused(metadata):
    base = metadata("smollm2-135m-instruct")
    with pytest.raises(TokenizerError, match="bert"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.model": "bert"})
    with pytest.raises(TokenizerError, match="no-such-pre"):
        Tokenizer.from_metadata({**base, "tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata({k: v for k, v in base.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(TokenizerError, match="tokens"):
        Tokenizer.from_metadata({k: v for k, v in base.items() if k != "tokenizer.ggml.tokens"})


def test_token_bytes_rejects_ids_outside_the_vocabulary(tokenizer):
    tok = tokenizer("smollm2-135m-instruct")
    with pytest.raises(TokenizerError, match="outside"):
        tok.token_bytes(tok.n_vocab)
