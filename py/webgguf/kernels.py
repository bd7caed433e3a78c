"""The kernels of one device: its pipelines (pipelines.py), its weight uploads (weights.py), and the
builders that turn "y = W x" into the dispatches of a plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .gpu.base import STORAGE, Backend, Buffer, Dispatch
from .pipelines import SHADER_DIR, Kernel, Pipelines, Target
from .weights import Weight, WeightPart, WeightUploads

# SHADER_DIR: the page's worker reads the shader directory here.
__all__ = ["SHADER_DIR", "AddNorm", "Kernels"]


@dataclass(frozen=True)
class AddNorm:
    """A post-norm residual add folded into the input of a GEMV (gemv.wgsl ADD_NORM): the GEMV reads
    x' = x + proj / rms(proj) * post_w, where its x binding holds two halves of the residual stream; x is
    the half at byte x_in, and x' is stored to the half at byte x_out (by the first dispatch, with write)."""

    proj: Target  # [n_in] f32, the block output to normalize and add
    post_w: Target  # [n_in] f32, its norm weight
    x_in: int  # bytes, multiple of 16
    x_out: int  # bytes, multiple of 16
    write: bool = True


# ---------------------------------------------------------------- the kernel set of one device


class Kernels(Pipelines):
    """The pipelines of one backend (Pipelines: get, dispatch, grid), its weight uploads (`uploads`) and
    the dispatch builders."""

    def __init__(
        self,
        backend: Backend,
        source_of: Callable[[str], str] | None = None,
        gemv_rows: int | None = None,
        gemv_row_threads: int | None = None,
    ):
        super().__init__(backend, source_of)
        self.uploads = WeightUploads(self)
        sizes = backend.subgroup_sizes
        self.subgroups = sizes is not None and sizes[1] <= 128
        self.max_subgroup = sizes[1] if self.subgroups else 0
        self.gemv_rows_fixed = gemv_rows  # None: chosen per matrix by gemv_shape
        self.gemv_row_threads_fixed = gemv_row_threads
        # The barrier-free prefill kernels (gemm_rows.wgsl, attn_prefill_rows.wgsl): for CPU adapters.
        self.cpu_kernels = False
        self.gemv_rows_plain, self.gemv_rows_gate_up = 4, 2  # gemv_rows.wgsl's ROWS
        self.prepare_norm = True  # gemv_rows NORM after norm_inputs.wgsl (see PREPARE_NORM_MIN_ROWS)
        self._prepared: dict[int, Buffer] = {}  # n_in -> norm_inputs.wgsl's output
        self.f16 = "shader-f16" in backend.features

    # ---- pipelines

    def get(self, name: str, **defines: bool | int | str) -> Kernel:
        """The kernel `name` specialized by `defines` (compiled once, then cached)."""
        if self.cpu_kernels and defines.get("WEIGHTS") == "q8_0" and name in WEIGHT_READERS:
            defines = {**defines, "MASKED_BYTES": True}  # lib/weights.wgsl bytes_i8: faster on a CPU adapter
        return super().get(name, **defines)

    def gemv_shape(self, n_out: int) -> tuple[int, int]:
        """(ROWS, ROW_THREADS) of a GEMV with `n_out` output rows: about GEMV_THREADS invocations in
        total, so that small matrices spread each row over many invocations (more loads in flight per
        row) and large ones give each invocation several steps (more loads in flight per invocation)."""
        threads = GEMV_THREADS // max(1, n_out)
        row_threads = self.gemv_row_threads_fixed or min(128, max(4, 1 << max(0, threads.bit_length() - 1)))
        return self.gemv_rows_fixed or max(1, 256 // row_threads), row_threads

    # ---- dispatch builders

    def gemv(
        self,
        w: Weight,
        x: Target,
        y: Target,
        *,
        residual: bool = False,
        gate_up: bool = False,
        gelu: bool = False,
        norm: Target | None = None,
        eps: float = 0.0,
        y_row: int = 0,
        add_norm: AddNorm | None = None,
        label: str = "",
    ) -> list[Dispatch]:
        """y = W x for one token (x: [n_in] f32, y: [n_out] f32), one dispatch per weight part.

        residual: y += W x. gate_up: W is [gate; up] (2 n rows) and y = act(gate x) * (up x), y: [n],
        act = GELU (tanh approximation) with gelu, else SiLU.
        norm: the RMSNorm weight [n_in]; x is normalized in the same pass (eps: its epsilon).
        y_row: the element of y where row 0 goes (a matrix stacked from tensors of different types).
        add_norm: x is the two halves of the residual stream and the input is x + RMSNorm(proj) * post_w
        (eps: its epsilon too), stored to the other half by the first dispatch (AddNorm). GPU kernels only:
        GpuModel does not fold post-norms on CPU adapters."""
        if self.cpu_kernels:
            if add_norm is not None:
                raise ValueError(f"{w.name}: ADD_NORM is for the GPU kernels, not gemv_rows.wgsl")
            # gemv_rows.wgsl: several rows per invocation, no barriers (the same bits as gemv.wgsl with
            # rows of one invocation, in less time on SwiftShader: docs/GPU.md "CPU adapters").
            # The inputs prepared by a dispatch of their own where that pays for the dispatch: large
            # matrices (an output head) and GATE_UP (its inputs are shared by only 2 rows).
            prepare = norm is not None and self.prepare_norm and (gate_up or w.n_out >= PREPARE_NORM_MIN_ROWS)
            kernel, rows = self.gemv_rows_kernel(
                w,
                gate_up,
                RESIDUAL=residual,
                GATE_UP=gate_up,
                GELU=gate_up and gelu,
                NORM=norm is not None,
                PREPARED=prepare,
            )
            if prepare:
                # x * norm_w and the sum of squares, once (norm_inputs.wgsl), not in every invocation.
                prepared = self._prepared_inputs(w.n_in)
                nibbles = w.type_name in NIBBLE_ORDER_TYPES
                prep = self.get("norm_inputs", NIBBLES=nibbles)
                label_prep = f"{label or w.name}.norm_inputs"
                steps = [
                    self.dispatch(prep, label_prep, 1, {"x": x, "out": prepared, "norm_w": norm}, n_in=w.n_in)
                ]
                steps += self._gemv_dispatches(w, prepared, y, None, kernel, rows, gate_up, eps, y_row, label)
                return steps
        else:
            rows, row_threads = self.gemv_shape(w.n_out // 2 if gate_up else w.n_out)
            if add_norm is not None and (rows * row_threads) & (rows * row_threads - 1):
                raise ValueError(
                    f"{w.name}: ADD_NORM needs a power-of-two workgroup, not {rows} x {row_threads}"
                )
            kernel = self._gemv_kernel(
                w, rows, row_threads, residual, gate_up, gelu, norm is not None, add_norm is not None
            )
        return self._gemv_dispatches(w, x, y, norm, kernel, rows, gate_up, eps, y_row, label, add_norm)

    def _gemv_dispatches(
        self, w, x, y, norm, kernel, rows, gate_up, eps, y_row, label, add_norm: AddNorm | None = None
    ) -> list[Dispatch]:
        """One GEMV dispatch per weight part (`rows` output rows per workgroup); with add_norm, only the
        first stores x'."""
        steps = []
        for index, part in enumerate(_parts_for(w, gate_up)):
            n_out = part.n_out(gate_up)
            name = f"{label or w.name}.gemv[{part.row_begin}:{part.row_end}]"
            buffers, groups = _linear_buffers(part, x, y, norm), -(-n_out // rows)
            params = dict(n_out=n_out, row_base=y_row + part.row_begin, eps=eps)
            if add_norm is not None:
                if add_norm.x_in % 16 or add_norm.x_out % 16:
                    raise ValueError(f"{name}: residual halves at bytes {add_norm.x_in}, {add_norm.x_out}")
                buffers |= {"proj": add_norm.proj, "post_w": add_norm.post_w}
                write = add_norm.write and index == 0  # one store of x' is enough
                params |= dict(x_in=add_norm.x_in // 16, x_out=add_norm.x_out // 16, write_x=int(write))
            steps.append(self.dispatch(kernel, name, groups, buffers, **params))
        return steps

    def _prepared_inputs(self, n_in: int) -> Buffer:
        """norm_inputs.wgsl's output for GEMVs of n_in inputs: one buffer per size, shared by all of them
        (dispatches run in order, each GEMV right after its own norm_inputs)."""
        if n_in not in self._prepared:
            self._prepared[n_in] = self.backend.create_buffer(
                f"prepared_inputs[{n_in}]", 4 * n_in + 16, STORAGE
            )
        return self._prepared[n_in]

    def gemv_rows_kernel(self, w: Weight, gate_up: bool, **epilogue: bool | int) -> tuple[Kernel, int]:
        """gemv_rows.wgsl for `w` with the given epilogue defines, and its output rows per workgroup.
        Rows per invocation: 2 with GATE_UP (4 weight rows in flight), else 4."""
        per_invocation = self.gemv_rows_gate_up if gate_up else self.gemv_rows_plain
        kernel = self.get(
            "gemv_rows", WEIGHTS=w.wgsl_format, N_IN=w.n_in, ROWS=per_invocation, WG=GEMV_ROWS_WG, **epilogue
        )
        return kernel, per_invocation * GEMV_ROWS_WG

    def _gemv_kernel(
        self,
        w: Weight,
        rows: int,
        row_threads: int,
        residual: bool,
        gate_up: bool,
        gelu: bool,
        norm: bool,
        add_norm: bool = False,
    ) -> Kernel:
        return self.get(
            "gemv",
            WEIGHTS=w.wgsl_format,
            N_IN=w.n_in,
            ROWS=rows,
            ROW_THREADS=row_threads,
            # Subgroup sums need every subgroup inside one row.
            SUBGROUPS=self.subgroups and row_threads >= self.max_subgroup,
            RESIDUAL=residual,
            GATE_UP=gate_up,
            GELU=gate_up and gelu,
            NORM=norm,
            ADD_NORM=add_norm,
        )

    def gemm(
        self,
        w: Weight,
        x: Target,
        y: Target,
        n_tokens: int,
        *,
        y_stride: int = 0,
        residual: bool = False,
        gate_up: bool = False,
        gelu: bool = False,
        norm: Target | None = None,
        eps: float = 0.0,
        y_row: int = 0,
        label: str = "",
    ) -> list[Dispatch]:
        """Y[t] = W X[t] for n_tokens tokens (X: [n_tokens, n_in], Y: [n_tokens, y_stride]), with the
        epilogues of `gemv`; y_stride defaults to the output rows (n_out, or n_out / 2 with gate_up);
        row 0 goes to column y_row of Y."""
        defines = dict(
            WEIGHTS=w.wgsl_format,
            RESIDUAL=residual,
            GATE_UP=gate_up,
            GELU=gate_up and gelu,
            NORM=norm is not None,
        )
        # On a CPU adapter, gemm_rows.wgsl (no barriers) unless its row loop would pass lavapipe's limit.
        rows_kernel = self.cpu_kernels and (w.n_in // 8) * (GEMM_ROWS_TOKENS + 1) < CPU_LOOP_LIMIT
        if rows_kernel:
            name, tile_rows, tile_tokens = "gemm_rows", GEMM_ROWS_ROWS, GEMM_ROWS_TOKENS
            kernel = self.get(name, N_IN=w.n_in, ROWS=tile_rows, TOKENS=tile_tokens, **defines)
        else:
            name, tile_rows, tile_tokens = "gemm", (32 if gate_up else 64), 32  # per workgroup (gemm.wgsl)
            kernel = self.get(name, F16=self.f16, **defines)
        steps = []
        for part in _parts_for(w, gate_up):
            n_out = part.n_out(gate_up)
            row_tiles = -(-n_out // tile_rows)
            params = dict(
                n_out=n_out,
                row_base=y_row + part.row_begin,
                eps=eps,
                n_tokens=n_tokens,
                y_stride=y_stride or w.n_out // (2 if gate_up else 1),
                row_tiles=row_tiles,
            )
            if not rows_kernel:
                params["n_in"] = w.n_in  # gemm_rows has it as the constant N_IN
            step = self.dispatch(
                kernel,
                f"{label or w.name}.{name}[{part.row_begin}:{part.row_end}]",
                row_tiles * -(-n_tokens // tile_tokens),
                _linear_buffers(part, x, y, norm),
                **params,
            )
            steps.append(step)
        return steps

    def rmsnorm(
        self,
        x: Target | None,
        y: Target,
        weight: Target,
        n: int,
        n_rows: int,
        eps: float,
        *,
        add: bool = False,
        label: str = "rmsnorm",
    ) -> Dispatch:
        """y[r] = x[r] / rms(x[r]) * weight for n_rows rows of n (x None: normalize y in place);
        add: y[r] += that instead (a post-norm added to the residual stream)."""
        if n % 4:
            raise ValueError(f"{label}: rmsnorm needs n % 4 == 0, got {n}")
        kernel = self.get(
            "rmsnorm", SUBGROUPS=self.subgroups, ROW_THREADS=self.norm_threads, ADD=add, IN_PLACE=x is None
        )
        buffers = {"y": y, "w": weight} | ({} if x is None else {"x": x})
        return self.dispatch(kernel, label, n_rows, buffers, n=n, n_rows=n_rows, eps=eps)

    @property
    def norm_threads(self) -> int:
        """Invocations per row of the standalone kernels (one row per workgroup)."""
        return max(64, self.max_subgroup)

    def embed(
        self,
        table: Weight,
        ids: Target,
        out: Target,
        n_tokens: int,
        *,
        id_offset: int = 0,
        scale: float = 1.0,
        label: str = "embed",
    ) -> list[Dispatch]:
        """out[t] = table[ids[id_offset + t]] * scale for n_tokens tokens (out: [n_tokens, n_in] f32).

        The ids are read on the GPU, so the next token needs no CPU round trip. One dispatch per part
        of the table; an id past the table writes nothing."""
        kernel = self.get("embed", WEIGHTS=table.wgsl_format, ROW_THREADS=self.norm_threads)
        steps = []
        for part in table.parts:
            buffers = {"ids": ids, "out": out} | part.buffers
            name = f"{label}[{part.row_begin}:{part.row_end}]"
            step = self.dispatch(
                kernel,
                name,
                n_tokens,
                buffers,
                n_embd=table.n_in,
                row_begin=part.row_begin,
                row_end=part.row_end,
                id_offset=id_offset,
                n_tokens=n_tokens,
                scale=scale,
            )
            steps.append(step)
        return steps


GEMV_ROWS_WG = 16  # invocations per workgroup of gemv_rows.wgsl (ROWS rows each)
# gemv_rows NORM GEMVs of at least this many rows (or with GATE_UP) take norm_inputs.wgsl's prepared
# inputs: Gemma-3-270M's decode step on SwiftShader 512 ms without, 464 with the output head's alone,
# 449 with the gate/up GEMVs' too (158 dispatches), 456 with every NORM GEMV's (185 dispatches).
PREPARE_NORM_MIN_ROWS = 4096
# Formats whose GEMV steps read the inputs in GGUF's Q4/Q5 nibble order (lib/weights.wgsl), for
# norm_inputs.wgsl's NIBBLES.
NIBBLE_ORDER_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"})
GEMM_ROWS_ROWS = 64  # weight rows (invocations) per workgroup of gemm_rows.wgsl
GEMM_ROWS_TOKENS = 8  # tokens per invocation of gemm_rows.wgsl
# Mesa's llvmpipe (lavapipe) ends any loop nest after 65,535 iterations in all (its guard against
# endless loops) and goes on with wrong results: kernels meant for CPU adapters stay below.
CPU_LOOP_LIMIT = 65535

# The kernels that read weights through lib/weights.wgsl's load_w8 (its specializations apply to them).
WEIGHT_READERS = ("gemv", "gemv_rows", "gemm", "gemm_rows", "embed")

# Invocations a GEMV aims for: about what a large GPU keeps resident (an H100: 132 SMs x 2048).
GEMV_THREADS = 1 << 18


def _linear_buffers(part: WeightPart, x: Target, y: Target, norm: Target | None) -> dict[str, Target]:
    """The bindings of a gemv / gemm dispatch over one weight part."""
    return {"x": x, "y": y} | part.buffers | ({} if norm is None else {"norm_w": norm})


def _parts_for(w: Weight, gate_up: bool) -> tuple[WeightPart, ...]:
    if gate_up and len(w.parts) != 1:
        raise ValueError(f"{w.name}: a fused gate/up matrix must fit one binding ({len(w.parts)} parts)")
    if gate_up and w.n_out % 2:
        raise ValueError(f"{w.name}: a gate/up matrix has an even number of rows, not {w.n_out}")
    return w.parts
