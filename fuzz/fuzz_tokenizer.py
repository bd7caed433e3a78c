"""Fuzz target: webgguf.tokenizer's encode, decode and IncrementalDecoder on the real models' vocabularies.

The tokenizers are built once from the GGUF metadata of SmolLM2 (GPT-2 byte-level BPE) and Gemma 3
(SentencePiece), plus the same vocabularies under other settings llama.cpp supports, so that code the
two models leave unused runs too (space cleaning, ignore_merges, other pre-tokenizers, SentencePiece's
dummy prefix). What must hold:
- encode gives in-range ids for any text, and raises nothing at all unless the text holds a lone
  surrogate (then TokenizerError is allowed);
- decode gives valid text (no lone surrogates) for in-range ids and TokenizerError for any other id;
- the IncrementalDecoder's pieces are valid text and join to exactly decode(ids).

Input layout: one flag byte, then the payload.
  bits 0-2  which tokenizer (modulo their number)
  bit 3     parse_special for encode, special for decode
  bit 4     add_special for encode
  bits 5-6  0, 1: payload is text (encoded, then its ids decoded); 2: payload is ids, 3 bytes each,
            modulo the vocabulary size; 3: payload is ids, signed 32-bit each (mostly out of range)
"""

from harness import fuzz, has_lone_surrogate, instrument_module, text_of

from webgguf import models, pretokenize, tokenizer
from webgguf.gguf import read_header
from webgguf.tokenizer import Tokenizer, TokenizerError

BPE_PRE_VARIANTS = ("gpt-2", "llama3", "qwen2", "default")
# Coverage feedback comes from all of tokenizer.py but this: its loop over every special token (6414 in
# Gemma 3) runs ~20x slower instrumented, and its branches say little about the text.
UNINSTRUMENTED = frozenset(["Tokenizer._partition"])


def build_tokenizers() -> list[Tokenizer]:
    bpe = read_header(models.ensure("smollm2-135m-instruct")).metadata
    spm = read_header(models.ensure("gemma-3-270m")).metadata
    tokenizers = [Tokenizer(bpe), Tokenizer(spm)]
    tokenizers += [Tokenizer({**bpe, "tokenizer.ggml.pre": pre}) for pre in BPE_PRE_VARIANTS]
    tokenizers.append(Tokenizer({**spm, "tokenizer.ggml.add_space_prefix": True}))
    return tokenizers


TOKENIZERS = build_tokenizers()  # before instrumenting: loading the vocabularies needs no feedback
instrument_module(pretokenize)
instrument_module(tokenizer, skip=UNINSTRUMENTED)


def check_valid_text(text: str) -> None:
    assert not has_lone_surrogate(text), f"decoded text holds a lone surrogate: {text!r}"


def check_decoders(tok: Tokenizer, ids: list[int], special: bool) -> None:
    """ids are all in range: decode and the incremental decoder give the same valid text."""
    expected = tok.decode(ids, special)
    check_valid_text(expected)
    decoder = tok.incremental_decoder(special)
    pieces = [decoder.feed(token_id) for token_id in ids]
    pieces.append(decoder.flush())
    for piece in pieces:
        check_valid_text(piece)
    streamed = "".join(pieces)
    assert streamed == expected, f"incremental {streamed!r} != decode {expected!r} for ids {ids}"


def check_out_of_range(tok: Tokenizer, ids: list[int], special: bool) -> None:
    """Some id is out of range: decode and feeding that id raise TokenizerError, earlier ids decode."""
    try:
        tok.decode(ids, special)
    except TokenizerError:
        pass
    else:
        raise AssertionError(f"decode accepted out-of-range ids {ids}")
    decoder = tok.incremental_decoder(special)
    for token_id in ids:
        if not 0 <= token_id < tok.n_vocab:
            try:
                decoder.feed(token_id)
            except TokenizerError:
                return
            raise AssertionError(f"IncrementalDecoder.feed accepted out-of-range id {token_id}")
        check_valid_text(decoder.feed(token_id))


def check_encode(tok: Tokenizer, text: str, add_special: bool, parse_special: bool) -> None:
    try:
        ids = tok.encode(text, add_special=add_special, parse_special=parse_special)
    except TokenizerError:
        if has_lone_surrogate(text):
            return
        raise
    assert all(isinstance(i, int) and 0 <= i < tok.n_vocab for i in ids), f"ids out of range: {ids}"
    check_decoders(tok, ids, parse_special)


def ids_of(payload: bytes, width: int, n_vocab: int | None) -> list[int]:
    chunks = (payload[i : i + width] for i in range(0, len(payload) - width + 1, width))
    if n_vocab is None:
        return [int.from_bytes(chunk, "little", signed=True) for chunk in chunks]
    return [int.from_bytes(chunk, "little") % n_vocab for chunk in chunks]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    flags, payload = data[0], data[1:]
    tok = TOKENIZERS[(flags & 7) % len(TOKENIZERS)]
    special = bool(flags & 8)
    mode = (flags >> 5) & 3
    if mode < 2:
        check_encode(tok, text_of(payload), add_special=bool(flags & 16), parse_special=special)
        return
    ids = ids_of(payload, 3, tok.n_vocab) if mode == 2 else ids_of(payload, 4, None)
    if all(0 <= i < tok.n_vocab for i in ids):
        check_decoders(tok, ids, special)
    else:
        check_out_of_range(tok, ids, special)


# ---- seed corpus ---------------------------------------------------------------------------------------

SEED_TEXTS = [
    "Hello world! How are you today?",
    "  leading and   inner   spaces ?  ! . , ' s 're 've 'm 't 'll 'd",
    "I'm sure they'RE here; DON'T WORRY, it'S fine.",
    "def f(x):\n\tif x > 12345:\n\t\treturn x ** 2  # square\r\n\r\n\n",
    "naïve café, Ünïcödé: 日本語のテキスト, 한국어, русский, العربية, 🤖👍🏽",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n<bos><eos><pad>",
    "\u2581\u2581 spm marks \u2581x <0x41> <0xE2> [EMPTY_0]",
    "\u00a0\u2028\u3000\x85 whitespace\x0b\x0c and digits ١٢٣ 12 123 1234",
    "\ud83e\udd16 lone \udc80 surrogates \ud800",
]


def _seed_texts_bytes() -> list[bytes]:
    return [text.encode("utf-8", "surrogatepass") for text in SEED_TEXTS]


def seeds() -> list[bytes]:
    out = []
    for index in range(len(TOKENIZERS)):
        for k, text in enumerate(_seed_texts_bytes()):
            flags = index | (8 if k % 2 else 0) | (16 if k % 3 == 0 else 0)
            out.append(bytes([flags]) + text)
        out.append(bytes([index | 2 << 5]) + bytes(range(0, 240, 7)))  # ids modulo the vocabulary
        raw_ids = (5).to_bytes(4, "little") + (-1).to_bytes(4, "little", signed=True)
        out.append(bytes([index | 3 << 5 | 8]) + raw_ids)  # one id in range, one out
    return out


if __name__ == "__main__":
    fuzz(test_one_input, seeds())
