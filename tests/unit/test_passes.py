"""The fusion passes (passes.py) on graphs, without a GPU: what each folds, where it must not, and that the
architectures' graphs mean the same whatever came before. That the fused and unfused plans compute the
same logits is tests/models/test_fusions.py."""

import dataclasses
from types import SimpleNamespace

import pytest

from webgguf import passes
from webgguf.arch import gemma3, llama
from webgguf.caps import AdapterCaps
from webgguf.graph import AddNorm, Attention, AttentionSpec, Graph, Linear, OutputHead, RmsNorm
from webgguf.preflight import WEBGPU_DEFAULT_LIMITS
from webgguf.weights import StackedWeight, Weight, WeightPart

SPEC = AttentionSpec(scale=0.125, rope_base=1e4, window=4)
PLAIN = Weight("w", "Q4_0", 64, 64, ())
WEIGHTS = {name: PLAIN for name in ("qkv.w", "o.w", "gate_up.w", "down.w", "head.w")}


def gemma_layer() -> list:
    """One Gemma-style layer and the output head, as an architecture writes them."""
    g = Graph()
    g.rmsnorm("x", "normed", "attn_norm")
    g.linear("qkv.w", "normed", "qkv")
    g.attention(0, "qkv", "attn", SPEC)
    g.linear("o.w", "attn", "proj")
    g.add_norm("proj", "x", "post_attention_norm")
    g.rmsnorm("x", "normed", "ffn_norm")
    g.linear("gate_up.w", "normed", "ffn", gate_up=True, gelu=True)
    g.linear("down.w", "ffn", "proj")
    g.add_norm("proj", "x", "post_ffw_norm")
    g.rmsnorm("x", "normed", "output_norm")
    g.output_head("head.w", "normed")
    return g.ops


def run(ops, fusions, n_tokens=1, weights=WEIGHTS):
    return passes.run(ops, frozenset(fusions), passes.Step(n_tokens, weights))


def test_norms_fold_into_the_linear_and_the_head_that_read_them():
    ops = run(gemma_layer(), {"norms"}, n_tokens=7)
    assert not any(isinstance(op, RmsNorm) for op in ops)
    assert [op.norm for op in ops if isinstance(op, Linear | OutputHead) and op.norm] == [
        "attn_norm",
        "ffn_norm",
        "output_norm",
    ]
    assert all(op.x != "normed" for op in ops if isinstance(op, Linear))


def test_a_norm_read_again_later_is_not_folded():
    g = Graph()
    g.rmsnorm("x", "normed", "n")
    g.linear("qkv.w", "normed", "qkv")
    g.linear("o.w", "normed", "proj")  # reads the normalized activation a second time
    assert run(g.ops, {"norms"}) == g.ops


def test_post_norm_adds_fold_into_the_next_norm_gemv_and_move_the_residual_stream():
    ops = run(gemma_layer(), {"norms", "post_norm_adds"})
    gate_up = next(op for op in ops if isinstance(op, Linear) and op.gate_up)
    assert gate_up.add.proj == "proj" and gate_up.add.weight == "post_attention_norm"
    assert gate_up.x == "x" and gate_up.add.out == "x@1"  # reads one half, stores x' to the other
    # The second add is not folded into the head (docs/PERF.md): it stays an add into the current half.
    assert isinstance(ops[-2], AddNorm) and ops[-2].y == "x@1" and ops[-1].x == "x@1"
    assert sum(isinstance(op, AddNorm) for op in ops) == 1


def test_two_folds_bring_the_residual_stream_back_to_its_first_half():
    ops = gemma_layer()[:-2] * 2  # two layers without the head
    folded = run(ops, {"norms", "post_norm_adds"})
    adds = [op.add for op in folded if isinstance(op, Linear) and op.add]
    assert [add.out for add in adds] == ["x@1", "x", "x@1"]
    assert isinstance(folded[-1], AddNorm) and folded[-1].y == "x@1"  # the last add: nothing reads x after


def test_post_norm_adds_need_a_single_token_and_norm_gemvs():
    assert run(gemma_layer(), {"norms", "post_norm_adds"}, n_tokens=2) == run(gemma_layer(), {"norms"}, 2)
    assert run(gemma_layer(), {"post_norm_adds"}) == gemma_layer()


def test_attention_splits_fold_into_the_linear_of_one_matrix_that_reads_them():
    ops = run(gemma_layer(), {"attention_splits"})
    attention = next(op for op in ops if isinstance(op, Attention))
    o_proj = next(op for op in ops if isinstance(op, Linear) and op.weight == "o.w")
    assert attention.splits and o_proj.split_window == SPEC.window
    assert run(gemma_layer(), {"attention_splits"}, n_tokens=3) == gemma_layer()
    stacked = WEIGHTS | {"o.w": StackedWeight("o.w", ((0, PLAIN), (64, PLAIN)))}
    assert run(gemma_layer(), {"attention_splits"}, weights=stacked) == gemma_layer()


def test_unknown_fusions_are_named():
    with pytest.raises(ValueError, match="no_such_fusion"):
        run(gemma_layer(), {"no_such_fusion"})


def test_cpu_adapters_do_not_fold_post_norm_adds():
    gpu = AdapterCaps(frozenset(), WEBGPU_DEFAULT_LIMITS, None, cpu_shapes=False, f16=False)
    assert passes.default_fusions(gpu) == frozenset(passes.FUSIONS) - {"int8"}
    assert passes.default_fusions(dataclasses.replace(gpu, int8=True)) == frozenset(passes.FUSIONS)
    cpu = dataclasses.replace(gpu, cpu_shapes=True)
    assert passes.default_fusions(cpu) == frozenset({"norms", "attention_splits"})


def test_a_linear_means_the_same_whatever_came_before():
    """What an architecture records does not depend on earlier calls: the same Linear after an attention,
    a post-norm or nothing."""
    alone = Graph()
    alone.linear("o.w", "attn", "x", residual=True)
    after = Graph()
    after.attention(0, "qkv", "attn", SPEC)
    after.add_norm("proj", "x", "n")
    after.linear("o.w", "attn", "x", residual=True)
    assert after.ops[-1] == alone.ops[-1]


@pytest.mark.parametrize("module", [llama, gemma3])
def test_the_architectures_write_plain_ops(module):
    """No architecture sets what only the passes set."""
    c = SimpleNamespace(  # what the forward passes read of a config
        n_layer=2,
        head_dim=64,
        rope_base=1e4,
        rope_scale=1.0,
        rope_freq_factors=False,
        tied_output=True,
        final_logit_softcap=0.0,
        embedding_scale=8.0,
        local_layers=(True, False),
        query_scale=0.125,
        rope_base_local=1e4,
        sliding_window=512,
    )
    g = Graph()
    module.forward(g, c, decode=True, head="last")
    for op in g.ops:
        if isinstance(op, Linear):
            assert (op.norm, op.add, op.split_window) == (None, None, None)
        if isinstance(op, Attention):
            assert not op.splits
        if isinstance(op, OutputHead):
            assert op.norm is None and op.weight == "token_embd.weight"


def sized(name: str, n_bytes: int) -> Weight:
    """A Q4_K weight whose GPU arrays hold n_bytes (what the int8 pass weighs)."""
    return Weight(name, "Q4_K", 256, 256, (WeightPart(0, 256, {3: SimpleNamespace(size=n_bytes)}),))


def int8_linears(n_tokens: int, weights: dict) -> list[str]:
    caps = AdapterCaps(frozenset(), WEBGPU_DEFAULT_LIMITS, None, cpu_shapes=False, f16=False, int8=True)
    ops = passes.run(gemma_layer()[:-2], frozenset({"int8"}), passes.Step(n_tokens, weights, caps))
    return [op.weight for op in ops if isinstance(op, Linear) and op.int8]


def test_a_chunk_runs_every_linear_on_the_integer_path_where_the_large_ones_are():
    mib = 1 << 20
    # A 1B-like layer: the feed-forward matrices above the 4 MiB line, the attention projections below.
    large_ffn = {"qkv.w": sized("qkv.w", 3 * mib), "o.w": sized("o.w", 2 * mib)}
    large_ffn |= {"gate_up.w": sized("gate_up.w", 18 * mib), "down.w": sized("down.w", 9 * mib)}
    assert int8_linears(1, large_ffn) == ["gate_up.w", "down.w"]  # decode: by size
    assert int8_linears(64, large_ffn) == ["qkv.w", "o.w", "gate_up.w", "down.w"]  # a chunk: all
    # A small model (every linear under the line) stays f32 in every step.
    small = {name: sized(name, mib) for name in large_ffn}
    assert int8_linears(1, small) == int8_linears(64, small) == []


def llama_layers(n_layer: int) -> list:
    """Llama-style layers and the output head (the norms then fold into the linears)."""
    g = Graph()
    for layer in range(n_layer):
        g.rmsnorm("x", "normed", f"attn_norm.{layer}")
        g.linear("qkv.w", "normed", "qkv")
        g.attention(layer, "qkv", "attn", SPEC)
        g.linear("o.w", "attn", "x", residual=True)
        g.rmsnorm("x", "normed", f"ffn_norm.{layer}")
        g.linear("gate_up.w", "normed", "ffn", gate_up=True)
        g.linear("down.w", "ffn", "x", residual=True)
    g.rmsnorm("x", "normed", "output_norm")
    g.output_head("head.w", "normed")
    return g.ops


# Limits that take gemv_q8 QUANT_OUT's workgroups of 1024 invocations and its 10 storage buffers.
WIDE_WORKGROUPS = {
    "max_compute_invocations_per_workgroup": 1024,
    "max_compute_workgroup_size_x": 1024,
    "max_storage_buffers_per_shader_stage": 10,
}


def quantized_outputs(weights: dict, n_tokens: int = 1, **caps_fields) -> list[tuple]:
    """(producer, the norm it applies, consumer) of every quantize_outputs fold in two llama layers."""
    limits = dataclasses.replace(WEBGPU_DEFAULT_LIMITS, **WIDE_WORKGROUPS)
    caps = AdapterCaps(frozenset({"subgroups"}), limits, (32, 32), cpu_shapes=False, f16=False, int8=True)
    caps = dataclasses.replace(caps, **caps_fields)
    fusions = frozenset({"norms", "attention_splits", "int8", "quantize_outputs"})
    ops = passes.run(llama_layers(2), fusions, passes.Step(n_tokens, weights, caps))
    folds = []
    for producer, consumer in zip(ops, ops[1:], strict=False):
        if isinstance(producer, Linear) and producer.q8_out:
            assert consumer.q8_in
            folds.append((producer.weight, producer.q8_out_norm, consumer.weight))
    assert sum(getattr(op, "q8_in", False) for op in ops) == len(folds)
    return folds


def test_a_linear_writes_the_blocks_of_the_next_one_that_reads_its_whole_output():
    mib = 1 << 20
    big = {name: sized(name, 64 * mib) for name in ("qkv.w", "o.w", "down.w", "head.w")}
    big["gate_up.w"] = dataclasses.replace(sized("gate_up.w", 64 * mib), n_out=512)  # 256 outputs
    # Every linear on the integer path: gate/up's input from o, down's from gate/up, the next layer's
    # q/k/v from down, the head's from the last down; the first q/k/v's input follows the embedding.
    assert quantized_outputs(big, quant_out_min_outputs=0) == [
        ("o.w", "ffn_norm.0", "gate_up.w"),
        ("gate_up.w", None, "down.w"),
        ("down.w", "attn_norm.1", "qkv.w"),
        ("o.w", "ffn_norm.1", "gate_up.w"),
        ("gate_up.w", None, "down.w"),
        ("down.w", "output_norm", "head.w"),
    ]
    assert quantized_outputs(big, n_tokens=8, quant_out_min_outputs=0) == []  # single-token steps only
    assert quantized_outputs(big) == []  # 256 outputs: under selection.QUANT_OUT_MIN_OUTPUTS
    # Workgroups of 32 rows x 32 invocations need the adapter's 1024, in all and along x, and 10 storage
    # buffers (WebGPU's defaults: 256, 256, 8).
    for name in WIDE_WORKGROUPS:
        limits = dataclasses.replace(
            WEBGPU_DEFAULT_LIMITS, **(WIDE_WORKGROUPS | {name: getattr(WEBGPU_DEFAULT_LIMITS, name)})
        )
        assert quantized_outputs(big, limits=limits, quant_out_min_outputs=0) == [], name
    # Not from a linear on the f32 path (under the int8 line in a decode step), nor from a matrix in
    # several bindings.
    small_down = big | {"down.w": sized("down.w", mib)}
    assert ("gate_up.w", None, "down.w") not in quantized_outputs(small_down, quant_out_min_outputs=0)
    down = big["down.w"]
    split_down = big | {"down.w": dataclasses.replace(down, parts=down.parts * 2)}
    folds = quantized_outputs(split_down, quant_out_min_outputs=0)
    assert not any(producer == "down.w" for producer, _, _ in folds) and len(folds) == 4
