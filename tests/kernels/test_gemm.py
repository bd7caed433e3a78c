"""gemm.wgsl and gemm_rows.wgsl (the CPU adapters' GEMM) against numpy: every weight format, the
epilogues, token and row counts that are not multiples of the tiles, outputs written into a wider Y at
an offset, split weights.

Tolerance, per output, as a fraction of sum_i |w_i x_i|: 1e-5 (exact dequantization, f32 sums over
at most ~600 additions here; both kernels keep f32 tiles on every feature set).
"""

import numpy as np
import pytest
from gpu_helpers import max_scaled_error, read_f32, upload
from random_weights import random_weights

from webgguf import ops, selection
from webgguf.gpu import Plan
from webgguf.quants import TYPE_BY_NAME
from webgguf.weights import WEIGHT_TYPES

# Formats with blocks of up to 32 elements (super-block formats, whose rows are multiples of 256:
# test_kquants.py).
SMALL_BLOCK_TYPES = [t for t in WEIGHT_TYPES if TYPE_BY_NAME[t].block_elems <= 32]

EPS = 1e-6


def silu(v):
    return v / (1.0 + np.exp(-v))


def gelu(v):
    """GELU, tanh approximation."""
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3)))


def tolerance_of(kernels):
    return 1e-5


def run_gemm(
    kernels,
    type_name,
    n_tokens,
    n_out,
    n_in,
    *,
    y_stride=0,
    y_row=0,
    seed=0,
    max_part_bytes=0,
    tiles=None,
    **epilogue,
):
    """(Y from the GPU, Y from numpy, error scale), each [n_tokens, y_stride or n_out]; the rows go to
    columns y_row..y_row + n_out."""
    backend = kernels.backend
    rng = np.random.default_rng(seed)
    gate_up = epilogue.get("gate_up", False)
    w_rows = 2 * n_out if gate_up else n_out
    raw, w = random_weights(rng, type_name, w_rows, n_in)
    x = rng.standard_normal((n_tokens, n_in))
    width = y_stride or n_out
    y0 = rng.standard_normal((n_tokens, width))
    weight = kernels.uploads.upload_weight("w", type_name, n_in, w_rows, raw, max_part_bytes)
    x_buf = upload(backend, "x", x.astype(np.float32))
    y_buf = upload(backend, "y", y0.astype(np.float32))
    norm_buf = None
    xn = x
    if epilogue.get("norm"):
        norm_w = rng.uniform(0.5, 1.5, n_in)
        norm_buf = upload(backend, "norm_w", norm_w.astype(np.float32))
        xn = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS) * norm_w
    steps = ops.gemm(
        kernels,
        weight,
        x_buf,
        y_buf,
        n_tokens,
        y_stride=y_stride,
        y_row=y_row,
        residual=epilogue.get("residual", False),
        gate_up=gate_up,
        gelu=epilogue.get("gelu", False),
        norm=norm_buf,
        eps=EPS,
        tiles=tiles,
    )
    backend.replay(Plan("gemm", tuple(steps)))
    got = read_f32(backend, y_buf, (n_tokens, width))

    product, scale = xn @ w.T, np.abs(xn) @ np.abs(w).T  # [n_tokens, w_rows]
    if gate_up:
        act = gelu if epilogue.get("gelu") else silu
        g, u = product[:, :n_out], product[:, n_out:]
        product = act(g) * u
        # |silu'| < 1.1, |gelu'| < 1.13
        scale = 1.2 * np.abs(u) * scale[:, :n_out] + np.abs(act(g)) * scale[:, n_out:]
    cols = slice(y_row, y_row + n_out)
    want, full_scale = y0.copy(), np.ones_like(y0)  # the other columns must keep their values
    want[:, cols] = product + (y0[:, cols] if epilogue.get("residual") else 0)
    full_scale[:, cols] = scale + (np.abs(y0[:, cols]) if epilogue.get("residual") else 0)
    for buffer in (x_buf, y_buf, norm_buf, *[b for p in weight.parts for b in p.arrays.values()]):
        if buffer is not None:
            backend.destroy_buffer(buffer)
    return got, want, full_scale


@pytest.mark.parametrize("type_name", SMALL_BLOCK_TYPES)
def test_gemm_formats(gemm_kernels, type_name):
    got, want, scale = run_gemm(gemm_kernels, type_name, 37, 70, 96)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


def test_gemm_larger(gemm_kernels):
    got, want, scale = run_gemm(gemm_kernels, "Q4_1", 70, 200, 576, seed=2)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


TILES = [(8, 8), (16, 8), (32, 8), (8, 16), (16, 16)]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize(
    "epilogue", [{"norm": True, "gate_up": True}, {"residual": True}], ids=["norm", "residual"]
)
def test_gemm_tiles(kernels, tiles, epilogue):
    """Every tile shape gemm.wgsl takes (each splits a block's staging differently among its
    invocations; NORM sums each token's x^2 over the invocations that staged it), with partial token
    and row tiles."""
    if selection.gemm_tile_bytes(*tiles) > kernels.caps.limits.max_compute_workgroup_storage_size:
        with pytest.raises(ValueError, match="workgroup memory"):
            run_gemm(kernels, "Q4_K", 3, 8, 256, tiles=tiles)
        return
    got, want, scale = run_gemm(kernels, "Q4_K", 70, 75, 512, seed=4, tiles=tiles, **epilogue)
    assert max_scaled_error(got, want, scale) <= tolerance_of(kernels)


def test_gemm_long_chunk_tiles(kernels):
    """A chunk of >= 256 tokens takes the long-chunk tiles (64 tokens x 64 rows)."""
    assert selection.gemm("Q4_0", 64, kernels.caps, n_tokens=260).tokens == 64
    got, want, scale = run_gemm(kernels, "Q4_0", 260, 40, 64, seed=6, norm=True)
    assert max_scaled_error(got, want, scale) <= tolerance_of(kernels)


@pytest.mark.parametrize(
    "epilogue",
    [
        {"residual": True},
        {"gate_up": True},
        {"gate_up": True, "gelu": True},
        {"norm": True},
        {"norm": True, "gate_up": True},
        {"norm": True, "gate_up": True, "gelu": True},
    ],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_1"])
def test_gemm_epilogues(gemm_kernels, type_name, epilogue):
    got, want, scale = run_gemm(gemm_kernels, type_name, 33, 45, 128, seed=1, **epilogue)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


def test_gemm_single_token_into_wider_rows(gemm_kernels):
    got, want, scale = run_gemm(gemm_kernels, "Q4_0", 1, 20, 64, y_stride=29, residual=True)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


def test_gemm_rows_at_an_offset_of_wider_rows(gemm_kernels):
    """A segment of a stacked matrix (gemma3's q, k, v of different types) writes its columns only."""
    got, want, scale = run_gemm(gemm_kernels, "Q5_0", 19, 40, 64, y_stride=100, y_row=48, residual=True)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)


def test_gemm_split_weight(gemm_kernels):
    got, want, scale = run_gemm(gemm_kernels, "Q8_0", 5, 150, 64, max_part_bytes=40 * 68)
    assert max_scaled_error(got, want, scale) <= tolerance_of(gemm_kernels)
