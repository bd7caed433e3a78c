"""The prefill GEMM with integer dot products: X quantized to 8-bit blocks (shaders/quantize_rows.wgsl),
then Y (+)= W X with W's quants as int8 and dot4I8Packed (shaders/gemm_q8.wgsl).

One quantize dispatch per GEMM input (it takes the place of gemm.wgsl's NORM prologue); every GEMM that
reads the same input (a stacked QKV's segments, say) reads the same quantized rows. The tile shape is a
`TileConfig` (specialization defines), to be tuned per adapter: tools/bench_gemm.py sweeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu.base import Dispatch, Limits
from .kernels import Kernels, Target, Weight

# Weight formats gemm_q8.wgsl reads (lib/weights_i8.wgsl).
Q8_WEIGHT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
QUANT_BLOCK = 32  # elements per 8-bit block of X (llama.cpp's q8_1)
_HAS_MIN = frozenset({"Q4_1", "Q4_K", "Q5_K"})  # w = d q + m: X's block sums are read too
_SUBS = {"Q6_K": 2}  # integer sums per block (Q6_K's scales cover 16 elements)


@dataclass(frozen=True)
class TileConfig:
    """gemm_q8.wgsl's tile: wg_t x wg_n invocations, each 4 tokens x 8 weight rows (so 4 wg_t tokens by
    8 wg_n rows), one block of 32 columns per stage, double-buffered."""

    wg_t: int = 16
    wg_n: int = 16
    convert_by_bits: bool = True  # i32 -> f32 by an integer add and a float subtract

    @property
    def tokens(self) -> int:
        """Tokens per tile (BM)."""
        return 4 * self.wg_t

    @property
    def rows(self) -> int:
        """Weight rows per tile (BN; with GATE_UP half gate, half up rows)."""
        return 8 * self.wg_n

    @property
    def invocations(self) -> int:
        return self.wg_t * self.wg_n

    def out_rows(self, gate_up: bool) -> int:
        return self.rows // 2 if gate_up else self.rows

    def workgroup_bytes(self, type_name: str) -> int:
        """Bytes of var<workgroup> of the kernel (as gemm_q8.wgsl declares them)."""
        subs = _SUBS.get(type_name, 1)
        stage = 32 * (self.tokens + self.rows) + 4 * (subs * self.rows + self.tokens)  # quants, scales
        mins = 2 * 4 * (self.rows + self.tokens) if type_name in _HAS_MIN else 2 * 16  # else one vec4 each
        return 2 * stage + mins

    def unfit(self, limits: Limits, type_name: str, gate_up: bool = False) -> str | None:
        """Why this config cannot run on a device with `limits` (None if it can)."""
        if self.wg_t < 8 or self.wg_n < 8:
            # Invocations 0..BN-1 stage the weight rows, the last 2 BM the token halves (gemm_q8.wgsl).
            return f"tile {self}: wg_t and wg_n must be at least 8"
        most = limits.max_compute_invocations_per_workgroup
        if self.invocations > most:
            return f"tile {self}: {self.invocations} invocations > {most}"
        need, most = self.workgroup_bytes(type_name), limits.max_compute_workgroup_storage_size
        if need > most:
            return f"tile {self}: {need} bytes of workgroup memory > {most}"
        return None

    def defines(self) -> dict[str, int | bool]:
        return dict(WG_T=self.wg_t, WG_N=self.wg_n, CONVERT_BY_BITS=self.convert_by_bits)

    def __str__(self) -> str:
        return f"{self.wg_t}x{self.wg_n}" + ("" if self.convert_by_bits else "/cvt")


DEFAULT_TILES = TileConfig()  # 64 tokens x 128 rows, 256 invocations, < 16 KiB of workgroup memory


def quantized_bytes(n_tokens: int, n_in: int) -> tuple[int, int]:
    """Bytes of the x_q and x_ds buffers of n_tokens quantized rows of n_in."""
    return n_tokens * n_in, n_tokens * (n_in // QUANT_BLOCK) * 8


def quantize_rows_defines(kernels: Kernels, norm: bool) -> dict[str, int | bool]:
    """quantize_rows.wgsl's specialization on the device of `kernels`."""
    return dict(ROW_THREADS=kernels.norm_threads, SUBGROUPS=kernels.subgroups and norm, NORM=norm)


def gemm_q8_defines(
    type_name: str, tiles: TileConfig, residual: bool, gate_up: bool, gelu: bool
) -> dict[str, str | int | bool]:
    """gemm_q8.wgsl's specialization."""
    epilogue = dict(RESIDUAL=residual, GATE_UP=gate_up, GELU=gate_up and gelu)
    return {"WEIGHTS": type_name.lower(), **epilogue, **tiles.defines()}


def quantize_rows(
    kernels: Kernels,
    x: Target,
    x_q: Target,
    x_ds: Target,
    n_tokens: int,
    n_in: int,
    *,
    norm: Target | None = None,
    eps: float = 0.0,
    label: str = "quantize_rows",
) -> Dispatch:
    """x [n_tokens, n_in] f32 (rmsnorm(x) * norm with norm) -> x_q, x_ds (quantize_rows.wgsl's layout)."""
    if n_in % QUANT_BLOCK:
        raise ValueError(f"{label}: n_in {n_in} is not a multiple of {QUANT_BLOCK}")
    kernel = kernels.get("quantize_rows", **quantize_rows_defines(kernels, norm is not None))
    buffers = {"x": x, "x_q": x_q, "x_ds": x_ds} | ({} if norm is None else {"norm_w": norm})
    return kernels.dispatch(kernel, label, n_tokens, buffers, n_in=n_in, n_tokens=n_tokens, eps=eps)


def gemm_q8(
    kernels: Kernels,
    w: Weight,
    x_q: Target,
    x_ds: Target,
    y: Target,
    n_tokens: int,
    *,
    tiles: TileConfig = DEFAULT_TILES,
    y_stride: int = 0,
    residual: bool = False,
    gate_up: bool = False,
    gelu: bool = False,
    y_row: int = 0,
    label: str = "",
) -> list[Dispatch]:
    """Y[t] (+)= W X[t] for n_tokens quantized rows (x_q, x_ds from quantize_rows), with the epilogues of
    Kernels.gemm except NORM (quantize_rows does it); one dispatch per weight part."""
    name = label or w.name
    if w.type_name not in Q8_WEIGHT_TYPES:
        raise ValueError(f"{name}: gemm_q8 reads {Q8_WEIGHT_TYPES}, not {w.type_name}")
    unfit = tiles.unfit(kernels.backend.limits, w.type_name, gate_up)
    if unfit:
        raise ValueError(f"{name}: {unfit}")
    if gate_up and (len(w.parts) != 1 or w.n_out % 2):
        raise ValueError(f"{name}: a fused gate/up matrix is one part of an even number of rows")
    kernel = kernels.get("gemm_q8", **gemm_q8_defines(w.type_name, tiles, residual, gate_up, gelu))
    token_tiles = -(-n_tokens // tiles.tokens)
    steps = []
    for part in w.parts:
        n_out = part.n_out(gate_up)
        row_tiles = -(-n_out // tiles.out_rows(gate_up))
        buffers = {"x_q": x_q, "x_ds": x_ds, "y": y} | part.buffers
        step = kernels.dispatch(
            kernel,
            f"{name}.gemm_q8[{part.row_begin}:{part.row_end}]",
            row_tiles * token_tiles,
            buffers,
            n_in=w.n_in,
            n_out=n_out,
            row_base=y_row + part.row_begin,
            n_tokens=n_tokens,
            y_stride=y_stride or w.n_out // (2 if gate_up else 1),
            row_tiles=row_tiles,
        )
        steps.append(step)
    return steps
