"""Static dispatch plans: a model's GPU buffers, and the plans for a decode step and prefill chunks.

A plan is a flat list of dispatches built once; everything that changes from token to token (the
position, the chunk length, the last token, the sampling parameters, the RNG) lives in the GPU state
buffer (docs/ENGINE_STATE.md), so the same plan is replayed for every decode step.

The architecture modules (arch/*.py) describe their forward pass against `Graph`, which turns each
operation into kernels (kernels.py): GEMV for a single token, GEMM for a prefill chunk.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

from .gpu.base import STORAGE, Backend, Buffer, BufferRange, Copy, Dispatch, Plan
from .kernels import AddNorm, Kernels, Weight

# ---------------------------------------------------------------- the state buffer (docs/ENGINE_STATE.md)

POS, N_TOKENS, TOKEN, STEP, RNG = 0, 1, 2, 3, 4
TEMPERATURE, TOP_K, TOP_P, MIN_P, REPEAT_PENALTY, REPEAT_LAST_N = 5, 6, 7, 8, 9, 10
HISTORY_LEN, HISTORY_HEAD, HISTORY = 11, 12, 16
HISTORY_CAP = 256
STATE_WORDS = HISTORY + HISTORY_CAP


def pack_state(pos: int, n_tokens: int, token: int, params, history: list[int], step: int = 0) -> bytes:
    """The state words for the start of a generation (history: the prompt's last tokens)."""
    history = history[-HISTORY_CAP:]
    words = [0] * STATE_WORDS
    words[POS], words[N_TOKENS], words[TOKEN], words[STEP] = pos, n_tokens, token, step
    words[RNG] = _seed_state(params.seed)
    words[TOP_K], words[REPEAT_LAST_N] = params.top_k, min(params.repeat_last_n, HISTORY_CAP)
    words[HISTORY_LEN], words[HISTORY_HEAD] = len(history), len(history) % HISTORY_CAP
    words[HISTORY : HISTORY + len(history)] = history
    data = bytearray(struct.pack(f"<{STATE_WORDS}I", *words))
    for index, value in (
        (TEMPERATURE, params.temperature),
        (TOP_P, params.top_p),
        (MIN_P, params.min_p),
        (REPEAT_PENALTY, params.repeat_penalty),
    ):
        struct.pack_into("<f", data, 4 * index, value)
    return bytes(data)


def _seed_state(seed: int) -> int:
    """A nonzero 32-bit RNG state from the user's seed (splitmix-style scramble)."""
    z = (seed + 0x9E3779B9) & 0xFFFFFFFF
    z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return (z ^ (z >> 16)) or 1


# ---------------------------------------------------------------- sizes fixed at load time


@dataclass(frozen=True)
class PlanShape:
    n_ctx: int  # positions the KV cache holds
    max_chunk: int  # most tokens of one prefill step
    score_chunk: int  # most tokens of one scoring step (all positions' logits kept)
    ring: int  # slots of the output id ring
    n_splits: int  # flash-decoding splits of the KV cache


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
    all_logits: Buffer  # f32 [score_chunk, n_vocab]  every position's logits (scoring)
    attn_partials: Buffer  # f32 [n_head, n_splits, head_dim + 4]  flash-decoding partials
    argmax_partials: Buffer  # u32 [2 * argmax groups]  greedy sampling partials
    top_k_candidates: Buffer  # u32 [2 * TOP_K_MAX * top-k groups]  filtered sampling's candidates


ARGMAX_CHUNK = 1024  # vocabulary ids per workgroup of the greedy sampler's first pass
TOP_K_CHUNK = 1024  # vocabulary ids per workgroup of sample_topk_partial (its CHUNK)
TOP_K_MAX = 128  # the largest top_k served by the candidate path (larger, or 0: the full scan)


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention, as its architecture defines it (Graph.attention). Names are GPU vectors."""

    scale: float  # multiplies q . k (1 / sqrt(head_dim), or the model's query scale)
    rope_base: float  # theta of this layer's RoPE
    rope_scale: float = 1.0  # positions are multiplied by this (linear rope scaling)
    neox: bool = False  # RoPE rotates pairs (i, i + rope_dims / 2), else (2i, 2i + 1)
    window: int = 0  # sliding window in positions (0: attend to everything before)
    q_norm: str | None = None  # per-head RMSNorm weights of q and k (qwen3, gemma3)
    k_norm: str | None = None
    bias: str | None = None  # the q|k|v projection bias (qwen2)
    freq_factors: str | None = None  # rope_freqs.weight (Llama 3.1)


@dataclass(frozen=True)
class StackedWeight:
    """A matrix stacked from tensors of different types (gemma3's q, k and v): one Weight per run of
    tensors of one type, each with the output row where its rows go. `Graph.linear` runs one GEMV / GEMM
    per segment; a single-type stack is a plain Weight."""

    name: str
    segments: tuple[tuple[int, Weight], ...]  # (first output row, weight)

    @property
    def n_out(self) -> int:
        first_row, last = self.segments[-1]
        return first_row + last.n_out


class Graph:
    """Records one step's dispatches; the architecture modules call these in forward order.

    Activations are named buffers (see `Activations`); a step has `n_tokens` tokens (1: decode with
    GEMV kernels; more: a prefill chunk with GEMM kernels)."""

    def __init__(self, model: GpuModel, n_tokens: int):
        self.model = model
        self.k: Kernels = model.kernels
        self.act = model.act
        self.n_tokens = n_tokens
        self.steps: list[Dispatch | Copy] = []
        # Decode attention outputs still held as split partials (name -> the attention's window); the
        # linear that reads one merges the splits in its prologue (gemv.wgsl COMBINE).
        self.split_outputs: dict[str, int] = {}
        # Decode on a GPU: a post-norm add into x (add_norm) waits as (its input, its norm) for the next
        # NORM linear of x, which takes it in its prologue (gemv.wgsl ADD_NORM) and stores x + the add to
        # the other half of x; x_half says which half holds the residual stream now. Any other use of x
        # or of the add's input dispatches the add first (flush_add_norm).
        self.fold_post_norms = model.fold_post_norms and n_tokens == 1
        self.pending_add: tuple[str, str] | None = None
        self.x_half = 0

    def buffer(self, name: str) -> Buffer | BufferRange:
        if name in self.split_outputs:
            raise ValueError(
                f"{name!r} is a decode attention output kept as split partials: only linear reads it"
            )
        if self.pending_add is not None and name in ("x", self.pending_add[0]):
            self.flush_add_norm()
        if name == "x" and self.x_half:
            return BufferRange(self.act.x, self.model.x_half_bytes, self.model.config.d_model * 4)
        return getattr(self.act, name)

    # ---- operations

    def embed(self, out: str, from_state: bool, scale: float = 1.0):
        """out[t] = token_embd[id_t] * scale; ids from the state (decode) or the ids buffer (prefill)."""
        ids, offset = (self.act.state, TOKEN) if from_state else (self.act.ids, 0)
        table = self.model.weights["token_embd.weight"]
        self.steps += self.k.embed(table, ids, self.buffer(out), self.n_tokens, id_offset=offset, scale=scale)

    def linear(
        self,
        weight: str,
        x: str,
        y: str,
        *,
        norm: str | None = None,
        residual=False,
        gate_up=False,
        gelu=False,
    ):
        """y = W x per token (+ y with residual; RMSNorm of x with norm; with gate_up: act(gate) * up,
        act = GELU (tanh approximation) with gelu, else SiLU)."""
        w = self.model.weights[weight]
        if x in self.split_outputs:
            if norm or gate_up or isinstance(w, StackedWeight):
                raise ValueError(f"{weight}: a linear of split attention partials takes one plain matrix")
            self.steps += self._linear_of_splits(w, self.split_outputs[x], y, residual)
            return
        segments = w.segments if isinstance(w, StackedWeight) else ((0, w),)
        if gate_up and len(segments) > 1:
            raise ValueError(f"{weight}: gate and up of different types cannot share a GEMV")
        norm_buffer = self.model.vectors[norm] if norm else None
        eps = self.model.config.rms_eps
        kw = dict(residual=residual, gate_up=gate_up, gelu=gelu, norm=norm_buffer, eps=eps, label=weight)
        if self.n_tokens == 1 and norm and x == "x" and y != "x" and self.pending_add is not None:
            y_buf = self.buffer(y)  # first: if y is the add's input, this dispatches the add
            if self.pending_add is not None:
                x_buf, add = self._fold_add_norm()
                for index, (y_row, segment) in enumerate(segments):
                    add_norm = add if index == 0 else dataclasses.replace(add, write=False)  # one store of x'
                    self.steps += self.k.gemv(segment, x_buf, y_buf, y_row=y_row, add_norm=add_norm, **kw)
                return
        for y_row, segment in segments:
            if self.n_tokens == 1:
                self.steps += self.k.gemv(segment, self.buffer(x), self.buffer(y), y_row=y_row, **kw)
            else:
                x_buf, y_buf, n = self.buffer(x), self.buffer(y), self.n_tokens
                y_stride = w.n_out // 2 if gate_up else w.n_out
                self.steps += self.k.gemm(segment, x_buf, y_buf, n, y_stride=y_stride, y_row=y_row, **kw)

    def add_norm(self, x: str, y: str, norm: str):
        """y += RMSNorm(x) * norm per token (gemma3's post-attention and post-FFN norms). In a decode step
        on a GPU the add into the residual stream waits for the GEMV that reads it next (see __init__)."""
        if self.fold_post_norms and y == "x" and x != "x":
            if self.pending_add is not None:
                self.flush_add_norm()
            self.pending_add = (x, norm)
            return
        self._add_norm_dispatch(x, y, norm)

    def flush_add_norm(self):
        """Dispatches the pending post-norm add as it is (rmsnorm.wgsl ADD on the current half of x)."""
        x, norm = self.pending_add
        self.pending_add = None
        self._add_norm_dispatch(x, "x", norm)

    def _fold_add_norm(self) -> tuple[BufferRange, AddNorm]:
        """The x binding (both halves) and the AddNorm of a GEMV that takes in the pending add; from
        here on the residual stream is the other half."""
        (x, norm), m = self.pending_add, self.model
        self.pending_add = None
        half = m.x_half_bytes
        both = BufferRange(self.act.x, 0, half + m.config.d_model * 4)
        x_in = self.x_half * half
        self.x_half ^= 1
        return both, AddNorm(getattr(self.act, x), m.vectors[norm], x_in=x_in, x_out=self.x_half * half)

    def _add_norm_dispatch(self, x: str, y: str, norm: str):
        c = self.model.config
        self.steps.append(
            self.k.rmsnorm(
                self.buffer(x),
                self.buffer(y),
                self.model.vectors[norm],
                c.d_model,
                self.n_tokens,
                c.rms_eps,
                add=True,
                label=f"{norm}.add",
            )
        )

    def attention(self, layer: int, qkv: str, out: str, spec: AttentionSpec):
        """RoPE, the KV-cache write and causal attention (GQA) of this step's tokens, from the fused
        projection `qkv` [T, (n_head + 2 n_head_kv) head_dim] into `out` [T, n_head head_dim]; bias and
        q/k norms as `spec` says.

        Decode: one kernel (attn_decode.wgsl) that leaves `out` as split partials, merged by the linear
        that reads `out`. Prefill: rope_kv (q into `q`, k and v into the cache), then attn_prefill."""
        if self.n_tokens == 1:
            self._attention_decode(layer, qkv, spec)
            self.split_outputs[out] = spec.window
        else:
            self.split_outputs.pop(out, None)
            self._rope_kv(layer, qkv, "q", spec)
            self._attention_prefill(layer, "q", out, spec)

    # ---- the kernels behind attention

    def _rope_params(self, spec: AttentionSpec) -> dict:
        c = self.model.config
        # powf(base, -2 / rope_dims) rounded to f32 as llama.cpp computes it (rope_kv.wgsl).
        theta_scale = struct.unpack("<f", struct.pack("<f", spec.rope_base ** (-2.0 / c.rope_dims)))[0]
        return dict(rope_dims=c.rope_dims, theta_scale=theta_scale, freq_scale=spec.rope_scale)

    def _head_options(self, spec: AttentionSpec) -> tuple[dict, dict]:
        """The defines and extra buffers of rope_kv / attn_decode for the spec's bias, norms, factors."""
        if (spec.q_norm is None) != (spec.k_norm is None):
            raise ValueError("q and k norms come together")
        vectors = self.model.vectors
        defines = dict(
            NEOX=spec.neox,
            QK_NORM=spec.q_norm is not None,
            BIAS=spec.bias is not None,
            FREQ_FACTORS=spec.freq_factors is not None,
        )
        buffers = {}
        if spec.q_norm is not None:
            buffers |= {"q_norm": vectors[spec.q_norm], "k_norm": vectors[spec.k_norm]}
        if spec.bias is not None:
            buffers["bias"] = vectors[spec.bias]
        if spec.freq_factors is not None:
            buffers["freq_factors"] = vectors[spec.freq_factors]
        return defines, buffers

    def _rope_kv(self, layer: int, qkv: str, q: str, spec: AttentionSpec):
        """RoPE on q and k of the fused projection; q to `q`, k and v into the layer's cache."""
        c, m = self.model.config, self.model
        defines, options = self._head_options(spec)
        kernel = self.k.get("rope_kv", HEAD_DIM=c.head_dim, F16=m.f16_cache, **defines)
        rows = c.n_head + 2 * c.n_head_kv
        buffers = {
            "state": self.act.state,
            "qkv": self.buffer(qkv),
            "q": self.buffer(q),
            "k_cache": m.k_cache[layer],
            "v_cache": m.v_cache[layer],
        } | options
        self.steps.append(
            self.k.dispatch(
                kernel,
                f"blk.{layer}.rope_kv",
                self.n_tokens * rows,
                buffers,
                n_head=c.n_head,
                n_head_kv=c.n_head_kv,
                n_ctx=m.shape.n_ctx,
                eps=c.rms_eps,
                **self._rope_params(spec),
            )
        )

    def _attention_decode(self, layer: int, qkv: str, spec: AttentionSpec):
        """RoPE + cache write + one split of attention per workgroup, into `attn_partials`."""
        c, m = self.model.config, self.model
        rope_multiple = 8 if spec.neox else 4
        if c.head_dim & (c.head_dim - 1) or not 16 <= c.head_dim <= 1024 or c.rope_dims % rope_multiple:
            raise ValueError(
                f"attn_decode needs a power-of-two head size in 16..1024 and rope dims divisible by "
                f"{rope_multiple}, got {c.head_dim} and {c.rope_dims}"
            )
        defines, options = self._head_options(spec)
        kernel = self.k.get("attn_decode", HEAD_DIM=c.head_dim, GROUP=c.n_group, F16=m.f16_cache, **defines)
        buffers = {
            "state": self.act.state,
            "qkv": self.buffer(qkv),
            "k_cache": m.k_cache[layer],
            "v_cache": m.v_cache[layer],
            "partials": self.act.attn_partials,
        } | options
        self.steps.append(
            self.k.dispatch(
                kernel,
                f"blk.{layer}.attn_decode",
                c.n_head_kv * m.shape.n_splits,
                buffers,
                n_head_kv=c.n_head_kv,
                n_ctx=m.shape.n_ctx,
                n_splits=m.shape.n_splits,
                window=spec.window,
                scale=spec.scale,
                eps=c.rms_eps,
                **self._rope_params(spec),
            )
        )

    def _attention_prefill(self, layer: int, q: str, out: str, spec: AttentionSpec):
        c, m = self.model.config, self.model
        kernel = self.k.get("attn_prefill", HEAD_DIM=c.head_dim, GROUP=c.n_group, F16=m.f16_cache)
        tile = prefill_tile(c.head_dim)
        groups = -(-(self.n_tokens * c.n_group) // tile) * c.n_head_kv
        buffers = {
            "state": self.act.state,
            "q": self.buffer(q),
            "k_cache": m.k_cache[layer],
            "v_cache": m.v_cache[layer],
            "out": self.buffer(out),
        }
        self.steps.append(
            self.k.dispatch(
                kernel,
                f"blk.{layer}.attn_prefill",
                groups,
                buffers,
                n_head_kv=c.n_head_kv,
                n_ctx=m.shape.n_ctx,
                window=spec.window,
                scale=spec.scale,
            )
        )

    def _linear_of_splits(self, w: Weight, window: int, y: str, residual: bool) -> list[Dispatch]:
        """y (+)= W attn for a decode step whose attention output is still split partials."""
        return combine_gemv(
            self.k,
            w,
            self.act.state,
            self.act.attn_partials,
            self.buffer(y),
            head_dim=self.model.config.head_dim,
            n_ctx=self.model.shape.n_ctx,
            n_splits=self.model.shape.n_splits,
            window=window,
            residual=residual,
            combine_row_threads=self.model.combine_row_threads,
        )

    def output_head(self, x: str, norm: str, all_positions: bool = False):
        """Logits of the last token (into `logits`) or of every token (into `all_logits`)."""
        c, m = self.model.config, self.model
        w = m.weights["output.weight" if "output.weight" in m.weights else "token_embd.weight"]
        norm_buffer, eps = m.vectors[norm], c.rms_eps
        if all_positions:
            self.steps += self.k.gemm(
                w,
                self.buffer(x),
                self.act.all_logits,
                self.n_tokens,
                norm=norm_buffer,
                eps=eps,
                label="output",
            )
            return
        # A pending post-norm add is not folded into the head: its rows are narrow (4 invocations), so the
        # fold's reduction takes the barrier tree, and on an H100 the head took 31 µs longer with it than
        # the 8 µs of the rmsnorm ADD dispatch that buffer() issues instead (docs/PERF.md).
        last = self.buffer(x)
        if self.n_tokens > 1:  # the last token's row, copied out (a storage binding offset must be aligned)
            row = (self.n_tokens - 1) * c.d_model * 4
            self.steps.append(Copy(self.buffer(x), self.act.last, c.d_model * 4, src_offset=row))
            last = self.act.last
        self.steps += self.k.gemv(w, last, self.act.logits, norm=norm_buffer, eps=eps, label="output")

    def sample(self, greedy: bool):
        """The step's token from `logits`: written to the state and the output ring (docs/ENGINE_STATE.md)."""
        m, act = self.model, self.act
        n_vocab = m.config.n_vocab
        if greedy:
            groups = -(-n_vocab // ARGMAX_CHUNK)
            partial = self.k.get("sample_argmax_partial", NARROW=self.k.cpu_kernels)
            self.steps.append(
                self.k.dispatch(
                    partial,
                    "sample_argmax_partial",
                    groups,
                    {"state": act.state, "logits": act.logits, "partials": act.argmax_partials},
                    n_vocab=n_vocab,
                    chunk=ARGMAX_CHUNK,
                )
            )
            final = self.k.get("sample_argmax_final")
            self.steps.append(
                self.k.dispatch(
                    final,
                    "sample_argmax_final",
                    1,
                    {"state": act.state, "partials": act.argmax_partials, "out_ids": act.out_ids},
                    n_parts=groups,
                    ring=m.shape.ring,
                )
            )
        else:
            # Two steps: the best top_k of each chunk (when 1 <= top_k <= TOP_K_MAX; the kernels read
            # top_k from the state), then the filter chain and the draw over those candidates, or over
            # all the logits when the first step wrote none (shaders/sample_topk_partial.wgsl).
            candidates = act.top_k_candidates
            partial = self.k.get("sample_topk_partial", K_MAX=TOP_K_MAX)
            self.steps.append(
                self.k.dispatch(
                    partial,
                    "sample_topk_partial",
                    -(-n_vocab // TOP_K_CHUNK),
                    {"state": act.state, "logits": act.logits, "candidates": candidates},
                    n_vocab=n_vocab,
                )
            )
            kernel = self.k.get("sample_filtered", CANDIDATES=True, K_MAX=TOP_K_MAX)
            buffers = {
                "state": act.state,
                "logits": act.logits,
                "out_ids": act.out_ids,
                "candidates": candidates,
            }
            self.steps.append(
                self.k.dispatch(
                    kernel,
                    "sample_filtered",
                    1,
                    buffers,
                    n_vocab=n_vocab,
                    ring=m.shape.ring,
                    chunk=TOP_K_CHUNK,
                )
            )

    def plan(self, name: str) -> Plan:
        if self.pending_add is not None:
            self.flush_add_norm()
        return Plan(name, tuple(self.steps))


def prefill_tile(head_dim: int) -> int:
    """Query rows per workgroup of attn_prefill.wgsl (its TILE)."""
    return max(1, min(16, 1024 // head_dim))


# Invocations per row of the COMBINE GEMV: few workgroups (each merges all the split partials), and
# rows at least as wide as a subgroup (CPU adapters use gemv_rows.wgsl instead).
COMBINE_ROW_THREADS = 32


def combine_gemv(
    kernels: Kernels,
    w: Weight,
    state: Buffer,
    partials: Buffer,
    y: Buffer,
    *,
    head_dim: int,
    n_ctx: int,
    n_splits: int,
    window: int,
    residual: bool,
    combine_row_threads: int = COMBINE_ROW_THREADS,
) -> list[Dispatch]:
    """y (+)= W attn, one dispatch per weight part, where attn [n_in] is a decode step's attention output
    still as attn_decode's split partials [n_in / head_dim, n_splits, head_dim + 4] (gemv.wgsl COMBINE)."""
    if kernels.cpu_kernels:
        # gemv_rows.wgsl: each invocation merges the inputs it reads itself, so no barriers.
        kernel, rows = kernels.gemv_rows_kernel(w, False, RESIDUAL=residual, COMBINE=True, HEAD_DIM=head_dim)
    else:
        row_threads = max(combine_row_threads, kernels.max_subgroup)
        rows = 256 // row_threads
        kernel = kernels.get(
            "gemv",
            WEIGHTS=w.wgsl_format,
            N_IN=w.n_in,
            ROWS=rows,
            ROW_THREADS=row_threads,
            SUBGROUPS=kernels.subgroups,
            RESIDUAL=residual,
            COMBINE=True,
            HEAD_DIM=head_dim,
        )
    steps = []
    for part in w.parts:
        buffers = {"state": state, "partials": partials, "y": y} | part.buffers
        n_out = part.n_out(gate_up=False)
        steps.append(
            kernels.dispatch(
                kernel,
                f"{w.name}.gemv_combine[{part.row_begin}:{part.row_end}]",
                -(-n_out // rows),
                buffers,
                n_out=n_out,
                row_base=part.row_begin,
                eps=0.0,
                n_ctx=n_ctx,
                window=window,
                n_splits=n_splits,
            )
        )
    return steps


# ---------------------------------------------------------------- a model on the GPU


class GpuModel:
    """All GPU memory of one model (weights, KV cache, activations) and its plans, built once."""

    def __init__(
        self,
        config,
        arch_module,
        backend: Backend,
        shape: PlanShape,
        f16: bool = False,
        cpu_shapes: bool = False,
        source_of=None,
    ):
        self.config = config
        self.arch = arch_module  # provides gpu_matrices, gpu_vectors, forward
        self.backend = backend
        self.kernels = Kernels(backend, source_of=source_of)  # source_of: WGSL by relative path, or None
        # f16 (GEMM tiles, KV cache) only on request: with it, logits move by ~3e-3 relative to the f32
        # reference, over the 1e-3 the engine promises; without it, by ~4e-6 (docs/ENGINE.md).
        self.kernels.f16 = f16 and self.kernels.f16
        self.shape = shape
        self.f16_cache = self.kernels.f16
        self.combine_row_threads = COMBINE_ROW_THREADS
        if cpu_shapes:
            # On a CPU implementation of WebGPU / Vulkan (SwiftShader, lavapipe) a workgroup barrier costs
            # ~2 µs per invocation (invocations run as coroutines that switch there), a plain invocation
            # ~15 ns: the barrier-free kernels (gemv_rows.wgsl, gemm_rows.wgsl, the narrow greedy sampler)
            # and one attention split. Same results; SmolLM2 decodes ~100x faster on SwiftShader, ~6x on
            # lavapipe (PERF.md).
            self.kernels.cpu_kernels = True
            self.shape = dataclasses.replace(shape, n_splits=1)
        # Post-norm adds folded into the next GEMV (Graph.add_norm): on a GPU a dispatch saved is ~3-5 µs;
        # CPU adapters keep the plain add (gemv_rows.wgsl has no ADD_NORM: there a dispatch costs ~0.1 ms
        # on SwiftShader, less than the prologue would repeated in every invocation).
        self.fold_post_norms = not cpu_shapes
        # The second half of x in a decode step starts here: an aligned storage binding offset.
        align = max(16, backend.limits.min_storage_buffer_offset_alignment)  # and whole vec4s
        self.x_half_bytes = -(-config.d_model * 4 // align) * align
        self.weights: dict[str, Weight] = {}
        self.vectors: dict[str, Buffer] = {}
        self.k_cache, self.v_cache = self._caches()
        self.act = self._activations()
        self._plans: dict[tuple, Plan] = {}

    # ---- memory

    def _caches(self) -> tuple[list[Buffer], list[Buffer]]:
        c, n_ctx = self.config, self.shape.n_ctx
        size = c.n_head_kv * n_ctx * c.head_dim * (2 if self.f16_cache else 4)
        if size > self.backend.limits.max_storage_buffer_binding_size:
            raise ValueError(
                f"a context of {n_ctx} needs {size} bytes per layer cache: more than one binding"
            )
        make = self.backend.create_buffer
        k = [make(f"blk.{i}.k_cache", size, STORAGE) for i in range(c.n_layer)]
        v = [make(f"blk.{i}.v_cache", size, STORAGE) for i in range(c.n_layer)]
        return k, v

    def _activations(self) -> Activations:
        c, s, make = self.config, self.shape, self.backend.create_buffer
        width = (c.n_head + 2 * c.n_head_kv) * c.head_dim
        f32 = 4
        return Activations(
            state=make("state", STATE_WORDS * 4, STORAGE),
            ids=make("ids", s.max_chunk * 4, STORAGE),
            out_ids=make("out_ids", s.ring * 4, STORAGE),
            x=make("x", max(s.max_chunk * c.d_model * f32, self.x_half_bytes + c.d_model * f32), STORAGE),
            qkv=make("qkv", s.max_chunk * width * f32, STORAGE),
            q=make("q", s.max_chunk * c.n_head * c.head_dim * f32, STORAGE),
            attn=make("attn", s.max_chunk * c.n_head * c.head_dim * f32, STORAGE),
            proj=make("proj", s.max_chunk * c.d_model * f32, STORAGE),
            ffn=make("ffn", s.max_chunk * c.d_ff * f32, STORAGE),
            last=make("last", c.d_model * f32, STORAGE),
            logits=make("logits", -(-c.n_vocab // 4) * 4 * f32, STORAGE),  # the sampler reads vec4s
            all_logits=make("all_logits", s.score_chunk * c.n_vocab * f32, STORAGE),
            attn_partials=make("attn_partials", c.n_head * s.n_splits * (c.head_dim + 4) * f32, STORAGE),
            argmax_partials=make("argmax_partials", 8 * -(-c.n_vocab // ARGMAX_CHUNK), STORAGE),
            top_k_candidates=make("top_k_candidates", 8 * TOP_K_MAX * -(-c.n_vocab // TOP_K_CHUNK), STORAGE),
        )

    def upload(self, tensors, tensor_bytes) -> None:
        """Weights from the file: `tensors` name -> TensorInfo, `tensor_bytes(name)` -> its raw bytes."""
        for info, target, row in self.weight_targets(tensors):
            if isinstance(target, Weight):
                self.kernels.write_rows(target, row, tensor_bytes(info.name), _rows(info))
            else:  # a vector; `row` is its byte offset in the (stacked) buffer
                self.backend.write_buffer(target, tensor_bytes(info.name), offset=row)
        self.kernels.release_upload_buffers()

    async def upload_from(self, tensors, source) -> None:
        """`upload` with bytes that never pass through Python (the browser): `await source.write_to(
        buffer, buffer_offset, file_offset, size)` copies bytes of the file into a GPU buffer. Tensors
        go in file order, so a stream read front to back serves them."""
        for info, target, row in sorted(self.weight_targets(tensors), key=lambda t: t[0].offset):
            if isinstance(target, Weight):
                await self.kernels.write_rows_from(target, row, _rows(info), source, info.offset)
            else:
                await source.write_to(target, row, info.offset, info.nbytes)
        self.kernels.release_upload_buffers()

    def weight_targets(self, tensors) -> list[tuple]:
        """Creates the (empty) GPU weights; returns (TensorInfo, Weight or vector Buffer, first row or byte
        offset) for every tensor to upload: a matrix or vector made of several tensors takes each at its
        offset."""
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
                weight = self.kernels.create_weight(label, run[0].type.name, n_in, n_out)
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
            self.vectors[name] = self.backend.create_buffer(name, sum(i.nbytes for i in infos), STORAGE)
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
        """A chunk of ids whose every position's logits go to `all_logits` (teacher forcing)."""
        return self._plan(("score", n_tokens), n_tokens, decode=False, head="all", sample=None)

    def _plan(self, key: tuple, n_tokens: int, decode: bool, head: str, sample: bool | None) -> Plan:
        if key not in self._plans:
            g = Graph(self, n_tokens)
            self.arch.forward(g, self.config, decode=decode, head=head)
            if sample is not None:
                g.sample(greedy=sample)
            self._plans[key] = g.plan("-".join(map(str, key)))
        return self._plans[key]


def _rows(info) -> int:
    """Rows of a weight tensor in GGUF order (shape[0] is the row length; a vector is one row)."""
    return info.shape[1] if len(info.shape) > 1 else 1
