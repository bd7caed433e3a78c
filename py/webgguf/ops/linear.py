"""y = W x: the GEMV of one token, the GEMM of a chunk, and the GEMV that merges attention splits.

One dispatch per weight part (a matrix larger than one storage binding is split on row boundaries,
weights.py); each writes its rows of y.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import selection
from ..gpu.base import Buffer, Dispatch
from ..pipelines import Target
from ..selection import Choice
from ..weights import Weight, WeightPart
from .emit import Trace, emit

if TYPE_CHECKING:
    from ..kernels import Kernels


@dataclass(frozen=True)
class AddNormInput:
    """A post-norm residual add folded into the input of a GEMV (gemv.wgsl ADD_NORM): the GEMV reads
    x' = x + proj / rms(proj) * post_w, where its x binding holds two halves of the residual stream; x is
    the half at byte x_in, and x' is stored to the half at byte x_out (by the first dispatch, with write)."""

    proj: Target  # [n_in] f32, the block output to normalize and add
    post_w: Target  # [n_in] f32, its norm weight
    x_in: int  # bytes, multiple of 16
    x_out: int  # bytes, multiple of 16
    write: bool = True


def gemv(
    k: Kernels,
    w: Weight,
    x: Target,
    y: Target,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: Target | None = None,
    eps: float = 0.0,
    y_row: int = 0,
    add_norm: AddNormInput | None = None,
    label: str = "",
    trace: Trace | None = None,
) -> list[Dispatch]:
    """y = W x for one token (x: [n_in] f32, y: [n_out] f32), one dispatch per weight part.

    residual: y += W x. gate_up: W is [gate; up] (2 n rows) and y = act(gate x) * (up x), y: [n],
    act = GELU (tanh approximation) with gelu, else SiLU.
    norm: the RMSNorm weight [n_in]; x is normalized in the same pass (eps: its epsilon).
    y_row: the element of y where row 0 goes (a matrix stacked from tensors of different types).
    add_norm: x is the two halves of the residual stream and the input is x + RMSNorm(proj) * post_w
    (eps: its epsilon too), stored to the other half by the first dispatch (AddNormInput). GPU shapes only:
    the passes do not fold post-norms on CPU adapters."""
    try:
        choice = selection.gemv(
            w.type_name,
            w.n_in,
            w.n_out,
            k.caps,
            residual=residual,
            gate_up=gate_up,
            gelu=gelu,
            norm=norm is not None,
            add_norm=add_norm is not None,
        )
    except ValueError as e:
        raise ValueError(f"{w.name}: {e}") from None
    steps = []
    if choice.prologue is not None:
        # x * norm_w and the sum of squares, once (norm_inputs.wgsl), not in every invocation; the GEMV
        # then reads the prepared inputs and binds no norm weight.
        prepared = k.scratch(f"prepared_inputs[{w.n_in}]", 4 * w.n_in + 16)
        buffers = {"x": x, "out": prepared, "norm_w": norm}
        steps.append(
            emit(k, choice.prologue, f"{label or w.name}.norm_inputs", 1, buffers, trace, n_in=w.n_in)
        )
        x, norm = prepared, None
    for index, part in enumerate(_parts_for(w, gate_up)):
        n_out = part.n_out(gate_up)
        name = f"{label or w.name}.gemv[{part.row_begin}:{part.row_end}]"
        buffers = _linear_buffers(part, x, y, norm)
        params = dict(n_out=n_out, row_base=y_row + part.row_begin, eps=eps)
        if add_norm is not None:
            if add_norm.x_in % 16 or add_norm.x_out % 16:
                raise ValueError(f"{name}: residual halves at bytes {add_norm.x_in}, {add_norm.x_out}")
            buffers |= {"proj": add_norm.proj, "post_w": add_norm.post_w}
            write = add_norm.write and index == 0  # one store of x' is enough
            params |= dict(x_in=add_norm.x_in // 16, x_out=add_norm.x_out // 16, write_x=int(write))
        steps.append(emit(k, choice, name, -(-n_out // choice.rows), buffers, trace, **params))
    return steps


def gemm(
    k: Kernels,
    w: Weight,
    x: Target,
    y: Target,
    n_tokens: int,
    *,
    y_stride: int = 0,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: Target | None = None,
    eps: float = 0.0,
    y_row: int = 0,
    label: str = "",
    trace: Trace | None = None,
    tiles: tuple[int, int] | None = None,
) -> list[Dispatch]:
    """Y[t] = W X[t] for n_tokens tokens (X: [n_tokens, n_in], Y: [n_tokens, y_stride]), with the
    epilogues of `gemv`; y_stride defaults to the output rows (n_out, or n_out / 2 with gate_up);
    row 0 goes to column y_row of Y. tiles: see selection.gemm."""
    choice = selection.gemm(
        w.type_name,
        w.n_in,
        k.caps,
        n_tokens=n_tokens,
        residual=residual,
        gate_up=gate_up,
        gelu=gelu,
        norm=norm is not None,
        tiles=tiles,
    )
    steps = []
    for part in _parts_for(w, gate_up):
        n_out = part.n_out(gate_up)
        row_tiles = -(-n_out // choice.rows)
        params = dict(
            n_out=n_out,
            row_base=y_row + part.row_begin,
            eps=eps,
            n_tokens=n_tokens,
            y_stride=y_stride or w.n_out // (2 if gate_up else 1),
            row_tiles=row_tiles,
        )
        if "N_IN" not in choice.defines:
            params["n_in"] = w.n_in  # a kernel without the constant N_IN has it in its Params
        steps.append(
            emit(
                k,
                choice,
                f"{label or w.name}.{choice.kernel}[{part.row_begin}:{part.row_end}]",
                row_tiles * -(-n_tokens // choice.tokens),
                _linear_buffers(part, x, y, norm),
                trace,
                **params,
            )
        )
    return steps


def combine_gemv(
    k: Kernels,
    w: Weight,
    state: Buffer,
    partials: Buffer,
    y: Target,
    *,
    head_dim: int,
    n_ctx: int,
    n_splits: int,
    window: int,
    residual: bool,
    trace: Trace | None = None,
) -> list[Dispatch]:
    """y (+)= W attn, one dispatch per weight part, where attn [n_in] is a decode step's attention output
    still as attn_decode's split partials [n_in / head_dim, n_splits, head_dim + 4] (gemv.wgsl COMBINE)."""
    choice: Choice = selection.gemv_combine(w.type_name, w.n_in, head_dim, k.caps, residual=residual)
    steps = []
    for part in w.parts:
        buffers = {"state": state, "partials": partials, "y": y} | part.buffers
        n_out = part.n_out(gate_up=False)
        steps.append(
            emit(
                k,
                choice,
                f"{w.name}.gemv_combine[{part.row_begin}:{part.row_end}]",
                -(-n_out // choice.rows),
                buffers,
                trace,
                n_out=n_out,
                row_base=part.row_begin,
                eps=0.0,
                n_ctx=n_ctx,
                window=window,
                n_splits=n_splits,
            )
        )
    return steps


def _linear_buffers(part: WeightPart, x: Target, y: Target, norm: Target | None) -> dict[str, Target]:
    """The bindings of a gemv / gemm dispatch over one weight part."""
    return {"x": x, "y": y} | part.buffers | ({} if norm is None else {"norm_w": norm})


def _parts_for(w: Weight, gate_up: bool) -> tuple[WeightPart, ...]:
    if gate_up and len(w.parts) != 1:
        raise ValueError(f"{w.name}: a fused gate/up matrix must fit one binding ({len(w.parts)} parts)")
    if gate_up and w.n_out % 2:
        raise ValueError(f"{w.name}: a gate/up matrix has an even number of rows, not {w.n_out}")
    return w.parts
