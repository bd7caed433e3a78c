"""Model configs from GGUF metadata for the qwen and gemma3 families (the llama family's are in
tests/models/test_reference_parity.py)."""

import math

import pytest

from webgguf.arch import ARCHITECTURES, ConfigError, config_from_metadata
from webgguf.arch.gemma3 import Gemma3Config
from webgguf.arch.qwen import QwenConfig


def metadata(arch: str, **overrides) -> dict:
    """Metadata of a small model of `arch`; overrides by key without the `{arch}.` prefix."""
    values = {
        "block_count": 12,
        "context_length": 4096,
        "embedding_length": 256,
        "feed_forward_length": 512,
        "attention.head_count": 8,
        "attention.head_count_kv": 2,
        "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.freq_base": 1e6,
        "vocab_size": 1000,
    }
    values.update(overrides)
    return {"general.architecture": arch, **{f"{arch}.{key}": value for key, value in values.items()}}


def layer_tensors(n_layer: int, *names: str) -> list[str]:
    return ["token_embd.weight"] + [f"blk.{i}.{name}" for i in range(n_layer) for name in names]


def test_each_family_is_registered():
    assert {"llama", "qwen2", "qwen3", "gemma3"} <= set(ARCHITECTURES)


# --- qwen2 / qwen3 ------------------------------------------------------------------------------------------


def test_qwen2_has_qkv_bias_when_the_gguf_has_it():
    with_bias = layer_tensors(12, "attn_q.bias", "attn_k.bias", "attn_v.bias")
    c = config_from_metadata(metadata("qwen2"), with_bias)
    assert isinstance(c, QwenConfig)
    assert (c.arch, c.qkv_bias, c.qk_norm, c.head_dim, c.n_group, c.tied_output) == (
        "qwen2",
        True,
        False,
        32,
        4,
        True,
    )
    assert not config_from_metadata(metadata("qwen2"), layer_tensors(12)).qkv_bias


def test_qwen3_has_qk_norm_and_its_own_head_dim():
    tensors = layer_tensors(12, "attn_q_norm.weight", "attn_k_norm.weight") + ["output.weight"]
    c = config_from_metadata(
        metadata("qwen3", **{"attention.key_length": 64, "attention.value_length": 64}), tensors
    )
    assert isinstance(c, QwenConfig)
    assert (c.qk_norm, c.qkv_bias, c.head_dim, c.rope_dims, c.tied_output) == (True, False, 64, 64, False)
    assert c.n_head * c.head_dim == 2 * c.d_model


def test_qwen_reads_the_keys_llama_reads():
    with pytest.raises(ConfigError, match="qwen2.block_count"):
        config_from_metadata({k: v for k, v in metadata("qwen2").items() if k != "qwen2.block_count"}, [])


# --- gemma3 -------------------------------------------------------------------------------------------------


def gemma3_metadata(**overrides) -> dict:
    values = {
        "block_count": 18,
        "embedding_length": 640,
        "attention.head_count": 4,
        "attention.head_count_kv": 1,
        "attention.key_length": 256,
        "attention.value_length": 256,
        "attention.sliding_window": 512,
    }
    values.update(overrides)
    return metadata("gemma3", **values)


def global_layers(c: Gemma3Config) -> list[int]:
    return [layer for layer, local in enumerate(c.local_layers) if not local]


def test_gemma3_defaults_follow_llama_cpp():
    c = config_from_metadata(gemma3_metadata(), ["token_embd.weight"])
    assert isinstance(c, Gemma3Config)
    assert global_layers(c) == [5, 11, 17]  # every 6th layer
    assert (c.sliding_window, c.rope_base, c.rope_base_local, c.rope_scale) == (512, 1e6, 1e4, 1.0)
    assert c.query_scale == 1 / math.sqrt(256)  # 1 / sqrt(head_dim), not 1 / sqrt(d_model / n_head)
    assert c.embedding_scale == math.sqrt(640)
    assert c.final_logit_softcap == 0 and c.tied_output


def test_gemma3_sliding_window_pattern_as_period_or_flags():
    c = config_from_metadata(gemma3_metadata(**{"attention.sliding_window_pattern": 3}), [])
    assert global_layers(c) == [2, 5, 8, 11, 14, 17]
    c = config_from_metadata(gemma3_metadata(**{"attention.sliding_window_pattern": 0}), [])
    assert global_layers(c) == []
    flags = [layer % 2 == 0 for layer in range(18)]
    c = config_from_metadata(gemma3_metadata(**{"attention.sliding_window_pattern": flags}), [])
    assert global_layers(c) == list(range(1, 18, 2))
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        config_from_metadata(gemma3_metadata(**{"attention.sliding_window_pattern": flags[:5]}), [])


def test_gemma3_without_sliding_window_is_all_global():
    plain = {k: v for k, v in gemma3_metadata().items() if k != "gemma3.attention.sliding_window"}
    c = config_from_metadata(plain, [])
    assert (c.sliding_window, global_layers(c)) == (0, list(range(18)))


def test_gemma3_optional_keys():
    c = config_from_metadata(
        gemma3_metadata(
            **{
                "rope.freq_base_swa": 20000.0,
                "final_logit_softcapping": 30.0,
                "rope.scaling.type": "linear",
                "rope.scaling.factor": 8.0,
            }
        ),
        ["output.weight"],
    )
    assert (c.rope_base_local, c.final_logit_softcap, c.rope_scale, c.tied_output) == (
        20000.0,
        30.0,
        0.125,
        False,
    )


def test_gemma3_27b_scales_queries_by_model_width():
    c = config_from_metadata(
        gemma3_metadata(block_count=62, embedding_length=5376, **{"attention.head_count": 32}), []
    )
    assert c.query_scale == 1 / math.sqrt(5376 // 32)
