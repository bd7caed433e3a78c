"""Kernel selection: which kernel runs for an op, specialized how, covering what per workgroup, and why.

One function per op, from (weight format, shape, adapter caps) to a `Choice`: the kernel file, its
defines, what one workgroup covers and a reason a person can read. Every kernel variant the engine runs
is chosen here and nowhere else; the op builders (ops/) only bind buffers and size grids from a Choice,
and `webgguf inspect MODEL --plan` prints the choices of a model's plans.

Adding a kernel variant (a GEMV for large matrices, an integer-dot GEMM for a format, ...):
1. write shaders/<kernel>.wgsl (docs/GPU.md "Adding a kernel");
2. add a rule to its op's function below. A function's rules are tried top to bottom and the first that
   applies returns its Choice, so a specialist goes above the general kernel it replaces, with its
   condition (format, shape, caps) and its reason. Tuning constants live next to the rules that use them;
3. if it binds other buffers or Params than the op's kernels so far, teach the op's builder in ops/; a
   dispatch of its own that must run first (an activation quantizer, like norm_inputs for gemv_rows
   today) is the Choice's `prologue`;
4. a kernel test (tests/kernels/) and a selection test (tests/unit/test_selection.py) for where the rule
   applies and where it does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .caps import AdapterCaps
from .pipelines import pipeline_name


@dataclass(frozen=True)
class Choice:
    """One kernel decision: what runs for an op, and why."""

    op: str  # the op it serves: "gemv", "gemm", "rmsnorm", ...
    kernel: str  # shaders/<kernel>.wgsl
    defines: dict = field(default_factory=dict)  # its specialization, as given to Pipelines.get
    rows: int = 1  # per workgroup: output rows (GEMV, GEMM), query rows (attention) or vocabulary ids
    tokens: int = 1  # per workgroup: tokens (GEMM tiles)
    reason: str = ""
    prologue: Choice | None = None  # a dispatch of its own that runs first (its output is the input)

    @property
    def name(self) -> str:
        """The pipeline name: the kernel with its specialization."""
        return pipeline_name(self.kernel, self.defines)

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


# ---------------------------------------------------------------- weights, adapter-wide options


def _weight_reader(type_name: str, caps: AdapterCaps) -> tuple[dict, str]:
    """The defines every kernel that reads weights through lib/weights.wgsl takes, and what they add to
    the reason."""
    defines: dict = {"WEIGHTS": type_name.lower()}
    if caps.cpu_shapes and type_name == "Q8_0":
        # Q8_0 bytes by masks and power-of-two scales, not vector shifts: SwiftShader runs those slowly
        # (the Q8_0 output head ~385 -> ~260 ms, docs/GPU.md "CPU adapters"); the same bits.
        defines["MASKED_BYTES"] = True
        return defines, "; Q8_0 bytes by masks (MASKED_BYTES: a CPU adapter's vector shifts are slow)"
    return defines, ""


def norm_threads(caps: AdapterCaps) -> int:
    """Invocations per row of the one-row-per-workgroup kernels (rmsnorm, embed): at least a subgroup."""
    return max(64, caps.max_subgroup)


# ---------------------------------------------------------------- y = W x for one token (decode)

# Invocations a GEMV aims for: about what a large GPU keeps resident (an H100: 132 SMs x 2048).
GEMV_THREADS = 1 << 18
# gemv_rows.wgsl (CPU adapters): invocations per workgroup, and rows per invocation (2 with GATE_UP: 4
# weight rows in flight; 4 rows shared each step's input loads best on SwiftShader, docs/GPU.md).
GEMV_ROWS_WG = 16
GEMV_ROWS_PER_INVOCATION = 4
GEMV_ROWS_PER_INVOCATION_GATE_UP = 2
# gemv_rows NORM GEMVs of at least this many rows (or with GATE_UP) take norm_inputs.wgsl's prepared
# inputs: Gemma-3-270M's decode step on SwiftShader 512 ms without, 464 with the output head's alone,
# 449 with the gate/up GEMVs' too (158 dispatches), 456 with every NORM GEMV's (185 dispatches).
PREPARE_NORM_MIN_ROWS = 4096
# Formats whose GEMV steps read the inputs in GGUF's Q4/Q5 nibble order (lib/weights.wgsl), for
# norm_inputs.wgsl's NIBBLES.
NIBBLE_ORDER_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"})
# Invocations per row of the COMBINE GEMV: few workgroups (each merges all the split partials), and
# rows at least as wide as a subgroup.
COMBINE_ROW_THREADS = 32


def gemv_shape(n_out: int, caps: AdapterCaps) -> tuple[int, int]:
    """(ROWS, ROW_THREADS) of gemv.wgsl for `n_out` output rows: about GEMV_THREADS invocations in
    total, so that small matrices spread each row over many invocations (more loads in flight per row)
    and large ones give each invocation several steps (more loads in flight per invocation)."""
    threads = GEMV_THREADS // max(1, n_out)
    row_threads = caps.gemv_row_threads or min(128, max(4, 1 << max(0, threads.bit_length() - 1)))
    return caps.gemv_rows or max(1, 256 // row_threads), row_threads


def gemv(
    type_name: str,
    n_in: int,
    n_rows: int,
    caps: AdapterCaps,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    add_norm: bool = False,
) -> Choice:
    """The GEMV of a [n_rows, n_in] matrix (with gate_up: [gate; up], n_rows / 2 outputs) and its
    epilogues: residual (y +=), gate_up (act(gate) * up, act GELU with gelu else SiLU), norm (RMSNorm of
    x in the same pass), add_norm (a post-norm add into x first, docs/GPU.md ADD_NORM)."""
    weights, weights_why = _weight_reader(type_name, caps)
    epilogue = dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu, NORM=norm)
    if caps.cpu_shapes:
        if add_norm:
            raise ValueError("ADD_NORM is for the GPU kernels, not gemv_rows.wgsl")
        # The inputs prepared by a dispatch of their own where that pays for the dispatch: large matrices
        # (an output head) and GATE_UP (its inputs are shared by only 2 rows).
        prepare = norm and (gate_up or n_rows >= PREPARE_NORM_MIN_ROWS)
        per_invocation = GEMV_ROWS_PER_INVOCATION_GATE_UP if gate_up else GEMV_ROWS_PER_INVOCATION
        defines = {**weights, "N_IN": n_in, "ROWS": per_invocation, "WG": GEMV_ROWS_WG}
        reason = (
            f"CPU adapter: gemv_rows, no barriers, {per_invocation} rows per invocation sharing the input "
            f"loads x {GEMV_ROWS_WG} invocations"
        )
        prologue = None
        if prepare:
            prologue = norm_inputs(type_name, n_in)
            why = "GATE_UP rows share inputs in pairs only" if gate_up else f"{n_rows} rows >= 4096"
            reason += f"; inputs normalized once by norm_inputs ({why})"
        elif norm:
            reason += "; RMSNorm of x in every invocation (NORM)"
        return Choice(
            "gemv",
            "gemv_rows",
            defines | epilogue | {"PREPARED": prepare},
            rows=per_invocation * GEMV_ROWS_WG,
            reason=reason + weights_why,
            prologue=prologue,
        )
    n_out = n_rows // 2 if gate_up else n_rows
    rows, row_threads = gemv_shape(n_out, caps)
    if add_norm and (rows * row_threads) & (rows * row_threads - 1):
        raise ValueError(f"ADD_NORM needs a power-of-two workgroup, not {rows} x {row_threads}")
    # Subgroup sums need every subgroup inside one row.
    subgroups = caps.subgroups and row_threads >= caps.max_subgroup
    if caps.gemv_rows or caps.gemv_row_threads:
        reason = f"shape fixed by the caps: {rows} rows x {row_threads} invocations"
    else:
        reason = f"{n_out} rows, ~2^18 invocations in all: {rows} rows x {row_threads} invocations each"
    reason += ", subgroup sums" if subgroups else ", shared-memory sums"
    if norm:
        reason += "; RMSNorm of x in the same pass (NORM)"
    if add_norm:
        reason += "; the pending post-norm add read in the prologue (ADD_NORM)"
    defines = {**weights, "N_IN": n_in, "ROWS": rows, "ROW_THREADS": row_threads, "SUBGROUPS": subgroups}
    return Choice("gemv", "gemv", defines | epilogue | {"ADD_NORM": add_norm}, rows=rows, reason=reason)


def norm_inputs(type_name: str, n_in: int) -> Choice:
    """x * norm_w and the sum of squares once, for the gemv_rows NORM GEMV that follows (PREPARED)."""
    nibbles = type_name in NIBBLE_ORDER_TYPES
    order = "in GGUF's nibble order" if nibbles else "in element order"
    return Choice(
        "norm_inputs",
        "norm_inputs",
        {"NIBBLES": nibbles},
        rows=n_in,
        reason=f"the next GEMV's inputs, normalized once, {order}",
    )


def gemv_combine(type_name: str, n_in: int, head_dim: int, caps: AdapterCaps, *, residual: bool) -> Choice:
    """The GEMV that reads a decode step's attention output as attn_decode's split partials and merges
    them in its prologue (COMBINE)."""
    weights, weights_why = _weight_reader(type_name, caps)
    epilogue = dict(RESIDUAL=residual, COMBINE=True, HEAD_DIM=head_dim)
    if caps.cpu_shapes:
        # Each invocation merges the inputs it reads itself, so no barriers.
        per_invocation = GEMV_ROWS_PER_INVOCATION
        defines = {**weights, "N_IN": n_in, "ROWS": per_invocation, "WG": GEMV_ROWS_WG}
        return Choice(
            "gemv_combine",
            "gemv_rows",
            defines | epilogue,
            rows=per_invocation * GEMV_ROWS_WG,
            reason="CPU adapter: gemv_rows, each invocation merges the attention splits it reads (no "
            "barriers)" + weights_why,
        )
    row_threads = max(COMBINE_ROW_THREADS, caps.max_subgroup)
    rows = 256 // row_threads
    defines = {
        **weights,
        "N_IN": n_in,
        "ROWS": rows,
        "ROW_THREADS": row_threads,
        "SUBGROUPS": caps.subgroups,
    }
    return Choice(
        "gemv_combine",
        "gemv",
        defines | epilogue,
        rows=rows,
        reason=f"every workgroup merges the attention splits first: few workgroups, {rows} rows x "
        f"{row_threads} invocations",
    )


# ---------------------------------------------------------------- Y = W X for a chunk of tokens (prefill)

GEMM_ROWS_ROWS = 64  # weight rows (invocations) per workgroup of gemm_rows.wgsl
GEMM_ROWS_TOKENS = 8  # tokens per invocation of gemm_rows.wgsl
# Mesa's llvmpipe (lavapipe) ends any loop nest after 65,535 iterations in all (its guard against
# endless loops) and goes on with wrong results: kernels meant for CPU adapters stay below.
CPU_LOOP_LIMIT = 65535


def gemm(
    type_name: str,
    n_in: int,
    caps: AdapterCaps,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
) -> Choice:
    """The GEMM of a [n_rows, n_in] matrix over a chunk of tokens, with the epilogues of `gemv`."""
    weights, weights_why = _weight_reader(type_name, caps)
    defines = weights | dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu, NORM=norm)
    loop = (n_in // 8) * (GEMM_ROWS_TOKENS + 1)
    if caps.cpu_shapes and loop < CPU_LOOP_LIMIT:
        return Choice(
            "gemm",
            "gemm_rows",
            {"N_IN": n_in, "ROWS": GEMM_ROWS_ROWS, "TOKENS": GEMM_ROWS_TOKENS} | defines,
            rows=GEMM_ROWS_ROWS,
            tokens=GEMM_ROWS_TOKENS,
            reason=f"CPU adapter: gemm_rows, one invocation per weight row and {GEMM_ROWS_TOKENS} tokens, "
            "no barriers" + weights_why,
        )
    rows = 32 if gate_up else 64  # per workgroup (gemm.wgsl)
    reason = f"tiles of {rows} rows x 32 tokens in workgroup memory, {'f16' if caps.f16 else 'f32'}"
    if caps.cpu_shapes:
        reason += f" (gemm_rows' row loop of {loop} iterations would pass lavapipe's {CPU_LOOP_LIMIT})"
    return Choice(
        "gemm", "gemm", {"F16": caps.f16} | defines, rows=rows, tokens=32, reason=reason + weights_why
    )


# ---------------------------------------------------------------- rows of activations


def rmsnorm(caps: AdapterCaps, *, add: bool = False, in_place: bool = False) -> Choice:
    """y = RMSNorm(x) * w per row (add: y += that, a post-norm; in_place: x is y)."""
    threads = norm_threads(caps)
    what = "the post-norm added to the residual stream" if add else "a standalone RMSNorm"
    return Choice(
        "rmsnorm",
        "rmsnorm",
        {"SUBGROUPS": caps.subgroups, "ROW_THREADS": threads, "ADD": add, "IN_PLACE": in_place},
        reason=f"{what}: one row per workgroup of {threads} invocations",
    )


def embed(type_name: str, caps: AdapterCaps) -> Choice:
    """Rows of the token embedding, looked up by ids read on the GPU."""
    weights, weights_why = _weight_reader(type_name, caps)
    threads = norm_threads(caps)
    return Choice(
        "embed",
        "embed",
        weights | {"ROW_THREADS": threads},
        reason=f"one token per workgroup of {threads} invocations, ids read on the GPU" + weights_why,
    )


# ---------------------------------------------------------------- attention

# Flash-decoding splits of the KV cache a decode step may use on a GPU (lib/attn_splits.wgsl: short
# spans use fewer).
DECODE_SPLITS = 64


def decode_splits(caps: AdapterCaps, most: int = DECODE_SPLITS) -> int:
    """Splits of a decode step's attention: one on CPU adapters (each split's workgroup has barriers,
    and a CPU has few cores to spread splits over), else up to `most`."""
    return 1 if caps.cpu_shapes else most


def attn_decode(
    head_dim: int, group: int, rope_dims: int, caps: AdapterCaps, n_splits: int, **options: bool
) -> Choice:
    """A decode token's attention in one kernel: RoPE of its q rows and k row, its k / v into the cache,
    one split of the cache per workgroup, left as partials for the next GEMV (COMBINE). options: NEOX,
    QK_NORM, BIAS, FREQ_FACTORS."""
    rope_multiple = 8 if options.get("NEOX") else 4
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 1024 or rope_dims % rope_multiple:
        raise ValueError(
            f"attn_decode needs a power-of-two head size in 16..1024 and rope dims divisible by "
            f"{rope_multiple}, got {head_dim} and {rope_dims}"
        )
    splits = "one split (CPU adapter)" if n_splits == 1 else f"up to {n_splits} splits of the cache"
    return Choice(
        "attention",
        "attn_decode",
        {"HEAD_DIM": head_dim, "GROUP": group, "F16": caps.f16} | options,
        reason=f"RoPE + KV-cache write + {splits}, one per workgroup; merged by the next GEMV",
    )


def rope_kv(head_dim: int, caps: AdapterCaps, **options: bool) -> Choice:
    """RoPE (and q/k norms, bias, frequency factors: options) of a chunk; q out, k and v into the cache."""
    return Choice(
        "rope_kv",
        "rope_kv",
        {"HEAD_DIM": head_dim, "F16": caps.f16} | options,
        reason="one head row of one token per workgroup",
    )


def prefill_tile(head_dim: int) -> int:
    """Query rows per workgroup of attn_prefill.wgsl (its TILE)."""
    return max(1, min(16, 1024 // head_dim))


def attn_prefill(head_dim: int, group: int, caps: AdapterCaps) -> Choice:
    """Causal attention of a chunk's queries over the cache (online softmax over tiles of keys)."""
    tile = prefill_tile(head_dim)
    return Choice(
        "attention",
        "attn_prefill",
        {"HEAD_DIM": head_dim, "GROUP": group, "F16": caps.f16},
        rows=tile,
        reason=f"tiles of {tile} query rows of one kv head per workgroup",
    )


# ---------------------------------------------------------------- sampling

ARGMAX_CHUNK = 1024  # vocabulary ids per workgroup of the greedy sampler's first pass
TOP_K_CHUNK = 1024  # vocabulary ids per workgroup of sample_topk_partial (its CHUNK)
TOP_K_MAX = 128  # the largest top_k served by the candidate path (larger, or 0: the full scan)


def argmax_partial(caps: AdapterCaps) -> Choice:
    narrow = caps.cpu_shapes
    how = "4 invocations, no barriers (CPU adapter)" if narrow else "256 invocations, a reduction tree"
    return Choice(
        "sample",
        "sample_argmax_partial",
        {"NARROW": narrow},
        rows=ARGMAX_CHUNK,
        reason=f"greedy: the best id of {ARGMAX_CHUNK} per workgroup, {how}",
    )


def argmax_final() -> Choice:
    return Choice("sample", "sample_argmax_final", reason="greedy: the best of the partials, committed")


def topk_partial() -> Choice:
    return Choice(
        "sample",
        "sample_topk_partial",
        {"K_MAX": TOP_K_MAX},
        rows=TOP_K_CHUNK,
        reason=f"filtered: the best top_k (<= {TOP_K_MAX}) of {TOP_K_CHUNK} ids per workgroup",
    )


def sample_filtered() -> Choice:
    return Choice(
        "sample",
        "sample_filtered",
        {"CANDIDATES": True, "K_MAX": TOP_K_MAX},
        reason="filtered: top-k / top-p / min-p and the draw over the candidates (or all logits)",
    )
