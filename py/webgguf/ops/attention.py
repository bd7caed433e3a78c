"""Attention: the decode kernel that leaves split partials (attn_decode), and for a chunk RoPE + the
KV-cache write (rope_kv) then causal attention over the cache (attn_prefill).

`c` is the model config (head_dim, n_head, n_head_kv, n_group, rope_dims, rms_eps); `spec` the layer's
graph.AttentionSpec; `options` the buffers of its optional vectors (q_norm, k_norm, bias, freq_factors).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from .. import selection
from ..gpu.base import Buffer, Dispatch
from ..pipelines import Target
from .emit import Trace, emit

if TYPE_CHECKING:
    from ..graph import AttentionSpec
    from ..kernels import Kernels


def option_defines(spec: AttentionSpec) -> dict[str, bool]:
    """The defines of rope_kv / attn_decode for the spec's RoPE layout, bias, norms and factors."""
    if (spec.q_norm is None) != (spec.k_norm is None):
        raise ValueError("q and k norms come together")
    return dict(
        NEOX=spec.neox,
        QK_NORM=spec.q_norm is not None,
        BIAS=spec.bias is not None,
        FREQ_FACTORS=spec.freq_factors is not None,
    )


def option_vectors(spec: AttentionSpec) -> dict[str, str]:
    """Binding name -> vector name of the spec's optional vectors."""
    names = {
        "q_norm": spec.q_norm,
        "k_norm": spec.k_norm,
        "bias": spec.bias,
        "freq_factors": spec.freq_factors,
    }
    return {binding: name for binding, name in names.items() if name is not None}


def _rope_params(spec: AttentionSpec, rope_dims: int) -> dict:
    # powf(base, -2 / rope_dims) rounded to f32 as llama.cpp computes it (rope_kv.wgsl).
    theta_scale = struct.unpack("<f", struct.pack("<f", spec.rope_base ** (-2.0 / rope_dims)))[0]
    return dict(rope_dims=rope_dims, theta_scale=theta_scale, freq_scale=spec.rope_scale)


def rope_kv(
    k: Kernels,
    c,
    spec: AttentionSpec,
    *,
    state: Buffer,
    qkv: Target,
    q: Target,
    k_cache: Buffer,
    v_cache: Buffer,
    options: dict[str, Target],
    n_tokens: int,
    n_ctx: int,
    label: str,
    trace: Trace | None = None,
) -> Dispatch:
    """RoPE on q and k of the fused projection [T, (n_head + 2 n_head_kv) head_dim]; q to `q`
    [T, n_head head_dim], k and v into the layer's cache at positions pos.. (the state's)."""
    choice = selection.rope_kv(c.head_dim, k.caps, **option_defines(spec))
    buffers = {"state": state, "qkv": qkv, "q": q, "k_cache": k_cache, "v_cache": v_cache} | options
    return emit(
        k,
        choice,
        label,
        n_tokens * (c.n_head + 2 * c.n_head_kv),
        buffers,
        trace,
        n_head=c.n_head,
        n_head_kv=c.n_head_kv,
        n_ctx=n_ctx,
        eps=c.rms_eps,
        **_rope_params(spec, c.rope_dims),
    )


def attn_decode(
    k: Kernels,
    c,
    spec: AttentionSpec,
    *,
    state: Buffer,
    qkv: Target,
    k_cache: Buffer,
    v_cache: Buffer,
    partials: Buffer,
    options: dict[str, Target],
    n_ctx: int,
    n_splits: int,
    label: str,
    trace: Trace | None = None,
) -> Dispatch:
    """One decode token: RoPE + cache write + one split of attention per workgroup, into `partials`
    [n_head, n_splits, head_dim + 4] (merged by the GEMV that reads them: combine_gemv)."""
    choice = selection.attn_decode(
        c.head_dim, c.n_group, c.rope_dims, k.caps, n_splits, **option_defines(spec)
    )
    buffers = {
        "state": state,
        "qkv": qkv,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "partials": partials,
    } | options
    return emit(
        k,
        choice,
        label,
        c.n_head_kv * n_splits,
        buffers,
        trace,
        n_head_kv=c.n_head_kv,
        n_ctx=n_ctx,
        n_splits=n_splits,
        window=spec.window,
        scale=spec.scale,
        eps=c.rms_eps,
        **_rope_params(spec, c.rope_dims),
    )


def attn_prefill(
    k: Kernels,
    c,
    spec: AttentionSpec,
    *,
    state: Buffer,
    q: Target,
    k_cache: Buffer,
    v_cache: Buffer,
    out: Target,
    n_tokens: int,
    n_ctx: int,
    label: str,
    trace: Trace | None = None,
) -> Dispatch:
    """Causal attention of the chunk's roped queries q [T, n_head head_dim] over the cache (positions up
    to each token's own) into out [T, n_head head_dim]."""
    choice = selection.attn_prefill(c.head_dim, c.n_group, k.caps)
    groups = -(-(n_tokens * c.n_group) // choice.rows) * c.n_head_kv
    buffers = {"state": state, "q": q, "k_cache": k_cache, "v_cache": v_cache, "out": out}
    return emit(
        k,
        choice,
        label,
        groups,
        buffers,
        trace,
        n_head_kv=c.n_head_kv,
        n_ctx=n_ctx,
        window=spec.window,
        scale=spec.scale,
    )
