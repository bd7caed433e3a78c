"""WGSL kernels: load shaders/<name>.wgsl, specialize, cache pipelines; weights in their GPU layout;
and builders that turn "y = W x" into the dispatches of a plan.

Specialization is a tiny preprocessor (WGSL override constants cannot add `enable f16;`, change a
storage type or drop a binding):
- every integer define becomes a `const NAME: u32 = <value>u;` line in a generated header;
- the header starts with the `enable` directives of the features in use (F16, SUBGROUPS);
- `#if NAME`, `#if NAME == word`, `#if NAME != word`, `#else`, `#endif` (nestable) select lines by the
  bool and string defines; an undefined name is false;
- `#include "lib/x.wgsl"` pastes a file from the shader directory (once per kernel).
The pipeline name records the specialization, e.g.
"gemv[GATE_UP,NORM,N_IN=576,ROWS=2,ROW_THREADS=128,SUBGROUPS,WEIGHTS=q4_1]".
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .gpu.base import STORAGE, UNIFORM, Backend, Buffer, BufferRange, Dispatch, Pipeline, Plan
from .quants import TYPE_BY_NAME

SHADER_DIR = Path(__file__).resolve().parents[2] / "shaders"

Target = Buffer | BufferRange

# ---------------------------------------------------------------- the preprocessor


def specialize(source_of: Callable[[str], str], name: str, defines: dict, enables: list[str]) -> str:
    """The WGSL of kernel `name` for `defines` (bool / int / str values), with `enables` on top."""
    header = [line for line in enables if line]
    for key, value in sorted(defines.items()):
        if isinstance(value, int) and not isinstance(value, bool):
            header.append(f"const {key}: u32 = {value}u;")
    tested: set[str] = set()  # names the #if lines test (a define may be used only there)
    body = _preprocess(source_of, f"{name}.wgsl", defines, set(), tested)
    unused = [key for key in defines if key not in tested and not re.search(rf"\b{key}\b", body)]
    if unused:
        raise ValueError(f"kernel {name}: defines not used by the shader: {unused}")
    return "\n".join(header) + "\n\n" + body


_IF = re.compile(r"#if\s+(\w+)(?:\s*(==|!=)\s*(\w+))?\s*$")


def _preprocess(
    source_of: Callable[[str], str], path: str, defines: dict, included: set[str], tested: set[str]
) -> str:
    out: list[str] = []
    active = [True]  # one entry per open #if (and the file level): are lines kept?
    for number, line in enumerate(source_of(path).splitlines(), 1):
        stripped = line.strip()
        where = f"{path}:{number}"
        if stripped.startswith("#if"):
            match = _IF.match(stripped)
            if not match:
                raise ValueError(f"{where}: malformed {stripped!r}")
            key, op, word = match.groups()
            tested.add(key)
            value = defines.get(key, False)
            taken = bool(value) if op is None else (str(value) == word) == (op == "==")
            active.append(active[-1] and taken)
        elif stripped == "#else":
            if len(active) == 1:
                raise ValueError(f"{where}: #else without #if")
            active[-1] = active[-2] and not active[-1]
        elif stripped == "#endif":
            if len(active) == 1:
                raise ValueError(f"{where}: #endif without #if")
            active.pop()
        elif not active[-1]:
            continue
        elif stripped.startswith("#include"):
            included_path = stripped.split('"')[1]
            if included_path not in included:
                included.add(included_path)
                out.append(_preprocess(source_of, included_path, defines, included, tested))
        else:
            out.append(line)
    if len(active) != 1:
        raise ValueError(f"{path}: #if without #endif")
    return "\n".join(out)


# ---------------------------------------------------------------- kernels


@dataclass(frozen=True)
class Kernel:
    """One specialized kernel: its pipeline, binding names and Params layout (read from the WGSL)."""

    pipeline: Pipeline
    bindings: dict[str, int]  # variable name → binding number (group 0)
    params: tuple[tuple[str, str], ...]  # (field, "u32" | "i32" | "f32") of struct Params, in order

    @property
    def name(self) -> str:
        return self.pipeline.name

    def pack_params(self, **values: float) -> bytes:
        """struct Params as bytes (all fields 4-byte scalars; size padded to 16 for uniform layout)."""
        missing = {f for f, _ in self.params} ^ set(values)
        if missing:
            raise ValueError(f"{self.name}: Params fields missing or unknown: {sorted(missing)}")
        codes = {"u32": "I", "i32": "i", "f32": "f"}
        data = struct.pack(
            "<" + "".join(codes[t] for _, t in self.params), *(values[f] for f, _ in self.params)
        )
        return data + bytes(-len(data) % 16)


_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var(?:<[^>]*>)?\s+(\w+)")
_PARAMS = re.compile(r"struct Params\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"(\w+)\s*:\s*(u32|i32|f32)\s*,")


def _kernel_from_source(pipeline: Pipeline, wgsl: str) -> Kernel:
    bindings = {name: int(number) for number, name in _BINDING.findall(wgsl)}
    match = _PARAMS.search(wgsl)
    params = tuple(_FIELD.findall(re.sub(r"//.*", "", match.group(1)))) if match else ()
    return Kernel(pipeline, bindings, params)


# ---------------------------------------------------------------- weights in GPU layout

WEIGHT_TYPES = (
    *("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"),  # blocks of 32 (or single values)
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"),  # super-blocks of 256
)


def weight_row_bytes(type_name: str, n_in: int) -> dict[int, int]:
    """Bytes per weight row of each GPU array, by binding number (3 quants, 4 scales, 5 high bits)."""
    nb = n_in // 32  # blocks of 32 (of super-block formats: their chunks of 32)
    ns = n_in // 256  # super-blocks (K-quants, IQ4_XS)
    scale_pairs = 4 * ((nb + 1) // 2)  # one u32 per two f16 scales of a row
    return {
        "F32": {3: 4 * n_in},
        "F16": {3: 2 * n_in},
        "Q8_0": {3: 32 * nb, 4: scale_pairs},
        "Q4_0": {3: 16 * nb, 4: scale_pairs},
        "Q4_1": {3: 16 * nb, 4: 4 * nb},
        "Q5_0": {3: 16 * nb, 4: scale_pairs, 5: 4 * nb},
        "Q5_1": {3: 16 * nb, 4: 4 * nb, 5: 4 * nb},
        "IQ4_NL": {3: 16 * nb, 4: scale_pairs},
        # Super-block formats, per super-block: quants, scales (packed as in GGUF, with f16 d / dmin),
        # high bits.
        "Q2_K": {3: 64 * ns, 4: 20 * ns},  # 84 bytes, as in GGUF
        "Q3_K": {3: 64 * ns, 4: 16 * ns, 5: 32 * ns},  # 112 (GGUF: 110)
        "Q4_K": {3: 128 * ns, 4: 16 * ns},  # 144, as in GGUF
        "Q5_K": {3: 128 * ns, 4: 16 * ns, 5: 32 * ns},  # 176, as in GGUF
        "Q6_K": {3: 128 * ns, 4: 20 * ns, 5: 64 * ns},  # 212 (GGUF: 210)
        "IQ4_XS": {3: 128 * ns, 4: 8 * ns},  # 136, as in GGUF
    }[type_name]


def _row_multiple(type_name: str) -> int:
    """n_in must be a multiple of this: 8 for F32/F16 (a step of 8 weights), else the block size."""
    return 8 if type_name in ("F32", "F16") else TYPE_BY_NAME[type_name].block_elems


WEIGHT_NAMES = {3: "w_q", 4: "w_s", 5: "w_h"}  # binding number -> name in lib/weights.wgsl


@dataclass(frozen=True)
class WeightPart:
    row_begin: int  # first row of the matrix held by this part
    row_end: int
    arrays: dict[int, Buffer]  # binding number → buffer (rows row_begin..row_end-1 only)

    @property
    def buffers(self) -> dict[str, Buffer]:
        """The arrays by their binding names in lib/weights.wgsl (for Kernels.dispatch)."""
        return {WEIGHT_NAMES[b]: buffer for b, buffer in self.arrays.items()}

    def n_out(self, gate_up: bool) -> int:
        """Output rows of a dispatch over this part (a [gate; up] part gives one per row pair)."""
        return (self.row_end - self.row_begin) // (2 if gate_up else 1)


@dataclass(frozen=True)
class Weight:
    """A weight matrix on the GPU: n_out rows of n_in, split on row boundaries into parts that each
    fit one storage binding. Kernels take one part per dispatch (gemv/gemm: one dispatch per part
    writing its rows of y; embed: one dispatch per part, each writing the tokens whose row it holds)."""

    name: str
    type_name: str  # GGML type name, one of WEIGHT_TYPES
    n_in: int
    n_out: int
    parts: tuple[WeightPart, ...]

    @property
    def wgsl_format(self) -> str:
        return self.type_name.lower()


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


class Kernels:
    """Pipelines of one backend (cached per specialization), weight uploads, dispatch builders."""

    def __init__(
        self,
        backend: Backend,
        source_of: Callable[[str], str] | None = None,
        gemv_rows: int | None = None,
        gemv_row_threads: int | None = None,
    ):
        self.backend = backend
        self.source_of = source_of or (lambda path: (SHADER_DIR / path).read_text())
        self._cache: dict[tuple, Kernel] = {}
        self._staging: Buffer | None = None  # raw GGUF bytes on their way through repack.wgsl
        self._repack_params: Buffer | None = None
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
        self._params_buffers: list[Buffer] = []  # the uniform Params buffers `dispatch` created
        self.f16 = "shader-f16" in backend.features

    # ---- pipelines

    def get(self, name: str, **defines: bool | int | str) -> Kernel:
        """The kernel `name` specialized by `defines` (compiled once, then cached)."""
        if self.cpu_kernels and defines.get("WEIGHTS") == "q8_0" and name in WEIGHT_READERS:
            defines = {**defines, "MASKED_BYTES": True}  # lib/weights.wgsl bytes_i8: faster on a CPU adapter
        key = (name, tuple(sorted(defines.items())))
        if key not in self._cache:
            enables = []
            for define, feature in (("F16", "shader-f16"), ("SUBGROUPS", "subgroups")):
                if defines.get(define):
                    if feature not in self.backend.features:
                        raise ValueError(f"kernel {name}: {define} needs the {feature!r} feature")
                    enables.append(self.backend.wgsl_enable(feature))
            wgsl = specialize(self.source_of, name, defines, enables)
            label = ",".join(k if v is True else f"{k}={v}" for k, v in key[1] if v is not False)
            pipeline = self.backend.create_pipeline(f"{name}[{label}]", wgsl)
            self._cache[key] = _kernel_from_source(pipeline, wgsl)
        return self._cache[key]

    def dispatch(
        self,
        kernel: Kernel,
        label: str,
        groups: int,
        buffers: dict[str, Target],
        params_buffer: Buffer | None = None,
        **params: float,
    ) -> Dispatch:
        """A dispatch of `groups` workgroups (a 2-D grid when needed) binding `buffers` by their WGSL
        names. Its Params go into `params_buffer`, or into a new uniform buffer that lives until
        `release()` (a few bytes per dispatch of a static plan)."""
        expected = set(kernel.bindings) - {"params"}
        if set(buffers) != expected:
            raise ValueError(f"{kernel.name}: buffers {sorted(buffers)} != bindings {sorted(expected)}")
        data = kernel.pack_params(**params)
        if params_buffer is None:
            params_buffer = self.backend.create_buffer(f"{label}.params", len(data), UNIFORM)
            self._params_buffers.append(params_buffer)
        self.backend.write_buffer(params_buffer, data)
        entries = {kernel.bindings[name]: target for name, target in buffers.items()}
        entries[kernel.bindings["params"]] = params_buffer
        bind_group = self.backend.create_bind_group(label, kernel.pipeline, entries)
        return Dispatch(kernel.pipeline, bind_group, *self.grid(groups))

    def gemv_shape(self, n_out: int) -> tuple[int, int]:
        """(ROWS, ROW_THREADS) of a GEMV with `n_out` output rows: about GEMV_THREADS invocations in
        total, so that small matrices spread each row over many invocations (more loads in flight per
        row) and large ones give each invocation several steps (more loads in flight per invocation)."""
        threads = GEMV_THREADS // max(1, n_out)
        row_threads = self.gemv_row_threads_fixed or min(128, max(4, 1 << max(0, threads.bit_length() - 1)))
        return self.gemv_rows_fixed or max(1, 256 // row_threads), row_threads

    def grid(self, groups: int) -> tuple[int, int, int]:
        """Workgroup grid covering `groups` workgroups; kernels linearize it as x + y * width."""
        limit = self.backend.limits.max_compute_workgroups_per_dimension
        if groups <= limit:
            return (groups, 1, 1)
        rows = -(-groups // limit)
        return (-(-groups // rows), rows, 1)

    # ---- weights

    def create_weight(
        self, name: str, type_name: str, n_in: int, n_out: int, max_part_bytes: int = 0
    ) -> Weight:
        """Empty GPU arrays for an n_out x n_in matrix, split so each part fits one binding (and the
        raw bytes of a part fit the repack kernel's source binding). Fill with `write_rows`."""
        if type_name not in WEIGHT_TYPES:
            raise ValueError(f"{name}: weight type {type_name} has no GPU kernels (have {WEIGHT_TYPES})")
        multiple = _row_multiple(type_name)
        if n_in % multiple:
            raise ValueError(f"{name}: n_in {n_in} is not a multiple of {multiple} ({type_name})")
        row_bytes = weight_row_bytes(type_name, n_in)
        raw_row_bytes = _raw_row_bytes(type_name, n_in)
        limit = max_part_bytes or self.backend.limits.max_storage_buffer_binding_size
        rows_per_part = (limit - 4) // max([raw_row_bytes, *row_bytes.values()])  # -4: raw padding
        if rows_per_part < 1:
            raise ValueError(f"{name}: one row ({raw_row_bytes} bytes) exceeds the binding limit {limit}")
        parts, made = [], []
        try:
            for begin in range(0, n_out, rows_per_part):
                end = min(n_out, begin + rows_per_part)
                arrays = {}
                for binding, size in row_bytes.items():
                    label = f"{name}[{begin}:{end}].{binding}"
                    arrays[binding] = self.backend.create_buffer(label, (end - begin) * size, STORAGE)
                    made.append(arrays[binding])
                parts.append(WeightPart(begin, end, arrays))
        except BaseException:  # out of memory halfway: nothing of this weight stays allocated
            for buffer in made:
                self.backend.destroy_buffer(buffer)
            raise
        return Weight(name, type_name, n_in, n_out, tuple(parts))

    def write_rows(self, weight: Weight, row_begin: int, raw, n_rows: int) -> None:
        """Upload `n_rows` rows in GGUF layout (`raw`: bytes-like) as rows row_begin.. of `weight`:
        float formats are written as they are, block formats staged then repacked on the GPU."""
        raw = memoryview(raw).cast("B")
        raw_row_bytes = _raw_row_bytes(weight.type_name, weight.n_in)
        if len(raw) != n_rows * raw_row_bytes:
            raise ValueError(f"{weight.name}: {len(raw)} bytes for {n_rows} rows of {raw_row_bytes}")
        for part in weight.parts:
            begin, end = max(row_begin, part.row_begin), min(row_begin + n_rows, part.row_end)
            if begin >= end:
                continue
            chunk = raw[(begin - row_begin) * raw_row_bytes : (end - row_begin) * raw_row_bytes]
            if weight.type_name in ("F32", "F16"):
                self.backend.write_buffer(part.arrays[3], chunk, (begin - part.row_begin) * raw_row_bytes)
            else:
                self._repack(weight, part, chunk, begin - part.row_begin, end - begin)

    async def write_rows_from(self, weight: Weight, row_begin: int, n_rows: int, source, offset: int) -> None:
        """`write_rows` with bytes that never pass through Python (the browser's fetch stream or File):
        `await source.write_to(buffer, buffer_offset, file_offset, size)` copies bytes of the file into
        a GPU buffer (zero-padding a tail that is not a multiple of 4); the rows start at `offset`."""
        raw_row_bytes = _raw_row_bytes(weight.type_name, weight.n_in)
        for part in weight.parts:
            begin, end = max(row_begin, part.row_begin), min(row_begin + n_rows, part.row_end)
            if begin >= end:
                continue
            at, size = offset + (begin - row_begin) * raw_row_bytes, (end - begin) * raw_row_bytes
            if weight.type_name in ("F32", "F16"):
                await source.write_to(part.arrays[3], (begin - part.row_begin) * raw_row_bytes, at, size)
            else:
                await source.write_to(self._staging_for(size), 0, at, size)
                self._repack_staged(weight, part, begin - part.row_begin, end - begin)

    def upload_weight(
        self, name: str, type_name: str, n_in: int, n_out: int, raw, max_part_bytes: int = 0
    ) -> Weight:
        weight = self.create_weight(name, type_name, n_in, n_out, max_part_bytes)
        self.write_rows(weight, 0, raw, n_out)
        return weight

    def release_upload_buffers(self) -> None:
        """Free the buffers that uploads keep for the next upload (call when loading is done)."""
        for buffer in (self._staging, self._repack_params):
            if buffer is not None:
                self.backend.destroy_buffer(buffer)
        self._staging = self._repack_params = None

    def release(self) -> None:
        """Free every buffer these kernels made (Params of the dispatches built so far, norm_inputs
        outputs, upload buffers): the plans built on them must not run again. Weights are the caller's."""
        self.release_upload_buffers()
        for buffer in [*self._params_buffers, *self._prepared.values()]:
            self.backend.destroy_buffer(buffer)
        self._params_buffers, self._prepared = [], {}

    def _repack(self, weight: Weight, part: WeightPart, raw: memoryview, local_row: int, n_rows: int) -> None:
        staging = self._staging_for(len(raw))
        aligned = len(raw) // 4 * 4  # write_buffer takes multiples of 4 bytes: pad the tail only
        self.backend.write_buffer(staging, raw[:aligned])
        if aligned < len(raw):
            self.backend.write_buffer(staging, bytes(raw[aligned:]) + bytes(-len(raw) % 4), aligned)
        self._repack_staged(weight, part, local_row, n_rows)

    def _staging_for(self, n_bytes: int) -> Buffer:
        """The staging buffer of raw GGUF bytes, grown to hold n_bytes. Reusing it is safe: queue
        writes and submits run in queue order."""
        size = -(-n_bytes // 4) * 4
        if self._staging is None or self._staging.size < size:
            if self._staging is not None:
                self.backend.destroy_buffer(self._staging)
            self._staging = self.backend.create_buffer("repack.staging", size, STORAGE)
        return self._staging

    def _repack_staged(self, weight: Weight, part: WeightPart, local_row: int, n_rows: int) -> None:
        """Repack n_rows rows of GGUF blocks at the start of the staging buffer into `part` at local_row."""
        size = -(-n_rows * _raw_row_bytes(weight.type_name, weight.n_in) // 4) * 4
        if self._repack_params is None:
            self._repack_params = self.backend.create_buffer("repack.params", 16, UNIFORM)
        kernel = self.get("repack", WEIGHTS=weight.wgsl_format)
        block_elems = TYPE_BY_NAME[weight.type_name].block_elems
        n_blocks = n_rows * weight.n_in // block_elems
        src = BufferRange(self._staging, 0, size)
        buffers = {"src": src} | part.buffers
        step = self.dispatch(
            kernel,
            f"repack.{weight.name}",
            -(-n_blocks // 64),
            buffers,
            self._repack_params,
            blocks_per_row=weight.n_in // block_elems,
            n_blocks=n_blocks,
            row_begin=local_row,
        )
        self.backend.replay(Plan(f"repack.{weight.name}", (step,)))

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


def _raw_row_bytes(type_name: str, n_in: int) -> int:
    t = TYPE_BY_NAME[type_name]
    return n_in // t.block_elems * t.block_bytes


def _linear_buffers(part: WeightPart, x: Target, y: Target, norm: Target | None) -> dict[str, Target]:
    """The bindings of a gemv / gemm dispatch over one weight part."""
    return {"x": x, "y": y} | part.buffers | ({} if norm is None else {"norm_w": norm})


def _parts_for(w: Weight, gate_up: bool) -> tuple[WeightPart, ...]:
    if gate_up and len(w.parts) != 1:
        raise ValueError(f"{w.name}: a fused gate/up matrix must fit one binding ({len(w.parts)} parts)")
    if gate_up and w.n_out % 2:
        raise ValueError(f"{w.name}: a gate/up matrix has an even number of rows, not {w.n_out}")
    return w.parts
