"""gemv.wgsl against numpy: every weight format, every epilogue, split weights and 2-D grids, and the
COMBINE input (a decode step's attention output merged from attn_decode's split partials).

Tolerance: 1e-5 of sum_i |w_i x_i| (per output). The GPU dequantizes exactly (f16 scales and small
integers are exact in f32) and accumulates in f32 over chains of at most ~100 additions here, whose
rounding is bounded by ~100 * 6e-8 of that sum; the numpy reference is float64.
"""

import numpy as np
import pytest
from gpu_helpers import max_scaled_error, read_f32, upload
from random_weights import random_weights
from test_attention import merge_partials, split_count, state_words

from webgguf import ops
from webgguf.caps import AdapterCaps
from webgguf.gpu import Plan
from webgguf.kernels import Kernels
from webgguf.ops import AddNormInput, combine_gemv
from webgguf.quants import TYPE_BY_NAME
from webgguf.selection import gemv_shape
from webgguf.weights import WEIGHT_TYPES

# Formats with blocks of up to 32 elements (super-block formats, whose rows are multiples of 256:
# test_kquants.py).
SMALL_BLOCK_TYPES = [t for t in WEIGHT_TYPES if TYPE_BY_NAME[t].block_elems <= 32]

RTOL = 1e-5
EPS = 1e-5


def silu(v):
    return v / (1.0 + np.exp(-v))


def gelu(v):
    """GELU, tanh approximation."""
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


def kernels_of(backend, **caps) -> Kernels:
    """Kernels of `backend` with every feature and the GPU shapes, but for the given AdapterCaps fields
    (a fixed GEMV shape, the CPU shapes)."""
    return Kernels(backend, AdapterCaps.of(backend, f16=True, **{"cpu_shapes": False} | caps))


def run_gemv(kernels, type_name, n_out, n_in, *, seed=0, max_part_bytes=0, y_row=0, **epilogue):
    """Returns (y from the GPU, y from numpy, error scale), for y = W x with the given epilogue; with
    y_row, y has y_row elements before and 5 after the outputs, which must keep their values."""
    backend = kernels.backend
    rng = np.random.default_rng(seed)
    gate_up = epilogue.get("gate_up", False)
    w_rows = 2 * n_out if gate_up else n_out
    raw, w = random_weights(rng, type_name, w_rows, n_in)
    x = rng.standard_normal(n_in)
    y0 = rng.standard_normal(y_row + n_out + (5 if y_row else 0))
    weight = kernels.uploads.upload_weight("w", type_name, n_in, w_rows, raw, max_part_bytes)
    x_buf = upload(backend, "x", x.astype(np.float32))
    y_buf = upload(backend, "y", y0.astype(np.float32))
    norm_buf = None
    xn = x
    if epilogue.get("norm"):
        norm_w = rng.uniform(0.5, 1.5, n_in)
        norm_buf = upload(backend, "norm_w", norm_w.astype(np.float32))
        xn = x / np.sqrt(np.mean(x * x) + EPS) * norm_w
    steps = ops.gemv(
        kernels,
        weight,
        x_buf,
        y_buf,
        residual=epilogue.get("residual", False),
        gate_up=gate_up,
        gelu=epilogue.get("gelu", False),
        norm=norm_buf,
        eps=EPS,
        y_row=y_row,
    )
    backend.replay(Plan("gemv", tuple(steps)))
    got = read_f32(backend, y_buf, len(y0))

    want, scale = w @ xn, np.abs(w) @ np.abs(xn)
    if gate_up:
        act = gelu if epilogue.get("gelu") else silu
        g, u = want[:n_out], want[n_out:]
        want = act(g) * u
        # d(act(g) u) = act'(g) u dg + act(g) du, and |silu'| < 1.1, |gelu'| < 1.13
        scale = 1.2 * np.abs(u) * scale[:n_out] + np.abs(act(g)) * scale[n_out:]
    rows = slice(y_row, y_row + n_out)
    if epilogue.get("residual"):
        want, scale = want + y0[rows], scale + np.abs(y0[rows])
    full_want, full_scale = y0.copy(), np.ones_like(y0)
    full_want[rows], full_scale[rows] = want, scale
    want, scale = full_want, full_scale
    for buffer in (x_buf, y_buf, norm_buf, *[b for p in weight.parts for b in p.arrays.values()]):
        if buffer is not None:
            backend.destroy_buffer(buffer)
    return got, want, scale


@pytest.mark.parametrize("type_name", SMALL_BLOCK_TYPES)
@pytest.mark.parametrize("n_out,n_in", [(67, 96), (300, 576)])
def test_gemv_formats(gemv_kernels, type_name, n_out, n_in):
    kernels = gemv_kernels
    got, want, scale = run_gemv(kernels, type_name, n_out, n_in)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize("type_name", ["F32", "F16"])
def test_gemv_float_rows_not_a_multiple_of_32(gemv_kernels, type_name):
    kernels = gemv_kernels
    got, want, scale = run_gemv(kernels, type_name, 9, 40)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize(
    "epilogue",
    [
        {"residual": True},
        {"gate_up": True},
        {"gate_up": True, "gelu": True},
        {"norm": True},
        {"norm": True, "gate_up": True},
        {"norm": True, "gate_up": True, "gelu": True},
        {"norm": True, "residual": True},
    ],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "Q5_0"])
def test_gemv_epilogues(gemv_kernels, type_name, epilogue):
    kernels = gemv_kernels
    got, want, scale = run_gemv(kernels, type_name, 45, 160, seed=1, **epilogue)
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_rows_at_an_offset(gemv_kernels):
    """A segment of a stacked matrix (gemma3's q, k, v of different types) writes its rows of y only."""
    kernels = gemv_kernels
    got, want, scale = run_gemv(kernels, "Q8_0", 40, 96, y_row=100, norm=True)
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_split_weight(gemv_kernels):
    """A weight split into parts (forced small here) gives the same y: one dispatch per part."""
    kernels = gemv_kernels
    got, want, scale = run_gemv(kernels, "Q5_1", 100, 128, max_part_bytes=30 * 96, residual=True)
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_one_row_per_subgroup_sized_workgroup(native_backends):
    """ROW_THREADS equal to the subgroup size (8 on lavapipe): one subgroupAdd per row."""
    backend = native_backends("full")
    small = kernels_of(backend, gemv_rows=2, gemv_row_threads=max(8, (backend.subgroup_sizes or (8, 8))[1]))
    got, want, scale = run_gemv(small, "Q4_0", 31, 256, norm=True)
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_rows_narrower_than_a_subgroup(backend):
    """4 invocations per row (what large matrices get): the shared-memory reduction, even with
    subgroups on the device."""
    narrow = kernels_of(backend, gemv_row_threads=4)
    got, want, scale = run_gemv(narrow, "Q4_1", 70, 192, gate_up=True, norm=True)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize("n_out", [1, 576, 3072, 49152, 262144])
def test_gemv_shape_fits_a_workgroup(kernels, n_out):
    rows, row_threads = gemv_shape(n_out, kernels.caps)
    assert rows * row_threads <= 256 and row_threads & (row_threads - 1) == 0 and 4 <= row_threads <= 128


@pytest.mark.parametrize("feature_set", ["full", "plain"])
def test_gemv_2d_grid_past_65535_workgroups(native_backends, feature_set):
    """One row per workgroup and 65,636 rows: the grid wraps into y, the overhang leaves."""
    backend = native_backends(feature_set)
    one_row = kernels_of(backend, gemv_rows=1, gemv_row_threads=max(8, (backend.subgroup_sizes or (8, 8))[1]))
    assert one_row.grid(65_636) == (32_818, 2, 1)
    got, want, scale = run_gemv(one_row, "Q8_0", 65_636, 32, seed=3)
    assert max_scaled_error(got, want, scale) <= RTOL


COMBINE_CASES = {
    # name: (type, head_dim, n_head, n_out, pos, n_ctx, window, n_splits, residual, max_part_bytes)
    "smollm2_output_projection": ("Q4_1", 64, 9, 576, 300, 320, 0, 64, True, 0),
    "smollm2_10_splits": ("Q4_1", 64, 9, 576, 600, 642, 0, 64, True, 0),
    "smollm2_16_splits": ("Q4_1", 64, 9, 576, 1000, 1010, 0, 64, False, 0),
    "head_128_window_3_splits": ("Q8_0", 128, 4, 100, 299, 310, 100, 3, False, 0),
    "one_split": ("Q4_0", 64, 2, 33, 5, 8, 0, 4, True, 0),
    "split_weight": ("Q5_1", 64, 2, 100, 700, 800, 0, 4, True, 30 * 96),
    "3072_inputs_merged_in_two_blocks": ("Q8_0", 128, 24, 40, 90, 100, 0, 8, False, 0),
}


@pytest.mark.parametrize("case", sorted(COMBINE_CASES))
def test_gemv_combine(gemv_kernels, case):
    """y (+)= W attn, attn merged from split partials in the GEMV's prologue. The partials of splits
    past the used ones hold NaN: reading one would show."""
    kernels = gemv_kernels
    type_name, head_dim, n_head, n_out, pos, n_ctx, window, n_splits, residual, max_part_bytes = (
        COMBINE_CASES[case]
    )
    backend = kernels.backend
    rng = np.random.default_rng(n_out)
    n_in = n_head * head_dim
    count = split_count(pos, n_ctx, window, n_splits, head_dim)
    partials = np.full((n_head, n_splits, head_dim + 4), np.nan, np.float32)
    partials[:, :count, :head_dim] = rng.standard_normal((n_head, count, head_dim))
    partials[:, :count, head_dim] = rng.uniform(-5.0, 5.0, (n_head, count))  # max
    partials[:, :count, head_dim + 1] = rng.uniform(0.5, 20.0, (n_head, count))  # sum
    partials[:, :count, head_dim + 2 :] = 0.0
    x = merge_partials(partials.astype(np.float64), count, head_dim).reshape(n_in)
    raw, w = random_weights(rng, type_name, n_out, n_in)
    y0 = rng.standard_normal(n_out)
    weight = kernels.uploads.upload_weight("w", type_name, n_in, n_out, raw, max_part_bytes)
    buffers = [
        upload(backend, "state", state_words(pos, 1)),
        upload(backend, "partials", partials),
        upload(backend, "y", y0.astype(np.float32)),
    ]
    steps = combine_gemv(
        kernels,
        weight,
        *buffers,
        head_dim=head_dim,
        n_ctx=n_ctx,
        n_splits=n_splits,
        window=window,
        residual=residual,
    )
    assert len(steps) == len(weight.parts)
    backend.replay(Plan("gemv_combine", tuple(steps)))
    got = read_f32(backend, buffers[2], n_out)
    for buffer in (*buffers, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)
    want, scale = w @ x, np.abs(w) @ np.abs(x)
    if residual:
        want, scale = want + y0, scale + np.abs(y0)
    assert max_scaled_error(got, want, scale) <= RTOL


ADD_NORM_CASES = {
    # name: (type, n_out, n_in, gate_up, read half, max_part_bytes, row threads or None)
    "q5_0_three_arrays_eight_bindings": ("Q5_0", 70, 160, False, 0, 0, None),
    "q8_0_gelu_gate_up_from_the_second_half": ("Q8_0", 45, 96, True, 1, 0, None),
    "split_weight_one_store": ("Q4_1", 100, 128, False, 1, 30 * 80, None),
    "narrow_rows_tree_reduction": ("Q4_0", 70, 192, True, 0, 0, 4),
}


@pytest.mark.parametrize("case", sorted(ADD_NORM_CASES))
def test_gemv_add_norm(kernels, case):
    """ADD_NORM: y = W RMSNorm(x + RMSNorm(proj) * post_w) with x one half of a two-half residual
    buffer; x' lands in the other half (once, with a split weight), the half read keeps its values."""
    type_name, n_out, n_in, gate_up, read_half, max_part_bytes, row_threads = ADD_NORM_CASES[case]
    backend = kernels.backend
    if row_threads:
        kernels = kernels_of(backend, gemv_row_threads=row_threads)
    rng = np.random.default_rng(n_out + n_in)
    half = -(-n_in * 4 // 256) * 64  # floats per half: a 256-byte aligned storage offset
    w_rows = 2 * n_out if gate_up else n_out
    raw, w = random_weights(rng, type_name, w_rows, n_in)
    residual = np.full(2 * half, np.nan)  # the half written starts as NaN: any element left shows
    x = 3.0 * rng.standard_normal(n_in)
    residual[read_half * half : read_half * half + n_in] = x
    proj, post_w, norm_w = rng.standard_normal(n_in), rng.uniform(0.5, 1.5, n_in), rng.uniform(0.5, 1.5, n_in)
    weight = kernels.uploads.upload_weight("w", type_name, n_in, w_rows, raw, max_part_bytes)
    buffers = [
        upload(backend, name, a.astype(np.float32))
        for name, a in (("residual", residual), ("proj", proj), ("post_w", post_w), ("norm_w", norm_w))
    ]
    y_buf = upload(backend, "y", np.zeros(n_out, np.float32))
    res_buf, proj_buf, post_buf, norm_buf = buffers
    add = AddNormInput(proj_buf, post_buf, x_in=read_half * half * 4, x_out=(1 - read_half) * half * 4)
    steps = ops.gemv(
        kernels, weight, res_buf, y_buf, gate_up=gate_up, gelu=gate_up, norm=norm_buf, eps=EPS, add_norm=add
    )
    assert len(steps) == len(weight.parts)
    backend.replay(Plan("gemv_add_norm", tuple(steps)))
    got, got_residual = read_f32(backend, y_buf, n_out), read_f32(backend, res_buf, 2 * half)

    x_new = x + proj / np.sqrt(np.mean(proj * proj) + EPS) * post_w
    xn = x_new / np.sqrt(np.mean(x_new * x_new) + EPS) * norm_w
    want, scale = w @ xn, np.abs(w) @ np.abs(xn)
    if gate_up:
        g, u = want[:n_out], want[n_out:]
        want, scale = gelu(g) * u, 1.2 * np.abs(u) * scale[:n_out] + np.abs(gelu(g)) * scale[n_out:]
    assert max_scaled_error(got, want, scale) <= RTOL
    written = got_residual[(1 - read_half) * half :][:n_in]
    assert max_scaled_error(written, x_new, np.abs(x) + np.abs(x_new - x)) <= RTOL
    np.testing.assert_array_equal(got_residual[read_half * half :][:n_in], x.astype(np.float32))
    for buffer in (*buffers, y_buf, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)


@pytest.mark.parametrize(
    "epilogue",
    [{"norm": True, "gate_up": True, "gelu": True}, {"norm": True}, {"residual": True}],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q5_0", "Q8_0", "Q4_K"])  # both input orders of the steps
@pytest.mark.parametrize("prepare_min_rows", [1, 1 << 30], ids=["prepared", "unprepared"])
def test_gemv_rows_same_bits_as_one_invocation_rows(
    backend, type_name, epilogue, prepare_min_rows, monkeypatch
):
    """gemv_rows.wgsl (2-4 rows per invocation; NORM with or without norm_inputs.wgsl, which GATE_UP
    and large matrices take) sums each row in the order of gemv.wgsl with rows of one invocation (the
    CPU shapes before it): the same bits, so decoding on a CPU adapter is unchanged."""
    monkeypatch.setattr("webgguf.selection.PREPARE_NORM_MIN_ROWS", prepare_min_rows)
    one = kernels_of(backend, gemv_rows=64, gemv_row_threads=1)
    rows = kernels_of(backend, cpu_shapes=True)
    got_one, _, _ = run_gemv(one, type_name, 130, 512, seed=4, **epilogue)
    got_rows, _, _ = run_gemv(rows, type_name, 130, 512, seed=4, **epilogue)
    assert np.array_equal(got_one, got_rows)
