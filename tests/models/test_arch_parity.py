"""The numpy reference forward pass against llama.cpp beyond the llama architecture (teacher forcing over
tests/refs/arch_*.json, made by tools/make_arch_refs.py): Gemma 3 270M, and synthetic qwen2, qwen3 and
Llama-3-style models rebuilt here from their recipes (tools/make_synthetic_models.py). Then the KV cache and
the sliding window on a tiny random Gemma 3."""

import importlib.util
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from webgguf.reference import ReferenceModel, apply_rope, apply_rope_neox, causal_attention

ROOT = Path(__file__).resolve().parents[2]
REFS = ROOT / "tests/refs"
MIN_TOP1_AGREEMENT = 0.98
# llama.cpp on F32 weights computes what the reference (and the GPU engine) computes: they pick its next
# token at every compared position of Gemma 3 (288 of 288 measured), so every position must agree.
F32_TOP1_AGREEMENT = 1.0
CLEAR_MARGIN = 1.0  # llama.cpp's top-1 logit beats its top-2 by this much: the reference must agree there
# llama.cpp on an F32 copy of Gemma 3 computes what the reference computes, except that its GELU goes through
# an f16 table and its RoPE angles through an f32 recurrence; Gemma's large activations (norm weights up to
# ~300) turn these into logit differences of up to 0.032 measured (the reference in f32 and in float64 differ
# by < 1e-4). A structural error (a norm weight off by 1, a wrong RoPE base or epsilon) moves logits by > 2.
GEMMA3_F32_LOGIT_TOLERANCE = 0.05


def load_refs(name: str) -> dict:
    return json.loads((REFS / name).read_text())


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_logits(model: ReferenceModel, seq: dict) -> np.ndarray:
    """The reference's logits at the positions llama.cpp's top-k were kept for: [positions, n_vocab]."""
    model.reset()
    ids = seq["ids"][:-1]  # the last token predicts nothing that is compared
    return model.forward(ids, 0, n_logits=len(ids) - seq["first_position"])


def greedy_reference(reference: ReferenceModel, ids: list[int], n: int) -> list[int]:
    """The reference's n greedy tokens after `ids` (argmax at every step, no end-of-generation stop)."""
    reference.reset()
    logits = reference.forward(ids, 0)[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = reference.forward([out[-1]], len(ids) + len(out) - 1)[-1]
    return out


def compare_next_tokens(logits_by_seq: list[np.ndarray], sequences: list[dict]) -> dict:
    """Top-1 agreement with llama.cpp, the clear disagreements, and the largest logit difference on
    llama.cpp's top-k ids."""
    n_compared = n_agree = 0
    max_logit_diff = 0.0
    clear_disagreements = []
    for logits, seq in zip(logits_by_seq, sequences, strict=True):
        top_ids = np.array(seq["top_ids"])  # [positions, top_k] llama.cpp's
        top_logits = np.array(seq["top_logits"])  # [positions, top_k]
        ours = np.argmax(logits, axis=1)  # [positions]
        n_compared += len(ours)
        n_agree += int(np.sum(ours == top_ids[:, 0]))
        margins = top_logits[:, 0] - top_logits[:, 1]  # [positions]
        for i in np.flatnonzero((ours != top_ids[:, 0]) & (margins >= CLEAR_MARGIN)):
            position = seq["first_position"] + int(i)
            clear_disagreements.append((seq["name"], position, int(ours[i]), int(top_ids[i, 0]), margins[i]))
        diff = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top_logits)  # [positions, top_k]
        max_logit_diff = max(max_logit_diff, float(diff.max()))
    return {
        "n_compared": n_compared,
        "agreement": n_agree / n_compared,
        "clear_disagreements": clear_disagreements,
        "max_logit_diff": max_logit_diff,
    }


# --- Gemma 3 270M ------------------------------------------------------------------------------------------


def test_gemma3_next_token_agrees_with_llama_cpp_on_f32_weights(gemma3_config, gemma3_logits):
    """llama.cpp on an F32 copy of the model (F32 KV cache) computes what the reference computes."""
    refs = load_refs("arch_gemma3_f32.json")
    result = compare_next_tokens(gemma3_logits, refs["sequences"])
    print(result)
    assert result["n_compared"] >= 5 * 48
    # One prompt is long enough that the local layers' window slides during the continuation.
    assert max(seq["n_prompt"] for seq in refs["sequences"]) > gemma3_config.sliding_window
    assert result["agreement"] >= F32_TOP1_AGREEMENT
    assert result["clear_disagreements"] == []
    assert result["max_logit_diff"] <= GEMMA3_F32_LOGIT_TOLERANCE


def gemma3_sequences(file: str, names: list[str] | None = None) -> list[dict]:
    """The sequences of a Gemma 3 refs file, all or those named (in the file's order)."""
    sequences = load_refs(file)["sequences"]
    return sequences if names is None else [seq for seq in sequences if seq["name"] in names]


def llama_cpp_self_agreement(names: list[str] | None = None) -> dict[str, float]:
    """Top-1 agreement with llama.cpp's run as shipped of llama.cpp's own other configurations of the same
    model: F32 weights (arch_gemma3_f32.json), flash attention on and an F32 KV cache
    (arch_gemma3_variants.json, tools/make_llama_cpp_variants.py); over the sequences named (None: all)."""
    shipped = gemma3_sequences("arch_gemma3.json", names)
    top1 = {
        "f32_weights": {
            seq["name"]: np.array(seq["top_ids"])[:, 0]
            for seq in load_refs("arch_gemma3_f32.json")["sequences"]
        }
    }
    top1.update(load_refs("arch_gemma3_variants.json")["top1"])
    agreement = {}
    for name, by_seq in top1.items():
        agree = sum(
            int(np.sum(np.array(by_seq[seq["name"]]) == np.array(seq["top_ids"])[:, 0])) for seq in shipped
        )
        agreement[name] = agree / sum(len(seq["top_ids"]) for seq in shipped)
    return agreement


def check_gemma3_against_llama_cpp_as_shipped(
    logits_by_seq: list[np.ndarray], names: list[str] | None = None
) -> dict:
    """llama.cpp on the Q4_K_M model as shipped rounds its matmuls' activations to 8 bits (and its KV cache
    to f16), which moves logits by up to ~2 and flips its top-1 where the top two are close: there its own
    other configurations (F32 weights, flash attention, an F32 KV cache) disagree with it too, each on
    2.8-3.8% of the positions, and bit-exact emulation is out of reach (docs/ENGINE.md, "llama.cpp as
    shipped"). So: no disagreement where llama.cpp is clear, none that llama.cpp on F32 weights does not
    share, and an agreement no lower than that of llama.cpp's own other configurations. `names`: the
    sequences `logits_by_seq` holds (None: all of them)."""
    shipped = gemma3_sequences("arch_gemma3.json", names)
    f32 = gemma3_sequences("arch_gemma3_f32.json", names)
    result = compare_next_tokens(logits_by_seq, shipped)
    result["llama_cpp_self_agreement"] = llama_cpp_self_agreement(names)
    print(result)
    assert result["n_compared"] >= 5 * 48
    assert result["clear_disagreements"] == []
    for logits, seq, seq_f32 in zip(logits_by_seq, shipped, f32, strict=True):
        shipped_top1 = np.array(seq["top_ids"])[:, 0]  # [positions]
        f32_top1 = np.array(seq_f32["top_ids"])[:, 0]  # [positions]
        ours_differ = np.argmax(logits, axis=1) != shipped_top1
        llama_cpp_differs = f32_top1 != shipped_top1
        assert not np.any(ours_differ & ~llama_cpp_differs), seq["name"]
    assert result["agreement"] >= min(result["llama_cpp_self_agreement"].values())
    return result


def test_gemma3_next_token_agrees_with_llama_cpp_as_shipped(gemma3_logits):
    check_gemma3_against_llama_cpp_as_shipped(gemma3_logits)


def test_llama_cpp_disagrees_with_itself_where_the_top_two_are_close():
    """The evidence behind the criterion above: llama.cpp's other configurations of the same file flip
    some top-1 choices of its run as shipped, never one where that run is clear."""
    shipped = load_refs("arch_gemma3.json")["sequences"]
    agreement = llama_cpp_self_agreement()
    print(agreement)
    assert all(0.9 < value < 1 for value in agreement.values())
    for by_seq in load_refs("arch_gemma3_variants.json")["top1"].values():
        for seq in shipped:
            top_logits = np.array(seq["top_logits"])  # [positions, top_k]
            flipped = np.array(by_seq[seq["name"]]) != np.array(seq["top_ids"])[:, 0]
            assert np.all(top_logits[flipped, 0] - top_logits[flipped, 1] < CLEAR_MARGIN), seq["name"]


def test_gemma3_config(gemma3_config):
    c = gemma3_config
    assert (c.arch, c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim) == ("gemma3", 18, 640, 4, 1, 256)
    assert (c.d_ff, c.n_vocab, c.rope_base, c.rope_base_local) == (2048, 262144, 1e6, 1e4)
    assert c.sliding_window == 512
    assert [layer for layer in range(c.n_layer) if not c.local_layers[layer]] == [5, 11, 17]
    assert c.query_scale == 1 / 16 and c.tied_output and c.final_logit_softcap == 0


# --- synthetic qwen2, qwen3, Llama 3 -----------------------------------------------------------------------

SYNTHETIC = load_refs("arch_synthetic.json")["models"]


def build_synthetic(refs: dict, model_path, tmp_path_factory) -> Path:
    """The synthetic model of `refs`, rebuilt byte for byte from its recipe (checked by sha256)."""
    make_synthetic_models = load_tool("make_synthetic_models")
    recipe = make_synthetic_models.Recipe(**refs["recipe"])
    path = tmp_path_factory.mktemp("synthetic") / f"{recipe.name}.gguf"
    sha256 = make_synthetic_models.write_model(recipe, path, model_path("smollm2-135m-instruct"))
    assert sha256 == refs["sha256"], f"{recipe.name}: the rebuilt GGUF differs from the one llama.cpp ran"
    return path


@pytest.fixture(scope="module", params=SYNTHETIC, ids=[m["recipe"]["name"] for m in SYNTHETIC])
def synthetic(request, model_path, tmp_path_factory):
    """(the reference model, its refs), the model rebuilt byte for byte from the recipe in the refs."""
    refs = request.param
    path = build_synthetic(refs, model_path, tmp_path_factory)
    model = ReferenceModel(path)
    path.unlink()  # ~40 MB; the model holds its weights in memory
    return model, refs


def test_synthetic_next_token_agrees_with_llama_cpp(synthetic):
    model, refs = synthetic
    result = compare_next_tokens(
        [reference_logits(model, seq) for seq in refs["sequences"]], refs["sequences"]
    )
    print(refs["recipe"]["name"], result)
    assert result["n_compared"] >= 100
    assert result["agreement"] >= MIN_TOP1_AGREEMENT
    assert result["clear_disagreements"] == []


def test_synthetic_config_follows_recipe(synthetic):
    model, refs = synthetic
    c, recipe = model.config, refs["recipe"]
    assert (c.arch, c.n_layer, c.d_model, c.n_head, c.n_head_kv) == tuple(
        recipe[key] for key in ("arch", "n_layer", "d_model", "n_head", "n_head_kv")
    )
    assert (c.head_dim, c.d_ff, c.rope_base, c.rms_eps) == pytest.approx(
        tuple(recipe[key] for key in ("head_dim", "d_ff", "rope_base", "rms_eps"))
    )
    assert c.tied_output == (recipe["output_type"] == "tied")
    if recipe["arch"] != "llama":
        assert (c.qkv_bias, c.qk_norm) == (recipe["qkv_bias"], recipe["qk_norm"])
    assert ("rope_freqs.weight" in model.weights) == recipe["llama3_rope_freqs"]


# --- a tiny random Gemma 3: the KV cache and the sliding window ---------------------------------------------

TINY = {"n_layer": 3, "d_model": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 32, "d_ff": 96, "n_vocab": 50}
TINY_WINDOW = 4


def write_tiny_gemma3(path: Path, pattern: int) -> None:
    """A 3-layer Gemma 3 GGUF with random F32 weights (numpy shapes [n_out, n_in]) and a sliding window of
    TINY_WINDOW; `pattern`: attention.sliding_window_pattern (3: layers 0 and 1 local; 0: all local)."""
    rng = np.random.default_rng(11)
    d, d_ff, n_vocab, hd = TINY["d_model"], TINY["d_ff"], TINY["n_vocab"], TINY["head_dim"]
    d_q, d_kv = TINY["n_head"] * hd, TINY["n_head_kv"] * hd

    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(width=d):
        return (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)

    writer = gguf.GGUFWriter(path, "gemma3")
    writer.add_block_count(TINY["n_layer"])
    writer.add_context_length(128)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(TINY["n_head"])
    writer.add_head_count_kv(TINY["n_head_kv"])
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(TINY_WINDOW)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", pattern)
    writer.add_vocab_size(n_vocab)
    writer.add_tensor("token_embd.weight", weight(n_vocab, d))
    for layer in range(TINY["n_layer"]):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", norm())
        writer.add_tensor(p + "attn_q.weight", weight(d_q, d))
        writer.add_tensor(p + "attn_k.weight", weight(d_kv, d))
        writer.add_tensor(p + "attn_v.weight", weight(d_kv, d))
        writer.add_tensor(p + "attn_q_norm.weight", norm(hd))
        writer.add_tensor(p + "attn_k_norm.weight", norm(hd))
        writer.add_tensor(p + "attn_output.weight", weight(d, d_q))
        writer.add_tensor(p + "post_attention_norm.weight", norm())
        writer.add_tensor(p + "ffn_norm.weight", norm())
        writer.add_tensor(p + "ffn_gate.weight", weight(d_ff, d))
        writer.add_tensor(p + "ffn_up.weight", weight(d_ff, d))
        writer.add_tensor(p + "ffn_down.weight", weight(d, d_ff))
        writer.add_tensor(p + "post_ffw_norm.weight", norm())
    writer.add_tensor("output_norm.weight", norm())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-gemma3.gguf"
    write_tiny_gemma3(path, pattern=3)
    return ReferenceModel(path)


TOKENS = [3, 17, 42, 8, 8, 0, 49, 23, 5, 11, 30, 2, 19, 7, 7, 40, 12, 1, 33, 26]


def test_tiny_gemma3_config(tiny_gemma3):
    c = tiny_gemma3.config
    assert (c.n_layer, c.head_dim, c.n_group, c.sliding_window) == (3, 32, 2, TINY_WINDOW)
    assert c.local_layers == (True, True, False)


def test_tiny_gemma3_chunked_forward_equals_one_shot(tiny_gemma3):
    """The sliding window masks by position, whether the keys come from the cache or the chunk."""
    tiny_gemma3.reset()
    one_shot = tiny_gemma3.forward(TOKENS, 0)  # [20, n_vocab]
    tiny_gemma3.reset()
    chunks, start = [], 0
    for size in [5, 1, 4, 3, 7]:
        chunks.append(tiny_gemma3.forward(TOKENS[start : start + size], start))
        start += size
    np.testing.assert_allclose(np.concatenate(chunks), one_shot, rtol=1e-5, atol=1e-5)


def test_local_layers_forget_tokens_that_left_every_window(tiny_gemma3, tmp_path):
    """With only local layers, position p sees positions p - (window - 1) * n_layer .. p; with a global
    layer, all of them."""
    path = tmp_path / "all-local.gguf"
    write_tiny_gemma3(path, pattern=0)
    all_local = ReferenceModel(path)
    assert all_local.config.local_layers == (True, True, True)
    changed_start = [1, 2, 3] + TOKENS[3:]
    first_unaffected = 3 + (TINY_WINDOW - 1) * 3
    for model in [all_local, tiny_gemma3]:
        model.reset()
        a = model.forward(TOKENS, 0)
        model.reset()
        b = model.forward(changed_start, 0)
        assert not np.allclose(a[3:first_unaffected], b[3:first_unaffected])
        unaffected = np.allclose(a[first_unaffected:], b[first_unaffected:], rtol=1e-5, atol=1e-5)
        assert unaffected == (model is all_local)


def test_n_logits_returns_the_last_rows(tiny_gemma3):
    tiny_gemma3.reset()
    every = tiny_gemma3.forward(TOKENS, 0)
    tiny_gemma3.reset()
    last = tiny_gemma3.forward(TOKENS, 0, n_logits=4)
    np.testing.assert_allclose(last, every[-4:], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="n_logits"):
        tiny_gemma3.forward(TOKENS, 0, n_logits=0)


# --- the steps the new architectures add -------------------------------------------------------------------


def test_neox_rope_is_normal_rope_on_a_permuted_head():
    """NeoX pairs dims (i, i + r/2), the normal layout pairs (2i, 2i + 1): the same rotation after
    interleaving the two halves (as llama's GGUF converter permutes q/k)."""
    rng = np.random.default_rng(0)
    n, heads, head_dim, rope_dims = 5, 3, 16, 12
    x = rng.standard_normal((n, heads, head_dim)).astype(np.float32)
    angles = rng.uniform(-3, 3, (n, rope_dims // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    halves = np.stack([np.arange(6), np.arange(6, 12)], axis=1).ravel()  # 0, 6, 1, 7, ..., 5, 11
    interleave = np.concatenate([halves, np.arange(rope_dims, head_dim)])
    np.testing.assert_allclose(
        apply_rope_neox(x, cos, sin)[..., interleave], apply_rope(x[..., interleave], cos, sin), rtol=1e-6
    )
    np.testing.assert_array_equal(apply_rope_neox(x, cos, sin)[..., rope_dims:], x[..., rope_dims:])


def test_sliding_window_hides_keys_that_slid_out():
    """A query at p sees keys p - window + 1 .. p: with one-hot values, the attention weights themselves."""
    n, window = 7, 3
    q = np.zeros((n, 1, n), np.float32)  # equal scores: uniform attention over the visible keys
    keys = np.zeros((n, 1, n), np.float32)
    values = np.eye(n, dtype=np.float32)[:, None, :]  # [T, 1, T]: the value of key j is e_j
    weights = causal_attention(q, keys, values, 0, 1.0, window)[:, 0, :]  # [n, T]
    for p in range(n):
        visible = list(range(max(0, p - window + 1), p + 1))
        np.testing.assert_allclose(weights[p, visible], 1 / len(visible), rtol=1e-6)
        assert weights[p].sum() == pytest.approx(1)
