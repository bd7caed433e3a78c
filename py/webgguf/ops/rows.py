"""Ops on rows of activations: the standalone RMSNorm and the embedding lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import selection
from ..gpu.base import Dispatch
from ..pipelines import Target
from ..weights import Weight
from .emit import Trace, emit

if TYPE_CHECKING:
    from ..kernels import Kernels


def rmsnorm(
    k: Kernels,
    x: Target | None,
    y: Target,
    weight: Target,
    n: int,
    n_rows: int,
    eps: float,
    *,
    add: bool = False,
    label: str = "rmsnorm",
    trace: Trace | None = None,
) -> Dispatch:
    """y[r] = x[r] / rms(x[r]) * weight for n_rows rows of n (x None: normalize y in place);
    add: y[r] += that instead (a post-norm added to the residual stream)."""
    if n % 4:
        raise ValueError(f"{label}: rmsnorm needs n % 4 == 0, got {n}")
    choice = selection.rmsnorm(k.caps, add=add, in_place=x is None)
    buffers = {"y": y, "w": weight} | ({} if x is None else {"x": x})
    return emit(k, choice, label, n_rows, buffers, trace, n=n, n_rows=n_rows, eps=eps)


def embed(
    k: Kernels,
    table: Weight,
    ids: Target,
    out: Target,
    n_tokens: int,
    *,
    id_offset: int = 0,
    scale: float = 1.0,
    label: str = "embed",
    trace: Trace | None = None,
) -> list[Dispatch]:
    """out[t] = table[ids[id_offset + t]] * scale for n_tokens tokens (out: [n_tokens, n_in] f32).

    The ids are read on the GPU, so the next token needs no CPU round trip. One dispatch per part
    of the table; an id past the table writes nothing."""
    choice = selection.embed(table.type_name, k.caps)
    steps = []
    for part in table.parts:
        buffers = {"ids": ids, "out": out} | part.buffers
        step = emit(
            k,
            choice,
            f"{label}[{part.row_begin}:{part.row_end}]",
            n_tokens,
            buffers,
            trace,
            n_embd=table.n_in,
            row_begin=part.row_begin,
            row_end=part.row_end,
            id_offset=id_offset,
            n_tokens=n_tokens,
            scale=scale,
        )
        steps.append(step)
    return steps
