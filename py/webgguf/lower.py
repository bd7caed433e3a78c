"""Lowering: a step's ops (after the fusion passes) to the dispatches of a plan, and a note per step
saying what runs and why.

Each op becomes the dispatches of its builder in ops/ (GEMV for a single token, GEMM for a chunk);
activation names become the model's buffers (plan.Activations; "x@1" is the second half of the residual
stream, passes.RESIDUAL_OTHER_HALF). Nothing here chooses a kernel: the builders ask selection.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import ops
from .gpu.base import BufferRange, Copy, Dispatch
from .graph import AddNorm, Attention, Embed, Linear, Op, OutputHead, RmsNorm, Sample
from .ops.attention import option_vectors
from .passes import RESIDUAL, RESIDUAL_OTHER_HALF
from .pipelines import Target
from .state import TOKEN
from .weights import StackedWeight

if TYPE_CHECKING:
    from .plan import GpuModel


@dataclass(frozen=True)
class StepNote:
    """One step of a plan, explained: what it computes, which kernel, how many workgroups, and why."""

    tensor: str  # the graph op's tensor (or its layer, for attention)
    op: str  # "gemv", "gemm", "attention", ...
    name: str  # the dispatch's own label, e.g. "blk.3.ffn_down.weight.gemv[0:576]"
    kernel: str  # the pipeline: kernel and specialization
    workgroups: tuple[int, int, int]
    reason: str


def lower(step_ops: list[Op], model: GpuModel, n_tokens: int) -> tuple[list[Dispatch | Copy], list[StepNote]]:
    """The plan steps of `step_ops` for a step of n_tokens tokens, and a note for each."""
    lowering = _Lowering(model, n_tokens)
    for op in step_ops:
        lowering.lower(op)
    return lowering.steps, lowering.notes


class _Lowering:
    def __init__(self, model: GpuModel, n_tokens: int):
        self.m = model
        self.k = model.kernels
        self.c = model.config
        self.act = model.act
        self.n_tokens = n_tokens
        self.steps: list[Dispatch | Copy] = []
        self.notes: list[StepNote] = []
        # The 8-bit blocks a linear with q8_out wrote for the next one (Linear.q8_in / OutputHead.q8_in)
        self.q8_written: ops.Q8Activations | None = None

    def buffer(self, name: str) -> Target:
        """The buffer of an activation (the second half of the residual stream as a range)."""
        if name == RESIDUAL_OTHER_HALF:
            return BufferRange(self.act.x, self.m.x_half_bytes, self.c.d_model * 4)
        return getattr(self.act, name)

    def lower(self, op: Op) -> None:
        trace: ops.Trace = []
        first = len(self.steps)
        handler = {
            Embed: self.embed,
            RmsNorm: self.rmsnorm,
            Linear: self.linear,
            Attention: self.attention,
            AddNorm: self.add_norm,
            OutputHead: self.output_head,
            Sample: self.sample,
        }[type(op)]
        handler(op, trace)
        choices = {id(dispatch): choice for dispatch, choice in trace}
        for step in self.steps[first:]:
            if isinstance(step, Copy):
                note = StepNote(
                    op.label, "copy", f"{step.src.name} -> {step.dst.name}", "copy", (0, 0, 0), ""
                )
            else:
                choice = choices[id(step)]
                grid = (step.x, step.y, step.z)
                note = StepNote(op.label, choice.op, step.bind_group.name, choice.name, grid, choice.reason)
            self.notes.append(note)

    # ---- one method per op

    def embed(self, op: Embed, trace: ops.Trace) -> None:
        ids, offset = (self.act.state, TOKEN) if op.from_state else (self.act.ids, 0)
        table = self.m.weights["token_embd.weight"]
        out = self.buffer(op.out)
        self.steps += ops.embed(
            self.k, table, ids, out, self.n_tokens, id_offset=offset, scale=op.scale, trace=trace
        )

    def rmsnorm(self, op: RmsNorm, trace: ops.Trace) -> None:
        self._rmsnorm(op.x, op.out, op.weight, trace, add=False, label=f"{op.weight}.rmsnorm")

    def add_norm(self, op: AddNorm, trace: ops.Trace) -> None:
        self._rmsnorm(op.x, op.y, op.weight, trace, add=True, label=f"{op.weight}.add")

    def _rmsnorm(self, x: str, y: str, weight: str, trace: ops.Trace, *, add: bool, label: str) -> None:
        """y = RMSNorm(x) * weight per token (add: y += that), the rmsnorm.wgsl dispatch."""
        w, c = self.m.vectors[weight], self.c
        step = ops.rmsnorm(
            self.k,
            self.buffer(x),
            self.buffer(y),
            w,
            c.d_model,
            self.n_tokens,
            c.rms_eps,
            add=add,
            label=label,
            trace=trace,
        )
        self.steps.append(step)

    def linear(self, op: Linear, trace: ops.Trace) -> None:
        w, y = self.m.weights[op.weight], self.buffer(op.y)
        if op.int8:
            self._linear_int8(op, w, y, trace)
            return
        if op.split_window is not None:  # x is attn_decode's split partials
            self.steps += ops.combine_gemv(
                self.k,
                w,
                self.act.state,
                self.act.attn_partials,
                y,
                head_dim=self.c.head_dim,
                n_ctx=self.m.shape.n_ctx,
                n_splits=self.m.shape.n_splits,
                window=op.split_window,
                residual=op.residual,
                trace=trace,
            )
            return
        segments = w.segments if isinstance(w, StackedWeight) else ((0, w),)
        if op.gate_up and len(segments) > 1:
            raise ValueError(f"{op.weight}: gate and up of different types cannot share a GEMV")
        kw = dict(
            residual=op.residual,
            gate_up=op.gate_up,
            gelu=op.gelu,
            norm=self.m.vectors[op.norm] if op.norm else None,
            eps=self.c.rms_eps,
            label=op.weight,
            trace=trace,
        )
        if op.add is not None:
            # x is both halves of the residual stream: the GEMV reads op.x's half plus the add, and its
            # first dispatch stores that to the other half (a stacked matrix: the first segment's).
            half = self.m.x_half_bytes
            both = BufferRange(self.act.x, 0, half + self.c.d_model * 4)
            add = ops.AddNormInput(
                self.buffer(op.add.proj),
                self.m.vectors[op.add.weight],
                x_in=self._half(op.x) * half,
                x_out=self._half(op.add.out) * half,
            )
            for index, (y_row, segment) in enumerate(segments):
                add_norm = add if index == 0 else dataclasses.replace(add, write=False)
                self.steps += ops.gemv(self.k, segment, both, y, y_row=y_row, add_norm=add_norm, **kw)
            return
        x = self.buffer(op.x)
        for y_row, segment in segments:
            if self.n_tokens == 1:
                self.steps += ops.gemv(self.k, segment, x, y, y_row=y_row, **kw)
            else:
                y_stride = w.n_out // 2 if op.gate_up else w.n_out
                self.steps += ops.gemm(
                    self.k, segment, x, y, self.n_tokens, y_stride=y_stride, y_row=y_row, **kw
                )

    def _linear_int8(self, op: Linear, w, y: Target, trace: ops.Trace) -> None:
        """The input as 8-bit blocks (quantized, or merged from attention splits and quantized), then the
        integer-dot GEMV / GEMM of each segment."""
        q8, c = self.act.q8, self.c
        segments = w.segments if isinstance(w, StackedWeight) else ((0, w),)
        if op.q8_in:  # the linear before wrote them
            q8 = self._q8_written(op.weight)
        elif op.split_window is not None:
            self.steps.append(
                ops.attn_merge(
                    self.k,
                    self.act.state,
                    self.act.attn_partials,
                    q8,
                    head_dim=c.head_dim,
                    n_head=c.n_head,
                    n_ctx=self.m.shape.n_ctx,
                    n_splits=self.m.shape.n_splits,
                    window=op.split_window,
                    label=f"{op.weight}.attn_merge_q8",
                    trace=trace,
                )
            )
        else:
            norm = self.m.vectors[op.norm] if op.norm else None
            self.steps.append(
                ops.quantize(
                    self.k,
                    self.buffer(op.x),
                    q8,
                    self.n_tokens,
                    w.n_in,
                    norm=norm,
                    label=f"{op.weight}.quantize_q8",
                    trace=trace,
                )  # fmt: skip
            )
        kw = dict(
            residual=op.residual,
            gate_up=op.gate_up,
            gelu=op.gelu,
            norm=op.norm is not None,
            eps=c.rms_eps,
            label=op.weight,
            trace=trace,
        )
        if op.q8_out:  # the next linear's blocks, into the set this one does not read
            out = self.act.q8_next if q8 is self.act.q8 else self.act.q8
            norm_out = self.m.vectors[op.q8_out_norm] if op.q8_out_norm else None
            self.steps += ops.gemv_q8(self.k, w, q8, y, out=out, norm_out=norm_out, **kw)
            self.q8_written = out
            return
        for y_row, segment in segments:
            if self.n_tokens == 1:
                self.steps += ops.gemv_q8(self.k, segment, q8, y, y_row=y_row, **kw)
            else:
                y_stride = w.n_out // 2 if op.gate_up else w.n_out
                self.steps += ops.gemm_q8(
                    self.k, segment, q8, y, self.n_tokens, y_stride=y_stride, y_row=y_row, **kw
                )

    def _q8_written(self, weight: str) -> ops.Q8Activations:
        """The blocks the linear before wrote for `weight`'s op (q8_in), once."""
        if self.q8_written is None:
            raise ValueError(f"{weight}: q8_in without a linear before that wrote its blocks (q8_out)")
        q8, self.q8_written = self.q8_written, None
        return q8

    def _half(self, name: str) -> int:
        if name not in (RESIDUAL, RESIDUAL_OTHER_HALF):
            raise ValueError(f"{name!r} is not a half of the residual stream")
        return int(name == RESIDUAL_OTHER_HALF)

    def attention(self, op: Attention, trace: ops.Trace) -> None:
        m, layer, spec = self.m, op.layer, op.spec
        options = {binding: m.vectors[name] for binding, name in option_vectors(spec).items()}
        common = dict(state=self.act.state, k_cache=m.k_cache[layer], v_cache=m.v_cache[layer])
        common |= dict(options=options, n_ctx=m.shape.n_ctx, trace=trace)
        if op.splits:  # left as split partials for the linear that reads op.out (COMBINE)
            self.steps.append(
                ops.attn_decode(
                    self.k,
                    self.c,
                    spec,
                    qkv=self.buffer(op.qkv),
                    partials=self.act.attn_partials,
                    n_splits=m.shape.n_splits,
                    label=f"blk.{layer}.attn_decode",
                    **common,
                )
            )
            return
        q = self.act.q  # roped queries [T, n_head head_dim]
        self.steps.append(
            ops.rope_kv(
                self.k,
                self.c,
                spec,
                qkv=self.buffer(op.qkv),
                q=q,
                n_tokens=self.n_tokens,
                label=f"blk.{layer}.rope_kv",
                **common,
            )
        )
        del common["options"]
        self.steps.append(
            ops.attn_prefill(
                self.k,
                self.c,
                spec,
                q=q,
                out=self.buffer(op.out),
                n_tokens=self.n_tokens,
                label=f"blk.{layer}.attn_prefill",
                **common,
            )
        )

    def output_head(self, op: OutputHead, trace: ops.Trace) -> None:
        w, c = self.m.weights[op.weight], self.c
        kw = dict(
            norm=self.m.vectors[op.norm] if op.norm else None, eps=c.rms_eps, label="output", trace=trace
        )
        x = self.buffer(op.x)
        if op.all_positions:
            self.steps += ops.gemm(self.k, w, x, self.act.all_logits, self.n_tokens, **kw)
            return
        if self.n_tokens > 1:  # the last token's row, copied out (a storage binding offset must be aligned)
            row = (self.n_tokens - 1) * c.d_model * 4
            self.steps.append(Copy(x, self.act.last, c.d_model * 4, src_offset=row))
            x = self.act.last
        if op.int8:
            norm = kw["norm"]
            if op.q8_in:  # the last layer's linear wrote them
                q8 = self._q8_written(op.weight)
            else:
                q8 = self.act.q8
                self.steps.append(
                    ops.quantize(self.k, x, q8, 1, w.n_in, norm=norm, label="output.quantize_q8", trace=trace)
                )
            self.steps += ops.gemv_q8(
                self.k, w, q8, self.act.logits, norm=norm is not None, eps=c.rms_eps, label="output",
                trace=trace,
            )  # fmt: skip
            return
        self.steps += ops.gemv(self.k, w, x, self.act.logits, **kw)

    def sample(self, op: Sample, trace: ops.Trace) -> None:
        act = self.act
        common = dict(
            state=act.state,
            logits=act.logits,
            out_ids=act.out_ids,
            n_vocab=self.c.n_vocab,
            ring=self.m.shape.ring,
            trace=trace,
        )
        if op.greedy:
            self.steps += ops.sample_greedy(self.k, partials=act.argmax_partials, **common)
        else:
            self.steps += ops.sample_filtered(self.k, candidates=act.top_k_candidates, **common)
