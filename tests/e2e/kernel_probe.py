"""A small kernel workload that runs unchanged on any Backend: natively (wgpu) and in the page
(BrowserBackend in Pyodide). Pure Python: Pyodide here has no numpy.

rmsnorm of a vector, then y = W x and y = W rmsnorm(x) with a Q4_1 matrix, all from one seeded RNG,
so both runs see the same bytes.
"""

import random
import struct

from webgguf import ops
from webgguf.gpu import STORAGE, Plan
from webgguf.kernels import Kernels

N_IN, N_OUT = 256, 72  # N_OUT not a multiple of the rows per workgroup: the tail is covered too
EPS = 1e-5


def make_inputs(seed: int = 0) -> dict:
    """x [N_IN] f32, norm weight [N_IN] f32, W [N_OUT][N_IN] as raw Q4_1 blocks (GGUF layout)."""
    rng = random.Random(seed)
    x = [rng.uniform(-2.0, 2.0) for _ in range(N_IN)]
    norm_w = [rng.uniform(0.5, 1.5) for _ in range(N_IN)]
    raw = bytearray()
    for _ in range(N_OUT * N_IN // 32):
        # Q4_1 block: f16 scale d, f16 minimum m, 32 4-bit quants q (value = d * q + m)
        raw += struct.pack("<ee", rng.uniform(0.01, 0.1), rng.uniform(-0.5, 0.0))
        raw += bytes(rng.randrange(256) for _ in range(16))
    return {"x": x, "norm_w": norm_w, "raw": bytes(raw)}


def _f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


async def run_kernels(backend, source_of=None) -> dict:
    """{"rmsnorm": [N_IN], "gemv": [N_OUT], "gemv_norm": [N_OUT]} as lists of floats; `source_of`: where
    the shaders come from (in the page: webgguf_worker.shader_source)."""
    kernels = Kernels(backend, source_of=source_of)
    inputs = make_inputs()
    buffers = []

    def buffer(name, data=None, size=0):
        buf = backend.create_buffer(name, size or len(data), STORAGE)
        if data is not None:
            backend.write_buffer(buf, data)
        buffers.append(buf)
        return buf

    x = buffer("probe.x", _f32(inputs["x"]))
    norm_w = buffer("probe.norm_w", _f32(inputs["norm_w"]))
    normed = buffer("probe.normed", size=4 * N_IN)
    y = buffer("probe.y", size=4 * N_OUT)
    y_norm = buffer("probe.y_norm", size=4 * N_OUT)
    weight = kernels.uploads.upload_weight("probe.w", "Q4_1", N_IN, N_OUT, inputs["raw"])
    steps = [ops.rmsnorm(kernels, x, normed, norm_w, N_IN, 1, EPS, label="probe.rmsnorm")]
    steps += ops.gemv(kernels, weight, x, y, label="probe.gemv")
    steps += ops.gemv(kernels, weight, x, y_norm, norm=norm_w, eps=EPS, label="probe.gemv_norm")
    backend.replay(Plan("probe", tuple(steps)))
    result = {}
    for name, buf, n in (("rmsnorm", normed, N_IN), ("gemv", y, N_OUT), ("gemv_norm", y_norm, N_OUT)):
        result[name] = list(struct.unpack(f"<{n}f", await backend.read_async(buf, 0, 4 * n)))
    kernels.uploads.release_upload_buffers()
    for buf in buffers + [b for part in weight.parts for b in part.arrays.values()]:
        backend.destroy_buffer(buf)
    return result
