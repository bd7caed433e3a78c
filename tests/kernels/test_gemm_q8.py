"""gemm_q8.wgsl (after quantize_q8.wgsl) against numpy: every weight format it reads, the epilogues,
tile shapes, token and row counts that are not multiples of the tile, outputs into a wider Y at an
offset, split weights, and a grid past 65,535 workgroups.

Each result is checked two ways:
(a) Against an exact model of the integer path: the quantized X the GPU produced (read back), the
    weights as int8 quants with their block scales (q8_helpers.integer_blocks, decoded from the GGUF
    bytes), the integer sums per block (per 16 for Q6_K) in int64, scaled and summed in float64. The
    GPU differs only by f32 rounding: per term ~3 roundings (the scale product, the product with the
    sum, the add) and the running sum over at most 2 n_in / 16 terms, so with n_in <= 1024 here
    |got - want| <= (128 + 3) 2^-24 sum |terms| < 1e-5 sum |terms| (EXACT_RTOL), terms = every
    sum * d_w * d_x and m_w * s_x.
    With NORM both sides are scaled by 1 / rms(x): the GPU's from its f32 sums of squares (quantize_q8's
    blocks), numpy's in float64; their ratio differs from 1 by ~n_in / 32 f32 roundings (< 1e-5).
(b) Against the float product of the dequantized weights and X (rmsnorm(X) with the norm): the 8-bit
    activations add at most d_x / 2 per element (round to nearest), so per output
    |got - want| <= sum over blocks of d_x / 2 * sum |w| (with d_x from numpy's X; the slack 1e-4
    covers the 2.5 ulp division and NORM's f32 normalization), plus (a)'s 1e-5 sum |w x|. Through
    GATE_UP act(g) u: (|act(g)| + 1.2 E_g) E_u + 1.2 E_g |u| (|silu'|, |gelu'| < 1.2).
"""

import numpy as np
import pytest
from gpu_helpers import read_f32, upload
from q8_helpers import integer_blocks, quantize_on_gpu, rmsnorm
from random_weights import random_weights
from test_gemm import gelu, silu

from webgguf.gpu import STORAGE, Plan
from webgguf.kernels import Kernels
from webgguf.ops import gemm_q8
from webgguf.selection import INT8_WEIGHT_TYPES

Q8_WEIGHT_TYPES = sorted(INT8_WEIGHT_TYPES)

EXACT_RTOL = 1e-5
X_SLACK = 1e-4
EPS = 1e-6


def exact_model(qx, dx, sx, qw, dw, mw):
    """(Y, sum of |terms|) [n_tokens, n_rows] of the integer path, in int64 / float64."""
    n_tokens, n_in = qx.shape
    n_sub = dw.shape[1]  # blocks of 16 (d per half block)
    sums = np.einsum(
        "tsl,rsl->trs",
        qx.reshape(n_tokens, n_sub, -1).astype(np.int64),
        qw.reshape(len(qw), n_sub, -1).astype(np.int64),
    )  # [t, r, half block]
    if np.all(dw[:, 0::2] == dw[:, 1::2]):  # one scale per block: the kernel sums whole blocks
        sums = sums[:, :, 0::2] + sums[:, :, 1::2]
        dw = dw[:, 0::2]
    dx_sub = np.repeat(dx, dw.shape[1] // dx.shape[1], axis=1)
    terms = sums * dw[None, :, :] * dx_sub[:, None, :]
    min_terms = mw[None, :, :] * sx[:, None, :]
    y = terms.sum(axis=2) + min_terms.sum(axis=2)
    scale = np.abs(terms).sum(axis=2) + np.abs(min_terms).sum(axis=2)
    return y, scale


def float_bound(x, w):
    """Bound of |W x - W x_q| per output [n_tokens, n_rows] from rounding x to 8-bit blocks."""
    blocks = x.reshape(len(x), -1, 32)
    half_d = np.max(np.abs(blocks), axis=2) / 127 / 2 * (1 + X_SLACK)  # [t, nb]
    w_abs = np.abs(w).reshape(len(w), -1, 32).sum(axis=2)  # [r, nb]
    return half_d @ w_abs.T


def gated(y, bound, n_out, act):
    """act(gate) * up of [gate | up] columns, and its error bound from theirs."""
    g, u, e_g, e_u = y[:, :n_out], y[:, n_out:], bound[:, :n_out], bound[:, n_out:]
    return act(g) * u, (np.abs(act(g)) + 1.2 * e_g) * e_u + 1.2 * e_g * np.abs(u)


def check(got, want, bound, what):
    error = np.abs(got - want)
    assert np.all(error <= bound), f"{what}: worst error {np.max(error / bound):.3g} x the bound"


def run_gemm_q8(
    kernels,
    type_name,
    n_tokens,
    n_out,
    n_in,
    *,
    tiles=None,
    y_stride=0,
    y_row=0,
    seed=0,
    max_part_bytes=0,
    norm=False,
    residual=False,
    gate_up=False,
    gelu_act=False,
):
    """Run quantize_q8 + gemm_q8 (tiles: (wg_t, wg_n), None as the engine picks); check (a) and (b) of
    the module docstring."""
    backend = kernels.backend
    rng = np.random.default_rng(seed)
    w_rows = 2 * n_out if gate_up else n_out
    raw, w = random_weights(rng, type_name, w_rows, n_in)
    qw, dw, mw = integer_blocks(raw, type_name, w_rows, n_in)
    x = rng.standard_normal((n_tokens, n_in)) * rng.uniform(0.1, 10, (n_tokens, 1))
    width = y_stride or n_out
    y0 = rng.standard_normal((n_tokens, width))
    norm_w = rng.uniform(0.5, 1.5, n_in) if norm else None
    weight = kernels.uploads.upload_weight("w", type_name, n_in, w_rows, raw, max_part_bytes)
    assert max_part_bytes == 0 or len(weight.parts) > 1
    qx, dx, sx, _, q8, buffers = quantize_on_gpu(kernels, x, norm_w=norm_w)
    y_buf = upload(backend, "y", y0.astype(np.float32))
    steps = gemm_q8(
        kernels,
        weight,
        q8,
        y_buf,
        n_tokens,
        tiles=tiles,
        y_stride=y_stride,
        y_row=y_row,
        residual=residual,
        gate_up=gate_up,
        gelu=gelu_act,
        norm=norm,
        eps=EPS,
    )
    backend.replay(Plan("gemm_q8", tuple(steps)))
    got = read_f32(backend, y_buf, (n_tokens, width))
    for buffer in (*buffers, y_buf, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)

    exact, exact_scale = exact_model(qx, dx, sx, qw, dw, mw)  # [t, w_rows]
    if norm:  # quantize_q8 applied norm_w; the GEMM scales by 1 / rms(x)
        inv_rms = 1 / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS)
        exact, exact_scale = exact * inv_rms, exact_scale * inv_rms
    xn = rmsnorm(x, norm_w, EPS) if norm else x
    flt, flt_scale = xn @ w.T, np.abs(xn) @ np.abs(w).T
    flt_bound = float_bound(xn, w) + EXACT_RTOL * flt_scale
    exact_bound = EXACT_RTOL * exact_scale
    if gate_up:
        act = gelu if gelu_act else silu
        exact, exact_bound = gated(exact, exact_bound, n_out, act)
        flt, flt_bound = gated(flt, flt_bound, n_out, act)
    cols = slice(y_row, y_row + n_out)
    base = y0[:, cols] if residual else 0.0
    slack = EXACT_RTOL * np.abs(y0[:, cols]) if residual else 0.0
    others = np.ones(width, bool)
    others[cols] = False
    assert np.array_equal(got[:, others], y0.astype(np.float32)[:, others]), "other columns changed"
    check(got[:, cols], exact + base, exact_bound + slack, "exact model")
    check(got[:, cols], flt + base, flt_bound + slack, "float product")


def n_in_of(type_name):
    return 512 if type_name.endswith("_K") else 160


@pytest.mark.parametrize("type_name", Q8_WEIGHT_TYPES)
def test_gemm_q8_formats(kernels, type_name):
    """Three token tiles and two row tiles, both partial (short-chunk tiles: 32 tokens x 64 rows)."""
    run_gemm_q8(kernels, type_name, 70, 100, n_in_of(type_name))


TILES = [(8, 8), (16, 8), (8, 16), (32, 8)]


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("type_name", ["Q5_0", "Q6_K"])
def test_gemm_q8_tiles(kernels, type_name, tiles):
    """Tiles where the invocations staging weight rows and token halves overlap (8x8: 64 invocations
    stage 64 rows and 2 x 32 halves) and where they do not."""
    run_gemm_q8(kernels, type_name, 45, 70, n_in_of(type_name), tiles=tiles, seed=3)


def test_gemm_q8_long_chunk_tiles(kernels):
    """A chunk of >= 256 tokens takes the long-chunk tiles (64 tokens x 64 rows)."""
    run_gemm_q8(kernels, "Q4_K", 260, 40, 256, seed=6, norm=True)


EPILOGUES = [
    {"residual": True},
    {"gate_up": True},
    {"gate_up": True, "gelu_act": True},
    {"norm": True},
    {"norm": True, "gate_up": True},
    {"norm": True, "residual": True},
]


@pytest.mark.parametrize("epilogue", EPILOGUES, ids=lambda e: "+".join(sorted(e)))
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q4_1"])
def test_gemm_q8_epilogues(kernels, type_name, epilogue):
    run_gemm_q8(kernels, type_name, 33, 45, n_in_of(type_name), seed=1, **epilogue)


def test_gemm_q8_rows_at_an_offset_of_wider_rows(kernels):
    """A segment of a stacked matrix (q, k, v of different types) writes its columns only."""
    run_gemm_q8(kernels, "Q6_K", 19, 40, 256, y_stride=100, y_row=48, residual=True)


def test_gemm_q8_single_token(kernels):
    run_gemm_q8(kernels, "Q4_0", 1, 20, 64, y_stride=29, residual=True)


def test_gemm_q8_split_weight(kernels):
    """Three parts (one dispatch each), the middle one ending inside a row tile."""
    run_gemm_q8(kernels, "Q4_K", 9, 300, 256, max_part_bytes=120 * 144)


@pytest.mark.parametrize("feature_set", ["full", "plain"])
def test_gemm_q8_2d_grid_past_65535_workgroups(native_backends, feature_set):
    """65,537 row tiles of 64 rows (tiles of 8 x 8 invocations): the grid wraps into y, the overhang
    leaves. Every weight is 1 (Q4_0 quants 9, scales 1), so each output is the sum of the token's
    quantized inputs: cheap to build and to check at 4.2 M rows."""
    backend = native_backends(feature_set)
    kernels = Kernels(backend)
    tiles = (8, 8)  # 64 rows per tile
    n_out, n_in = 65_537 * 64, 32
    assert kernels.grid(65_537)[1] == 2
    block = np.frombuffer(np.float16(1.0).tobytes() + bytes([0x99] * 16), np.uint8)  # d = 1, quants 9 - 8
    weight = kernels.uploads.upload_weight("ones", "Q4_0", n_in, n_out, np.tile(block, n_out))
    x = np.random.default_rng(5).standard_normal((1, n_in))
    qx, dx, _, _, q8, buffers = quantize_on_gpu(kernels, x)
    y = backend.create_buffer("y", 4 * n_out, STORAGE)
    steps = gemm_q8(kernels, weight, q8, y, 1, tiles=tiles)
    assert len(steps) == 1
    backend.replay(Plan("gemm_q8", tuple(steps)))
    got = np.frombuffer(backend.read(y, 0, 4 * n_out), np.float32)
    want = np.float32(dx[0, 0] * qx[0].sum())
    assert np.all(np.abs(got - want) <= 1e-6 * np.abs(dx[0, 0] * qx[0]).sum()), "a row tile was skipped"
    for buffer in (*buffers, y, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)


def test_gemm_q8_refuses_tiles_it_cannot_run(kernels):
    from random_weights import random_weights as draw

    raw, _ = draw(np.random.default_rng(0), "Q8_0", 4, 32)
    weight = kernels.uploads.upload_weight("w", "Q8_0", 32, 4, raw)
    with pytest.raises(ValueError, match=">= 8"):
        gemm_q8(kernels, weight, None, None, 1, tiles=(4, 16))
