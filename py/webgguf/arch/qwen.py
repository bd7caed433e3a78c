"""The Qwen 2 and Qwen 3 families (Qwen2, Qwen2.5, Qwen3 dense): config from GGUF metadata.

Both are llama-shaped decoders (RMSNorm, grouped-query attention, SwiGLU FFN) with the same metadata keys,
and differ from llama (llama.cpp: src/models/qwen2.cpp, qwen3.cpp) in that RoPE rotates the two halves of
each head (NeoX layout: the converter does not permute q/k as it does for llama), and:
  qwen2: q, k and v projections have a bias;
  qwen3: no biases; q and k get a per-head RMSNorm before RoPE, and n_head * head_dim may differ from d_model.

Tensor names (GGUF, used verbatim): as llama's, plus blk.N.attn_q.bias, attn_k.bias, attn_v.bias (qwen2)
or blk.N.attn_q_norm.weight, attn_k_norm.weight (qwen3).
"""

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from webgguf.arch import llama


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
