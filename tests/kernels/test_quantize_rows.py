"""quantize_rows.wgsl against numpy: X rows as 8-bit blocks of 32 (d = max|v| / 127, q = v / d rounded
half away from zero, s = d * sum(q)), with and without the RMSNorm prologue, zero blocks, exact halves,
and a grid past 65,535 workgroups.

Without NORM the kernel's arithmetic is reproduced exactly (q_helpers.quantize_reference): d and s must
be equal bit for bit; q too, except that WGSL's division is only accurate to 2.5 ulp, so where v / d
lies within NEAR_TIE of a half integer (never in these tests on lavapipe, whose division is exact) a q
may differ by one. With NORM the normalized values differ from numpy's by a few f32 roundings (a sum of
squares in another order, inverseSqrt's 2 ulp): d is then checked to 1e-5 relative, and the dequantized
values to within d / 2 of numpy's normalized row (the rounding's own bound) plus that 1e-5.
"""

import numpy as np
import pytest
from q8_helpers import quantize_on_gpu, quantize_reference, rmsnorm

NEAR_TIE = 4e-5  # |p| <= 127 times a relative error of ~3 ulp (2.5 of the division, 0.5 of the product)
EPS = 1e-6


def check_exact(x, q, d, s):
    q_ref, d_ref, s_ref, p = quantize_reference(x)
    assert np.array_equal(d, d_ref)
    differ = q.astype(np.int32) != q_ref
    near_tie = np.abs(np.abs(p - np.trunc(p)) - 0.5) < NEAR_TIE
    assert not np.any(differ & ~near_tie), f"{np.count_nonzero(differ)} quants differ"
    assert np.all(np.abs(q.astype(np.int32) - q_ref) <= 1)
    # s is d times the kernel's own sum of q.
    sums = q.astype(np.int32).reshape(len(x), -1, 32).sum(axis=2).astype(np.float32)
    assert np.array_equal(s, d * sums)
    if not np.any(differ):
        assert np.array_equal(s, s_ref)


def test_quantize_rows_exact(kernels):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 160)).astype(np.float32) * rng.uniform(0.01, 100, (37, 1)).astype(np.float32)
    x[3, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    x[5, :32] = rng.integers(-127, 128, 32)  # integers with max 127: d = 1, q = x
    x[5, 0] = 127.0
    x[6, :32] = np.arange(-15.5, 16.5, 1.0)  # exact halves once d = 1 ...
    x[6, 0] = -127.0  # ... (max |v| 127): roundf takes them away from zero
    q, d, s, _, buffers = quantize_on_gpu(kernels, x)
    for buffer in buffers:
        kernels.backend.destroy_buffer(buffer)
    check_exact(x, q, d, s)
    assert d[3, 1] == 0 and not q[3, 32:64].any()
    assert d[5, 0] == 1 and np.array_equal(q[5, :32], x[5, :32])
    assert np.array_equal(q[6, 1:6], [-15, -14, -13, -12, -11]) and q[6, 16] == 1 and q[6, 15] == -1


def test_quantize_rows_norm(kernels):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((21, 256)) * 3.0
    x[2] *= 1e-3  # a small row: normalized like the others
    norm_w = rng.uniform(0.5, 1.5, 256)
    q, d, s, _, buffers = quantize_on_gpu(kernels, x, norm_w=norm_w, eps=EPS)
    for buffer in buffers:
        kernels.backend.destroy_buffer(buffer)
    xn = rmsnorm(x, norm_w, EPS).reshape(21, -1, 32)
    d_ref = np.max(np.abs(xn), axis=2) / 127
    assert np.all(np.abs(d - d_ref) <= 1e-5 * d_ref)
    error = np.abs(d[:, :, None] * q.reshape(21, -1, 32) - xn)
    assert np.all(error <= 0.5 * d[:, :, None] + 1e-5 * np.abs(xn))
    sums = q.astype(np.int32).reshape(21, -1, 32).sum(axis=2).astype(np.float32)
    assert np.array_equal(s, d * sums)


@pytest.mark.parametrize("feature_set", ["full", "plain"])
def test_quantize_rows_2d_grid_past_65535_workgroups(native_backends, feature_set):
    """One workgroup per token and 65,537 tokens: the grid wraps into y, the overhang leaves."""
    from webgguf.kernels import Kernels

    kernels = Kernels(native_backends(feature_set))
    assert kernels.grid(65_537)[1] == 2
    x = np.random.default_rng(2).standard_normal((65_537, 32)).astype(np.float32)
    q, d, s, _, buffers = quantize_on_gpu(kernels, x)
    for buffer in buffers:
        kernels.backend.destroy_buffer(buffer)
    check_exact(x, q, d, s)
