"""Pre-tokenizers for byte-level BPE: split text into words the way llama.cpp does.

llama.cpp selects a list of regexes by `tokenizer.ggml.pre` and applies them in sequence: each regex
splits every piece produced so far into its matches and the gaps between them. The big GPT-2 /
Llama-3 / Qwen2 regexes need \\p{L} and \\p{N}, which Python's `re` lacks, so they are written here as
hand-made scanners over Unicode categories, following the same decisions as llama.cpp's custom
splitters in unicode.cpp. Categories come from `unicodedata` (the runtime's Unicode version); the
whitespace set is llama.cpp's, not `str.isspace()`.
"""

import unicodedata

LETTER = 1  # \p{L}
NUMBER = 2  # \p{N}
SPACE = 4  # \s as llama.cpp defines it
PUNCT = 8  # \p{P}

# llama.cpp's \s: the Unicode White_Space property (str.isspace() also counts U+001C..U+001F).
WHITESPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)

_FLAG_OF_MAJOR_CATEGORY = {"L": LETTER, "N": NUMBER, "P": PUNCT}
_flag_cache: dict[str, int] = {}


def char_flags(ch: str) -> int:
    """Category bits of one character (cached: texts repeat few distinct characters)."""
    flags = _flag_cache.get(ch)
    if flags is None:
        flags = _FLAG_OF_MAJOR_CATEGORY.get(unicodedata.category(ch)[0], 0)
        if ch in WHITESPACE:
            flags |= SPACE
        _flag_cache[ch] = flags
    return flags


def text_flags(text: str) -> list[int]:
    cache = _flag_cache
    return [cache[ch] if ch in cache else char_flags(ch) for ch in text]


def _is_contraction(text: str, pos: int, n: int, ignore_case: bool) -> int:
    """Length of a contraction ('s 't 're 've 'm 'll 'd) starting at text[pos] == "'", else 0."""
    if pos + 1 >= n:
        return 0
    # only ASCII letters fold onto the ASCII contraction letters (llama.cpp's adapted '[sS]' classes)
    nxt = text[pos + 1]
    if ignore_case and nxt.isascii():
        nxt = nxt.lower()
    if nxt in "stmd":
        return 2
    if pos + 2 < n:
        pair = text[pos + 1 : pos + 3]
        if ignore_case and pair.isascii():
            pair = pair.lower()
        if pair in ("re", "ve", "ll"):
            return 3
    return 0


def split_gpt2(text: str) -> list[str]:
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    flags = text_flags(text)
    n = len(text)
    words = []
    pos = 0
    while pos < n:
        if text[pos] == "'":
            length = _is_contraction(text, pos, n, ignore_case=False)
            if length:
                words.append(text[pos : pos + length])
                pos += length
                continue
        # an optional leading space joins the run that follows it
        first = pos + 1 if text[pos] == " " else pos
        kind = flags[first] if first < n else 0
        if kind & (LETTER | NUMBER):
            run = kind & (LETTER | NUMBER)
            end = first + 1
            while end < n and flags[end] & run:
                end += 1
        elif first < n and not kind & (SPACE | LETTER | NUMBER):
            end = first + 1
            while end < n and not flags[end] & (SPACE | LETTER | NUMBER):
                end += 1
        else:
            end = _whitespace_end(flags, pos, n)
        words.append(text[pos:end])
        pos = end
    return words


def _whitespace_end(flags: list[int], pos: int, n: int) -> int:
    """\\s+(?!\\S)|\\s+ : a run of spaces gives its last one to the word that follows it."""
    end = pos
    while end < n and flags[end] & SPACE:
        end += 1
    if end - pos > 1 and end < n:
        return end - 1
    return end


def _split_llama3_like(text: str, max_digits: int) -> list[str]:
    """(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,max_digits}
    | ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    flags = text_flags(text)
    n = len(text)
    words = []
    pos = 0
    while pos < n:
        ch = text[pos]
        here = flags[pos]
        if ch == "'":
            length = _is_contraction(text, pos, n, ignore_case=True)
            if length:
                words.append(text[pos : pos + length])
                pos += length
                continue
        if (
            ch not in "\r\n"
            and not here & NUMBER
            and (here & LETTER or (pos + 1 < n and flags[pos + 1] & LETTER))
        ):
            # one optional non-letter prefix character, then letters
            end = pos + 1
            while end < n and flags[end] & LETTER:
                end += 1
        elif here & NUMBER:
            end = pos + 1
            while end < n and end - pos < max_digits and flags[end] & NUMBER:
                end += 1
        else:
            first = pos + 1 if ch == " " else pos
            kind = flags[first] if first < n else 0
            if not kind & (SPACE | LETTER | NUMBER):
                end = first
                while end < n and not flags[end] & (SPACE | LETTER | NUMBER):
                    end += 1
                while end < n and text[end] in "\r\n":
                    end += 1
            else:
                end = _newline_or_whitespace_end(text, flags, pos, n)
        words.append(text[pos:end])
        pos = end
    return words


def _newline_or_whitespace_end(text: str, flags: list[int], pos: int, n: int) -> int:
    """\\s*[\\r\\n]+ (up to the last newline of the run), else \\s+(?!\\S)|\\s+."""
    end = pos
    after_newline = 0
    while end < n and flags[end] & SPACE:
        if text[end] in "\r\n":
            after_newline = end + 1
        end += 1
    if after_newline:
        return after_newline
    if end - pos > 1 and end < n:
        return end - 1
    return end


def split_llama3(text: str) -> list[str]:
    return _split_llama3_like(text, max_digits=3)


def split_qwen2(text: str) -> list[str]:
    return _split_llama3_like(text, max_digits=1)


def _isolate(text: str, is_member, runs: bool) -> list[str]:
    """Split around characters matching is_member (each alone, or maximal runs of them)."""
    words = []
    start = 0
    pos = 0
    n = len(text)
    while pos < n:
        if not is_member(text[pos]):
            pos += 1
            continue
        end = pos + 1
        if runs:
            while end < n and is_member(text[end]):
                end += 1
        if pos > start:
            words.append(text[start:pos])
        words.append(text[pos:end])
        start = pos = end
    if start < n:
        words.append(text[start:])
    return words


def split_each_digit(text: str) -> list[str]:
    """\\p{N}: every number character is its own word."""
    return _isolate(text, lambda ch: char_flags(ch) & NUMBER, runs=False)


def split_number_runs(text: str) -> list[str]:
    """\\p{N}+"""
    return _isolate(text, lambda ch: char_flags(ch) & NUMBER, runs=True)


def split_punctuation_runs(text: str) -> list[str]:
    """[\\p{P}\\$\\+<=>\\^~\\|]+"""
    return _isolate(text, lambda ch: char_flags(ch) & PUNCT or ch in "$+<=>^~|", runs=True)


def split_ascii_digit_triples(text: str) -> list[str]:
    """[0-9][0-9][0-9]: leftmost groups of exactly three ASCII digits."""
    words = []
    start = 0
    pos = 0
    n = len(text)
    while pos + 3 <= n:
        if text[pos : pos + 3].isdigit() and text[pos : pos + 3].isascii():
            if pos > start:
                words.append(text[start:pos])
            words.append(text[pos : pos + 3])
            start = pos = pos + 3
        else:
            pos += 1
    if start < n:
        words.append(text[start:])
    return words


_DEFAULT = (split_punctuation_runs, split_gpt2, split_number_runs, split_ascii_digit_triples)
_GPT2 = (split_gpt2,)
_STARCODER = (split_each_digit, split_gpt2)
_LLAMA3 = (split_llama3,)
_QWEN2 = (split_qwen2,)

# tokenizer.ggml.pre -> splitters applied in order (llama.cpp's pre-tokenizer families)
PRE_TOKENIZERS = {
    "default": _DEFAULT,
    "gpt-2": _GPT2,
    "phi-2": _GPT2,
    "mpt": _GPT2,
    "olmo": _GPT2,
    "jais": _GPT2,
    "exaone4": _GPT2,
    "smollm": _STARCODER,
    "starcoder": _STARCODER,
    "refact": _STARCODER,
    "command-r": _STARCODER,
    "codeshell": _STARCODER,
    "exaone": _STARCODER,
    "minerva-7b": _STARCODER,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "falcon3": _LLAMA3,
    "dbrx": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "stablelm2": _QWEN2,
    "megrez": _QWEN2,
}


def pre_tokenize(text: str, splitters) -> list[str]:
    words = [text]
    for split in splitters:
        words = [piece for word in words for piece in split(word)]
    return words


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character table (bytes that print as themselves stay)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return [table[byte] for byte in range(256)]


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {ch: byte for byte, ch in enumerate(BYTE_TO_CHAR)}
# str.translate table: a latin-1 decoded byte string -> GPT-2 byte characters
_BYTE_ENCODE_TABLE = {byte: ch for byte, ch in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """UTF-8 bytes of word, each byte spelled as its GPT-2 character."""
    return word.encode("utf-8").decode("latin-1").translate(_BYTE_ENCODE_TABLE)
