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

Why one module of ~500 lines: it is the one place kernels are chosen (docs/ENGINE.md), every op's rules
and tuning tables side by side; split by op it would scatter the adapter policy this module exists to hold.
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


def _lanes_hold(n: int, caps: AdapterCaps) -> bool:
    """Whether every subgroup has at least n lanes: the CPU-shape kernels then load n steps' (or
    tokens') inputs one per lane and hand them to the other lanes (their SUBGROUPS), instead of every
    lane loading the same address (a CPU adapter gathers it per lane)."""
    return caps.subgroups and caps.subgroup_sizes[0] >= n


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


# gemv_rows.wgsl SUBGROUPS: the inputs of this many steps are loaded one per lane and shuffled to all.
GEMV_ROWS_STEPS_SHARED = 8


def _gemv_rows_defines(weights: dict, n_in: int, per_invocation: int, broadcast: bool) -> dict:
    """gemv_rows.wgsl's specialization (before its epilogue defines)."""
    return {**weights, "N_IN": n_in, "ROWS": per_invocation, "WG": GEMV_ROWS_WG, "SUBGROUPS": broadcast}


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
        broadcast = _lanes_hold(GEMV_ROWS_STEPS_SHARED, caps)
        defines = _gemv_rows_defines(weights, n_in, per_invocation, broadcast)
        reason = (
            f"CPU adapter: gemv_rows, no barriers, {per_invocation} rows per invocation sharing the input "
            f"loads x {GEMV_ROWS_WG} invocations"
            + ("; inputs loaded one step per lane and broadcast (SUBGROUPS)" if broadcast else "")
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
        broadcast = _lanes_hold(GEMV_ROWS_STEPS_SHARED, caps)
        defines = _gemv_rows_defines(weights, n_in, per_invocation, broadcast)
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

# Prompt tokens per prefill step. On a GPU 512: a small model's GEMMs are latency-bound, a chunk of 128
# takes about as long as one of 512 (H100: the page's prefill, in chunks of 128, ran at 0.47-0.58x the
# native one in chunks of 512: docs/PERF.md), and 512 tokens of activations are a few percent of a
# model's weights. On a CPU adapter 128: a step is one submission of seconds (SwiftShader), which an
# abort or a progress report waits for.
PREFILL_CHUNK_GPU = 512
PREFILL_CHUNK_CPU = 128
# The most positions of one scoring step (all of whose logits are kept: chunk x vocabulary floats).
SCORE_CHUNK = 128


def prefill_chunk(cpu_shapes: bool) -> int:
    """Prompt tokens per prefill step for an adapter (CPU shapes or GPU shapes)."""
    return PREFILL_CHUNK_CPU if cpu_shapes else PREFILL_CHUNK_GPU


def score_chunk(max_chunk: int, n_vocab: int, max_binding: int) -> int:
    """Positions per scoring step: at most a prefill step's and SCORE_CHUNK, and [chunk, n_vocab] f32
    logits within one storage binding."""
    return max(1, min(max_chunk, SCORE_CHUNK, max_binding // (4 * n_vocab)))


GEMM_ROWS_WG = 64  # invocations per workgroup of gemm_rows.wgsl
GEMM_ROWS_ROWS = 4 * GEMM_ROWS_WG  # weight rows per workgroup (4 per invocation: gemm_rows.wgsl)
GEMM_ROWS_TOKENS = 8  # tokens per invocation of gemm_rows.wgsl (its registers g0..g7)
# Mesa's llvmpipe (lavapipe) ends any loop nest after 65,535 iterations in all (its guard against
# endless loops) and goes on with wrong results: kernels meant for CPU adapters stay below.
CPU_LOOP_LIMIT = 65535


# gemm.wgsl's tiles (invocations along tokens x along rows, each 4 tokens x 8 rows), like gemm_q8's:
# 64 tokens x 64 rows for long chunks, 32 x 64 for short ones (more workgroups for small matrices).
GEMM_LONG_CHUNK = 256
GEMM_TILES = {"long": (16, 8), "short": (8, 8)}


def gemm_tile_bytes(wg_t: int, wg_n: int) -> int:
    """Workgroup memory of gemm.wgsl at tiles (wg_t, wg_n): one 32-column block of 4 wg_t tokens and
    8 wg_n rows in f32."""
    return 32 * 4 * (4 * wg_t + 8 * wg_n)


def gemm(
    type_name: str,
    n_in: int,
    caps: AdapterCaps,
    *,
    n_tokens: int = GEMM_LONG_CHUNK,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    tiles: tuple[int, int] | None = None,
) -> Choice:
    """The GEMM of a [n_rows, n_in] matrix over a chunk of n_tokens tokens, with the epilogues of `gemv`.
    tiles: gemm.wgsl's (wg_t, wg_n) fixed by the caller (tests, tools/bench_gemm.py)."""
    weights, weights_why = _weight_reader(type_name, caps)
    defines = weights | dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu, NORM=norm)
    loop = n_in // 8
    if caps.cpu_shapes and loop < CPU_LOOP_LIMIT and tiles is None:
        # The tokens' inputs one per lane, broadcast to the others, where a subgroup holds them all.
        broadcast = _lanes_hold(GEMM_ROWS_TOKENS, caps)
        return Choice(
            "gemm",
            "gemm_rows",
            {"N_IN": n_in, "WG": GEMM_ROWS_WG, "SUBGROUPS": broadcast} | defines,
            rows=GEMM_ROWS_ROWS,
            tokens=GEMM_ROWS_TOKENS,
            reason=f"CPU adapter: gemm_rows, one invocation per 4 weight rows and {GEMM_ROWS_TOKENS} tokens "
            "(every load shared), no barriers"
            + ("; inputs loaded one token per lane and broadcast (SUBGROUPS)" if broadcast else "")
            + weights_why,
        )
    wg_t, wg_n = tiles or GEMM_TILES["long" if n_tokens >= GEMM_LONG_CHUNK else "short"]
    if wg_t not in (8, 16, 32) or wg_n not in (8, 16, 32) or wg_t * wg_n > 256:
        raise ValueError(f"gemm tiles need wg_t, wg_n in 8, 16, 32 and at most 256 invocations, not {tiles}")
    if gemm_tile_bytes(wg_t, wg_n) > caps.limits.max_compute_workgroup_storage_size:
        if tiles is not None:
            raise ValueError(
                f"gemm tiles {tiles} need {gemm_tile_bytes(wg_t, wg_n)} bytes of workgroup memory"
            )
        wg_t, wg_n = GEMM_TILES["short"]
    rows = 8 * wg_n // (2 if gate_up else 1)
    reason = (
        f"f32 tiles of {4 * wg_t} tokens x {8 * wg_n} rows in workgroup memory, 4 x 8 outputs per invocation"
    )
    if caps.cpu_shapes:
        reason += f" (gemm_rows' row loop of {loop} iterations would pass lavapipe's {CPU_LOOP_LIMIT})"
    return Choice(
        "gemm",
        "gemm",
        {"WG_T": wg_t, "WG_N": wg_n} | defines,
        rows=rows,
        tokens=4 * wg_t,
        reason=reason + weights_why,
    )


# ---------------------------------------------------------------- 8-bit activations, integer dot products

# The formats the integer-dot kernels read (lib/weights_q8.wgsl for gemv_q8, lib/weights_i8.wgsl for
# gemm_q8).
INT8_WEIGHT_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
# gemv_q8 reads the activations of these in K-quant order (quantize_q8's xk: lib/weights_q8.wgsl).
K_ORDER_TYPES = frozenset({"Q4_K", "Q5_K", "Q6_K"})
# A linear takes the integer path from this many bytes of weights on. In a decode step it needs a
# quantize dispatch (~3-5 us in a pass), which pays where the GEMV reads megabytes (H100, docs/PERF.md: a
# 2.8 MB Q4_K matrix 10.6 -> 6.8 us, a 63 MB one 84 -> 31 us), not where a step is a chain of tiny
# dispatches. And 8-bit activations move the logits: the small models the tests hold to llama.cpp's next
# tokens (SmolLM2, Gemma 3 270M) keep their layers in f32, where they meet the criteria; every layer of
# SmolLM2 in 8 bits agrees with llama.cpp on 281 of 288 positions against the 283 the criterion asks for
# (docs/ENGINE.md "Precision"). The layers of 1B+ models are above it; their output heads too.
INT8_MIN_BYTES = 4 << 20
QUANTIZE_WG = 64  # invocations (blocks of 32) per workgroup of quantize_q8 / attn_merge_q8
# gemm_q8.wgsl's tiles (invocations along tokens x along rows, each 4 tokens x 8 rows): 64 tokens x 64
# rows for long chunks; 32 x 64 for short ones, which give too few workgroups otherwise (H100, 8B shapes:
# 16x8 is best or within 5% at 512 tokens, 8x8 at 128: docs/PERF.md).
GEMM_Q8_LONG_CHUNK = 256
GEMM_Q8_TILES = {"long": (16, 8), "short": (8, 8)}


def int8_linear(
    type_names: tuple[str, ...],
    weight_bytes: int,
    n_tokens: int,
    caps: AdapterCaps,
    *,
    large_linears_int8: bool = False,
) -> tuple[bool, str]:
    """Whether a linear reads 8-bit activation blocks with integer dot products (gemv_q8 / gemm_q8,
    after a quantize_q8 or attn_merge_q8 dispatch), and why or why not. large_linears_int8: other
    linears of the same step take the path by their size (a model of 0.5B and more)."""
    if not caps.int8:
        return False, "integer dot products are off for this adapter (caps.int8)"
    unread = sorted(set(type_names) - INT8_WEIGHT_TYPES)
    if unread:
        return False, f"no integer-dot kernel reads {', '.join(unread)}"
    least = INT8_MIN_BYTES if caps.int8_min_bytes is None else caps.int8_min_bytes
    if weight_bytes < least:
        below = f"{weight_bytes >> 10} KiB of weights: below the integer path's {least >> 20} MiB"
        if n_tokens > 1 and large_linears_int8:
            # The size line is a decode-step trade-off (a quantize dispatch against a small GEMV's
            # time); a GEMM's products dwarf its quantize pass, so in a model whose large linears take
            # the path (1B: the attention projections' prefill GEMMs 11.5 of 35 ms in f32) all do.
            return True, f"8-bit activations, integer dot products (GEMM: {below}, but the model's large "
            "linears take the path, and a GEMM's quantize pass is small next to its products)"
        return False, below
    what = "GEMV" if n_tokens == 1 else "GEMM"
    return True, f"8-bit activations, integer dot products ({what} of {weight_bytes >> 20} MiB of weights)"


def quantize_q8(caps: AdapterCaps, *, norm_w: bool) -> Choice:
    """Activations to 8-bit blocks of 32 (both element and K-quant order), norm weight applied."""
    return Choice(
        "quantize",
        "quantize_q8",
        {"WG": QUANTIZE_WG, "NORM_W": norm_w, "K_ORDER": True},
        rows=QUANTIZE_WG * 32,
        reason="one invocation per block of 32, no barriers"
        + ("; the RMSNorm's weight applied" if norm_w else ""),
    )


ATTN_MERGE_WG = 256  # invocations per workgroup of attn_merge_q8 (8 per block of 32: 32 blocks)


def attn_merge_q8(head_dim: int, caps: AdapterCaps) -> Choice:
    """A decode step's attention splits merged and quantized for an integer-dot output projection."""
    return Choice(
        "attention_merge",
        "attn_merge_q8",
        {"HEAD_DIM": head_dim, "WG": ATTN_MERGE_WG, "K_ORDER": True},
        rows=ATTN_MERGE_WG * 4,
        reason="the attention splits merged (one invocation per 4 outputs, 4 splits per load round trip) "
        "and quantized",
    )


def gemv_q8(
    type_name: str,
    n_in: int,
    caps: AdapterCaps,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    quant_out: bool = False,
    norm_out: bool = False,
) -> Choice:
    """The integer-dot GEMV: one row per group of invocations that share its chunks of 32 (a subgroup
    where the adapter's subgroups have one size), 4 groups (8 for long rows) per workgroup (H100: within a
    few percent of the best at every 1-8B shape, docs/PERF.md). quant_out: its outputs also written as the
    next linear's 8-bit blocks (with norm_out: times that linear's RMSNorm weight), one block of 32 rows
    per workgroup (gemv_q8_quant_out_fits says where)."""
    row_threads, one_size = _gemv_q8_row_threads(caps)
    # Two gate/up row pairs per invocation at 4096 inputs and more (8B gate/up: 30.9 against 35.0 us),
    # one below (7B's 3584: 34.4 against 38.4 us); longer rows want more groups (8B down: 15.2 against
    # 18.4 us with 8): H100, docs/PERF.md.
    rows = 2 if gate_up and n_in >= 4096 else 1
    groups = 2 if rows == 2 else 8 if n_in >= 8192 else 4
    if quant_out:
        # A block of 32 outputs per workgroup: 32 rows of one invocation group each, as fast as the shapes
        # above at the 8B o / gate-up / down GEMVs (H100: within 1 us of the best, docs/PERF.md).
        rows, groups = 1, QUANT_BLOCK
    defines = {
        "WEIGHTS": type_name.lower(),
        "N_IN": n_in,
        "ROWS": rows,
        "ROW_THREADS": row_threads,
        "GROUPS": groups,
        "SUBGROUPS": one_size,
    }
    epilogue = dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu, NORM=norm)
    epilogue |= dict(QUANT_OUT=quant_out, NORM_OUT=quant_out and norm_out)
    order = "K-quant order" if type_name in K_ORDER_TYPES else "element order"
    sums = "one subgroupAdd per row" if one_size else "workgroup-memory sums"
    reason = (
        f"integer dot products over 8-bit activations ({order}), 16-byte weight loads, {row_threads} "
        f"invocations per row, {sums}" + ("; 1/rms from the blocks' sums of squares (NORM)" if norm else "")
    )
    if quant_out:
        reason += "; its outputs also quantized for the next linear, a block of 32 per workgroup (QUANT_OUT)"
        reason += ", times that linear's RMSNorm weight (NORM_OUT)" if norm_out else ""
    return Choice("gemv", "gemv_q8", defines | epilogue, rows=rows * groups, reason=reason)


# Elements per 8-bit activation block (quantize_q8.wgsl).
QUANT_BLOCK = 32
# The least outputs of a GEMV that writes the next linear's blocks (QUANT_OUT: a workgroup per 32): 64
# workgroups of 1024 invocations. H100, decode, the fold everywhere it fits: Llama-3.1-8B 235 -> 271 tok/s
# (4096 and 14336 outputs), Llama-3.2-1B 767 -> 816 (2048, 8192), but Qwen2.5-0.5B 755 -> 720: its 896
# outputs are 28 workgroups, too few to keep a large GPU busy (docs/PERF.md).
QUANT_OUT_MIN_OUTPUTS = 2048
# Storage bindings of gemv_q8 QUANT_OUT at most (WebGPU's default limit is 8).
QUANT_OUT_STORAGE_BUFFERS = 10


def _gemv_q8_row_threads(caps: AdapterCaps) -> tuple[int, bool]:
    """(invocations per row, whether a row is one subgroup) of gemv_q8."""
    sizes = caps.subgroup_sizes
    one_size = caps.subgroups and sizes[0] == sizes[1]
    return (sizes[0] if one_size else 32), one_size


def gemv_q8_quant_out_fits(n_out: int, caps: AdapterCaps) -> tuple[bool, str]:
    """Whether gemv_q8 can write its n_out outputs as 8-bit blocks (QUANT_OUT: 32 rows per workgroup of
    32 x ROW_THREADS invocations, 1024 where subgroups are 32 wide, past WebGPU's default limit of 256
    but within what GPUs offer), and why not."""
    row_threads, one_size = _gemv_q8_row_threads(caps)
    invocations = QUANT_BLOCK * row_threads
    # Workgroup memory: the block's 32 outputs, and lib/reduce.wgsl's partial per invocation without
    # subgroup sums.
    storage = 4 * QUANT_BLOCK + (0 if one_size else 16 * invocations)
    least = QUANT_OUT_MIN_OUTPUTS if caps.quant_out_min_outputs is None else caps.quant_out_min_outputs
    if n_out % QUANT_BLOCK:
        return False, f"{n_out} outputs are not whole blocks of {QUANT_BLOCK}"
    if n_out < least:
        return False, f"{n_out} outputs, under {least}: too few workgroups of 32 rows for a large GPU"
    limits = caps.limits
    if invocations > min(limits.max_compute_invocations_per_workgroup, limits.max_compute_workgroup_size_x):
        return False, f"workgroups of {invocations} invocations exceed the adapter's limit"
    # Its storage bindings: the input's quants and scales, y, up to 3 weight arrays, the output's
    # quants (two orders) and scales, the next norm's weight.
    if limits.max_storage_buffers_per_shader_stage < QUANT_OUT_STORAGE_BUFFERS:
        return False, f"{QUANT_OUT_STORAGE_BUFFERS} storage buffers exceed the adapter's limit"
    if storage > caps.limits.max_compute_workgroup_storage_size:
        return False, f"{storage} bytes of workgroup memory exceed the adapter's limit"
    return True, ""


def gemm_q8(
    type_name: str,
    n_tokens: int,
    caps: AdapterCaps,
    *,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    norm: bool = False,
    tiles: tuple[int, int] | None = None,
) -> Choice:
    """The integer-dot GEMM: tiles of 4 wg_t tokens x 8 wg_n rows (gemm_q8.wgsl; wg_t, wg_n >= 8), at
    most 8 KiB of workgroup memory at these tiles. tiles: (wg_t, wg_n) fixed by the caller (tests,
    tools/bench_gemm.py)."""
    wg_t, wg_n = tiles or GEMM_Q8_TILES["long" if n_tokens >= GEMM_Q8_LONG_CHUNK else "short"]
    if wg_t < 8 or wg_n < 8:
        raise ValueError(
            f"gemm_q8 tiles need wg_t, wg_n >= 8 (invocations stage rows and tokens), not {tiles}"
        )
    rows = 8 * wg_n // (2 if gate_up else 1)
    defines = {"WEIGHTS": type_name.lower(), "WG_T": wg_t, "WG_N": wg_n, "CONVERT_BY_BITS": True}
    defines |= dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu, NORM=norm)
    return Choice(
        "gemm",
        "gemm_q8",
        defines,
        rows=rows,
        tokens=4 * wg_t,
        reason=f"integer dot products over 8-bit activations, tiles of {4 * wg_t} tokens x {8 * wg_n} rows "
        "in workgroup memory, 4 x 8 outputs per invocation" + ("; 1/rms per token (NORM)" if norm else ""),
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


def attn_prefill_bytes(head_dim: int, wide: bool) -> int:
    """Workgroup memory of attn_prefill.wgsl: the staged queries, keys (rows padded by a vec4) and
    values, the scores and the partial scores of its 256 invocations."""
    tile = prefill_tile(head_dim)
    keys = 2 * tile if wide else tile
    hd4 = head_dim // 4
    return 16 * (tile * hd4 + keys * (hd4 + 1) + keys * hd4) + 4 * (tile * keys + 256)


# Query rows per workgroup of attn_prefill_rows.wgsl (CPU adapters: one invocation per row).
PREFILL_ROWS_CPU = 16


def attn_prefill(head_dim: int, group: int, caps: AdapterCaps) -> Choice:
    """Causal attention of a chunk's queries over the cache (online softmax over tiles of keys; on CPU
    adapters over one key at a time per row, without barriers)."""
    if caps.cpu_shapes:
        # attn_prefill.wgsl has a few barriers per tile of keys, ~2 us per invocation each on a CPU
        # adapter: SmolLM2's 64-token chunk took 45 ms per layer there (docs/PERF.md).
        return Choice(
            "attention",
            "attn_prefill_rows",
            {"HEAD_DIM": head_dim, "GROUP": group, "F16": caps.f16, "ROWS": PREFILL_ROWS_CPU},
            rows=PREFILL_ROWS_CPU,
            reason=f"one query row per invocation, {PREFILL_ROWS_CPU} per workgroup, no barriers "
            "(CPU adapter)",
        )
    tile = prefill_tile(head_dim)
    # Tiles of twice as many keys as rows where the rows are few (head sizes of 128 and more: 8 or 4
    # rows), so that a row's walk over the cache takes half the tiles (each a few barriers and a load
    # round trip), where the adapter has the workgroup memory (~22 KiB) and on GPU shapes: Gemma 3's
    # 512-token prefill on an H100, attention 3.6 -> 2.8 ms, 28,000 -> 30,000 tok/s (docs/PERF.md).
    wide = (
        tile * 2 * tile <= 256
        and attn_prefill_bytes(head_dim, True) <= caps.limits.max_compute_workgroup_storage_size
    )
    keys = 2 * tile if wide else tile
    return Choice(
        "attention",
        "attn_prefill",
        {"HEAD_DIM": head_dim, "GROUP": group, "F16": caps.f16, "WIDE": wide},
        rows=tile,
        reason=f"tiles of {tile} query rows of one kv head per workgroup, {keys} keys per tile",
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
