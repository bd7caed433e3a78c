"""The scale ladder: real-shaped stand-ins of the 0.5-8B models people run, for benchmarks.

The models themselves cannot be downloaded here, and the engine's speed depends only on the shapes and
quant types of the tensors, not on their values. A stand-in has the model family's real tokenizer (the
vocabulary GGUFs that llama.cpp ships for its tokenizer tests: ggml-vocab-llama-bpe.gguf is Llama 3's,
ggml-vocab-qwen2.gguf is Qwen2's), the model's hyperparameters, every tensor of the real model with the type
llama.cpp's `quantize` assigns for the file type (Q4_K_M, Q4_0, Q8_0: `tensor_types` below), and random
well-formed blocks (random bytes with finite f16 scales) as data.

    python tools/ladder.py list
    python tools/ladder.py vocab DIR                  # fetch the vocabulary GGUFs (from PyPI)
    python tools/ladder.py make NAME VOCAB_DIR OUT.gguf [--seed N]
    python tools/ladder.py types NAME                 # the tensor types a stand-in gets, with counts

`make` needs numpy (it writes GBs: random bytes in large slices, scales fixed with strided views).
"""

from __future__ import annotations

import argparse
import io
import struct
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from webgguf.gguf import GGUFValueType, read_header  # noqa: E402
from webgguf.quants import TYPE_BY_NAME  # noqa: E402

VOCAB_SDIST = "llama-cpp-python==0.3.36"  # its vendored llama.cpp carries models/ggml-vocab-*.gguf
VOCAB_FILES = {"llama-bpe": "ggml-vocab-llama-bpe.gguf", "qwen2": "ggml-vocab-qwen2.gguf"}


@dataclass(frozen=True)
class Recipe:
    """A model's shapes, as its config.json and llama.cpp's converter give them."""

    arch: str  # general.architecture
    vocab: str  # key of VOCAB_FILES
    n_vocab: int  # rows of the embedding (the converter pads the token list to it)
    n_layer: int
    d_model: int
    d_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    tied: bool  # no output.weight: the head reads token_embd.weight
    rope_base: float
    rms_eps: float
    n_ctx_train: int
    qkv_bias: bool = False  # qwen2
    rope_freqs: bool = False  # Llama 3.1 / 3.2: rope_freqs.weight, one factor per rotated pair
    ftype: str = "Q4_K_M"  # Q4_K_M | Q4_0 | Q8_0

    @property
    def name_in_file(self) -> str:
        return f"{self.arch} stand-in ({self.ftype}, {self.n_layer} layers x {self.d_model})"


_LLAMA3 = dict(arch="llama", vocab="llama-bpe", n_vocab=128256, rope_base=500000.0, rms_eps=1e-5)
_QWEN25 = dict(arch="qwen2", vocab="qwen2", rope_base=1000000.0, rms_eps=1e-6, qkv_bias=True)

RECIPES: dict[str, Recipe] = {
    "qwen2.5-0.5b": Recipe(
        **_QWEN25,
        n_vocab=151936,
        n_layer=24,
        d_model=896,
        d_ff=4864,
        n_head=14,
        n_head_kv=2,
        head_dim=64,
        tied=True,
        n_ctx_train=32768,
    ),
    "llama-3.2-1b": Recipe(
        **_LLAMA3,
        n_layer=16,
        d_model=2048,
        d_ff=8192,
        n_head=32,
        n_head_kv=8,
        head_dim=64,
        tied=True,
        n_ctx_train=131072,
        rope_freqs=True,
    ),
    "llama-3.2-3b": Recipe(
        **_LLAMA3,
        n_layer=28,
        d_model=3072,
        d_ff=8192,
        n_head=24,
        n_head_kv=8,
        head_dim=128,
        tied=True,
        n_ctx_train=131072,
        rope_freqs=True,
    ),
    "qwen2.5-7b": Recipe(
        **_QWEN25,
        n_vocab=152064,
        n_layer=28,
        d_model=3584,
        d_ff=18944,
        n_head=28,
        n_head_kv=4,
        head_dim=128,
        tied=False,
        n_ctx_train=32768,
    ),
    "llama-3.1-8b": Recipe(
        **_LLAMA3,
        n_layer=32,
        d_model=4096,
        d_ff=14336,
        n_head=32,
        n_head_kv=8,
        head_dim=128,
        tied=False,
        n_ctx_train=131072,
        rope_freqs=True,
    ),
}
for _base in ("llama-3.1-8b",):
    for _ftype in ("Q4_0", "Q8_0"):
        RECIPES[f"{_base}-{_ftype.lower()}"] = Recipe(**{**RECIPES[_base].__dict__, "ftype": _ftype})


# ---------------------------------------------------------------- tensors and their types


def tensors(r: Recipe) -> list[tuple[str, tuple[int, ...]]]:
    """(name, GGUF shape: row length first) of every tensor, in the converter's order."""
    q_rows, kv_rows = r.n_head * r.head_dim, r.n_head_kv * r.head_dim
    out = [("token_embd.weight", (r.d_model, r.n_vocab))]
    if r.rope_freqs:
        out.append(("rope_freqs.weight", (r.head_dim // 2,)))
    for i in range(r.n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (r.d_model,))]
        out += [(b + "attn_q.weight", (r.d_model, q_rows)), (b + "attn_k.weight", (r.d_model, kv_rows))]
        out += [(b + "attn_v.weight", (r.d_model, kv_rows))]
        if r.qkv_bias:
            out += [(b + "attn_q.bias", (q_rows,)), (b + "attn_k.bias", (kv_rows,))]
            out += [(b + "attn_v.bias", (kv_rows,))]
        out += [(b + "attn_output.weight", (q_rows, r.d_model)), (b + "ffn_norm.weight", (r.d_model,))]
        out += [(b + "ffn_gate.weight", (r.d_model, r.d_ff)), (b + "ffn_up.weight", (r.d_model, r.d_ff))]
        out += [(b + "ffn_down.weight", (r.d_ff, r.d_model))]
    out.append(("output_norm.weight", (r.d_model,)))
    if not r.tied:
        out.append(("output.weight", (r.d_model, r.n_vocab)))
    return out


def _more_bits(layer: int, n_layer: int) -> bool:
    """The layers whose attn_v / ffn_down Q4_K_M keeps in Q6_K: the first and last eighth, every third
    one between (llama.cpp's rule, llama-quant.cpp)."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


# What llama.cpp uses when a row is not a whole number of 256-element super-blocks.
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def tensor_types(r: Recipe) -> dict[str, str]:
    """The type `llama-quantize --ftype r.ftype` gives each tensor of an F16/BF16 model (its default
    options, no imatrix): 1-D tensors stay F32; the output head (or a tied embedding) takes Q6_K unless
    the file type is Q8_0; Q4_K_M keeps attn_v and ffn_down in Q6_K on the `_more_bits` layers."""
    base = {"Q4_K_M": "Q4_K", "Q4_0": "Q4_0", "Q8_0": "Q8_0"}[r.ftype]
    types = {}
    for name, shape in tensors(r):
        if len(shape) == 1:
            types[name] = "F32"
            continue
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        kind = name.split(".")[-2]
        t = base
        if name == "output.weight" or (r.tied and name == "token_embd.weight"):
            t = base if base == "Q8_0" else "Q6_K"
        elif r.ftype == "Q4_K_M" and kind in ("attn_v", "ffn_down") and _more_bits(layer, r.n_layer):
            t = "Q6_K"
        if shape[0] % TYPE_BY_NAME[t].block_elems:
            t = _FALLBACK[t]
        types[name] = t
    return types


# ---------------------------------------------------------------- a GGUF header


def _encode_value(vtype: GGUFValueType, value) -> bytes:
    codes = {
        GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
        GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
        GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
        GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
    }  # fmt: skip
    if vtype == GGUFValueType.STRING:
        raw = value.encode()
        return struct.pack("<Q", len(raw)) + raw
    return struct.pack("<" + codes[vtype], value)


def _encode_kv(key: str, vtype, value) -> bytes:
    out = _encode_value(GGUFValueType.STRING, key)
    if isinstance(vtype, tuple):  # (ARRAY, element type)
        elem = vtype[1]
        out += struct.pack("<IIQ", GGUFValueType.ARRAY, elem, len(value))
        if elem == GGUFValueType.STRING:
            return out + b"".join(_encode_value(elem, v) for v in value)
        code = {GGUFValueType.INT32: "i", GGUFValueType.UINT32: "I", GGUFValueType.FLOAT32: "f"}[elem]
        return out + struct.pack(f"<{len(value)}{code}", *value)
    return out + struct.pack("<I", vtype) + _encode_value(vtype, value)


def header_bytes(
    r: Recipe, vocab_dir: Path | None
) -> tuple[bytes, list[tuple[str, str, tuple[int, ...], int]]]:
    """The GGUF header of the stand-in (metadata + tensor infos, padded to the alignment), and its
    tensors as (name, type, shape, offset in the data section). Without a vocab_dir the header has no
    tokenizer: enough for sizing (pre-flight), not for running."""
    T = GGUFValueType
    a = r.arch
    kvs = [
        ("general.architecture", T.STRING, a),
        ("general.name", T.STRING, r.name_in_file),
        ("general.file_type", T.UINT32, {"Q4_K_M": 15, "Q4_0": 2, "Q8_0": 7}[r.ftype]),
        ("general.quantization_version", T.UINT32, 2),
        (f"{a}.block_count", T.UINT32, r.n_layer),
        (f"{a}.context_length", T.UINT32, r.n_ctx_train),
        (f"{a}.embedding_length", T.UINT32, r.d_model),
        (f"{a}.feed_forward_length", T.UINT32, r.d_ff),
        (f"{a}.attention.head_count", T.UINT32, r.n_head),
        (f"{a}.attention.head_count_kv", T.UINT32, r.n_head_kv),
        (f"{a}.attention.key_length", T.UINT32, r.head_dim),
        (f"{a}.attention.value_length", T.UINT32, r.head_dim),
        (f"{a}.rope.dimension_count", T.UINT32, r.head_dim),
        (f"{a}.rope.freq_base", T.FLOAT32, r.rope_base),
        (f"{a}.attention.layer_norm_rms_epsilon", T.FLOAT32, r.rms_eps),
        (f"{a}.vocab_size", T.UINT32, r.n_vocab),
    ]
    vocab = read_header(vocab_dir / VOCAB_FILES[r.vocab], first_read=16 << 20) if vocab_dir else None
    for key, value in vocab.metadata.items() if vocab else ():
        if not key.startswith("tokenizer."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type") and len(value) < r.n_vocab:
            # The converter pads the vocabulary to the embedding's rows with unused tokens.
            n = len(value)
            pad = (
                [f"[PAD{i}]" for i in range(n, r.n_vocab)]
                if key.endswith("tokens")
                else [5] * (r.n_vocab - n)
            )
            value = value + pad
        kvs.append((key, vocab.metadata_types[key], value))
    types = tensor_types(r)
    infos, placed, offset = [], [], 0
    for name, shape in tensors(r):
        t = TYPE_BY_NAME[types[name]]
        n_elements = 1
        for d in shape:
            n_elements *= d
        nbytes = n_elements // t.block_elems * t.block_bytes
        infos.append(
            _encode_value(T.STRING, name)
            + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, t.id, offset)
        )
        placed.append((name, t.name, shape, offset))
        offset += -(-nbytes // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kvs))
    head += b"".join(_encode_kv(k, vt, v) for k, vt, v in kvs) + b"".join(infos)
    return head + bytes(-len(head) % 32), placed


# ---------------------------------------------------------------- random well-formed data

# Byte offsets of the f16 scale fields in one block, by type: they must be finite.
F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "IQ4_NL": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,),
}  # fmt: skip
SCALE = 0.002  # every block's f16 scale(s): small, so random quants keep activations finite
SLICE_BLOCKS = 1 << 20  # blocks drawn per numpy call (bounded memory for multi-GB tensors)


def write_random_tensor(out: io.BufferedWriter, type_name: str, n_elements: int, rng) -> None:
    """n_elements of random well-formed data of one type, written in slices."""
    import numpy as np

    if type_name == "F32":  # norm weights, biases, RoPE factors: around 1 (positive, finite)
        out.write(rng.normal(1.0, 0.1, n_elements).astype("<f4").tobytes())
        return
    if type_name == "F16":
        out.write(rng.normal(0.0, 0.02, n_elements).astype("<f2").tobytes())
        return
    t = TYPE_BY_NAME[type_name]
    scale = np.frombuffer(struct.pack("<e", SCALE), dtype=np.uint8)
    n_blocks = n_elements // t.block_elems
    for first in range(0, n_blocks, SLICE_BLOCKS):
        count = min(SLICE_BLOCKS, n_blocks - first)
        blocks = np.frombuffer(rng.bytes(count * t.block_bytes), dtype=np.uint8).reshape(count, t.block_bytes)
        blocks = blocks.copy()
        for field in F16_FIELDS[type_name]:
            blocks[:, field : field + 2] = scale
        out.write(blocks.tobytes())


def make(r: Recipe, vocab_dir: Path, path: Path, seed: int = 0) -> None:
    import numpy as np

    head, placed = header_bytes(r, vocab_dir)
    rng = np.random.default_rng(seed)
    with open(path, "wb") as out:
        out.write(head)
        data_start = out.tell()
        for _name, type_name, shape, offset in placed:
            out.write(bytes(data_start + offset - out.tell()))
            n_elements = 1
            for d in shape:
                n_elements *= d
            write_random_tensor(out, type_name, n_elements, rng)


# ---------------------------------------------------------------- the vocabulary files


def fetch_vocab(dest: Path) -> None:
    """The vocabulary GGUFs from llama.cpp's sources (the llama-cpp-python sdist on PyPI)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:", VOCAB_SDIST]
        subprocess.run(cmd + ["-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if name in VOCAB_FILES.values() and "/models/" in member.name:
                    (dest / name).write_bytes(tar.extractfile(member).read())
    missing = [f for f in VOCAB_FILES.values() if not (dest / f).exists()]
    if missing:
        raise SystemExit(f"{VOCAB_SDIST} did not hold {missing}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    p = sub.add_parser("vocab")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("make")
    p.add_argument("name", choices=sorted(RECIPES))
    p.add_argument("vocab_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("types")
    p.add_argument("name", choices=sorted(RECIPES))
    args = parser.parse_args()
    if args.command == "list":
        for name, r in RECIPES.items():
            size = sum(_nbytes(s, t) for (_, s), t in zip(tensors(r), tensor_types(r).values(), strict=True))
            print(f"{name:24} {r.arch:6} {r.ftype:7} {size / 2**30:6.2f} GiB")
    elif args.command == "vocab":
        fetch_vocab(args.dir)
    elif args.command == "make":
        make(RECIPES[args.name], args.vocab_dir, args.out, args.seed)
    else:
        for (type_name, kind), count in sorted(Counter(_kinds(RECIPES[args.name])).items()):
            print(f"{count:4} {kind:20} {type_name}")


def _nbytes(shape: tuple[int, ...], type_name: str) -> int:
    t = TYPE_BY_NAME[type_name]
    n = 1
    for d in shape:
        n *= d
    return n // t.block_elems * t.block_bytes


def _kinds(r: Recipe):
    """(type, tensor name without its layer) of every tensor."""
    for name, t in tensor_types(r).items():
        yield t, ".".join(name.split(".")[2:]) if name.startswith("blk.") else name


if __name__ == "__main__":
    main()
