"""stream_read.wgsl (the bandwidth probe of tools/bench_bandwidth.py) against numpy: each invocation's
XOR over its grid-stride share of the buffer, with fewer and more invocations than vec4s. Exact."""

import numpy as np
import pytest
from gpu_helpers import upload

from webgguf.gpu import STORAGE, Plan

WG = 64


@pytest.mark.parametrize("n_vec4,workgroups", [(1000, 3), (37, 2)])
def test_stream_read(kernels, n_vec4, workgroups):
    backend = kernels.backend
    words = np.random.default_rng(n_vec4).integers(0, 2**32, size=(n_vec4, 4), dtype=np.uint32)
    src = upload(backend, "src", words)
    invocations = workgroups * WG
    out = backend.create_buffer("out", invocations * 4, STORAGE)
    kernel = kernels.get("stream_read", WG=WG)
    step = kernels.dispatch(
        kernel, "stream_read", workgroups, {"src": src, "out": out}, n_vec4=n_vec4, invocations=invocations
    )
    backend.replay(Plan("stream_read", (step,)))
    got = np.frombuffer(backend.read(out, 0, invocations * 4), np.uint32)
    want = np.zeros(invocations, np.uint32)
    for me in range(invocations):
        share = words[me::invocations]
        want[me] = np.bitwise_xor.reduce(share.ravel()) if len(share) else 0
    np.testing.assert_array_equal(got, want)
    backend.destroy_buffer(src)
    backend.destroy_buffer(out)
