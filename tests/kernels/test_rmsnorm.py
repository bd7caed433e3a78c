"""rmsnorm.wgsl against numpy: rows shorter and longer than the workgroup, in place, added to y.

Tolerance rtol 1e-5: a sum of squares over <= 600 elements in f32 and one inverseSqrt (2 ulp)."""

import numpy as np
import pytest
from gpu_helpers import read_f32, upload

from webgguf import ops
from webgguf.gpu import Plan

EPS = 1e-6


@pytest.mark.parametrize("n_rows,n", [(3, 576), (5, 40), (2, 4)])
@pytest.mark.parametrize("mode", ["out", "in_place", "add"])
def test_rmsnorm(kernels, n_rows, n, mode):
    backend = kernels.backend
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n_rows, n)) * 3
    w = rng.uniform(0.5, 1.5, n)
    y0 = rng.standard_normal((n_rows, n))
    normed = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS) * w
    w_buf = upload(backend, "norm_w", w.astype(np.float32))
    if mode == "in_place":
        x_buf, y_buf, want = None, upload(backend, "y", x.astype(np.float32)), normed
    else:
        x_buf, y_buf = upload(backend, "x", x.astype(np.float32)), upload(backend, "y", y0.astype(np.float32))
        want = normed + y0 if mode == "add" else normed
    step = ops.rmsnorm(kernels, x_buf, y_buf, w_buf, n, n_rows, EPS, add=mode == "add")
    backend.replay(Plan("rmsnorm", (step,)))
    got = read_f32(backend, y_buf, (n_rows, n))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    for buffer in (x_buf, y_buf, w_buf):
        if buffer is not None:
            backend.destroy_buffer(buffer)
