"""A step's forward pass as a list of plain operations on named activations.

Architecture modules (arch/*.py) record their forward pass with `Graph`, one call per operation, top to
bottom. Every call means the same whatever came before it: what runs on the GPU is decided afterwards,
by the fusion passes (passes.py: which neighbouring ops become one kernel) and the lowering (lower.py:
which kernels, from selection.py). Activations are named buffers (plan.Activations): "x" the residual
stream, "normed", "qkv", "attn", "proj", "ffn"; weights and vectors are named as in the GGUF.

The nodes are frozen dataclasses. The fields after "set by passes" are never set by an architecture:
they record a fusion (a prologue the kernel runs first), and the lowering reads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention, as its architecture defines it. Names are GPU vectors."""

    scale: float  # multiplies q . k (1 / sqrt(head_dim), or the model's query scale)
    rope_base: float  # theta of this layer's RoPE
    rope_scale: float = 1.0  # positions are multiplied by this (linear rope scaling)
    neox: bool = False  # RoPE rotates pairs (i, i + rope_dims / 2), else (2i, 2i + 1)
    window: int = 0  # sliding window in positions (0: attend to everything before)
    q_norm: str | None = None  # per-head RMSNorm weights of q and k (qwen3, gemma3)
    k_norm: str | None = None
    bias: str | None = None  # the q|k|v projection bias (qwen2)
    freq_factors: str | None = None  # rope_freqs.weight (Llama 3.1)


# ---------------------------------------------------------------- the operations


class Op:
    """A node of the graph. `inputs` and `outputs` name the activations it reads and writes."""

    ACTIVATIONS: tuple[str, ...] = ()  # fields that name activations (renamed by `renamed`)

    @property
    def inputs(self) -> tuple[str, ...]:
        return ()

    @property
    def outputs(self) -> tuple[str, ...]:
        return ()

    @property
    def label(self) -> str:
        """What the node is about, for people: its tensor, or its layer."""
        raise NotImplementedError

    def renamed(self, old: str, new: str) -> Op:
        """The same op with activation `old` called `new` (a pass moved it, e.g. to the other half of
        the residual stream)."""
        changes = {f: new for f in self.ACTIVATIONS if getattr(self, f) == old}
        return dataclasses.replace(self, **changes) if changes else self


@dataclass(frozen=True)
class Embed(Op):
    """out[t] = token_embd[id_t] * scale; ids from the state (decode) or the ids buffer (prefill)."""

    out: str
    from_state: bool
    scale: float = 1.0
    ACTIVATIONS = ("out",)

    @property
    def outputs(self):
        return (self.out,)

    @property
    def label(self):
        return "token_embd.weight"


@dataclass(frozen=True)
class RmsNorm(Op):
    """out[t] = RMSNorm(x[t]) * weight."""

    x: str
    out: str
    weight: str
    ACTIVATIONS = ("x", "out")

    @property
    def inputs(self):
        return (self.x,)

    @property
    def outputs(self):
        return (self.out,)

    @property
    def label(self):
        return self.weight


@dataclass(frozen=True)
class FoldedAdd:
    """A post-norm add x += RMSNorm(proj) * weight taken into the prologue of the linear that reads x
    (passes.fold_post_norm_adds): the linear reads its x with the add, and stores x' to `out`."""

    proj: str
    weight: str
    out: str  # where x' goes: the other half of the residual stream


@dataclass(frozen=True)
class Linear(Op):
    """y[t] = W x[t] (residual: y += W x; gate_up: W is [gate; up] and y = act(gate x) * (up x), act =
    GELU (tanh approximation) with gelu, else SiLU)."""

    weight: str
    x: str
    y: str
    residual: bool = False
    gate_up: bool = False
    gelu: bool = False
    # Set by passes:
    norm: str | None = None  # x is normalized first by this RMSNorm weight (passes.fold_norms)
    add: FoldedAdd | None = None  # a post-norm add into x first (passes.fold_post_norm_adds)
    split_window: int | None = None  # x is attention split partials, of this window (fold_attention_splits)
    # x is read as 8-bit blocks with integer dot products: quantized (or, with split_window, merged from
    # the splits and quantized) by a dispatch of its own first (passes.int8_activations)
    int8: bool = False
    # y is also written as 8-bit blocks, times this RMSNorm weight where q8_out_norm names one: the input
    # of the next linear, which then has q8_in and no quantize dispatch (passes.quantize_outputs)
    q8_out: bool = False
    q8_out_norm: str | None = None
    q8_in: bool = False
    ACTIVATIONS = ("x", "y")

    @property
    def inputs(self):
        return (self.x,) + ((self.add.proj,) if self.add else ())

    @property
    def outputs(self):
        return (self.y,) + ((self.add.out,) if self.add else ())

    @property
    def label(self):
        return self.weight


@dataclass(frozen=True)
class Attention(Op):
    """RoPE, the KV-cache write and causal attention (GQA) of the step's tokens, from the fused
    projection qkv [T, (n_head + 2 n_head_kv) head_dim] into out [T, n_head head_dim]; bias and q/k norms
    as the spec says."""

    layer: int
    qkv: str
    out: str
    spec: AttentionSpec
    # Set by passes: out is left as split partials for the linear that reads it (fold_attention_splits).
    splits: bool = False
    ACTIVATIONS = ("qkv", "out")

    @property
    def inputs(self):
        return (self.qkv,)

    @property
    def outputs(self):
        return (self.out,)

    @property
    def label(self):
        return f"blk.{self.layer}.attention"


@dataclass(frozen=True)
class AddNorm(Op):
    """y[t] += RMSNorm(x[t]) * weight (a post-norm: gemma3's after attention and after the FFN)."""

    x: str
    y: str
    weight: str
    ACTIVATIONS = ("x", "y")

    @property
    def inputs(self):
        return (self.x, self.y)

    @property
    def outputs(self):
        return (self.y,)

    @property
    def label(self):
        return self.weight


@dataclass(frozen=True)
class OutputHead(Op):
    """Logits from x: of the last token into `logits` [n_vocab], or of every token into `all_logits`
    [T, n_vocab]."""

    weight: str
    x: str
    all_positions: bool
    norm: str | None = None  # set by passes: x is normalized first (passes.fold_norms)
    int8: bool = False  # set by passes: x read as 8-bit blocks (passes.int8_activations)
    q8_in: bool = False  # set by passes: those blocks written by the linear before (passes.quantize_outputs)
    ACTIVATIONS = ("x",)

    @property
    def inputs(self):
        return (self.x,)

    @property
    def label(self):
        return self.weight


@dataclass(frozen=True)
class Sample(Op):
    """The step's token from `logits`, written to the state and the output ring (docs/ENGINE_STATE.md)."""

    greedy: bool

    @property
    def label(self):
        return "sampler"


# ---------------------------------------------------------------- recording


class Graph:
    """The operations of one step, in order; architecture modules call these top to bottom."""

    def __init__(self):
        self.ops: list[Op] = []

    def embed(self, out: str, from_state: bool, scale: float = 1.0):
        """out = token_embd[ids] * scale; ids from the state (decode) or the ids buffer (prefill)."""
        self.ops.append(Embed(out, from_state, scale))

    def rmsnorm(self, x: str, out: str, weight: str):
        """out = RMSNorm(x) * weight, per token."""
        self.ops.append(RmsNorm(x, out, weight))

    def linear(self, weight: str, x: str, y: str, *, residual=False, gate_up=False, gelu=False):
        """y = W x per token (y += W x with residual; with gate_up: act(gate x) * (up x), act = GELU
        (tanh approximation) with gelu, else SiLU)."""
        self.ops.append(Linear(weight, x, y, residual=residual, gate_up=gate_up, gelu=gelu))

    def attention(self, layer: int, qkv: str, out: str, spec: AttentionSpec):
        """Causal attention of this step's tokens (RoPE, the KV-cache write), from qkv into out."""
        self.ops.append(Attention(layer, qkv, out, spec))

    def add_norm(self, x: str, y: str, weight: str):
        """y += RMSNorm(x) * weight per token."""
        self.ops.append(AddNorm(x, y, weight))

    def output_head(self, weight: str, x: str, all_positions: bool = False):
        """Logits of the last token of x (into `logits`), or of every token (into `all_logits`)."""
        self.ops.append(OutputHead(weight, x, all_positions))

    def sample(self, greedy: bool):
        """The next token from `logits` (greedy: argmax; else the state's filters and a draw)."""
        self.ops.append(Sample(greedy))
