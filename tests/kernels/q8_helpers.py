"""numpy models of the integer GEMM path (quantize_q8.wgsl, gemm_q8.wgsl): X's 8-bit blocks as the GPU
wrote them, and every weight format as int8 quants with their block scales."""

import numpy as np
from gpu_helpers import upload

from webgguf import quants
from webgguf.gpu import STORAGE, Plan
from webgguf.ops import Q8Activations, quantize
from webgguf.ops.quantized import QUANT_BLOCK
from webgguf.quants import TYPE_BY_NAME


def quantize_on_gpu(kernels, x, *, norm_w=None):
    """Run quantize_q8 on x [n, n_in] (times norm_w) -> (q int8 [n, n_in], d [n, nb], s = d sum q
    [n, nb], sum x^2 [n, nb], the Q8Activations for gemm_q8, and every buffer to destroy)."""
    backend = kernels.backend
    n_tokens, n_in = x.shape
    sizes = Q8Activations.sizes(n_tokens, n_in)
    x_buf = upload(backend, "x", x.astype(np.float32))
    q8 = Q8Activations(
        *(
            backend.create_buffer(name, size, STORAGE)
            for name, size in zip(("xq", "xk", "xs"), sizes, strict=True)
        )
    )
    norm_buf = None if norm_w is None else upload(backend, "norm_w", norm_w.astype(np.float32))
    step = quantize(kernels, x_buf, q8, n_tokens, n_in, norm=norm_buf)
    backend.replay(Plan("quantize_q8", (step,)))
    q = np.frombuffer(backend.read(q8.xq), np.int8).reshape(n_tokens, n_in)
    scales = np.frombuffer(backend.read(q8.xs), np.float32).reshape(n_tokens, n_in // QUANT_BLOCK, 4)
    buffers = [b for b in (x_buf, q8.xq, q8.xk, q8.xs, norm_buf) if b is not None]
    return q, scales[:, :, 0], scales[:, :, 1], scales[:, :, 2], q8, buffers


def rmsnorm(x, norm_w, eps):
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * norm_w


# ---------------------------------------------------------------- weights as int8 blocks


def integer_blocks(raw, type_name: str, n_out: int, n_in: int):
    """GGUF rows -> (q int [n_out, n_in], d [n_out, n_in / 16], m [n_out, n_in / 32]) such that weight i of a
    row is d[i // 16] * q[i] + m[i // 32], with q as lib/weights_i8.wgsl unpacks it (ggml's offsets 8, 16,
    32 taken off) and d, m as it computes them (exact in f32). Decoded from the GGUF bytes with the
    format helpers of webgguf.quants, independently of the GPU repack."""
    data = np.ascontiguousarray(raw).reshape(-1)
    nb = n_in // QUANT_BLOCK
    if type_name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0"):
        layout = {
            "Q8_0": [("d", "<f2"), ("qs", "i1", 32)],
            "Q4_0": [("d", "<f2"), ("qs", "u1", 16)],
            "Q4_1": [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)],
            "Q5_0": [("d", "<f2"), ("qh", "<u4"), ("qs", "u1", 16)],
        }[type_name]
        blocks = quants._blocks(data, layout)
        if type_name == "Q8_0":
            q = blocks["qs"].astype(np.int32)
        elif type_name == "Q5_0":
            q = quants._five_bit_quants(blocks).astype(np.int32) - 16
        else:
            q = quants._unpack_low_high_nibbles(blocks["qs"]).astype(np.int32)
            q -= 8 if type_name == "Q4_0" else 0
        d = np.repeat(blocks["d"].astype(np.float64), 2)  # per 16 elements
        m = blocks["m"].astype(np.float64) if type_name == "Q4_1" else np.zeros(len(blocks))
    elif type_name in ("Q4_K", "Q5_K"):
        layout = [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12)]
        layout += [("qh", "u1", 32)] if type_name == "Q5_K" else []
        blocks = quants._blocks(data, [*layout, ("qs", "u1", 128)])
        sc, mn = quants._k4_scales_mins(blocks["scales"])  # [n, 8]
        q = quants._k4_nibbles(blocks["qs"]).astype(np.int32)  # [n, 8, 32]
        if type_name == "Q5_K":
            q |= ((blocks["qh"].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4
        d = np.repeat(blocks["d"].astype(np.float64)[:, None] * sc, 2, axis=1)
        m = -blocks["dmin"].astype(np.float64)[:, None] * mn
    elif type_name == "Q6_K":
        layout = [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]
        blocks = quants._blocks(data, layout)
        ql = blocks["ql"].reshape(-1, 2, 1, 2, 32)
        low = ((ql >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1, 1)) & 15).reshape(-1, 2, 4, 32)
        qh = blocks["qh"].reshape(-1, 2, 1, 32)
        high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
        q = (low | (high << 4)).astype(np.int32) - 32
        d = blocks["d"].astype(np.float64)[:, None] * blocks["scales"]
        m = np.zeros((len(blocks), 8))
    else:
        raise ValueError(f"no int8 model of {type_name}")
    q = q.reshape(n_out, n_in)
    d = d.reshape(n_out, 2 * nb)
    m = m.reshape(n_out, nb)
    # The decomposition is the format: it must give webgguf.quants' dequantization.
    w = d.repeat(16, axis=1) * q + m.repeat(32, axis=1)
    reference = quants.dequantize(data, TYPE_BY_NAME[type_name].id, (n_in, n_out))
    size = np.abs(d.repeat(16, axis=1) * q) + np.abs(m.repeat(32, axis=1))  # f32 rounds the difference
    assert np.all(np.abs(w - reference) <= 1e-6 * size), f"{type_name}: int8 model != dequantize"
    return q, d, m
