"""Tokenizers built from GGUF metadata alone, matching llama.cpp token for token.

Two vocabularies are supported:
- `tokenizer.ggml.model == "gpt2"`: byte-level BPE. Text is split into words by the pre-tokenizer
  named in `tokenizer.ggml.pre` (see pretokenize.py), each word's UTF-8 bytes are spelled with
  GPT-2's byte characters, and adjacent symbols merge by rank from `tokenizer.ggml.merges`.
- `tokenizer.ggml.model == "llama"`: SentencePiece. Spaces become U+2581, adjacent symbols merge by
  the score of the token they form, and characters outside the vocabulary fall back to <0xXX> tokens.

Special tokens (CONTROL / USER_DEFINED types) are cut out of the text before either algorithm runs,
longest first, as llama.cpp does. Decoding follows llama_detokenize (remove_special off), and the
IncrementalDecoder streams the same text without ever splitting a UTF-8 character.

Why one module of ~530 lines: both algorithms share the special-token split, the vocabulary tables and
the decoder, which must agree with each other token for token (pre-tokenization is pretokenize.py).
"""

import codecs
import heapq

from .pretokenize import CHAR_TO_BYTE, PRE_TOKENIZERS, byte_encode, pre_tokenize


class TokenizerError(ValueError):
    """The GGUF's tokenizer metadata is missing, malformed or of an unsupported kind."""


# llama.cpp's token attribute bits; tokenizer.ggml.token_type values map onto them
UNKNOWN = 1 << 0
UNUSED = 1 << 1
NORMAL = 1 << 2
CONTROL = 1 << 3
USER_DEFINED = 1 << 4
BYTE = 1 << 5
ATTR_OF_TOKEN_TYPE = {0: 0, 1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}

SPACE_MARK = "\u2581"  # SentencePiece's visible space

# Tokens that end generation, recognized by their text (llama.cpp does the same: GGUFs rarely list them).
EOG_TEXTS = frozenset(
    [
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~[",
    ]
)  # fmt: skip

# Special ids found by text when the metadata leaves them out: key -> candidate texts, in order.
# Each one found is made a CONTROL token; the fim pad / repo / file-separator ones also end generation.
DETECTED_SPECIALS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
# deprecated spellings of the fim ids, read after the current ones (they win when both are present)
DEPRECATED_FIM_KEYS = {
    "fim_pre": "tokenizer.ggml.prefix_token_id",
    "fim_suf": "tokenizer.ggml.suffix_token_id",
    "fim_mid": "tokenizer.ggml.middle_token_id",
}

# BPE pre-tokenizer flags that differ from the BPE defaults
LLAMA3_PRE = frozenset(["llama3", "llama-v3", "llama-bpe", "falcon3"])  # merges ignored for whole-token words
NO_CLEAN_SPACES_PRE = frozenset(["smollm", "command-r", "qwen2", "deepseek-r1-qwen"])


def _get(metadata: dict, key: str, kind, default=None):
    value = metadata.get(key, default)
    if value is not default and not isinstance(value, kind):
        raise TokenizerError(f"{key} has type {type(value).__name__}, expected {kind}")
    return value


def _utf8(text: str) -> bytes:
    # GGUF strings keep invalid UTF-8 bytes as surrogate escapes; give the bytes back as they were
    return text.encode("utf-8", "surrogateescape")


class Tokenizer:
    """Encode text to token ids and back, exactly as llama.cpp does for the same GGUF."""

    def __init__(self, metadata: dict):
        model = _get(metadata, "tokenizer.ggml.model", str)
        if model not in ("gpt2", "llama"):
            raise TokenizerError(f"tokenizer.ggml.model {model!r} is not supported (only 'gpt2' and 'llama')")
        self.is_bpe = model == "gpt2"
        tokens = _get(metadata, "tokenizer.ggml.tokens", list)
        if not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        self.n_vocab = len(tokens)
        self.tokens = [text if text else f"[EMPTY_{i}]" for i, text in enumerate(tokens)]
        self.token_to_id = {text: i for i, text in enumerate(self.tokens)}
        self.attrs = self._read_attrs(metadata)
        self._read_flags(metadata)
        self._read_special_ids(metadata)
        self.eog_ids = self._find_eog_ids()
        self._apply_attr_overrides()
        # special tokens cut out of the text before tokenizing, longest text first
        specials = [i for i, a in enumerate(self.attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        self.special_ids = sorted(specials, key=lambda i: -len(_utf8(self.tokens[i])))
        self._pieces: dict[int, bytes] = {}
        if self.is_bpe:
            self._words: dict[str, list[int]] = {}  # pre-token word -> its ids
            self._ranks = self._read_merges(metadata)
        else:
            self.scores = self._read_scores(metadata)

    @classmethod
    def from_metadata(cls, metadata: dict) -> "Tokenizer":
        return cls(metadata)

    # ---- loading -------------------------------------------------------------------------------

    def _read_attrs(self, metadata: dict) -> list[int]:
        types = _get(metadata, "tokenizer.ggml.token_type", list)
        if types is None:
            return [NORMAL] * self.n_vocab
        if len(types) < self.n_vocab:
            raise TokenizerError(
                f"tokenizer.ggml.token_type has {len(types)} entries for {self.n_vocab} tokens"
            )
        return [ATTR_OF_TOKEN_TYPE.get(t, 0) for t in types[: self.n_vocab]]

    def _read_flags(self, metadata: dict) -> None:
        """Per-vocabulary defaults (as llama.cpp sets them), then the metadata's own flags."""
        self.ignore_merges = False
        if self.is_bpe:
            pre = _get(metadata, "tokenizer.ggml.pre", str) or "default"
            if pre not in PRE_TOKENIZERS:
                known = ", ".join(sorted(PRE_TOKENIZERS))
                raise TokenizerError(f"tokenizer.ggml.pre {pre!r} is not supported (known: {known})")
            self.pre = pre
            self.splitters = PRE_TOKENIZERS[pre]
            self.ignore_merges = pre in LLAMA3_PRE
            self.clean_spaces = pre not in NO_CLEAN_SPACES_PRE
            add_space_prefix, add_bos = False, pre in LLAMA3_PRE
        else:
            self.pre = None
            self.clean_spaces = False
            add_space_prefix, add_bos = True, True
        self.add_space_prefix = _get(metadata, "tokenizer.ggml.add_space_prefix", bool, add_space_prefix)
        self.add_bos = _get(metadata, "tokenizer.ggml.add_bos_token", bool, add_bos)
        self.add_eos = _get(metadata, "tokenizer.ggml.add_eos_token", bool, False)

    def _read_special_ids(self, metadata: dict) -> None:
        defaults = {"bos": 11, "eos": 11, "unk": None} if self.is_bpe else {"bos": 1, "eos": 2, "unk": 0}
        ids = {}
        for name, key in SPECIAL_ID_KEYS.items():
            default = defaults.get(name)
            ids[name] = default if default is not None and default < self.n_vocab else None
            value = _get(metadata, key, int)
            if value is not None and 0 <= value < self.n_vocab:
                ids[name] = value
        for name, key in DEPRECATED_FIM_KEYS.items():
            value = _get(metadata, key, int)
            if value is not None and 0 <= value < self.n_vocab:
                ids[name] = value
        for name, texts in DETECTED_SPECIALS.items():
            if ids[name] is None:
                found = next((self.token_to_id[t] for t in texts if t in self.token_to_id), None)
                if found is not None:
                    ids[name] = found
                    self.attrs[found] |= CONTROL
        self.special = ids
        self.bos_id = ids["bos"]
        self.eos_id = ids["eos"]
        self.eot_id = ids["eot"]
        self.unk_id = ids["unk"]

    def _find_eog_ids(self) -> set[int]:
        ids = {self.special[name] for name in ("fim_pad", "fim_rep", "fim_sep")} - {None}
        for text in EOG_TEXTS:
            i = self.token_to_id.get(text)
            if i is not None:
                ids.add(i)
                self.attrs[i] |= CONTROL
        ids |= {self.special[name] for name in ("eos", "eot", "eom")} - {None}
        texts = {self.tokens[i]: i for i in ids}
        # harmony / solar-open: <|end|> only ends a message there, generation goes on
        if "<|end|>" in texts and (
            ("<|return|>" in texts and "<|call|>" in texts) or ("<|calls|>" in texts and "<|flush|>" in texts)
        ):
            ids.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = USER_DEFINED
        # gemma4 / plamo2: </s> is ordinary text there
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            ids.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = NORMAL
        return ids

    def _apply_attr_overrides(self) -> None:
        # gpt-oss: these structural tokens are always rendered as text
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if text in self.token_to_id:
                self.attrs[self.token_to_id[text]] = USER_DEFINED

    def _read_merges(self, metadata: dict) -> dict[tuple[str, str], int]:
        merges = _get(metadata, "tokenizer.ggml.merges", list)
        if merges is None:
            raise TokenizerError("tokenizer.ggml.merges is missing (required for a gpt2 tokenizer)")
        ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)
            pair = (merge[:cut], merge[cut + 1 :]) if cut >= 0 else ("", "")
            ranks.setdefault(pair, rank)  # the first listing of a pair wins
        return ranks

    def _read_scores(self, metadata: dict) -> list[float]:
        scores = _get(metadata, "tokenizer.ggml.scores", list)
        if scores is None:
            return [0.0] * self.n_vocab
        if len(scores) < self.n_vocab:
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for {self.n_vocab} tokens")
        return [float(s) for s in scores[: self.n_vocab]]

    # ---- encoding ------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text. add_special adds BOS/EOS as the model asks (add_bos_token /
        add_eos_token); parse_special lets control tokens written in the text become those tokens
        (user-defined tokens always do)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates: not text that UTF-8 (or llama.cpp) can hold
            raise TokenizerError(f"text is not valid Unicode at index {e.start}: {e.reason}") from None
        ids = []
        if add_special and self.add_bos:
            ids.append(self._required(self.bos_id, "BOS"))
        after_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            elif self.is_bpe:
                ids.extend(self._encode_bpe(fragment))
            else:
                # SentencePiece's dummy prefix: a space before text that starts the input or follows a special
                if self.add_space_prefix and after_special:
                    fragment = " " + fragment
                ids.extend(self._encode_spm(fragment.replace(" ", SPACE_MARK)))
                after_special = False
        if add_special and self.add_eos:
            ids.append(self._required(self.eos_id, "EOS"))
        return ids

    def _required(self, token_id: int | None, name: str) -> int:
        if token_id is None:
            raise TokenizerError(f"the model asks for a {name} token but has none")
        return token_id

    def _partition(self, text: str, parse_special: bool) -> list:
        """Split text around special-token texts: a list of str (plain text) and int (token ids)."""
        fragments: list = [text] if text else []
        for token_id in self.special_ids:
            if not parse_special and self.attrs[token_id] & (CONTROL | UNKNOWN):
                continue
            special = self.tokens[token_id]
            if special not in text:
                continue
            split: list = []
            for fragment in fragments:
                if isinstance(fragment, int) or special not in fragment:
                    split.append(fragment)
                    continue
                for k, part in enumerate(fragment.split(special)):
                    if k:
                        split.append(token_id)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    def _encode_bpe(self, text: str) -> list[int]:
        ids = []
        words = self._words
        for word in pre_tokenize(text, self.splitters):
            word = byte_encode(word)
            word_ids = words.get(word)
            if word_ids is None:
                word_ids = self._bpe_word(word)
                if len(words) >= 100_000:  # bound the cache on very long inputs
                    words.clear()
                words[word] = word_ids
            ids.extend(word_ids)
        return ids

    def _bpe_word(self, word: str) -> list[int]:
        """Ids of one byte-encoded word: its characters merged by rank, lowest first."""
        if self.ignore_merges and word in self.token_to_id:
            return [self.token_to_id[word]]
        ranks = self._ranks
        ids = []
        for symbol in merge_symbols(word, lambda left, right: ranks.get((left, right))):
            token_id = self.token_to_id.get(symbol)
            if token_id is not None:
                ids.append(token_id)
                continue
            # llama.cpp looks each byte up on its own and drops those the vocabulary lacks
            for byte in _utf8(symbol):
                single = bytes([byte]).decode("utf-8", "surrogateescape")
                if single in self.token_to_id:
                    ids.append(self.token_to_id[single])
        return ids

    def _encode_spm(self, text: str) -> list[int]:
        """Ids of SentencePiece text: pairs merged into the highest-scoring token they form."""
        vocab = self.token_to_id
        scores = self.scores

        def priority(left: str, right: str) -> float | None:
            token_id = vocab.get(left + right)
            return None if token_id is None else -scores[token_id]

        ids = []
        for symbol in merge_symbols(text, priority):
            token_id = vocab.get(symbol)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._byte_token(byte) for byte in _utf8(symbol))
        return ids

    def _byte_token(self, byte: int) -> int:
        """SentencePiece byte fallback: <0xXX>, else the byte as a one-character token."""
        token_id = self.token_to_id.get(f"<0x{byte:02X}>")
        if token_id is None:
            token_id = self.token_to_id.get(bytes([byte]).decode("utf-8", "surrogateescape"))
        if token_id is None:
            raise TokenizerError(f"no token for byte 0x{byte:02X} (vocabulary without byte fallback)")
        return token_id

    # ---- decoding ------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes token_id stands for. Control tokens give their text only when special is set."""
        if not 0 <= token_id < self.n_vocab:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        if not special and self.attrs[token_id] & (CONTROL | UNKNOWN):
            return b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (CONTROL | UNKNOWN | USER_DEFINED):
            return _utf8(text)
        if attr & NORMAL:
            if self.is_bpe:
                return _bpe_text_bytes(text)
            return _utf8(text.replace(SPACE_MARK, " "))
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens have no text

    def detokenize(self, ids, special: bool = False) -> bytes:
        """Bytes of the ids, as llama_detokenize gives them (remove_special off)."""
        pieces = [self.token_bytes(i, special) for i in ids]
        if pieces and self.add_space_prefix and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]  # the dummy prefix space SentencePiece added at encode time
        data = b"".join(pieces)
        return clean_spaces(data) if self.clean_spaces else data

    def decode(self, ids, special: bool = False) -> str:
        return self.detokenize(ids, special).decode("utf-8", "replace")

    def incremental_decoder(self, special: bool = False) -> "IncrementalDecoder":
        return IncrementalDecoder(self, special)


def merge_symbols(text: str, priority) -> list[str]:
    """Start from the characters of text; while some adjacent pair has a priority (priority(left, right)
    is not None), merge the pair with the smallest one, the leftmost on ties. Returns the final symbols.

    This is llama.cpp's bigram queue: queued pairs go stale when a neighbour merges first, which shows
    as a changed length on either side.
    """
    n = len(text)
    lengths = [1] * n  # symbol i starts at text[i]; merged-away symbols have length 0
    prev = list(range(-1, n - 1))  # start of the symbol before each live symbol
    queue: list = []  # (priority, left start, right start, merged length)

    def push(left: int, right: int) -> None:
        size = right - left + lengths[right]
        rank = priority(text[left:right], text[right : left + size])
        if rank is not None:
            heapq.heappush(queue, (rank, left, right, size))

    for i in range(1, n):
        push(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        if not lengths[left] or not lengths[right] or lengths[left] + lengths[right] != size:
            continue  # one side has merged since this pair was queued
        lengths[left] = size
        lengths[right] = 0
        after = left + size
        if after < n:
            prev[after] = left
        if prev[left] >= 0:
            push(prev[left], left)
        if after < n:
            push(left, after)
    symbols = []
    i = 0
    while i < n:
        symbols.append(text[i : i + lengths[i]])
        i += lengths[i]
    return symbols


def _bpe_text_bytes(text: str) -> bytes:
    """Undo GPT-2's byte spelling; a character outside it is kept visible as llama.cpp does."""
    out = bytearray()
    for ch in text:
        byte = CHAR_TO_BYTE.get(ch)
        if byte is not None:
            out.append(byte)
        else:
            out += b"[UNK_BYTE_0x" + _utf8(ch).hex().encode() + _utf8(text) + b"]"
    return bytes(out)


def clean_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: drop the space in " ?", " !", " .", " ,", around a
    lone apostrophe " ' ", and before the contractions " 's", " 'm", " 're", " 've"."""
    text = bytearray(data)
    # pass 1: " ?" " !" " ." " ,"
    total, end = (1 if text else 0), len(text)
    for i in range(1, end):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # pass 2: " ' " -> "'"
    end, total, i = total, (1 if total else 0), 1
    while i < end:
        x = text[i]
        if x == 0x27 and i + 1 < end and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            total -= 1
            i += 1
            text[i] = 0  # the space after is skipped (and no longer counts as a space)
        text[total] = x
        total += 1
        i += 1
    # pass 3: " 's" " 'm" " 're" " 've" lose their space (" 't" " 'd" " 'll" keep it)
    end, total = total, (1 if total else 0)
    for i in range(1, end):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < end:
            x1 = text[i + 1]
            if x1 in b"sm" or (x1 in b"rv" and i + 2 < end and text[i + 2] == ord("e")):
                total -= 1
        text[total] = x
        total += 1
    return bytes(text[:total])


# A cut in the byte stream where clean_spaces(a + b) == clean_spaces(a) + clean_spaces(b): the two bytes
# before it are neither spaces nor apostrophes (so nothing near the cut is deleted or starts a pattern)
# and the byte after it cannot end one. Checked exhaustively on all strings of up to 8 bytes over
# " 'srevl.x".
_NOT_BEFORE_CUT = frozenset(b" '\0")
_NOT_AFTER_CUT = frozenset(b" '?!.,\0")


class IncrementalDecoder:
    """Feed generated ids one at a time; get back only complete UTF-8 text.

    The concatenation of everything feed() and flush() return equals tokenizer.decode(ids).
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._first = True
        self._uncleaned = bytearray()  # bytes waiting for enough context to clean their spaces

    def feed(self, token_id: int) -> str:
        piece = self.tokenizer.token_bytes(token_id, self.special)
        if self._first:
            self._first = False
            if self.tokenizer.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
        if not self.tokenizer.clean_spaces:
            return self._utf8.decode(piece)
        self._uncleaned += piece
        cut = self._last_safe_cut()
        if not cut:
            return ""
        ready = clean_spaces(bytes(self._uncleaned[:cut]))
        del self._uncleaned[:cut]
        return self._utf8.decode(ready)

    def flush(self) -> str:
        rest = clean_spaces(bytes(self._uncleaned)) if self._uncleaned else b""
        self._uncleaned.clear()
        return self._utf8.decode(rest, final=True)

    def _last_safe_cut(self) -> int:
        """The last position where the waiting bytes can be cleaned in two independent parts, or 0."""
        data = self._uncleaned
        for cut in range(len(data) - 1, 1, -1):
            if (
                data[cut] not in _NOT_AFTER_CUT
                and data[cut - 1] not in _NOT_BEFORE_CUT
                and data[cut - 2] not in _NOT_BEFORE_CUT
            ):
                return cut
        return 0
