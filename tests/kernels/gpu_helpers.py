"""Test helpers: random quantized matrices with their numpy dequantization, GPU buffers from numpy
arrays, and the error measure the kernel tests use."""

import numpy as np
from gguf import GGMLQuantizationType, quants

from webgguf.gpu import STORAGE, Buffer
from webgguf.quants import TYPE_BY_NAME, dequantize


def random_matrix(rng, type_name: str, n_out: int, n_in: int):
    """(raw GGUF bytes [n_out, row bytes] uint8, dequantized weights [n_out, n_in] float64)."""
    dense = rng.standard_normal((n_out, n_in)).astype(np.float32)
    raw = quants.quantize(dense, GGMLQuantizationType[type_name]).view(np.uint8).reshape(n_out, -1)
    return raw, dequantize(raw, TYPE_BY_NAME[type_name].id, (n_in, n_out)).astype(np.float64)


def upload(backend, name: str, array) -> Buffer:
    data = np.ascontiguousarray(array)
    buffer = backend.create_buffer(name, data.nbytes, STORAGE)
    backend.write_buffer(buffer, data.tobytes())
    return buffer


def read_f32(backend, buffer, shape):
    n = int(np.prod(shape))
    return np.frombuffer(backend.read(buffer, 0, 4 * n), np.float32).reshape(shape).astype(np.float64)


def max_scaled_error(got, want, scale) -> float:
    """max |got - want| / scale, where scale bounds the rounding error of the computation (for a dot
    product: the sum of |w_i x_i|; an error relative to |want| itself means nothing after cancellation)."""
    return float(np.max(np.abs(got - want) / scale))
