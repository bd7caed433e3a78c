"""Dispatch builders: each turns one op on named GPU buffers into the dispatches of a plan.

A builder asks selection.py which kernel runs (a `Choice`), compiles it through the kernels' pipeline
cache, binds the buffers by their WGSL names, fills Params and sizes the grid from what the Choice says
one workgroup covers. Builders decide nothing else. Each takes an optional `trace` list that gets
(dispatch, choice) for every dispatch it makes: how a plan explains itself (`webgguf inspect --plan`).
"""

from .attention import attn_decode, attn_prefill, rope_kv
from .emit import Trace, emit
from .linear import AddNormInput, combine_gemv, gemm, gemv
from .quantized import Q8Activations, attn_merge, gemm_q8, gemv_q8, quantize
from .rows import embed, rmsnorm
from .sample import sample_filtered, sample_greedy

__all__ = [
    "AddNormInput",
    "Q8Activations",
    "attn_merge",
    "Trace",
    "attn_decode",
    "attn_prefill",
    "combine_gemv",
    "embed",
    "emit",
    "gemm",
    "gemm_q8",
    "gemv",
    "gemv_q8",
    "quantize",
    "rmsnorm",
    "rope_kv",
    "sample_filtered",
    "sample_greedy",
]
