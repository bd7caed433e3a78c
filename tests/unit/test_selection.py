"""Kernel selection (selection.py) without a GPU: which kernel, defines and shape each rule picks for which
caps, and that a Choice names the pipeline the cache compiles for it."""

import dataclasses

import pytest

from webgguf import selection
from webgguf.caps import AdapterCaps
from webgguf.pipelines import Pipelines
from webgguf.preflight import WEBGPU_DEFAULT_LIMITS, SizingBackend

GPU = AdapterCaps(
    features=frozenset({"shader-f16", "subgroups"}),
    limits=WEBGPU_DEFAULT_LIMITS,
    subgroup_sizes=(32, 32),
    cpu_shapes=False,
    f16=False,
)
CPU = dataclasses.replace(GPU, features=frozenset(), subgroup_sizes=None, cpu_shapes=True)


@pytest.mark.parametrize("n_out, shape", [(1, (2, 128)), (576, (2, 128)), (3072, (4, 64)), (49152, (64, 4))])
def test_gemv_shape_aims_for_2_18_invocations(n_out, shape):
    assert selection.gemv_shape(n_out, GPU) == shape


def test_gemv_on_a_gpu_sums_by_subgroups_where_rows_hold_whole_subgroups():
    wide = selection.gemv("Q4_1", 576, 960, GPU, norm=True)
    assert wide.kernel == "gemv" and wide.defines["SUBGROUPS"] and wide.defines["NORM"] and wide.rows == 2
    narrow = selection.gemv("Q8_0", 576, 49152, GPU, norm=True)
    assert (narrow.defines["ROW_THREADS"], narrow.defines["SUBGROUPS"]) == (4, False)
    assert "shared-memory" in narrow.reason
    assert narrow.prologue is None and "MASKED_BYTES" not in narrow.defines
    gate_up = selection.gemv("Q4_1", 576, 2 * 1536, GPU, gate_up=True, gelu=True)
    assert gate_up.defines["GATE_UP"] and gate_up.defines["GELU"]
    assert selection.gemv("Q4_1", 576, 3072, GPU).defines["GELU"] is False  # GELU only gates


def test_a_fixed_gemv_shape_in_the_caps_is_used_everywhere():
    fixed = dataclasses.replace(GPU, gemv_rows=1, gemv_row_threads=8)
    choice = selection.gemv("Q4_0", 256, 31, fixed)
    assert (choice.defines["ROWS"], choice.defines["ROW_THREADS"], choice.rows) == (1, 8, 1)
    assert "fixed" in choice.reason


def test_add_norm_needs_a_power_of_two_workgroup_and_a_gpu():
    assert selection.gemv("Q5_0", 640, 1536, GPU, norm=True, add_norm=True).defines["ADD_NORM"]
    with pytest.raises(ValueError, match="power-of-two"):
        selection.gemv(
            "Q5_0", 640, 64, dataclasses.replace(GPU, gemv_rows=3, gemv_row_threads=64), add_norm=True
        )
    with pytest.raises(ValueError, match="gemv_rows"):
        selection.gemv("Q5_0", 640, 64, CPU, norm=True, add_norm=True)


def test_cpu_adapters_get_the_barrier_free_gemv_and_prepared_inputs_where_they_pay():
    plain = selection.gemv("Q4_1", 576, 960, CPU, norm=True)
    assert plain.kernel == "gemv_rows" and plain.rows == 64 and plain.prologue is None
    assert plain.defines["PREPARED"] is False
    gate_up = selection.gemv("Q4_1", 576, 3072, CPU, norm=True, gate_up=True)
    assert gate_up.rows == 32 and gate_up.defines["PREPARED"]
    assert gate_up.prologue.kernel == "norm_inputs" and gate_up.prologue.defines == {"NIBBLES": True}
    head = selection.gemv("Q8_0", 576, 49152, CPU, norm=True)
    assert head.prologue.defines == {"NIBBLES": False} and head.defines["MASKED_BYTES"]
    assert selection.gemv("Q8_0", 576, 4095, CPU, norm=True).prologue is None
    assert selection.gemv("Q8_0", 576, 4096, CPU, norm=True).prologue is not None


def test_combine_gemv_rows_are_at_least_a_subgroup_wide():
    assert selection.gemv_combine("Q4_1", 576, 64, GPU, residual=True).defines["ROW_THREADS"] == 32
    wide = selection.gemv_combine(
        "Q4_1", 576, 64, dataclasses.replace(GPU, subgroup_sizes=(64, 64)), residual=True
    )
    assert (wide.defines["ROW_THREADS"], wide.rows) == (64, 4)
    cpu = selection.gemv_combine("Q8_0", 576, 64, CPU, residual=False)
    assert cpu.kernel == "gemv_rows" and cpu.defines["COMBINE"] and cpu.defines["MASKED_BYTES"]


def test_gemm_rows_on_cpu_adapters_until_the_loop_limit():
    rows = selection.gemm("Q4_1", 1536, CPU, residual=True)
    assert (rows.kernel, rows.rows, rows.tokens, rows.defines["N_IN"]) == ("gemm_rows", 256, 8, 1536)
    assert selection.gemm("Q4_1", 8 * (selection.CPU_LOOP_LIMIT - 1), CPU).kernel == "gemm_rows"
    past = selection.gemm("Q4_1", 8 * selection.CPU_LOOP_LIMIT, CPU)
    assert past.kernel == "gemm" and "65535" in past.reason
    tiles = selection.gemm("Q4_1", 576, GPU, gate_up=True, n_tokens=128)
    assert (tiles.kernel, tiles.rows, tiles.tokens, tiles.defines["WG_T"]) == ("gemm", 32, 32, 8)
    long = selection.gemm("Q4_1", 576, GPU, n_tokens=512)
    assert (long.rows, long.tokens, long.defines["WG_T"], long.defines["WG_N"]) == (64, 64, 16, 8)
    # The f16 option keeps gemm.wgsl's tiles f32 (it has no f16 form).
    assert selection.gemm("Q4_1", 576, dataclasses.replace(GPU, f16=True)) == long
    # A tile that needs more workgroup memory than the adapter gives: the short tiles, or an error when
    # the caller fixed it.
    small = dataclasses.replace(
        GPU, limits=dataclasses.replace(GPU.limits, max_compute_workgroup_storage_size=12288)
    )
    assert selection.gemm("Q4_1", 576, small, n_tokens=512).tokens == 32
    with pytest.raises(ValueError, match="workgroup memory"):
        selection.gemm("Q4_1", 576, small, tiles=(16, 8))


def test_adapter_wide_choices():
    assert selection.decode_splits(CPU) == 1 and selection.decode_splits(GPU) == selection.DECODE_SPLITS
    assert selection.argmax_partial(CPU).defines == {"NARROW": True}
    assert selection.argmax_partial(GPU).defines == {"NARROW": False}
    assert selection.rmsnorm(GPU).defines["ROW_THREADS"] == 64
    assert (
        selection.rmsnorm(dataclasses.replace(GPU, subgroup_sizes=(128, 128))).defines["ROW_THREADS"] == 128
    )
    assert selection.embed("Q8_0", CPU).defines == {
        "WEIGHTS": "q8_0",
        "MASKED_BYTES": True,
        "ROW_THREADS": 64,
    }
    with pytest.raises(ValueError, match="power-of-two head size"):
        selection.attn_decode(48, 2, 48, GPU, 4)


def test_subgroups_wider_than_the_kernels_take_are_not_used():
    huge = dataclasses.replace(GPU, subgroup_sizes=(256, 256))
    assert not huge.subgroups and huge.max_subgroup == 0
    assert selection.gemv("Q4_1", 576, 960, huge).defines["SUBGROUPS"] is False


def test_a_choice_names_the_pipeline_it_compiles():
    pipelines = Pipelines(SizingBackend(WEBGPU_DEFAULT_LIMITS, GPU.features, GPU.subgroup_sizes))
    for choice in (
        selection.gemv("Q4_1", 576, 960, GPU, norm=True),
        selection.gemv("Q8_0", 576, 49152, CPU, norm=True),
        selection.gemm("Q6_K", 1024, GPU, residual=True),
        selection.attn_decode(64, 3, 64, GPU, 64, NEOX=True, QK_NORM=False, BIAS=False, FREQ_FACTORS=False),
    ):
        assert pipelines.get(choice.kernel, **choice.defines).name == choice.name
        assert choice.name in str(choice) and choice.reason in str(choice)


def test_wide_key_tiles_for_large_heads_where_the_workgroup_memory_allows():
    roomy = dataclasses.replace(
        GPU, limits=dataclasses.replace(GPU.limits, max_compute_workgroup_storage_size=32768)
    )
    tight = dataclasses.replace(
        GPU, limits=dataclasses.replace(GPU.limits, max_compute_workgroup_storage_size=16384)
    )
    assert (
        selection.attn_prefill_bytes(256, False) <= 16384 < selection.attn_prefill_bytes(256, True) <= 32768
    )
    assert selection.attn_prefill(256, 4, roomy).defines["WIDE"]
    assert selection.attn_prefill(128, 7, roomy).defines["WIDE"]
    assert not selection.attn_prefill(256, 4, tight).defines["WIDE"]  # 16 KiB: WebGPU's default
    assert not selection.attn_prefill(64, 3, roomy).defines["WIDE"]  # 16 rows x 32 keys: past 256 scores
    cpu = dataclasses.replace(CPU, limits=roomy.limits)
    assert selection.attn_prefill(256, 4, cpu).kernel == "attn_prefill_rows"  # CPU adapters: no tiles


def test_gemm_rows_broadcasts_the_inputs_where_a_subgroup_holds_every_token():
    lavapipe = dataclasses.replace(CPU, features=GPU.features, subgroup_sizes=(8, 8))
    assert selection.gemm("Q4_1", 576, lavapipe).defines["SUBGROUPS"]
    narrow = dataclasses.replace(lavapipe, subgroup_sizes=(4, 4))  # 4 lanes cannot hold 8 tokens
    assert not selection.gemm("Q4_1", 576, narrow).defines["SUBGROUPS"]
    assert not selection.gemm("Q4_1", 576, CPU).defines["SUBGROUPS"]  # no subgroups
    # gemv_rows likewise, one step's inputs per lane (the plain GEMV and the one merging attention splits)
    assert selection.gemv("Q4_1", 576, 960, lavapipe, norm=True).defines["SUBGROUPS"]
    assert selection.gemv_combine("Q4_1", 576, 64, lavapipe, residual=True).defines["SUBGROUPS"]
    assert not selection.gemv("Q4_1", 576, 960, narrow).defines["SUBGROUPS"]
    assert not selection.gemv_combine("Q4_1", 576, 64, CPU, residual=True).defines["SUBGROUPS"]
