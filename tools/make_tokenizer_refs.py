"""Make the tokenizer references: llama.cpp's ids and detokenized bytes, and the original regexes' splits.

Writes
- tests/refs/tokenizer_<model>.json for each model: for every test string, llama.cpp's ids with add_bos on,
  without and with special-token parsing; llama_detokenize's bytes for those ids; the pieces of a sample of
  token ids; the end-of-generation ids. tests/unit/test_tokenizer.py checks webgguf.tokenizer against it.
- tests/refs/tokenizer_bpe_variants.json: the same for SmolLM2's vocabulary under other pre-tokenizers
  (gpt-2, default, llama-bpe, qwen2): a vocabulary-only GGUF with SmolLM2's tokenizer metadata,
  tokenizer.ggml.pre replaced and tokenizer.ggml.add_bos_token left out (so each pre-tokenizer's own BOS
  default applies), loaded by llama.cpp.
- tests/refs/tokenizer_pretokenizers.json: how the original regexes of the gpt-2, llama-bpe and qwen2
  pre-tokenizers (as written in the models' tokenizer.json) split the test strings, computed with the
  `regex` package.

Run with the venv that has llama-cpp-python and regex (see DESIGN.md):
    /tmp/llvenv/bin/python tools/make_tokenizer_refs.py
"""

import ctypes
import json
import tempfile
from pathlib import Path

import llama_cpp
import regex
from gguf import GGUFReader, GGUFValueType, GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
REFS = ROOT / "tests/refs"
MODELS = {
    "smollm2-135m-instruct": ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma-3-270m": ROOT / "models/cache/gemma-3-270m-q4_k_m.gguf",
}
N_PIECE_SAMPLES = 400  # token ids whose pieces are recorded, evenly spread, plus the first 300

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world   with    many     spaces",
    "   leading and trailing   ",
    " ",
    "a",
    "",
    "\t\ttabs\tand\ttabs\t",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\n\n\n",
    "  \n\n  x \n \t\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i] * b[i]; }",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null}}',
    '<div class="x">Hello &amp; goodbye</div>',
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "3.14159 2,718 1e-9 0x1F 007 +42 -17 $100 50% 1/2",
    "I'm sure you're right, they've said we'll go and he'd agree, it's John's.",
    "DON'T SHOUT, I'M HERE! YOU'LL SEE, WE'VE WON, SHE'D KNOW",
    "l'homme c'est l'été, it’s curly ‘quoted’ “double”",
    "日本語のテキストを分割します。",
    "中文分词测试：你好，世界！",
    "한국어 텍스트도 있습니다",
    "Привет, мир! Как дела?",
    "Ελληνικά γράμματα και αριθμοί 123",
    "مرحبا بالعالم",
    "हिन्दी में लिखा गया पाठ",
    "Café naïve résumé façade jalapeño Zürich Ǆ ǅ ǆ",
    "e\u0301 a\u0308 n\u0303 combining marks: Z\u0351\u0352\u0353algo",
    "emoji 😀😃😄 and thumbs 👍🏽 and flags 🇫🇷🇯🇵",
    "family 👨\u200d👩\u200d👧\u200d👦 and ZWJ 🏳️\u200d🌈 and 🧑🏿\u200d💻",
    "🙂",
    "math: ∑ x² ≤ ∞, α β γ → λ ∈ ℝ, Ⅻ ½ ٣ ৩ ①",
    "symbols: © ® ™ € £ ¥ § ¶ • … — –",
    "non-breaking\u00a0space and\u2003em space and\u3000ideographic",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "MixedCASE camelCase snake_case kebab-case SCREAMING_CASE abc123def456 x1y2z3",
    "https://example.com/path?query=1&b=two#frag user@example.org",
    "!!!???...,,,;;;:::'''\"\"\"```",
    "Wait , what ? Yes ! No . He said ' hi ' and it 's fine , we 're done , "
    "I 'm here , you 've got it , don 't , I 'd , we 'll",
    "   !!!   ???   ",
    "Tab\tseparated\tvalues\n1\t2\t3\n",
    "    indented code block\n        more indent\n",
    " " * 40 + "x" + "\n" * 35,
    "The quick brown fox jumps over the lazy dog. " * 3,
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "abc<|im_start|>def<|im_end|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "text with </s> and <s> and <eos> inside",
    "<bos>explicit bos<eos>",
    "<|endoftext|>after end",
    "<0x41><0xE2> byte tokens as text",
    "<unused0> and <unused99> control text",
    "<table><tr><td>cell</td></tr></table>",
    "[multimodal] <start_of_image> <end_of_image>",
]

# extra strings for the pre-tokenizer splits: the corners of the regexes
SPLIT_TEXTS = [
    "x'S y'LL z'Re w'd 'tis o'clock",
    "(hello) [world] {x}",
    " !!!\n\n",
    "a\r\n\r\nb",
    "end with space ",
    "end with spaces   ",
    "\t\tfoo",
    "   \nfoo",
    "foo \n bar",
    "12345678 and ١٢٣٤٥",
    "a1b22c333d4444",
    "...\n\n\nword",
    "x  y",
    "$$$ ### @@@",
]

VARIANT_BASE = "smollm2-135m-instruct"
VARIANT_PRES = ["gpt-2", "default", "llama-bpe", "qwen2"]

PRE_TOKENIZER_REGEXES = {
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def long_text() -> str:
    """About 4,000 tokens of English and code, deterministic."""
    parts = []
    for i in range(33):
        parts.append(
            f"Section {i + 1}. The engine reads {i * 37 + 5} tensors from the file header, "
            f"checks that every offset is aligned to {2 ** (i % 6 + 4)} bytes, and uploads the weights "
            "to the GPU in one pass. Isn't that what we'd want? It's fast, and it doesn't copy.\n"
        )
        parts.append(
            f"def step_{i}(x, w):\n"
            f"    # scale by {i / 7:.4f} then add the bias\n"
            f"    y = [v * {i + 1} for v in x]\n"
            f"    return {{'out': y, 'n': len(y), 'ok': {i % 2 == 0}}}\n\n"
        )
    return "".join(parts)


def detokenize(vocab, ids: list[int], unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    assert 0 <= n <= size, n
    return buf.raw[:n]


def piece(vocab, token_id: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, token_id, buf, 256, 0, special)
    assert 0 <= n <= 256, n
    return buf.raw[:n]


def as_json_bytes(data: bytes):
    """Bytes as text when they are valid UTF-8 (readable diffs), else as {"hex": ...}."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": data.hex()}


def tokenize_case(llm: llama_cpp.Llama, text: str) -> dict:
    """Ids without and with special-token parsing (the second where it differs) and their detokenizations."""
    vocab = llm._model.vocab
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    ids_special = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
    case = {"text": text, "ids": ids, "detok": as_json_bytes(detokenize(vocab, ids, False))}
    if ids_special != ids:
        case["ids_special"] = ids_special
        case["detok_special"] = as_json_bytes(detokenize(vocab, ids_special, False))
    unparsed = detokenize(vocab, ids_special, True)
    if unparsed != detokenize(vocab, ids_special, False):
        case["detok_unparsed"] = as_json_bytes(unparsed)
    return case


def model_refs(name: str, path: Path) -> dict:
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    sampled = range(0, n_vocab, max(1, n_vocab // N_PIECE_SAMPLES))
    piece_ids = sorted(set(range(min(300, n_vocab))) | set(sampled) | {n_vocab - 1})
    return {
        "model": name,
        "file": path.name,
        "llama_cpp_python": llama_cpp.__version__,
        "n_vocab": n_vocab,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "cases": [tokenize_case(llm, text) for text in [*TEXTS, long_text()]],
        # [id, piece, piece with special tokens rendered]
        "pieces": [
            [i, as_json_bytes(piece(vocab, i, False)), as_json_bytes(piece(vocab, i, True))]
            for i in piece_ids
        ],
    }


def write_bpe_variant(source: Path, pre: str, out: Path) -> None:
    """A GGUF with no tensors: source's llama.* and tokenizer.* keys, tokenizer.ggml.pre set to pre."""
    reader = GGUFReader(source)
    writer = GGUFWriter(out, "llama")
    skip = {"tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"}
    for key, field in reader.fields.items():
        if not key.startswith(("llama.", "tokenizer.")) or key in skip:
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    writer.add_string("tokenizer.ggml.pre", pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def bpe_variant_refs() -> dict:
    source = MODELS[VARIANT_BASE]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for pre in VARIANT_PRES:
            path = Path(tmp) / f"{pre}.gguf"
            write_bpe_variant(source, pre, path)
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
            cases += [{"pre": pre, "add_bos": add_bos, **tokenize_case(llm, text)} for text in TEXTS]
    return {"base_model": VARIANT_BASE, "removed_keys": ["tokenizer.ggml.add_bos_token"], "cases": cases}


def split_with(pattern: regex.Pattern, text: str) -> list[str]:
    """Matches and the gaps between them, as llama.cpp and Hugging Face's Split(Isolated) keep both."""
    words = []
    start = 0
    for match in pattern.finditer(text):
        if match.start() > start:
            words.append(text[start : match.start()])
        words.append(match.group())
        start = match.end()
    if start < len(text):
        words.append(text[start:])
    return words


def pretokenizer_refs() -> dict:
    texts = [t for t in [*TEXTS, *SPLIT_TEXTS] if t]
    cases = []
    for name, source in PRE_TOKENIZER_REGEXES.items():
        pattern = regex.compile(source)
        cases += [{"pre": name, "text": t, "words": split_with(pattern, t)} for t in texts]
    return {"regex_version": regex.__version__, "regexes": PRE_TOKENIZER_REGEXES, "cases": cases}


def write(path: Path, data: dict) -> None:
    """One line per top-level key, and one per list item: small diffs when llama.cpp changes."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
            items = ",\n  ".join(json.dumps(item, ensure_ascii=False) for item in value)
            lines.append(f"{json.dumps(key)}: [\n  {items}\n ]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    path.write_text("{\n " + ",\n ".join(lines) + "\n}\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")


def main() -> None:
    REFS.mkdir(parents=True, exist_ok=True)
    for name, path in MODELS.items():
        write(REFS / f"tokenizer_{name}.json", model_refs(name, path))
    write(REFS / "tokenizer_bpe_variants.json", bpe_variant_refs())
    write(REFS / "tokenizer_pretokenizers.json", pretokenizer_refs())


if __name__ == "__main__":
    main()
