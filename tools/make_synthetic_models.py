"""Write small synthetic GGUFs for architectures with no real model here: qwen2, qwen3, and llama with the
Llama 3 BPE pre-tokenizer (and Llama 3.1's rope_freqs.weight).

Each model has random weights, real-shaped metadata, and a real tokenizer: SmolLM2's GPT-2 BPE vocabulary and
merges (read from its GGUF) under another `tokenizer.ggml.pre`. The same recipe and tokenizer GGUF give a
byte-identical file: tools/make_arch_refs.py records each file's recipe and sha256 next to llama.cpp's logits,
and tests/models/test_arch_parity.py rebuilds the file from the recipe and checks the sha256.

Weights are scaled so that activations keep unit size through the layers. A random model's logits are nearly
Gaussian, so its top two crowd together (49152 draws: a typical gap of std / 4.6), and the rounding llama.cpp
applies to activations (to f16 for F16 weights, to 8-bit blocks for Q8_0 weights) flips top-1s that the
reference, in f32, does not. So the rows of the logit projection get log-normal norms, which spreads the top
logits apart as in trained models, and the blocks' matrices are F16 or F32; Q8_0 is used where llama.cpp
reads it without rounding activations (the embedding lookup). With Q8_0 matrices, 3 of 96 positions flipped.

    python tools/make_synthetic_models.py [--tokenizer-gguf PATH] [--out-dir DIR] [NAME ...]
"""

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER_GGUF = ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
LOGIT_STD = 8.0  # the spread of the logits
LOGIT_ROW_SIGMA = 0.5  # the logit projection's rows have norms scaled by exp(N(0, sigma^2))

try:
    from webgguf.gguf import read_header
except ImportError:  # run from a venv without the package installed (llama.cpp's)
    sys.path.insert(0, str(ROOT / "py"))
    from webgguf.gguf import read_header


@dataclass(frozen=True)
class Recipe:
    name: str  # file stem, and key of RECIPES
    arch: str  # general.architecture
    pre: str  # tokenizer.ggml.pre: the pre-tokenizer llama.cpp applies
    add_bos: bool  # tokenizer.ggml.add_bos_token
    seed: int
    n_layer: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int  # written as attention.key_length / value_length when n_head * head_dim != d_model
    d_ff: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    matrix_type: str  # GGML type of the blocks' weight matrices
    embedding_type: str  # GGML type of token_embd.weight
    output_type: str  # GGML type of output.weight; "tied": no output.weight, logits use token_embd
    qkv_bias: bool  # attn_{q,k,v}.bias (qwen2)
    qk_norm: bool  # attn_{q,k}_norm.weight (qwen3)
    llama3_rope_freqs: bool  # rope_freqs.weight with Llama 3.1's long-context factors


RECIPES = {
    r.name: r
    for r in [
        Recipe(
            name="synthetic-qwen2",
            arch="qwen2",
            pre="qwen2",
            add_bos=False,
            seed=2,
            n_layer=3,
            d_model=256,
            n_head=8,
            n_head_kv=2,
            head_dim=32,
            d_ff=512,
            n_ctx_train=32768,
            rms_eps=1e-6,
            rope_base=1000000.0,
            matrix_type="F16",
            embedding_type="Q8_0",
            output_type="F16",
            qkv_bias=True,
            qk_norm=False,
            llama3_rope_freqs=False,
        ),
        Recipe(
            name="synthetic-qwen3",
            arch="qwen3",
            pre="qwen2",
            add_bos=False,
            seed=3,
            n_layer=3,
            d_model=256,
            n_head=8,
            n_head_kv=2,
            head_dim=64,  # n_head * head_dim = 512 != d_model, as in Qwen3 0.6B
            d_ff=768,
            n_ctx_train=40960,
            rms_eps=1e-6,
            rope_base=1000000.0,
            matrix_type="F32",
            embedding_type="F16",
            output_type="tied",
            qkv_bias=False,
            qk_norm=True,
            llama3_rope_freqs=False,
        ),
        Recipe(
            name="synthetic-llama3",
            arch="llama",
            pre="llama-bpe",
            add_bos=True,
            seed=1,
            n_layer=2,
            d_model=256,
            n_head=4,
            n_head_kv=1,
            head_dim=64,
            d_ff=640,
            n_ctx_train=131072,
            rms_eps=1e-5,
            rope_base=500000.0,
            matrix_type="F16",
            embedding_type="Q8_0",
            output_type="F16",
            qkv_bias=False,
            qk_norm=False,
            llama3_rope_freqs=True,
        ),
    ]
}


def write_model(recipe: Recipe, path: Path, tokenizer_gguf: Path = DEFAULT_TOKENIZER_GGUF) -> str:
    """Write the model of `recipe` to `path`; its sha256 (hex)."""
    r = recipe
    rng = np.random.default_rng(r.seed)
    tokenizer = read_header(tokenizer_gguf).metadata
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"])
    d, d_q, d_kv = r.d_model, r.n_head * r.head_dim, r.n_head_kv * r.head_dim

    def matrix(n_out: int, n_in: int, std: float = 1.0) -> np.ndarray:
        """[n_out, n_in] random, entries std / sqrt(n_in): y = W @ x has entries about std * rms(x)."""
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std / np.sqrt(n_in))

    def norm(width: int) -> np.ndarray:
        return 1 + np.float32(0.1) * rng.standard_normal(width, dtype=np.float32)

    writer = gguf.GGUFWriter(path, r.arch)
    writer.add_name(r.name)
    writer.add_context_length(r.n_ctx_train)
    writer.add_embedding_length(d)
    writer.add_block_count(r.n_layer)
    writer.add_feed_forward_length(r.d_ff)
    writer.add_head_count(r.n_head)
    writer.add_head_count_kv(r.n_head_kv)
    if d_q != d:
        writer.add_key_length(r.head_dim)
        writer.add_value_length(r.head_dim)
    writer.add_layer_norm_rms_eps(r.rms_eps)
    writer.add_rope_freq_base(r.rope_base)
    writer.add_rope_dimension_count(r.head_dim)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(r.pre)
    writer.add_token_list(tokenizer["tokenizer.ggml.tokens"])
    writer.add_token_types(tokenizer["tokenizer.ggml.token_type"])
    writer.add_token_merges(tokenizer["tokenizer.ggml.merges"])
    writer.add_bos_token_id(tokenizer["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(tokenizer["tokenizer.ggml.eos_token_id"])
    writer.add_pad_token_id(tokenizer["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(r.add_bos)
    writer.add_chat_template(tokenizer["tokenizer.chat_template"])

    def add(name: str, values: np.ndarray, type_name: str = "F32") -> None:
        if type_name == "F32":
            writer.add_tensor(name, values.astype(np.float32))
        elif type_name == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        else:
            quant_type = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, gguf.quants.quantize(values, quant_type), raw_dtype=quant_type)

    # Unit-size embeddings; with a tied output they also set the logits' spread (|normed x| = sqrt(d)).
    def logit_rows() -> np.ndarray:
        """[n_vocab, d] rows of a logit projection: logits about LOGIT_STD * exp(N(0, LOGIT_ROW_SIGMA^2))."""
        row_scales = np.exp(LOGIT_ROW_SIGMA * rng.standard_normal((n_vocab, 1), dtype=np.float32))
        return matrix(n_vocab, d, std=LOGIT_STD) * row_scales

    if r.output_type == "tied":
        add("token_embd.weight", logit_rows(), r.embedding_type)
    else:
        add("token_embd.weight", rng.standard_normal((n_vocab, d), dtype=np.float32), r.embedding_type)
    if r.llama3_rope_freqs:
        add("rope_freqs.weight", llama3_rope_freqs(r.rope_base, r.head_dim))
    for layer in range(r.n_layer):
        p = f"blk.{layer}."
        add(p + "attn_norm.weight", norm(d))
        # Queries twice the keys' scale: sharper attention, so positions (RoPE) matter.
        add(p + "attn_q.weight", matrix(d_q, d, std=2.0), r.matrix_type)
        add(p + "attn_k.weight", matrix(d_kv, d), r.matrix_type)
        add(p + "attn_v.weight", matrix(d_kv, d), r.matrix_type)
        if r.qkv_bias:
            add(p + "attn_q.bias", 0.5 * rng.standard_normal(d_q, dtype=np.float32))
            add(p + "attn_k.bias", 0.5 * rng.standard_normal(d_kv, dtype=np.float32))
            add(p + "attn_v.bias", 0.5 * rng.standard_normal(d_kv, dtype=np.float32))
        if r.qk_norm:
            add(p + "attn_q_norm.weight", 2 * norm(r.head_dim))
            add(p + "attn_k_norm.weight", norm(r.head_dim))
        add(p + "attn_output.weight", matrix(d, d_q), r.matrix_type)
        add(p + "ffn_norm.weight", norm(d))
        add(p + "ffn_gate.weight", matrix(r.d_ff, d), r.matrix_type)
        add(p + "ffn_up.weight", matrix(r.d_ff, d), r.matrix_type)
        add(p + "ffn_down.weight", matrix(d, r.d_ff), r.matrix_type)
    add("output_norm.weight", norm(d))
    if r.output_type != "tied":
        add("output.weight", logit_rows(), r.output_type)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return file_sha256(path)


def llama3_rope_freqs(rope_base: float, head_dim: int) -> np.ndarray:
    """Llama 3.1's per-pair RoPE wavelength factors [head_dim / 2], as its GGUF converter writes them
    (factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192): long wavelengths are
    stretched 8x, short ones kept, the band between blended."""
    factor, low_freq_factor, high_freq_factor, original_context = 8.0, 1.0, 4.0, 8192
    freqs = 1.0 / rope_base ** (np.arange(0, head_dim, 2) / head_dim)  # [head_dim / 2]
    wavelen = 2 * np.pi / freqs
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = 1 / ((1 - smooth) / factor + smooth)
    long_wave = wavelen > original_context / low_freq_factor
    short_wave = wavelen < original_context / high_freq_factor
    return np.where(short_wave, 1.0, np.where(long_wave, factor, blended)).astype(np.float32)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models to write (default: all of {', '.join(RECIPES)})")
    parser.add_argument("--tokenizer-gguf", type=Path, default=DEFAULT_TOKENIZER_GGUF)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "models/cache")
    args = parser.parse_args()
    unknown = set(args.names) - set(RECIPES)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.names or RECIPES:
        path = args.out_dir / f"{name}.gguf"
        sha256 = write_model(RECIPES[name], path, args.tokenizer_gguf)
        print(f"{path} ({path.stat().st_size / 1e6:.1f} MB) sha256 {sha256}")


if __name__ == "__main__":
    main()
