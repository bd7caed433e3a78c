"""WGSL kernels as pipelines: load shaders/<name>.wgsl, specialize the text, compile once, cache; and
dispatches that bind buffers by their WGSL names.

Specialization is a tiny preprocessor (WGSL override constants cannot add `enable f16;`, change a
storage type or drop a binding):
- every integer define becomes a `const NAME: u32 = <value>u;` line in a generated header;
- the header starts with the `enable` directives of the features in use (F16, SUBGROUPS);
- `#if NAME`, `#if NAME == word`, `#if NAME != word`, `#else`, `#endif` (nestable) select lines by the
  bool and string defines; an undefined name is false;
- `#include "lib/x.wgsl"` pastes a file from the shader directory (once per kernel).
The pipeline name records the specialization, e.g.
"gemv[GATE_UP,NORM,N_IN=576,ROWS=2,ROW_THREADS=128,SUBGROUPS,WEIGHTS=q4_1]".

Which kernel and which defines an op gets is decided in selection.py, not here.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .gpu.base import UNIFORM, Backend, Buffer, BufferRange, Dispatch, Pipeline

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


# ---------------------------------------------------------------- compiled kernels


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


def pipeline_name(kernel: str, defines: dict) -> str:
    """The name of a specialized pipeline: the kernel and its defines that are not false, sorted."""
    label = ",".join(k if v is True else f"{k}={v}" for k, v in sorted(defines.items()) if v is not False)
    return f"{kernel}[{label}]"


class Pipelines:
    """The specialized pipelines of one backend, compiled once per (kernel, defines), and the
    dispatches that use them."""

    def __init__(self, backend: Backend, source_of: Callable[[str], str] | None = None):
        self.backend = backend
        # SHADER_DIR is read at each call, so tools can point a process at another shader directory.
        self.source_of = source_of or (lambda path: (SHADER_DIR / path).read_text())
        self._cache: dict[tuple, Kernel] = {}  # (name, sorted defines) -> Kernel
        self._params_buffers: list[Buffer] = []  # the uniform Params buffers `dispatch` created

    def get(self, name: str, **defines: bool | int | str) -> Kernel:
        """The kernel `name` specialized by `defines` (compiled once, then cached)."""
        key = (name, tuple(sorted(defines.items())))
        if key not in self._cache:
            enables = []
            for define, feature in (("F16", "shader-f16"), ("SUBGROUPS", "subgroups")):
                if defines.get(define):
                    if feature not in self.backend.features:
                        raise ValueError(f"kernel {name}: {define} needs the {feature!r} feature")
                    enables.append(self.backend.wgsl_enable(feature))
            wgsl = specialize(self.source_of, name, defines, enables)
            pipeline = self.backend.pipeline(pipeline_name(name, defines), wgsl)
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
        `release_params()` (a few bytes per dispatch of a static plan)."""
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

    def release_params(self) -> None:
        """Free the Params buffers of every dispatch made so far: plans built on them must not run again."""
        for buffer in self._params_buffers:
            self.backend.destroy_buffer(buffer)
        self._params_buffers = []

    def grid(self, groups: int) -> tuple[int, int, int]:
        """Workgroup grid covering `groups` workgroups; kernels linearize it as x + y * width."""
        limit = self.backend.limits.max_compute_workgroups_per_dimension
        if groups <= limit:
            return (groups, 1, 1)
        rows = -(-groups // limit)
        return (-(-groups // rows), rows, 1)
