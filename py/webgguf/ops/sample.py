"""The samplers: the step's token from the logits, committed on the GPU (docs/GPU.md "Samplers").

Both read their settings and the history from the state, so one plan serves every setting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import selection
from ..gpu.base import Buffer, Dispatch
from .emit import Trace, emit

if TYPE_CHECKING:
    from ..kernels import Kernels


def sample_greedy(
    k: Kernels,
    *,
    state: Buffer,
    logits: Buffer,
    partials: Buffer,
    out_ids: Buffer,
    n_vocab: int,
    ring: int,
    trace: Trace | None = None,
) -> list[Dispatch]:
    """Argmax of the penalized logits [n_vocab]: the best of each chunk into `partials`, then the best
    of those, written to the state and the output ring `out_ids` [ring]."""
    partial = selection.argmax_partial(k.caps)
    groups = -(-n_vocab // partial.rows)
    buffers = {"state": state, "logits": logits, "partials": partials}
    first = emit(
        k, partial, "sample_argmax_partial", groups, buffers, trace, n_vocab=n_vocab, chunk=partial.rows
    )
    buffers = {"state": state, "partials": partials, "out_ids": out_ids}
    final = emit(
        k, selection.argmax_final(), "sample_argmax_final", 1, buffers, trace, n_parts=groups, ring=ring
    )
    return [first, final]


def sample_filtered(
    k: Kernels,
    *,
    state: Buffer,
    logits: Buffer,
    candidates: Buffer,
    out_ids: Buffer,
    n_vocab: int,
    ring: int,
    trace: Trace | None = None,
) -> list[Dispatch]:
    """Two steps: the best top_k of each chunk into `candidates` (when 1 <= top_k <= TOP_K_MAX; the
    kernels read top_k from the state), then the filter chain and the draw over those candidates, or
    over all the logits when the first step wrote none (shaders/sample_topk_partial.wgsl)."""
    partial = selection.topk_partial()
    buffers = {"state": state, "logits": logits, "candidates": candidates}
    first = emit(
        k, partial, "sample_topk_partial", -(-n_vocab // partial.rows), buffers, trace, n_vocab=n_vocab
    )
    buffers = {"state": state, "logits": logits, "out_ids": out_ids, "candidates": candidates}
    draw = emit(
        k,
        selection.sample_filtered(),
        "sample_filtered",
        1,
        buffers,
        trace,
        n_vocab=n_vocab,
        ring=ring,
        chunk=partial.rows,
    )
    return [first, draw]
