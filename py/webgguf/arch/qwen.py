"""The Qwen 2 and Qwen 3 families (Qwen2, Qwen2.5, Qwen3 dense): config from GGUF metadata.

Both are llama-shaped decoders (RMSNorm, grouped-query attention, SwiGLU FFN) with the same metadata keys,
and differ from llama (llama.cpp: src/models/qwen2.cpp, qwen3.cpp) in that RoPE rotates the two halves of
each head (NeoX layout: the converter does not permute q/k as it does for llama), and:
  qwen2: q, k and v projections have a bias;
  qwen3: no biases; q and k get a per-head RMSNorm before RoPE, and n_head * head_dim may differ from d_model.

Tensor names (GGUF, used verbatim): as llama's, plus blk.N.attn_q.bias, attn_k.bias, attn_v.bias (qwen2)
or blk.N.attn_q_norm.weight, attn_k_norm.weight (qwen3).
"""

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from webgguf.arch import llama
from webgguf.graph import AttentionSpec


@dataclass(frozen=True)
class QwenConfig(llama.LlamaConfig):
    # The fields of LlamaConfig, with the same meaning, then the family's own.
    qkv_bias: bool  # q, k and v projections add attn_{q,k,v}.bias (qwen2)
    qk_norm: bool  # q and k get a per-head RMSNorm (attn_{q,k}_norm.weight) before RoPE (qwen3)


def config_from_metadata(metadata: dict[str, Any], tensor_names: Iterable[str]) -> QwenConfig:
    names = set(tensor_names)
    # Qwen's metadata keys are llama's, with the same meaning: read them as llama does.
    base = llama.config_from_metadata(metadata, names)
    return QwenConfig(
        **asdict(base),
        # llama.cpp adds q/k/v biases whenever the GGUF has them (Qwen2 GGUFs do, Qwen3 GGUFs do not).
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm=base.arch == "qwen3",
    )


# ---------------------------------------------------------------- the forward pass on the GPU


def gpu_matrices(c: QwenConfig) -> dict[str, list[str]]:
    """GPU weight matrices: llama's (q, k, v stacked into one projection; gate and up into another)."""
    return llama.gpu_matrices(c)


def gpu_vectors(c: QwenConfig) -> dict[str, list[str]]:
    """GPU f32 vectors: llama's, plus the q|k|v bias (qwen2) or the q and k norms (qwen3) per layer."""
    vectors = llama.gpu_vectors(c)
    for i in range(c.n_layer):
        b = f"blk.{i}."
        if c.qkv_bias:
            vectors[b + "attn_qkv.bias"] = [b + "attn_q.bias", b + "attn_k.bias", b + "attn_v.bias"]
        if c.qk_norm:
            vectors[b + "attn_q_norm.weight"] = [b + "attn_q_norm.weight"]
            vectors[b + "attn_k_norm.weight"] = [b + "attn_k_norm.weight"]
    return vectors


def forward(g, c: QwenConfig, decode: bool, head: str) -> None:
    """One step of T tokens (decode: T = 1, its id in the state). head: "last", "all" or "none"."""
    g.embed("x", from_state=decode)  # x: [T, d_model]
    for i in range(c.n_layer):
        b = f"blk.{i}."
        attention = AttentionSpec(
            scale=1.0 / math.sqrt(c.head_dim),
            rope_base=c.rope_base,
            rope_scale=c.rope_scale,
            neox=True,
            bias=b + "attn_qkv.bias" if c.qkv_bias else None,  # qwen2
            q_norm=b + "attn_q_norm.weight" if c.qk_norm else None,  # qwen3
            k_norm=b + "attn_k_norm.weight" if c.qk_norm else None,
        )
        g.rmsnorm("x", "normed", b + "attn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "attn_qkv", "normed", "qkv")  # qkv: [T, (n_head + 2 n_kv) head_dim], before the bias
        g.attention(i, "qkv", "attn", attention)  # attn: [T, n_head head_dim]; roped k and v -> the cache
        g.linear(b + "attn_output.weight", "attn", "x", residual=True)  # x += W_o attn
        g.rmsnorm("x", "normed", b + "ffn_norm.weight")  # normed: [T, d_model]
        g.linear(b + "ffn_gate_up", "normed", "ffn", gate_up=True)  # ffn: [T, d_ff] = SiLU(gate) * up
        g.linear(b + "ffn_down.weight", "ffn", "x", residual=True)  # x += W_down ffn
    if head != "none":
        llama.output_head(g, c, all_positions=head == "all")
