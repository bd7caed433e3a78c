"""The llama family (Llama 1-3, Mistral 7B, SmolLM2, ...): config from GGUF metadata.

Tensor names (GGUF, used verbatim): token_embd.weight, output_norm.weight, output.weight (absent when tied to
the embedding), rope_freqs.weight (optional, Llama 3.1 long-context frequency factors), and per layer blk.N.:
attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down (.weight).
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from webgguf.arch import ConfigError, read_key
from webgguf.graph import AttentionSpec

# llama.cpp's defaults for optional keys (llama-model.cpp / llama-hparams).
DEFAULT_ROPE_FREQ_BASE = 10000.0


@dataclass(frozen=True)
class LlamaConfig:
    arch: str  # general.architecture
    n_layer: int
    d_model: int  # embedding width
    n_head: int  # query heads
    n_head_kv: int  # key/value heads (grouped-query attention when < n_head)
    head_dim: int
    d_ff: int  # feed-forward hidden width
    n_vocab: int
    n_ctx_train: int  # context length the model was trained for
    rms_eps: float
    rope_base: float  # theta: frequency of pair i is rope_base ** (-2i / rope_dims)
    rope_dims: int  # leading dims of each head that are rotated (the rest pass through)
    rope_scale: float  # positions are multiplied by this (linear rope scaling: 1 / factor)
    tied_output: bool  # logits use token_embd.weight when output.weight is absent
    rope_freq_factors: bool  # rope_freqs.weight divides each pair's angle (Llama 3.1 long context)

    @property
    def n_group(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_head_kv


def config_from_metadata(metadata: dict[str, Any], tensor_names: Iterable[str]) -> LlamaConfig:
    arch = read_key(metadata, "general.architecture", str)
    names = set(tensor_names)

    def key(name: str, kind: type, default: Any = None) -> Any:
        return read_key(metadata, f"{arch}.{name}", kind, default)

    d_model = key("embedding_length", int)
    n_head = key("attention.head_count", int)
    head_dim = key("attention.key_length", int, d_model // n_head)
    if key("attention.value_length", int, head_dim) != head_dim:
        raise ConfigError(f"{arch}: attention.value_length differs from attention.key_length")
    n_head_kv = key("attention.head_count_kv", int, n_head)
    if n_head % n_head_kv != 0:
        raise ConfigError(f"{arch}: head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    if "tokenizer.ggml.tokens" in metadata:
        n_vocab_default = len(metadata["tokenizer.ggml.tokens"])
    else:
        n_vocab_default = None
    rope_dims = key("rope.dimension_count", int, head_dim)
    if rope_dims % 2 != 0 or rope_dims > head_dim:
        raise ConfigError(f"{arch}: rope.dimension_count {rope_dims} must be even and <= head dim {head_dim}")
    return LlamaConfig(
        arch=arch,
        n_layer=key("block_count", int),
        d_model=d_model,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        d_ff=key("feed_forward_length", int),
        n_vocab=key("vocab_size", int, n_vocab_default),
        n_ctx_train=key("context_length", int),
        rms_eps=key("attention.layer_norm_rms_epsilon", float),
        rope_base=key("rope.freq_base", float, DEFAULT_ROPE_FREQ_BASE),
        rope_dims=rope_dims,
        rope_scale=_rope_scale(arch, metadata),
        tied_output="output.weight" not in names,
        rope_freq_factors="rope_freqs.weight" in names,
    )


def _rope_scale(arch: str, metadata: dict[str, Any]) -> float:
    """Position multiplier from `{arch}.rope.scaling.*`: 1.0 without scaling, 1 / factor when linear."""
    scaling_type = read_key(metadata, f"{arch}.rope.scaling.type", str, "none")
    if scaling_type == "none":
        return 1.0
    if scaling_type == "linear":
        factor = read_key(metadata, f"{arch}.rope.scaling.factor", float, 1.0)
        return 1.0 / factor if factor > 0 else 1.0
    raise ConfigError(f"{arch}: rope scaling type {scaling_type!r} is not supported (only none and linear)")


# ---------------------------------------------------------------- the forward pass on the GPU


def gpu_matrices(c: LlamaConfig) -> dict[str, list[str]]:
    """GPU weight matrices: name -> the GGUF tensors stacked by rows into it (one GEMV reads them all)."""
    matrices = {"token_embd.weight": ["token_embd.weight"]}
    if not c.tied_output:
        matrices["output.weight"] = ["output.weight"]
    for i in range(c.n_layer):
        b = f"blk.{i}."
        matrices[b + "attn_qkv"] = [b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"]
        matrices[b + "attn_output.weight"] = [b + "attn_output.weight"]
        matrices[b + "ffn_gate_up"] = [b + "ffn_gate.weight", b + "ffn_up.weight"]
        matrices[b + "ffn_down.weight"] = [b + "ffn_down.weight"]
    return matrices


def gpu_vectors(c: LlamaConfig) -> dict[str, list[str]]:
    """GPU f32 vectors (norm weights, RoPE factors): name -> the GGUF tensors concatenated into it."""
    names = ["output_norm.weight"]
    if c.rope_freq_factors:
        names.append("rope_freqs.weight")
    for i in range(c.n_layer):
        names += [f"blk.{i}.attn_norm.weight", f"blk.{i}.ffn_norm.weight"]
    return {name: [name] for name in names}


def forward(g, c: LlamaConfig, decode: bool, head: str) -> None:
    """One step of T tokens (decode: T = 1, its id in the state). head: "last", "all" or "none"."""
    attention = AttentionSpec(
        scale=1.0 / math.sqrt(c.head_dim),
        rope_base=c.rope_base,
        rope_scale=c.rope_scale,
        freq_factors="rope_freqs.weight" if c.rope_freq_factors else None,
    )
    g.embed("x", from_state=decode)  # x: [T, d_model]
    for i in range(c.n_layer):
        b = f"blk.{i}."
        g.rmsnorm("x", "normed", b + "attn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "attn_qkv", "normed", "qkv")  # qkv: [T, (n_head + 2 n_kv) head_dim]
        g.attention(i, "qkv", "attn", attention)  # attn: [T, n_head head_dim]; roped k and v -> the cache
        g.linear(b + "attn_output.weight", "attn", "x", residual=True)  # x += W_o attn
        g.rmsnorm("x", "normed", b + "ffn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "ffn_gate_up", "normed", "ffn", gate_up=True)  # ffn: [T, d_ff] = SiLU(gate) * up
        g.linear(b + "ffn_down.weight", "ffn", "x", residual=True)  # x += W_down ffn
    if head != "none":
        output_head(g, c, all_positions=head == "all")


def output_head(g, c: LlamaConfig, all_positions: bool) -> None:
    """The final norm and the logits: of the last token [n_vocab], or of all of them [T, n_vocab]."""
    g.rmsnorm("x", "normed", "output_norm.weight")  # normed: [T, d_model]
    weight = "token_embd.weight" if c.tied_output else "output.weight"
    g.output_head(weight, "normed", all_positions=all_positions)  # logits: [n_vocab] or [T, n_vocab]
