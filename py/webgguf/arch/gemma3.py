"""The Gemma 3 family (text decoder): config from GGUF metadata.

How it differs from llama (llama.cpp: src/models/gemma3.cpp): the token embedding is scaled by sqrt(d_model);
q and k get a per-head RMSNorm before RoPE; the attention and FFN outputs get their own RMSNorm before the
residual add ("sandwich" norms); the FFN is GELU(tanh)-gated; RoPE rotates the two halves of each head (NeoX
layout); most layers attend only to a sliding window of recent tokens and use their own RoPE base. Norm
weights need no "+ 1": llama.cpp's converter adds it when writing the GGUF.

Tensor names (GGUF, used verbatim): token_embd.weight, output_norm.weight, output.weight (absent when tied),
and per layer blk.N.: attn_norm, attn_q, attn_k, attn_v, attn_q_norm, attn_k_norm, attn_output,
post_attention_norm, ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm (.weight).
"""

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from webgguf.arch import ConfigError, llama, read_key
from webgguf.graph import AttentionSpec

# llama.cpp's defaults for keys that Gemma 3 GGUFs usually leave out (src/models/gemma3.cpp, llama-hparams.h).
DEFAULT_SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally, the other five locally
DEFAULT_ROPE_FREQ_BASE_LOCAL = 10000.0
N_LAYER_27B = 62  # Gemma 3 27B scales queries by 1/sqrt(d_model / n_head) instead of 1/sqrt(head_dim)


@dataclass(frozen=True)
class Gemma3Config(llama.LlamaConfig):
    # The fields of LlamaConfig, with the same meaning (for gemma3: rope_base and rope_scale are the
    # global layers'), then the family's own.
    rope_base_local: float  # theta of the sliding-window layers (never scaled)
    sliding_window: int  # a local layer's query at p sees keys at p - sliding_window + 1 .. p
    local_layers: tuple[bool, ...]  # per layer: True when it attends to the sliding window only
    query_scale: float  # attention scores are (query_scale * q) . k
    final_logit_softcap: float  # logits = c * tanh(logits / c); 0 turns it off

    @property
    def embedding_scale(self) -> float:
        """Token embeddings are multiplied by sqrt(d_model) before the first layer."""
        return math.sqrt(self.d_model)


def config_from_metadata(metadata: dict[str, Any], tensor_names: Iterable[str]) -> Gemma3Config:
    # The keys Gemma 3 shares with llama mean the same there: read them as llama does.
    base = llama.config_from_metadata(metadata, set(tensor_names))
    arch = base.arch
    sliding_window = read_key(metadata, f"{arch}.attention.sliding_window", int, 0)
    if sliding_window > 0:
        local_layers = _local_layers(arch, metadata, base.n_layer)
    else:
        local_layers = (False,) * base.n_layer
    if base.n_layer == N_LAYER_27B:
        query_scale = 1.0 / math.sqrt(base.d_model // base.n_head)
    else:
        query_scale = 1.0 / math.sqrt(base.head_dim)
    return Gemma3Config(
        **asdict(base),
        rope_base_local=read_key(metadata, f"{arch}.rope.freq_base_swa", float, DEFAULT_ROPE_FREQ_BASE_LOCAL),
        sliding_window=sliding_window,
        local_layers=local_layers,
        query_scale=query_scale,
        final_logit_softcap=read_key(metadata, f"{arch}.final_logit_softcapping", float, 0.0),
    )


def _local_layers(arch: str, metadata: dict[str, Any], n_layer: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, as llama.cpp reads it: `attention.sliding_window_pattern` is
    either one flag per layer or a period P (layer i is local unless i % P == P - 1; P = 0: all local)."""
    key = f"{arch}.attention.sliding_window_pattern"
    flags = metadata.get(key)
    if isinstance(flags, list):
        if len(flags) != n_layer or not all(isinstance(flag, bool) for flag in flags):
            raise ConfigError(f"{key} should be {n_layer} booleans")
        return tuple(flags)
    period = read_key(metadata, key, int, DEFAULT_SLIDING_WINDOW_PATTERN)
    return tuple(period == 0 or layer % period < period - 1 for layer in range(n_layer))


# ---------------------------------------------------------------- the forward pass on the GPU


def gpu_matrices(c: Gemma3Config) -> dict[str, list[str]]:
    """GPU weight matrices, as llama's. Gemma's q, k and v often differ in type (Q5_0 q and k, Q8_0 v):
    the stacked projection is then one GEMV per run of one type (plan.StackedWeight)."""
    return llama.gpu_matrices(c)


def gpu_vectors(c: Gemma3Config) -> dict[str, list[str]]:
    """GPU f32 vectors: llama's norms, plus per layer the q and k norms and the two post-norms."""
    vectors = llama.gpu_vectors(c)
    for i in range(c.n_layer):
        b = f"blk.{i}."
        for name in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
            vectors[f"{b}{name}.weight"] = [f"{b}{name}.weight"]
    return vectors


def forward(g, c: Gemma3Config, decode: bool, head: str) -> None:
    """One step of T tokens (decode: T = 1, its id in the state). head: "last", "all" or "none"."""
    if c.final_logit_softcap:
        raise ConfigError("gemma3: final logit soft-capping is not supported by the GPU engine yet")
    g.embed("x", from_state=decode, scale=c.embedding_scale)  # x: [T, d_model], times sqrt(d_model)
    for i in range(c.n_layer):
        b = f"blk.{i}."
        local = c.local_layers[i]
        attention = AttentionSpec(
            scale=c.query_scale,
            rope_base=c.rope_base_local if local else c.rope_base,
            rope_scale=1.0 if local else c.rope_scale,  # the local layers' RoPE is never scaled
            neox=True,
            window=c.sliding_window if local else 0,
            q_norm=b + "attn_q_norm.weight",
            k_norm=b + "attn_k_norm.weight",
        )
        g.rmsnorm("x", "normed", b + "attn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "attn_qkv", "normed", "qkv")  # qkv: [T, (n_head + 2 n_kv) head_dim]
        g.attention(i, "qkv", "attn", attention)  # attn: [T, n_head head_dim]; normed, roped k, v -> cache
        g.linear(b + "attn_output.weight", "attn", "proj")  # proj: [T, d_model]
        g.add_norm("proj", "x", b + "post_attention_norm.weight")  # x += RMSNorm(proj)
        g.rmsnorm("x", "normed", b + "ffn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "ffn_gate_up", "normed", "ffn", gate_up=True, gelu=True)  # ffn: [T, d_ff], GELU-gated
        g.linear(b + "ffn_down.weight", "ffn", "proj")  # proj: [T, d_model]
        g.add_norm("proj", "x", b + "post_ffw_norm.weight")  # x += RMSNorm(proj)
    if head != "none":
        llama.output_head(g, c, all_positions=head == "all")
