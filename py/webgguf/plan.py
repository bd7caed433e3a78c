"""A model on the GPU: all its memory (weights, KV cache, activations, the state) and its static plans.

A plan is a flat list of dispatches built once; everything that changes from token to token (the
position, the chunk length, the last token, the sampling parameters, the RNG) lives in the GPU state
buffer (state.py, docs/ENGINE_STATE.md), so the same plan is replayed for every decode step.

How a plan is built: the architecture module (arch/*.py) records the step's forward pass as plain ops
(graph.py), the fusion passes chosen for the adapter fold neighbouring ops into one kernel (passes.py),
and the lowering turns the ops into dispatches (lower.py), whose kernels selection.py picks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from . import passes, selection
from .caps import AdapterCaps
from .gpu.base import STORAGE, Backend, Buffer, Plan
from .graph import Graph
from .kernels import Kernels
from .lower import StepNote, lower
from .ops import Q8Activations
from .selection import ARGMAX_CHUNK, TOP_K_CHUNK, TOP_K_MAX
from .state import STATE_WORDS
from .weights import StackedWeight, Weight

# ---------------------------------------------------------------- sizes fixed at load time


@dataclass(frozen=True)
class PlanShape:
    n_ctx: int  # positions the KV cache holds
    max_chunk: int  # most tokens of one prefill step
    score_chunk: int  # most tokens of one scoring step (all positions' logits kept)
    ring: int  # slots of the output id ring
    # Flash-decoding splits of the KV cache: the most asked for; GpuModel's shape holds what the adapter
    # uses (selection.decode_splits: 1 on CPU adapters).
    n_splits: int = selection.DECODE_SPLITS


@dataclass
class Activations:
    """Per-step working buffers, sized for the largest step (max_chunk tokens)."""

    state: Buffer  # u32 [STATE_WORDS]  docs/ENGINE_STATE.md
    ids: Buffer  # u32 [max_chunk]  prompt token ids of a prefill step
    out_ids: Buffer  # u32 [ring]  sampled ids, slot step % ring
    x: Buffer  # f32 [max_chunk, d_model]  the residual stream (decode: two halves, GpuModel.x_half_bytes)
    qkv: Buffer  # f32 [max_chunk, (n_head + 2 n_head_kv) * head_dim]
    q: Buffer  # f32 [max_chunk, n_head * head_dim]  roped queries
    attn: Buffer  # f32 [max_chunk, n_head * head_dim]  attention output
    proj: Buffer  # f32 [max_chunk, d_model]  a block's output before its post-norm (gemma3)
    ffn: Buffer  # f32 [max_chunk, d_ff]  SiLU(gate) * up
    last: Buffer  # f32 [d_model]  the last token's residual (input of the output head)
    logits: Buffer  # f32 [n_vocab]  the last token's logits
    all_logits: Buffer | None  # f32 [score_chunk, n_vocab]  every position's logits: made for scoring only
    attn_partials: Buffer  # f32 [n_head, n_splits, head_dim + 4]  flash-decoding partials
    argmax_partials: Buffer  # u32 [2 * argmax groups]  greedy sampling partials
    top_k_candidates: Buffer  # u32 [2 * TOP_K_MAX * top-k groups]  filtered sampling's candidates
    # f32 [max_chunk, d_model]  RMSNorm(x) * w: only without the "norms" fusion (which keeps it in the
    # GEMV / GEMM that reads it)
    normed: Buffer | None = None
    # The input of a linear that reads 8-bit blocks (ops.Q8Activations, sized for max_chunk rows of the
    # widest input: d_model, n_head head_dim or d_ff): only with the "int8" fusion
    q8: Q8Activations | None = None
    # A second set for one token: a linear that writes the next one's blocks (the "quantize_outputs"
    # fusion) reads its own input from the other set
    q8_next: Q8Activations | None = None


class GpuModel:
    """All GPU memory of one model (weights, KV cache, activations) and its plans, built once."""

    def __init__(
        self,
        config,
        arch_module,
        backend: Backend,
        shape: PlanShape,
        caps: AdapterCaps | None = None,
        fusions: frozenset[str] | None = None,
        source_of: Callable[[str], str] | None = None,
    ):
        """caps: what the kernels are chosen for (default: the backend's adapter, f32); fusions: the
        passes.FUSIONS to run (default: those chosen for the caps, passes.default_fusions); source_of:
        WGSL by path relative to shaders/ (default: the source tree's)."""
        self.config = config
        self.arch = arch_module  # provides gpu_matrices, gpu_vectors, forward
        self.backend = backend
        self.caps = caps or AdapterCaps.of(backend)
        self.kernels = Kernels(backend, self.caps, source_of=source_of)
        self.fusions = passes.default_fusions(self.caps) if fusions is None else frozenset(fusions)
        self.shape = dataclasses.replace(shape, n_splits=selection.decode_splits(self.caps, shape.n_splits))
        # The second half of x in a decode step starts here: an aligned storage binding offset.
        align = max(16, backend.limits.min_storage_buffer_offset_alignment)  # and whole vec4s
        self.x_half_bytes = -(-config.d_model * 4 // align) * align
        self.weights: dict[str, Weight | StackedWeight] = {}
        self.vectors: dict[str, Buffer] = {}
        self._plans: dict[tuple, tuple[Plan, list[StepNote]]] = {}
        # What release() frees besides the kernels' own buffers: every Weight and buffer made here.
        self._weights_made: list[Weight] = []
        self._buffers_made: list[Buffer] = []
        self.released = False
        try:
            self.k_cache, self.v_cache = self._caches()
            self.act = self._activations()
        except BaseException:  # out of memory halfway: nothing stays allocated
            self.release()
            raise

    # ---- memory

    def release(self) -> None:
        """Free every GPU buffer of the model: weights, vectors, KV cache, activations, and the kernels'
        Params of its plans, scratch and upload buffers. The model cannot run afterwards; a second call
        does nothing. (On a lost device the buffers are gone already: drop the model instead.)"""
        parts = [part for weight in self._weights_made for part in weight.parts]
        for buffer in [*self._buffers_made, *(a for part in parts for a in part.arrays.values())]:
            self.backend.destroy_buffer(buffer)
        self.kernels.release()
        self._weights_made, self._buffers_made = [], []
        self.weights, self.vectors, self._plans = {}, {}, {}
        self.released = True

    def require_alive(self) -> None:
        """Raise a clear error for a use of the model after release()."""
        if self.released:
            raise RuntimeError("this model's GPU memory was released: load it again")

    def _make(self, name: str, size: int) -> Buffer:
        """A storage buffer that release() frees."""
        buffer = self.backend.create_buffer(name, size, STORAGE)
        self._buffers_made.append(buffer)
        return buffer

    def _caches(self) -> tuple[list[Buffer], list[Buffer]]:
        c, n_ctx = self.config, self.shape.n_ctx
        size = c.n_head_kv * n_ctx * c.head_dim * (2 if self.caps.f16 else 4)
        if size > self.backend.limits.max_storage_buffer_binding_size:
            raise ValueError(
                f"a context of {n_ctx} needs {size} bytes per layer cache: more than one binding"
            )
        k = [self._make(f"blk.{i}.k_cache", size) for i in range(c.n_layer)]
        v = [self._make(f"blk.{i}.v_cache", size) for i in range(c.n_layer)]
        return k, v

    def _activations(self) -> Activations:
        c, s, make = self.config, self.shape, self._make
        width = (c.n_head + 2 * c.n_head_kv) * c.head_dim
        f32 = 4
        return Activations(
            state=make("state", STATE_WORDS * 4),
            ids=make("ids", s.max_chunk * 4),
            out_ids=make("out_ids", s.ring * 4),
            x=make("x", max(s.max_chunk * c.d_model * f32, self.x_half_bytes + c.d_model * f32)),
            qkv=make("qkv", s.max_chunk * width * f32),
            q=make("q", s.max_chunk * c.n_head * c.head_dim * f32),
            attn=make("attn", s.max_chunk * c.n_head * c.head_dim * f32),
            proj=make("proj", s.max_chunk * c.d_model * f32),
            ffn=make("ffn", s.max_chunk * c.d_ff * f32),
            last=make("last", c.d_model * f32),
            logits=make("logits", -(-c.n_vocab // 4) * 4 * f32),  # the sampler reads vec4s
            all_logits=None,  # [score_chunk x n_vocab]: 262 MB for an 8B model; score_plan makes it
            attn_partials=make("attn_partials", c.n_head * s.n_splits * (c.head_dim + 4) * f32),
            argmax_partials=make("argmax_partials", 8 * -(-c.n_vocab // ARGMAX_CHUNK)),
            top_k_candidates=make("top_k_candidates", 8 * TOP_K_MAX * -(-c.n_vocab // TOP_K_CHUNK)),
            normed=None if "norms" in self.fusions else make("normed", s.max_chunk * c.d_model * f32),
            q8=self._q8_activations("q8", s.max_chunk) if "int8" in self.fusions else None,
            q8_next=self._q8_activations("q8_next", 1)
            if {"int8", "quantize_outputs"} <= self.fusions
            else None,
        )

    def _q8_activations(self, name: str, n_tokens: int) -> Q8Activations:
        c = self.config
        widest = max(c.d_model, c.n_head * c.head_dim, c.d_ff)
        sizes = Q8Activations.sizes(n_tokens, widest)
        names = (f"{name}.quants", f"{name}.k_order", f"{name}.scales")
        return Q8Activations(*(self._make(n, b) for n, b in zip(names, sizes, strict=True)))

    def upload(self, tensors, tensor_bytes) -> None:
        """Weights from the file: `tensors` name -> TensorInfo, `tensor_bytes(name)` -> its raw bytes."""
        for info, target, row in self.weight_targets(tensors):
            if isinstance(target, Weight):
                self.kernels.uploads.write_rows(target, row, tensor_bytes(info.name), _rows(info))
            else:  # a vector; `row` is its byte offset in the (stacked) buffer
                self.backend.write_buffer(target, tensor_bytes(info.name), offset=row)
        self.kernels.uploads.release_upload_buffers()

    async def upload_from(self, tensors, source) -> None:
        """`upload` with bytes that never pass through Python (the browser): `await source.write_to(
        buffer, buffer_offset, file_offset, size)` copies bytes of the file into a GPU buffer. Tensors
        go in file order, so a stream read front to back serves them."""
        for info, target, row in sorted(self.weight_targets(tensors), key=lambda t: t[0].offset):
            if isinstance(target, Weight):
                await self.kernels.uploads.write_rows_from(target, row, _rows(info), source, info.offset)
            else:
                await source.write_to(target, row, info.offset, info.nbytes)
        self.kernels.uploads.release_upload_buffers()

    def weight_targets(self, tensors) -> list[tuple]:
        """Creates the (empty) GPU weights; returns (TensorInfo, Weight or vector Buffer, first row or byte
        offset) for every tensor to upload: a matrix or vector made of several tensors takes each at its
        offset."""
        self.require_alive()
        targets = []
        for name, parts in self.arch.gpu_matrices(self.config).items():
            infos = [tensors[p] for p in parts]
            if len({t.shape[0] for t in infos}) != 1:
                raise ValueError(f"{name}: tensors {parts} have different row lengths")
            # Runs of tensors of one type share a Weight; a matrix of several runs is a StackedWeight.
            runs: list[list] = []
            for info in infos:
                if runs and runs[-1][0].type.name == info.type.name:
                    runs[-1].append(info)
                else:
                    runs.append([info])
            segments, first_row = [], 0
            for run in runs:
                label = name if len(runs) == 1 else f"{name}[{first_row}:]"
                n_in, n_out = run[0].shape[0], sum(map(_rows, run))
                weight = self.kernels.uploads.create_weight(label, run[0].type.name, n_in, n_out)
                self._weights_made.append(weight)
                row = 0
                for info in run:
                    targets.append((info, weight, row))
                    row += _rows(info)
                segments.append((first_row, weight))
                first_row += row
            if len(segments) == 1:
                self.weights[name] = segments[0][1]
            else:
                self.weights[name] = StackedWeight(name, tuple(segments))
        for name, parts in self.arch.gpu_vectors(self.config).items():
            infos = [tensors[p] for p in parts]
            for info in infos:
                if info.type.name != "F32":
                    raise ValueError(f"{info.name}: expected an F32 vector, got {info.type.name}")
            self.vectors[name] = self._make(name, sum(i.nbytes for i in infos))
            offset = 0
            for info in infos:
                targets.append((info, self.vectors[name], offset))
                offset += info.nbytes
        return targets

    # ---- plans

    def decode_plan(self, greedy: bool) -> Plan:
        """One decode step: embed the state's token, the layers, the output head, sample."""
        return self._plan(("decode", greedy), 1, decode=True, head="last", sample=greedy)

    def prefill_plan(self, n_tokens: int, last: bool, greedy: bool) -> Plan:
        """A prefill chunk of `n_tokens` prompt ids; the last chunk also samples the first new token."""
        key = ("prefill", n_tokens, last, greedy if last else None)
        return self._plan(
            key, n_tokens, decode=False, head="last" if last else "none", sample=greedy if last else None
        )

    def score_plan(self, n_tokens: int) -> Plan:
        """A chunk of ids whose every position's logits go to `all_logits` (teacher forcing), which the
        first scoring plan makes: generating never needs it."""
        if self.act.all_logits is None:
            self.require_alive()
            self.act.all_logits = self._make("all_logits", self.shape.score_chunk * self.config.n_vocab * 4)
        return self._plan(("score", n_tokens), n_tokens, decode=False, head="all", sample=None)

    def explain(self, plan: Plan) -> list[StepNote]:
        """A note for every step of one of this model's plans: what runs, and why."""
        for built, notes in self._plans.values():
            if built is plan:
                return notes
        raise ValueError(f"plan {plan.name!r} was not built by this model")

    def _plan(self, key: tuple, n_tokens: int, decode: bool, head: str, sample: bool | None) -> Plan:
        self.require_alive()
        if key not in self._plans:
            g = Graph()
            self.arch.forward(g, self.config, decode=decode, head=head)
            if sample is not None:
                g.sample(greedy=sample)
            step_ops = passes.run(g.ops, self.fusions, passes.Step(n_tokens, self.weights, self.caps))
            steps, notes = lower(step_ops, self, n_tokens)
            self._plans[key] = (Plan("-".join(map(str, key)), tuple(steps)), notes)
        return self._plans[key][0]


def _rows(info) -> int:
    """Rows of a weight tensor in GGUF order (shape[0] is the row length; a vector is one row)."""
    return info.shape[1] if len(info.shape) > 1 else 1
