"""The GPU backend protocol: everything the engine asks of WebGPU, in one small interface.

Two implementations: `native.py` (CPython + wgpu-native) and `browser.py` (Pyodide → navigator.gpu).
The interface is shaped so the browser one stays thin:

- Objects (buffers, pipelines, bind groups) are created once, at load time, one call each.
- A `Plan` is plain data: a flat tuple of `Dispatch(pipeline, bind_group, x, y, z)` and `Copy` steps.
  `replay(plan)` encodes it into ONE command encoder with ONE compute pass (a `Copy` ends the pass and
  the next dispatch opens a new one) and submits. The browser converts a plan to a JS array once and
  then replays it with one call into JS, never one Python→JS call per dispatch.
- Reading results back is asynchronous (`read_async` → `PendingRead`), so the engine can submit the
  next batch of tokens before the previous one's ids have arrived.

Errors: a failed GPU operation raises `GpuError` naming the kind of operation and the kernel / buffer.
Natively it is raised by the call itself. In the browser, error scopes are asynchronous, so errors of
`replay` are raised no later than the next `PendingRead` of that backend resolves.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

# Buffer usages (what the engine needs; each maps to a set of WebGPU usage flags):
STORAGE = "storage"  # read/write in shaders, copy source and destination, written from the CPU
UNIFORM = "uniform"  # small kernel parameters, written from the CPU
READBACK = "readback"  # copy destination that the CPU maps to read

# Optional features, by their WebGPU names. Requested when the adapter has them.
OPTIONAL_FEATURES = ("shader-f16", "subgroups", "timestamp-query")


class GpuError(RuntimeError):
    """A GPU validation / out-of-memory error or a lost device, naming what it happened to."""

    def __init__(self, operation: str, name: str, message: str):
        super().__init__(f"{operation} {name!r}: {message}")
        self.operation = operation  # e.g. "create_pipeline", "create_buffer", "replay"
        self.name = name  # the kernel, buffer, bind group or plan name
        self.message = message


@dataclass(frozen=True)
class Limits:
    """The adapter limits the engine plans against (the device is created with these values)."""

    max_storage_buffer_binding_size: int  # bytes one storage binding may span
    max_buffer_size: int  # bytes of one buffer
    max_storage_buffers_per_shader_stage: int
    max_compute_workgroups_per_dimension: int  # grids past this use a 2-D grid
    max_compute_invocations_per_workgroup: int
    max_compute_workgroup_storage_size: int  # bytes of var<workgroup> per kernel
    max_uniform_buffer_binding_size: int
    min_storage_buffer_offset_alignment: int  # bytes
    min_uniform_buffer_offset_alignment: int  # bytes
    # Invocations along x of a workgroup (WebGPU's default 256; gemv_q8 QUANT_OUT takes up to 1024)
    max_compute_workgroup_size_x: int = 256


# WebGPU limit names of the fields above, in field order (the device requests exactly these).
LIMIT_NAMES = tuple(name.replace("_", "-") for name in Limits.__dataclass_fields__)


@dataclass(eq=False)
class Buffer:
    name: str
    size: int  # bytes
    usage: str  # STORAGE, UNIFORM or READBACK
    handle: Any = field(repr=False)  # the backend's buffer object


@dataclass(frozen=True)
class BufferRange:
    """Part of a buffer bound to one binding (offset aligned to min_*_buffer_offset_alignment)."""

    buffer: Buffer
    offset: int  # bytes
    size: int  # bytes


@dataclass(eq=False)
class Pipeline:
    name: str  # the kernel name, with its specialization (e.g. "gemv[Q4_1,NORM]")
    handle: Any = field(repr=False)


@dataclass(eq=False)
class BindGroup:
    name: str
    pipeline: Pipeline  # auto layouts are per pipeline: a bind group belongs to one
    handle: Any = field(repr=False)


@dataclass(frozen=True)
class Dispatch:
    pipeline: Pipeline
    bind_group: BindGroup  # bound at group 0
    x: int  # workgroups along x
    y: int = 1
    z: int = 1


@dataclass(frozen=True)
class Copy:
    src: Buffer
    dst: Buffer
    size: int  # bytes, multiple of 4
    src_offset: int = 0  # bytes, multiple of 4
    dst_offset: int = 0  # bytes, multiple of 4


@dataclass(frozen=True, eq=False)
class Plan:
    """A static, replayable list of GPU steps (compared and hashed by identity)."""

    name: str
    steps: tuple[Dispatch | Copy, ...]

    @property
    def dispatch_count(self) -> int:
        return sum(isinstance(s, Dispatch) for s in self.steps)


@dataclass(frozen=True)
class DispatchTime:
    kernel: str  # pipeline name
    seconds: float  # GPU time between the start and the end of the dispatch


class PendingRead(ABC):
    """A readback in flight: poll `done()`, or `await` it, or (natively) `wait()` for the bytes."""

    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def wait(self) -> bytes:
        """Block until the bytes are there (native only: a browser cannot block on the GPU)."""

    def __await__(self) -> Generator[Any, None, bytes]:
        while not self.done():
            yield from asyncio.sleep(0.0002).__await__()
        return self.wait()


class Backend(ABC):
    """One GPU device. Attributes are set by the implementation's constructor."""

    adapter_name: str
    features: frozenset[str]  # enabled optional features, WebGPU names (a subset of OPTIONAL_FEATURES)
    limits: Limits
    # (min, max) subgroup size the kernels may see; None without the "subgroups" feature.
    subgroup_sizes: tuple[int, int] | None
    # A CPU implementation of the API (lavapipe natively, SwiftShader in Chromium): a workgroup barrier
    # costs microseconds per invocation there, so the engine picks kernel shapes with few of them.
    cpu_adapter: bool = False

    def __init__(self) -> None:
        self.live_bytes = 0  # sum of the sizes of the buffers alive now
        self.peak_bytes = 0  # highest live_bytes since creation or reset_peak()
        self._pipelines: dict[tuple[str, str], Pipeline] = {}  # (name, WGSL) -> compiled, see pipeline()

    # ---- buffers

    @abstractmethod
    def create_buffer(self, name: str, size: int, usage: str) -> Buffer:
        """A zero-filled buffer of `size` bytes (rounded up to a multiple of 4)."""

    @abstractmethod
    def write_buffer(self, buffer: Buffer, data: Any, offset: int = 0) -> None:
        """Queue a CPU→GPU write of `data` (bytes-like, length a multiple of 4) at byte `offset`."""

    @abstractmethod
    def destroy_buffer(self, buffer: Buffer) -> None: ...

    # ---- kernels

    @abstractmethod
    def create_pipeline(self, name: str, wgsl: str) -> Pipeline:
        """Compile a compute pipeline (entry point `main`, layout derived from the shader)."""

    def pipeline(self, name: str, wgsl: str) -> Pipeline:
        """The pipeline of `wgsl`, compiled once per device. Pipelines hold no model data, so the models
        loaded one after another on a device (a model switch, a reload, a tool's several engines) share
        them instead of compiling every kernel again (~1 s per pipeline on a CPU adapter, tens of ms
        on a GPU). A failed compile raises and is not kept."""
        key = (name, wgsl)
        if key not in self._pipelines:
            self._pipelines[key] = self.create_pipeline(name, wgsl)
        return self._pipelines[key]

    @abstractmethod
    def create_bind_group(
        self, name: str, pipeline: Pipeline, entries: dict[int, Buffer | BufferRange]
    ) -> BindGroup:
        """Bind group 0 of `pipeline`: binding number → buffer (all the bindings the shader uses)."""

    def wgsl_enable(self, feature: str) -> str:
        """The WGSL `enable` directive a shader needs to use an optional feature ("" if none)."""
        return {"shader-f16": "enable f16;", "subgroups": "enable subgroups;"}.get(feature, "")

    # ---- running

    @abstractmethod
    def replay(self, plan: Plan, repeat: int = 1) -> None:
        """Submit `plan` `repeat` times in one command encoder and one compute pass (no waiting)."""

    @abstractmethod
    def read_async(self, buffer: Buffer, offset: int = 0, size: int | None = None) -> PendingRead:
        """Start copying `size` bytes at `offset` of a STORAGE buffer back to the CPU (after all
        work submitted so far)."""

    def read(self, buffer: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """Blocking readback (native convenience for tests and tools)."""
        return self.read_async(buffer, offset, size).wait()

    @abstractmethod
    def profile(self, plan: Plan) -> list[DispatchTime]:
        """Run `plan` once with a timestamp pair around every dispatch; needs "timestamp-query".

        Each dispatch gets its own compute pass here (WebGPU timestamps are per pass), so the sum of
        the times is close to, not equal to, the time of a real one-pass replay."""

    # ---- memory accounting (for the bench)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _count_alloc(self, size: int) -> None:
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _count_free(self, size: int) -> None:
        self.live_bytes -= size


def time_by_kernel(times: list[DispatchTime]) -> dict[str, tuple[int, float]]:
    """Kernel name → (dispatch count, total seconds), slowest kernel first."""
    totals: dict[str, tuple[int, float]] = {}
    for t in times:
        count, seconds = totals.get(t.kernel, (0, 0.0))
        totals[t.kernel] = (count + 1, seconds + t.seconds)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1][1]))
