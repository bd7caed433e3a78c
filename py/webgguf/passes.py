"""Fusion passes: rewrites of a step's graph (graph.py) that let one kernel do the work of two ops.

Each pass is a small function named for what it folds, from a list of ops to a list of ops. Which passes
run is decided from the adapter caps (`default_fusions`); each pass itself applies only where its pattern
holds in the step at hand (most need a single-token step). The lowering (lower.py) runs any graph
correctly without them: tests/models/test_passes.py checks that every fusion leaves the logits as they
are without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from . import selection
from .caps import AdapterCaps
from .graph import AddNorm, Attention, FoldedAdd, Linear, Op, OutputHead, RmsNorm
from .weights import StackedWeight, Weight

# The residual stream of a single-token step has two halves (plan.Activations.x): the linear that takes
# in a post-norm add reads x from one half and stores x + the add to the other.
RESIDUAL = "x"
RESIDUAL_OTHER_HALF = "x@1"


@dataclass(frozen=True)
class Step:
    """What the passes may look at besides the ops: the step's token count, the model's weights and the
    adapter caps."""

    n_tokens: int
    weights: Mapping[str, object]  # name -> Weight or StackedWeight
    caps: AdapterCaps | None = None


def fold_norms(ops: Sequence[Op], step: Step) -> list[Op]:
    """RMSNorm folded into the GEMV / GEMM that reads it (gemv.wgsl / gemm.wgsl NORM): the kernel
    normalizes its input rows itself, so the normalized activation is never written. Applies where the
    next op is a plain linear or the output head reading the norm's output, and nothing after reads it."""
    out: list[Op] = []
    for index, op in enumerate(ops):
        previous = out[-1] if out else None
        reads_norm = (
            isinstance(previous, RmsNorm)
            and isinstance(op, Linear | OutputHead)
            and op.x == previous.out
            and op.norm is None
            and not (isinstance(op, Linear) and (op.add or op.split_window is not None))
            and previous.out != previous.x
            and not _read_later(ops, index + 1, previous.out)
        )
        if reads_norm:
            out[-1] = dataclasses.replace(op, x=previous.x, norm=previous.weight)
        else:
            out.append(op)
    return out


def fold_post_norm_adds(ops: Sequence[Op], step: Step) -> list[Op]:
    """A post-norm add into the residual stream (x += RMSNorm(proj) * w) folded into the next NORM GEMV
    of x (gemv.wgsl ADD_NORM), one dispatch fewer each: that GEMV reads x + the add on the fly and stores
    it to the other half of x, where the rest of the step then finds the residual stream.

    Single-token steps only (the halves); not into the output head, whose narrow rows make the fold cost
    more than the dispatch it saves (docs/PERF.md); needs `fold_norms` first (it folds into NORM GEMVs)."""
    if step.n_tokens != 1:
        return list(ops)
    out: list[Op] = []
    renames: dict[str, str] = {}  # the residual stream's current half, once a fold has moved it
    for op in ops:
        for old, new in renames.items():
            op = op.renamed(old, new)
        previous = out[-1] if out else None
        foldable = (
            isinstance(previous, AddNorm)
            and isinstance(op, Linear)
            and previous.y in (RESIDUAL, RESIDUAL_OTHER_HALF)
            and previous.x != previous.y
            and op.x == previous.y
            and op.norm is not None
            and op.add is None
            and op.y not in (previous.x, previous.y)
        )
        if foldable:
            other = RESIDUAL_OTHER_HALF if previous.y == RESIDUAL else RESIDUAL
            out[-1] = dataclasses.replace(op, add=FoldedAdd(previous.x, previous.weight, other))
            renames = {RESIDUAL: other} if other == RESIDUAL_OTHER_HALF else {}
        else:
            out.append(op)
    return out


def fold_attention_splits(ops: Sequence[Op], step: Step) -> list[Op]:
    """A single token's attention left as flash-decoding split partials (attn_decode.wgsl: RoPE, the
    cache write and attention in one kernel), merged by the linear that reads its output in that
    linear's prologue (gemv.wgsl COMBINE): two dispatches (attn_decode + GEMV) instead of three (rope_kv,
    attn_prefill, GEMV). Applies where the next op is a plain linear of one matrix reading the output and
    nothing after reads it."""
    if step.n_tokens != 1:
        return list(ops)
    out: list[Op] = []
    for index, op in enumerate(ops):
        previous = out[-1] if out else None
        merges = (
            isinstance(previous, Attention)
            and isinstance(op, Linear)
            and op.x == previous.out
            and not (op.gate_up or op.norm or op.add)
            and isinstance(step.weights.get(op.weight), Weight)
            and not _read_later(ops, index + 1, previous.out)
        )
        if merges:
            out[-1] = dataclasses.replace(previous, splits=True)
            out.append(dataclasses.replace(op, split_window=previous.spec.window))
        else:
            out.append(op)
    return out


def int8_activations(ops: Sequence[Op], step: Step) -> list[Op]:
    """Linears (and the output head) whose weights are worth it read their input as 8-bit blocks with
    integer dot products (gemv_q8 / gemm_q8; selection.int8_linear says which and why): the lowering
    quantizes the input in a dispatch of its own first, with the norm weight of a folded RMSNorm (the
    GEMV / GEMM applies the 1 / rms), or merges a decode attention's splits and quantizes them (a linear
    of attention splits then no longer merges them itself). Not a linear that takes in a post-norm add:
    runs before fold_post_norm_adds, which then folds only into the f32 GEMVs.

    In a chunk's step (prefill, scoring), a model whose large linears take the path runs all its linears
    on it (selection.int8_linear: the size line is a decode trade-off); the small models whose every
    linear is under the line stay f32 in every step.

    This changes the arithmetic: the activations are rounded to 8 bits per block of 32, as llama.cpp's GPU
    backends and its CPU backend do (docs/ENGINE.md "Precision")."""
    if step.caps is None:
        raise ValueError("int8_activations needs the adapter caps (Step.caps)")
    facts = {
        op.weight: _weight_facts(step.weights[op.weight])
        for op in ops
        if isinstance(op, Linear) and op.add is None
    }
    large = any(selection.int8_linear(*f, step.n_tokens, step.caps)[0] for f in facts.values())
    out: list[Op] = []
    for op in ops:
        if isinstance(op, Linear) and op.add is None:
            if selection.int8_linear(*facts[op.weight], step.n_tokens, step.caps, large_linears_int8=large)[
                0
            ]:
                op = dataclasses.replace(op, int8=True)
        elif isinstance(op, OutputHead) and not op.all_positions:
            if selection.int8_linear(*_weight_facts(step.weights[op.weight]), 1, step.caps)[0]:
                op = dataclasses.replace(op, int8=True)
        out.append(op)
    return out


def quantize_outputs(ops: Sequence[Op], step: Step) -> list[Op]:
    """A linear on the integer path whose output is the whole input of the next one (also on it) writes
    that input's 8-bit blocks itself, with the next linear's RMSNorm weight applied (gemv_q8.wgsl
    QUANT_OUT, NORM_OUT): the next linear's quantize dispatch is saved. In a 1-8B decode step that is
    the input of the gate/up GEMV (from the attention output projection), of the down projection (from
    gate/up), of the next layer's q/k/v (from the down projection) and of the output head (from the last
    one): ~3 of the ~10 dispatches per layer.

    Single-token steps only; a producer of one matrix in one binding whose rows are whole blocks of 32,
    on adapters with workgroups of 32 rows (selection.gemv_q8_quant_out_fits); needs "int8" first."""
    if step.n_tokens != 1 or step.caps is None:
        return list(ops)
    out = list(ops)
    for index in range(len(out) - 1):
        producer, consumer = out[index], out[index + 1]
        if not (isinstance(producer, Linear) and producer.int8 and producer.add is None):
            continue
        if isinstance(consumer, Linear):
            reads_all = consumer.split_window is None and consumer.add is None
        else:
            reads_all = isinstance(consumer, OutputHead) and not consumer.all_positions
        if not (reads_all and consumer.int8 and consumer.x == producer.y and not consumer.q8_in):
            continue
        weight = step.weights[producer.weight]
        if not isinstance(weight, Weight) or len(weight.parts) != 1:
            continue
        n_out = weight.n_out // 2 if producer.gate_up else weight.n_out
        if n_out != step.weights[consumer.weight].n_in:
            continue
        if selection.gemv_q8_quant_out_fits(n_out, step.caps)[0]:
            out[index] = dataclasses.replace(producer, q8_out=True, q8_out_norm=consumer.norm)
            out[index + 1] = dataclasses.replace(consumer, q8_in=True)
    return out


def _weight_facts(w) -> tuple[tuple[str, ...], int]:
    """(types of its segments, bytes of its GPU arrays) of a Weight or StackedWeight."""
    segments = [segment for _, segment in w.segments] if isinstance(w, StackedWeight) else [w]
    types = tuple(segment.type_name for segment in segments)
    size = sum(array.size for segment in segments for part in segment.parts for array in part.arrays.values())
    return types, size


# Every fusion by name, in the order they run.
FUSIONS: dict[str, Callable[[Sequence[Op], Step], list[Op]]] = {
    "norms": fold_norms,
    "attention_splits": fold_attention_splits,
    "int8": int8_activations,
    "quantize_outputs": quantize_outputs,
    "post_norm_adds": fold_post_norm_adds,
}


def default_fusions(caps: AdapterCaps) -> frozenset[str]:
    """The fusions worth their kernels' prologues on this adapter: all of them on a GPU (a dispatch costs
    ~3-5 us there); on CPU adapters not the post-norm adds (gemv_rows.wgsl has no ADD_NORM: the prologue
    repeated in every invocation would cost more than the ~0.1 ms rmsnorm dispatch it saves). "int8" where
    the caps allow integer dot products (caps.int8), and with it "quantize_outputs"."""
    chosen = {"norms", "attention_splits"} if caps.cpu_shapes else set(FUSIONS) - {"int8"}
    if caps.int8:
        chosen |= {"int8", "quantize_outputs"}
    return frozenset(chosen)


def run(ops: Sequence[Op], fusions: frozenset[str], step: Step) -> list[Op]:
    """The ops after the named fusions, in FUSIONS order."""
    unknown = set(fusions) - set(FUSIONS)
    if unknown:
        raise ValueError(f"unknown fusions {sorted(unknown)} (have {list(FUSIONS)})")
    out = list(ops)
    for name, fold in FUSIONS.items():
        if name in fusions:
            out = fold(out, step)
    return out


def _read_later(ops: Sequence[Op], start: int, name: str) -> bool:
    """Whether an op from `start` on reads activation `name` before one overwrites it."""
    for op in ops[start:]:
        if name in op.inputs:
            return True
        if name in op.outputs:
            return False
    return False
