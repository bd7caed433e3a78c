"""y = W x with 8-bit activations and integer dot products: the activation quantizers (quantize_q8,
attn_merge_q8) and the GEMV / GEMM that read their blocks (gemv_q8, gemm_q8).

An activation read this way is first written as `Q8Activations`: its int8 quants in element order (xq),
the same in K-quant order (xk, which gemv_q8 reads for Q4_K / Q5_K / Q6_K) and per block of 32 the
scales (d, d sum q, sum x^2, d sum of the first 16 q) (shaders/quantize_q8.wgsl). An RMSNorm before the
linear is split: its weight is applied when quantizing, its 1 / rms by the GEMV / GEMM (NORM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import selection
from ..gpu.base import Buffer, Dispatch
from ..pipelines import Target
from ..weights import Weight
from .emit import Trace, emit
from .linear import _parts_for

if TYPE_CHECKING:
    from ..kernels import Kernels

QUANT_BLOCK = selection.QUANT_BLOCK  # elements per 8-bit activation block


@dataclass(frozen=True)
class Q8Activations:
    """Buffers of activations quantized to 8-bit blocks (sized for the largest rows they will hold)."""

    xq: Target  # u32 [n_tokens * n / 4]: int8 quants, element order
    xk: Target  # u32 [n_tokens * n / 4]: the same in K-quant order
    xs: Target  # vec4<f32> [n_tokens * n / 32]: (d, d sum q, sum x^2, d sum q_0..15)

    @staticmethod
    def sizes(n_tokens: int, n: int) -> tuple[int, int, int]:
        """Bytes of xq, xk and xs for n_tokens rows of n."""
        return n_tokens * n, n_tokens * n, n_tokens * (n // QUANT_BLOCK) * 16


def quantize(
    k: Kernels,
    x: Target,
    out: Q8Activations,
    n_tokens: int,
    n_in: int,
    *,
    norm: Target | None = None,
    label: str = "quantize_q8",
    trace: Trace | None = None,
) -> Dispatch:
    """x [n_tokens, n_in] f32 (times the RMSNorm weight `norm`) -> `out` as 8-bit blocks."""
    if n_in % QUANT_BLOCK:
        raise ValueError(f"{label}: n_in {n_in} is not a multiple of {QUANT_BLOCK}")
    choice = selection.quantize_q8(k.caps, norm_w=norm is not None)
    n_blocks = n_tokens * n_in // QUANT_BLOCK
    buffers = {"x": x, "xq": out.xq, "xk": out.xk, "xs": out.xs} | ({} if norm is None else {"norm_w": norm})
    groups = -(-n_blocks // (choice.rows // QUANT_BLOCK))
    return emit(k, choice, label, groups, buffers, trace, n=n_in, n_blocks=n_blocks)


def attn_merge(
    k: Kernels,
    state: Buffer,
    partials: Buffer,
    out: Q8Activations,
    *,
    head_dim: int,
    n_head: int,
    n_ctx: int,
    n_splits: int,
    window: int,
    label: str = "attn_merge_q8",
    trace: Trace | None = None,
) -> Dispatch:
    """A decode step's attention output [n_head head_dim], merged from attn_decode's split partials,
    as 8-bit blocks in `out`."""
    choice = selection.attn_merge_q8(head_dim, k.caps)
    n_blocks = n_head * head_dim // QUANT_BLOCK
    buffers = {"state": state, "partials": partials, "xq": out.xq, "xk": out.xk, "xs": out.xs}
    groups = -(-n_blocks // (choice.rows // QUANT_BLOCK))
    params = dict(n_blocks=n_blocks, n_ctx=n_ctx, window=window, n_splits=n_splits)
    return emit(k, choice, label, groups, buffers, trace, **params)


def gemv_q8(
    k: Kernels,
    w: Weight,
    x: Q8Activations,
    y: Target,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    eps: float = 0.0,
    y_row: int = 0,
    out: Q8Activations | None = None,
    norm_out: Target | None = None,
    label: str = "",
    trace: Trace | None = None,
) -> list[Dispatch]:
    """y = W x for one token from its 8-bit blocks (the epilogues of ops.gemv; norm: x was quantized
    with the RMSNorm's weight, and the GEMV applies its 1 / rms). out: the outputs (as stored to y) also
    written there as 8-bit blocks, times norm_out (an RMSNorm weight) if given: the next linear's input
    (other buffers than x's: the GEMV still reads those while it writes)."""
    if out is not None:
        fits, why = selection.gemv_q8_quant_out_fits(w.n_out // (2 if gate_up else 1), k.caps)
        if not fits or y_row % QUANT_BLOCK or len(w.parts) != 1:
            raise ValueError(f"{label or w.name}: no quantized outputs here ({why or 'y_row or parts'})")
        if out.xq is x.xq or out.xs is x.xs:
            raise ValueError(f"{label or w.name}: the quantized outputs need buffers of their own")
    choice = selection.gemv_q8(
        w.type_name,
        w.n_in,
        k.caps,
        residual=residual,
        gate_up=gate_up,
        gelu=gelu,
        norm=norm,
        quant_out=out is not None,
        norm_out=norm_out is not None,
    )
    quants = x.xk if w.type_name in selection.K_ORDER_TYPES else x.xq
    outputs = {} if out is None else {"oq": out.xq, "ok": out.xk, "os": out.xs}
    outputs |= {} if norm_out is None else {"onorm_w": norm_out}
    steps = []
    for part in _parts_for(w, gate_up):
        n_out = part.n_out(gate_up)
        name = f"{label or w.name}.gemv_q8[{part.row_begin}:{part.row_end}]"
        buffers = {"xq": quants, "xs": x.xs, "y": y} | outputs | part.buffers
        params = dict(n_out=n_out, row_base=y_row + part.row_begin, eps=eps)
        steps.append(emit(k, choice, name, -(-n_out // choice.rows), buffers, trace, **params))
    return steps


def gemm_q8(
    k: Kernels,
    w: Weight,
    x: Q8Activations,
    y: Target,
    n_tokens: int,
    *,
    y_stride: int = 0,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    eps: float = 0.0,
    y_row: int = 0,
    tiles: tuple[int, int] | None = None,
    label: str = "",
    trace: Trace | None = None,
) -> list[Dispatch]:
    """Y[t] = W X[t] for n_tokens tokens from their 8-bit blocks (the epilogues of ops.gemm, NORM as
    in gemv_q8); row 0 goes to column y_row of Y. tiles: see selection.gemm_q8."""
    choice = selection.gemm_q8(
        w.type_name, n_tokens, k.caps, residual=residual, gate_up=gate_up, gelu=gelu, norm=norm, tiles=tiles
    )
    steps = []
    for part in _parts_for(w, gate_up):
        n_out = part.n_out(gate_up)
        row_tiles = -(-n_out // choice.rows)
        params = dict(
            n_in=w.n_in,
            n_out=n_out,
            row_base=y_row + part.row_begin,
            n_tokens=n_tokens,
            y_stride=y_stride or w.n_out // (2 if gate_up else 1),
            row_tiles=row_tiles,
            eps=eps,
        )
        name = f"{label or w.name}.gemm_q8[{part.row_begin}:{part.row_end}]"
        buffers = {"x_q": x.xq, "xs": x.xs, "y": y} | part.buffers
        steps.append(
            emit(k, choice, name, row_tiles * -(-n_tokens // choice.tokens), buffers, trace, **params)
        )
    return steps
