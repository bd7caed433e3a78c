"""quantize_q8.wgsl and gemv_q8.wgsl against numpy.

quantize_q8: every block's scale is its max |v| / 127 (to f32 rounding; v = x or x * norm_w), every
quant is within half a step of v / d (plus the f32 rounding of v / d), the sums match the quants and x,
and the K-order copy is the element-order one permuted (even elements of each 8, then odd ones).

gemv_q8: y = W x_hat, where x_hat is the activation as quantized (the GPU's own xq and xs read back and
dequantized: the GEMV must be exact given them, as its integer sums are). Tolerance 1e-5 of the
computation's own scale, as tests/kernels/test_gemv_wide.py: the kernel computes d_w (d_x q . q_x -
o d_x sum q_x) per chunk, whose f32 rounding is bounded by ~3 sum |w_i x_hat_i|.
"""

import numpy as np
import pytest
from gpu_helpers import max_scaled_error, read_f32, upload
from random_weights import random_weights
from test_attention import merge_partials, split_count, state_words
from test_gemv import EPS, gelu, silu

from webgguf.gpu import STORAGE, Plan

Q8_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}
RTOL = 1e-5
OFFSET_FACTOR = 3.0


def quantize_on_gpu(kernels, x_buf, n, n_rows, norm_buf=None, wg=8):
    """Runs quantize_q8 on n_rows rows of n; returns (xq, xk, xs) buffers."""
    backend = kernels.backend
    n_blocks = n_rows * n // 32
    xq = backend.create_buffer("xq", n_rows * n, STORAGE)
    xk = backend.create_buffer("xk", n_rows * n, STORAGE)
    xs = backend.create_buffer("xs", n_blocks * 16, STORAGE)
    kernel = kernels.get("quantize_q8", WG=wg, NORM_W=norm_buf is not None, K_ORDER=True)
    buffers = {"x": x_buf, "xq": xq, "xs": xs, "xk": xk} | ({"norm_w": norm_buf} if norm_buf else {})
    step = kernels.dispatch(kernel, "quantize_q8", -(-n_blocks // wg), buffers, n=n, n_blocks=n_blocks)
    backend.replay(Plan("quantize_q8", (step,)))
    return xq, xk, xs


def read_quants(backend, xq, xs, n, n_rows):
    """(int8 quants [n_rows, n], scales [n_rows, n / 32, 4]) read back."""
    q = np.frombuffer(backend.read(xq, 0, n_rows * n), np.int8).reshape(n_rows, n).astype(np.int64)
    s = np.frombuffer(backend.read(xs, 0, n_rows * n // 32 * 16), np.float32).reshape(n_rows, n // 32, 4)
    return q, s.astype(np.float64)


@pytest.mark.parametrize("norm", [False, True])
def test_quantize_q8(kernels, norm):
    backend = kernels.backend
    rng = np.random.default_rng(3)
    n, n_rows = 352, 3  # 11 blocks per row, 33 in all: 5 workgroups of 8, the last one short
    x = rng.standard_normal((n_rows, n)) * rng.uniform(0.1, 10, (n_rows, 1))
    x[1, 64:96] = 0.0  # a block of zeros: d = 0, quants 0
    norm_w = rng.uniform(0.5, 1.5, n)
    x_buf = upload(backend, "x", x.astype(np.float32))
    norm_buf = upload(backend, "norm_w", norm_w.astype(np.float32)) if norm else None
    xq, xk, xs = quantize_on_gpu(kernels, x_buf, n, n_rows, norm_buf)
    q, s = read_quants(backend, xq, xs, n, n_rows)
    v = x * norm_w if norm else x
    np.testing.assert_allclose(s[..., 2], (x * x).reshape(n_rows, n // 32, 32).sum(axis=2), rtol=1e-5)
    blocks = v.reshape(n_rows, n // 32, 32)
    d = np.abs(blocks).max(axis=2) / 127
    np.testing.assert_allclose(s[..., 0], d, rtol=1e-5)
    qb = q.reshape(n_rows, n // 32, 32)
    assert np.abs(qb).max() <= 127
    safe_d = np.where(d > 0, d, 1.0)[..., None]
    assert np.all(np.abs(blocks / safe_d - qb) <= 0.5 + 1e-4)
    assert np.all(qb[1, 2] == 0) and s[1, 2, 0] == 0.0
    np.testing.assert_allclose(s[..., 1], s[..., 0] * qb.sum(axis=2), rtol=1e-6)
    np.testing.assert_allclose(s[..., 3], s[..., 0] * qb[..., :16].sum(axis=2), rtol=1e-6)
    k = np.frombuffer(backend.read(xk, 0, n_rows * n), np.int8).reshape(n_rows, n // 8, 8)
    groups = q.reshape(n_rows, n // 8, 8)
    np.testing.assert_array_equal(k, np.concatenate([groups[..., 0::2], groups[..., 1::2]], axis=2))
    for buffer in (x_buf, norm_buf, xq, xk, xs):
        if buffer is not None:
            backend.destroy_buffer(buffer)


def run_gemv_q8(
    kernels,
    type_name,
    n_out,
    n_in,
    *,
    rows=1,
    row_threads=8,
    groups=4,
    subgroups=False,
    seed=0,
    max_part_bytes=0,
    y_row=0,
    residual=False,
    gate_up=False,
    gelu_act=False,
    norm=False,
    quant_out=None,
):
    """quant_out: None, or a dict to fill with the QUANT_OUT blocks ("got": (quants, K-order quants,
    scales) read back, "want": quantize_q8 of the stored outputs, times "norm_out" if given)."""
    backend = kernels.backend
    rng = np.random.default_rng(seed)
    w_rows = 2 * n_out if gate_up else n_out
    raw, w = random_weights(rng, type_name, w_rows, n_in)
    x = rng.standard_normal(n_in)
    y0 = rng.standard_normal(y_row + n_out + 3)
    weight = kernels.uploads.upload_weight("w", type_name, n_in, w_rows, raw, max_part_bytes)
    x_buf = upload(backend, "x", x.astype(np.float32))
    y_buf = upload(backend, "y", y0.astype(np.float32))
    norm_buf = upload(backend, "norm_w", rng.uniform(0.5, 1.5, n_in).astype(np.float32)) if norm else None
    xq, xk, xs = quantize_on_gpu(kernels, x_buf, n_in, 1, norm_buf)
    q, s = read_quants(backend, xq, xs, n_in, 1)
    x_hat = (q.reshape(-1, 32) * s[0, :, :1]).reshape(n_in)  # the activation as the GEMV sees it
    if norm:  # quantize_q8 applied norm_w; the GEMV divides by rms(x)
        x_hat = x_hat / np.sqrt(np.mean(x * x) + EPS)
    kernel = kernels.get(
        "gemv_q8",
        WEIGHTS=type_name.lower(),
        N_IN=n_in,
        ROWS=rows,
        ROW_THREADS=row_threads,
        GROUPS=groups,
        SUBGROUPS=subgroups,
        RESIDUAL=residual,
        GATE_UP=gate_up,
        GELU=gelu_act,
        NORM=norm,
        QUANT_OUT=quant_out is not None,
        NORM_OUT=quant_out is not None and "norm_out" in quant_out,
    )
    buffers = {"xq": xk if type_name in K_QUANTS else xq, "xs": xs, "y": y_buf}
    out_buffers = []
    if quant_out is not None:
        n_y = y_row + n_out
        out_buffers = [backend.create_buffer(name, size, STORAGE) for name, size in
                       (("oq", n_y), ("ok", n_y), ("os", n_y // 32 * 16))]  # fmt: skip
        buffers |= dict(zip(("oq", "ok", "os"), out_buffers, strict=True))
        if "norm_out" in quant_out:
            out_buffers.append(upload(backend, "onorm_w", quant_out["norm_out"].astype(np.float32)))
            buffers["onorm_w"] = out_buffers[-1]
    steps = [
        kernels.dispatch(
            kernel,
            "gemv_q8",
            -(-part.n_out(gate_up) // (rows * groups)),
            buffers | part.buffers,
            n_out=part.n_out(gate_up),
            row_base=y_row + part.row_begin,
            eps=EPS,
        )
        for part in weight.parts
    ]
    backend.replay(Plan("gemv_q8", tuple(steps)))
    got = read_f32(backend, y_buf, len(y0))
    if quant_out is not None:
        # What quantize_q8 makes of the outputs the GEMV stored (its rows y_row..): the same block.
        at = slice(y_row, y_row + n_out)
        stored = upload(backend, "stored", got[at].astype(np.float32))
        norm_out = out_buffers[3] if len(out_buffers) > 3 else None
        if norm_out is not None:  # the weights of the GEMV's rows
            norm_out = upload(backend, "norm_at", quant_out["norm_out"][at].astype(np.float32))
        want_bufs = quantize_on_gpu(kernels, stored, n_out, 1, norm_out)
        quant_out["want"] = [backend.read(b, 0, b.size) for b in want_bufs]
        first, end = y_row // 32, (y_row + n_out) // 32
        quant_out["got"] = [
            backend.read(out_buffers[0], 8 * 4 * first, n_out),
            backend.read(out_buffers[1], 8 * 4 * first, n_out),
            backend.read(out_buffers[2], 16 * first, 16 * (end - first)),
        ]
        for buffer in (stored, norm_out, *want_bufs, *out_buffers):
            if buffer is not None:
                backend.destroy_buffer(buffer)

    want, scale = w @ x_hat, OFFSET_FACTOR * (np.abs(w) @ np.abs(x_hat))
    if gate_up:
        act = gelu if gelu_act else silu
        g, u = want[:n_out], want[n_out:]
        want = act(g) * u
        scale = 1.2 * np.abs(u) * scale[:n_out] + np.abs(act(g)) * scale[n_out:]
    at = slice(y_row, y_row + n_out)
    if residual:
        want, scale = want + y0[at], scale + np.abs(y0[at])
    full_want, full_scale = y0.copy(), np.ones_like(y0)
    full_want[at], full_scale[at] = want, scale
    for buffer in (x_buf, y_buf, norm_buf, xq, xk, xs, *[b for p in weight.parts for b in p.arrays.values()]):
        if buffer is not None:
            backend.destroy_buffer(buffer)
    return got, full_want, full_scale


@pytest.mark.parametrize("type_name", Q8_TYPES)
@pytest.mark.parametrize("rows", [1, 3])
def test_gemv_q8_formats(kernels, type_name, rows):
    # 512 inputs: 16 chunks over 8 invocations (2 steps each); 37 rows: a short last workgroup.
    got, want, scale = run_gemv_q8(kernels, type_name, 37, 512, rows=rows)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize("type_name", ["Q5_0", "Q8_0", "Q5_K", "Q6_K"])
def test_gemv_q8_chunks_not_a_multiple_of_the_row_threads(kernels, type_name):
    # 768 inputs: 24 chunks over 16 invocations (the second step has 8 of them idle); 4 rows each.
    got, want, scale = run_gemv_q8(kernels, type_name, 21, 768, rows=4, row_threads=16, groups=2)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize(
    "epilogue",
    [
        {"residual": True},
        {"gate_up": True},
        {"gate_up": True, "gelu_act": True},
        {"norm": True},
        {"norm": True, "gate_up": True},
        {"norm": True, "residual": True},
    ],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 2])
def test_gemv_q8_epilogues(kernels, type_name, epilogue, rows):
    got, want, scale = run_gemv_q8(kernels, type_name, 19, 256, rows=rows, seed=1, y_row=5, **epilogue)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize(
    "epilogue",
    [{"residual": True}, {"gate_up": True}, {"norm": True}],
    ids=lambda e: "+".join(sorted(e)),
)
@pytest.mark.parametrize("norm_out", [False, True])
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K"])
def test_gemv_q8_quantized_outputs(kernels, type_name, epilogue, norm_out):
    """QUANT_OUT: each workgroup's 32 outputs (after the residual add) also written as one 8-bit block,
    equal to what quantize_q8 makes of the outputs stored (times the next RMSNorm's weight with
    NORM_OUT): the same quants, K-order copy and scales, bit for bit. 96 outputs from row 32 on: 3
    workgroups, blocks 1..3 of y."""
    quant_out = {}
    if norm_out:
        quant_out["norm_out"] = np.random.default_rng(5).uniform(0.5, 1.5, 32 + 96 + 3)
    got, want, scale = run_gemv_q8(
        kernels, type_name, 96, 256, rows=1, groups=32, seed=2, y_row=32, quant_out=quant_out, **epilogue
    )
    assert max_scaled_error(got, want, scale) <= RTOL
    for name, got_bytes, want_bytes in zip(
        ("quants", "K-order quants", "scales"), quant_out["got"], quant_out["want"], strict=True
    ):
        assert got_bytes == want_bytes, name


@pytest.mark.parametrize("type_name", ["Q4_1", "Q6_K"])
def test_gemv_q8_subgroups(native_backends, type_name):
    """On the full feature set only: the plain one has no subgroups by design."""
    from webgguf.kernels import Kernels

    kernels = Kernels(native_backends("full"))
    sizes = kernels.backend.subgroup_sizes
    if not sizes or sizes[0] != sizes[1]:
        pytest.skip(f"the adapter ({kernels.backend.adapter_name}) has no subgroups of one size")
    got, want, scale = run_gemv_q8(
        kernels, type_name, 29, 512, rows=2, row_threads=sizes[0], subgroups=True, norm=True
    )
    assert max_scaled_error(got, want, scale) <= RTOL


def test_gemv_q8_split_weight(kernels):
    # Parts of 10 rows: several dispatches, each writing its rows at its offset.
    raw_row = 512 // 32 * 34
    got, want, scale = run_gemv_q8(kernels, "Q8_0", 33, 512, rows=2, max_part_bytes=10 * raw_row + 4)
    assert max_scaled_error(got, want, scale) <= RTOL


@pytest.mark.parametrize("head_dim,n_head,pos,window", [(64, 5, 700, 0), (128, 3, 300, 100), (32, 3, 10, 0)])
def test_attn_merge_q8(kernels, head_dim, n_head, pos, window):
    """attn_merge_q8.wgsl: attn_decode's split partials merged (test_attention.merge_partials) and
    quantized: each output within half a quantization step of the merge, the block scales as
    quantize_q8's (d = max |v| / 127, d sum q, sum v^2), and the K-order copy permuted."""
    backend = kernels.backend
    rng = np.random.default_rng(head_dim + pos)
    n_ctx, n_splits = 1024, 16
    count = split_count(pos, n_ctx, window, n_splits, head_dim)
    partials = rng.standard_normal((n_head, n_splits, head_dim + 4))
    partials[:, :, head_dim] *= 4  # the splits' maxima
    partials[:, :, head_dim + 1] = rng.uniform(0.5, 20, (n_head, n_splits))  # their sums (> 0)
    want = merge_partials(partials, count, head_dim).reshape(-1)  # [n_head hd]
    n = n_head * head_dim
    n_blocks = n // 32
    state = upload(backend, "state", state_words(pos, 1))
    part_buf = upload(backend, "partials", partials.astype(np.float32))
    xq = backend.create_buffer("xq", n, STORAGE)
    xk = backend.create_buffer("xk", n, STORAGE)
    xs = backend.create_buffer("xs", n_blocks * 16, STORAGE)
    kernel = kernels.get("attn_merge_q8", HEAD_DIM=head_dim, WG=16, K_ORDER=True)  # 2 blocks per workgroup
    buffers = {"state": state, "partials": part_buf, "xq": xq, "xk": xk, "xs": xs}
    step = kernels.dispatch(
        kernel, "attn_merge_q8", -(-n_blocks // 2), buffers, n_blocks=n_blocks, n_ctx=n_ctx, window=window,
        n_splits=n_splits,
    )  # fmt: skip
    backend.replay(Plan("attn_merge_q8", (step,)))
    q, s = read_quants(backend, xq, xs, n, 1)
    blocks = want.reshape(n_blocks, 32)
    d = np.abs(blocks).max(axis=1) / 127
    np.testing.assert_allclose(s[0, :, 0], d, rtol=1e-5)
    np.testing.assert_allclose(s[0, :, 2], (blocks * blocks).sum(axis=1), rtol=1e-5)
    assert np.all(np.abs(blocks - q.reshape(n_blocks, 32) * d[:, None]) <= d[:, None] * (0.5 + 1e-4))
    k = np.frombuffer(backend.read(xk, 0, n), np.int8).reshape(n // 8, 8)
    groups = q.reshape(n // 8, 8)
    np.testing.assert_array_equal(k, np.concatenate([groups[:, 0::2], groups[:, 1::2]], axis=1))
    for buffer in (state, part_buf, xq, xk, xs):
        backend.destroy_buffer(buffer)
