"""The numpy reference forward pass against llama.cpp on SmolLM2 (teacher forcing over tests/refs/, made by
tools/make_llama_refs.py; the reference's logits: conftest.smollm2_logits), KV-cache chunking on a tiny
random llama model, and the llama config."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from webgguf.arch import ConfigError, UnsupportedArchitecture, config_from_metadata
from webgguf.gguf import read_header
from webgguf.reference import ReferenceModel

REFS = Path(__file__).resolve().parent.parent / "refs"
MIN_TOP1_AGREEMENT = 0.98
CLEAR_MARGIN = 1.0  # llama.cpp's top-1 logit beats its top-2 by this much: the reference must agree there
# llama.cpp on an F32 copy of the model computes what the reference computes; the logits differ only by
# float32 summation order and the rounding to 4 decimals (measured max 8.4e-5).
F32_LOGIT_TOLERANCE = 1e-3


# --- parity with llama.cpp --------------------------------------------------------------------------------


def load_refs(name: str) -> dict:
    return json.loads((REFS / name).read_text())


def test_next_token_agrees_with_llama_cpp(smollm2_logits):
    """llama.cpp on the Q4_1 model as shipped (8-bit activations in its matmuls): same next token."""
    n_compared = n_agree = 0
    max_logit_diff = 0.0
    clear_disagreements = []
    for seq, logits in zip(load_refs("llama_smollm2.json")["sequences"], smollm2_logits, strict=True):
        top_ids = np.array(seq["top_ids"])  # [n, top_k] llama.cpp's
        top_logits = np.array(seq["top_logits"])  # [n, top_k]
        # Positions n_prompt - 1 .. n - 2 predict the continuation tokens.
        for pos in range(seq["n_prompt"] - 1, len(seq["ids"]) - 1):
            ours = int(np.argmax(logits[pos]))
            theirs = int(top_ids[pos, 0])
            n_compared += 1
            n_agree += ours == theirs
            margin = top_logits[pos, 0] - top_logits[pos, 1]
            if ours != theirs and margin >= CLEAR_MARGIN:
                clear_disagreements.append((seq["name"], pos, ours, theirs, round(float(margin), 3)))
            diff = np.abs(logits[pos, top_ids[pos]] - top_logits[pos])  # [top_k] on llama.cpp's top ids
            max_logit_diff = max(max_logit_diff, float(diff.max()))
    agreement = n_agree / n_compared
    print(
        f"top-1 agreement {n_agree}/{n_compared} = {agreement:.4f}; max |logit diff| on llama.cpp's top-8 "
        f"{max_logit_diff:.4f}"
    )
    assert n_compared >= 5 * 48
    assert agreement >= MIN_TOP1_AGREEMENT
    assert clear_disagreements == []


def test_logits_match_llama_cpp_on_f32_weights(smollm2_logits):
    """llama.cpp on an F32 copy of the model (F32 KV cache): the same arithmetic, so the same logits."""
    max_diff = 0.0
    shipped = load_refs("llama_smollm2.json")["sequences"]
    for seq, same_ids, logits in zip(
        load_refs("llama_smollm2_f32.json")["sequences"], shipped, smollm2_logits, strict=True
    ):
        assert seq["ids"] == same_ids["ids"]  # the logits are the reference's for these ids
        top_ids = np.array(seq["top_ids"])  # [n, top_k]
        ours = np.take_along_axis(logits, top_ids, axis=1)  # [n, top_k] at llama.cpp's top ids
        top_logits = np.array(seq["top_logits"])  # [n, top_k]
        max_diff = max(max_diff, float(np.max(np.abs(ours - top_logits))))
        not_tied = top_logits[:, 0] - top_logits[:, 1] > 2 * F32_LOGIT_TOLERANCE  # [n]
        np.testing.assert_array_equal(np.argmax(logits, axis=1)[not_tied], top_ids[not_tied, 0])
    print(f"max |logit diff| vs llama.cpp on F32 weights {max_diff:.2e}")
    assert max_diff <= F32_LOGIT_TOLERANCE


def test_smollm2_config(model_path):
    header = read_header(model_path("smollm2-135m-instruct"))
    c = config_from_metadata(header.metadata, list(header.tensors))
    assert (c.arch, c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (c.d_ff, c.n_vocab, c.n_ctx_train, c.rope_dims, c.rope_base) == (1536, 49152, 8192, 64, 100000.0)
    assert c.tied_output


# --- a tiny random llama model: the KV cache ---------------------------------------------------------------

TINY = {"n_layer": 2, "d_model": 64, "n_head": 4, "n_head_kv": 2, "d_ff": 96, "n_vocab": 50}


def tiny_metadata(**overrides) -> dict:
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": TINY["n_layer"],
        "llama.context_length": 128,
        "llama.embedding_length": TINY["d_model"],
        "llama.feed_forward_length": TINY["d_ff"],
        "llama.attention.head_count": TINY["n_head"],
        "llama.attention.head_count_kv": TINY["n_head_kv"],
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "llama.vocab_size": TINY["n_vocab"],
    }
    metadata.update(overrides)
    return metadata


def write_tiny_llama(path: Path, tied_output: bool) -> None:
    """A 2-layer llama GGUF with random F32 weights (numpy shapes [n_out, n_in])."""
    rng = np.random.default_rng(7)
    d, d_ff, n_vocab = TINY["d_model"], TINY["d_ff"], TINY["n_vocab"]
    d_kv = TINY["n_head_kv"] * d // TINY["n_head"]

    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(TINY["n_layer"])
    writer.add_context_length(128)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(TINY["n_head"])
    writer.add_head_count_kv(TINY["n_head_kv"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_tensor("token_embd.weight", weight(n_vocab, d))
    for layer in range(TINY["n_layer"]):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", norm())
        writer.add_tensor(p + "attn_q.weight", weight(d, d))
        writer.add_tensor(p + "attn_k.weight", weight(d_kv, d))
        writer.add_tensor(p + "attn_v.weight", weight(d_kv, d))
        writer.add_tensor(p + "attn_output.weight", weight(d, d))
        writer.add_tensor(p + "ffn_norm.weight", norm())
        writer.add_tensor(p + "ffn_gate.weight", weight(d_ff, d))
        writer.add_tensor(p + "ffn_up.weight", weight(d_ff, d))
        writer.add_tensor(p + "ffn_down.weight", weight(d, d_ff))
    writer.add_tensor("output_norm.weight", norm())
    if not tied_output:
        writer.add_tensor("output.weight", weight(n_vocab, d))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=[False, True], ids=["separate_output", "tied_output"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"
    write_tiny_llama(path, tied_output=request.param)
    return ReferenceModel(path)


TOKENS = [3, 17, 42, 8, 8, 0, 49, 23, 5, 11, 30, 2, 19]


def test_tiny_config_from_file(tiny):
    c = tiny.config
    assert (c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim, c.d_ff) == (2, 64, 4, 2, 16, 96)
    assert c.n_vocab == 50 and c.rope_dims == 16


def test_chunked_forward_equals_one_shot(tiny):
    tiny.reset()
    one_shot = tiny.forward(TOKENS, 0)  # [13, n_vocab]
    tiny.reset()
    chunks, start = [], 0
    for size in [5, 1, 4, 3]:
        chunks.append(tiny.forward(TOKENS[start : start + size], start))
        start += size
    assert tiny.n_cached == len(TOKENS)
    np.testing.assert_allclose(np.concatenate(chunks), one_shot, rtol=1e-5, atol=1e-5)


def test_token_by_token_equals_one_shot(tiny):
    tiny.reset()
    one_shot = tiny.forward(TOKENS, 0)
    tiny.reset()
    steps = np.concatenate([tiny.forward([t], pos) for pos, t in enumerate(TOKENS)])
    np.testing.assert_allclose(steps, one_shot, rtol=1e-5, atol=1e-5)


def test_rewinding_the_cache_recomputes_the_suffix(tiny):
    tiny.reset()
    one_shot = tiny.forward(TOKENS, 0)
    tiny.reset()
    tiny.forward(TOKENS[:6] + [1, 1, 1], 0)  # a wrong suffix, then overwrite it from position 6
    suffix = tiny.forward(TOKENS[6:], 6)
    np.testing.assert_allclose(suffix, one_shot[6:], rtol=1e-5, atol=1e-5)


def test_causal_prefix_logits_do_not_depend_on_later_tokens(tiny):
    tiny.reset()
    a = tiny.forward(TOKENS, 0)
    tiny.reset()
    b = tiny.forward(TOKENS[:7] + [0] * 6, 0)
    np.testing.assert_allclose(a[:7], b[:7], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[7:], b[7:])


def test_start_pos_past_the_cache_is_an_error(tiny):
    tiny.reset()
    tiny.forward(TOKENS[:3], 0)
    with pytest.raises(ValueError, match="outside the KV cache"):
        tiny.forward([1], 4)


# --- config from metadata ----------------------------------------------------------------------------------


def test_config_defaults_and_tied_output():
    c = config_from_metadata(tiny_metadata(), ["token_embd.weight"])
    assert c.head_dim == 16 and c.rope_dims == 16 and c.n_group == 2
    assert c.tied_output
    assert not config_from_metadata(tiny_metadata(), ["token_embd.weight", "output.weight"]).tied_output


def test_unsupported_architecture_is_named():
    with pytest.raises(UnsupportedArchitecture, match="'mamba'"):
        config_from_metadata(tiny_metadata(**{"general.architecture": "mamba"}), [])


def test_missing_key_is_named():
    metadata = tiny_metadata()
    del metadata["llama.block_count"]
    with pytest.raises(ConfigError, match="llama.block_count"):
        config_from_metadata(metadata, [])


def test_unsupported_rope_scaling_is_an_error():
    with pytest.raises(ConfigError, match="yarn"):
        config_from_metadata(tiny_metadata(**{"llama.rope.scaling.type": "yarn"}), [])
