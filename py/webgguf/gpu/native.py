"""The backend protocol on CPython + wgpu (wgpu-native over Vulkan / Metal / D3D12).

Two deliberate uses of wgpu-py internals, both measured or forced:
- `replay` records dispatches with the raw cffi functions (`lib.wgpuComputePassEncoder*`) instead of
  the Python wrappers: 2.1 µs instead of 6.5 µs per dispatch on the development machine, which
  matters at ~200 dispatches per token. Recording errors inside a pass are deferred by wgpu to the
  end of the pass, which goes through the wrapped (error-raising) API.
- wgpu-py gives no non-blocking way to ask whether a map request finished, so `done()` looks at
  the promise state; and its adapter info does not carry subgroup sizes, so they are probed.
"""

from __future__ import annotations

import struct
import weakref

import wgpu
from wgpu.backends.wgpu_native._api import ffi, lib

from .base import (
    LIMIT_NAMES,
    OPTIONAL_FEATURES,
    READBACK,
    STORAGE,
    UNIFORM,
    Backend,
    BindGroup,
    Buffer,
    BufferRange,
    Copy,
    Dispatch,
    DispatchTime,
    GpuError,
    Limits,
    PendingRead,
    Pipeline,
    Plan,
)

_USAGE_FLAGS = {
    STORAGE: wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST,
    UNIFORM: wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST,
    READBACK: wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
}

# wgpu-native spells some WebGPU features its own way.
_NATIVE_FEATURE_NAME = {
    "shader-f16": "shader-f16",
    "subgroups": "subgroup",
    "timestamp-query": "timestamp-query",
}

# A plan replayed once (a prompt or scoring chunk: the GPU is often idle when it comes) is submitted in
# parts: its first FIRST_SUBMIT_DISPATCHES dispatches, then twice as many each time. Recording costs the
# CPU 3-10 µs per dispatch, so one submit at the end of a 512-token prefill (~160 dispatches) kept the
# GPU waiting ~1.6 ms (H100, docs/PERF.md). Decode batches (repeat > 1) keep one submit per replay: the
# engine has the next batch recorded while one runs, and more submits per step cost small models ~5%.
FIRST_SUBMIT_DISPATCHES = 16

# WebGPU allows at most 4096 queries per query set: profile in chunks of this many dispatches.
_PROFILE_CHUNK = 2048

_SUBGROUP_PROBE_WGSL = """
@group(0) @binding(0) var<storage, read_write> sizes: array<atomic<u32>, 2>;  // [min, max]
@compute @workgroup_size(256)
fn main(@builtin(subgroup_size) size: u32) {
    atomicMin(&sizes[0], size);
    atomicMax(&sizes[1], size);
}
"""


class NativeBackend(Backend):
    def __init__(
        self, disable_features: set[str] | frozenset[str] = frozenset(), power_preference="high-performance"
    ):
        super().__init__()
        unknown = set(disable_features) - set(OPTIONAL_FEATURES)
        if unknown:
            raise ValueError(f"unknown features to disable: {sorted(unknown)}; known: {OPTIONAL_FEATURES}")
        adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
        self.adapter_name = adapter.info["device"]
        self.cpu_adapter = adapter.info.get("adapter_type") == "CPU"
        self.features = frozenset(
            f
            for f in OPTIONAL_FEATURES
            if f not in disable_features and _NATIVE_FEATURE_NAME[f] in adapter.features
        )
        required_limits = {name: adapter.limits[name] for name in LIMIT_NAMES}
        self.limits = Limits(*required_limits.values())
        try:
            self.device = adapter.request_device_sync(
                label="webgguf",
                required_features=[_NATIVE_FEATURE_NAME[f] for f in sorted(self.features)],
                required_limits=required_limits,
            )
        except Exception as e:
            raise GpuError("request_device", self.adapter_name, str(e)) from e
        self.queue = self.device.queue
        # Plans in the form replay records: raw handles, looked up once per plan.
        self._prepared: weakref.WeakKeyDictionary[Plan, list] = weakref.WeakKeyDictionary()
        # Nanoseconds per timestamp tick (wgpu-native reports raw ticks).
        self._timestamp_period_ns = float(lib.wgpuQueueGetTimestampPeriod(self.queue._internal))
        self.subgroup_sizes = self._probe_subgroup_sizes() if "subgroups" in self.features else None

    def wgsl_enable(self, feature: str) -> str:
        # Naga enables subgroup builtins with the device feature and rejects `enable subgroups;`.
        return "" if feature == "subgroups" else super().wgsl_enable(feature)

    # ---- buffers

    def create_buffer(self, name: str, size: int, usage: str) -> Buffer:
        size = max(4, -(-size // 4) * 4)
        try:
            handle = self.device.create_buffer(label=name, size=size, usage=_USAGE_FLAGS[usage])
        except wgpu.GPUError as e:
            raise GpuError("create_buffer", name, f"{size} bytes: {e}") from e
        self._count_alloc(size)
        return Buffer(name, size, usage, handle)

    def write_buffer(self, buffer: Buffer, data, offset: int = 0) -> None:
        try:
            self.queue.write_buffer(buffer.handle, offset, data)
        except (wgpu.GPUError, ValueError) as e:
            raise GpuError("write_buffer", buffer.name, str(e)) from e

    def destroy_buffer(self, buffer: Buffer) -> None:
        buffer.handle.destroy()
        self._count_free(buffer.size)

    # ---- kernels

    def create_pipeline(self, name: str, wgsl: str) -> Pipeline:
        try:
            module = self.device.create_shader_module(label=name, code=wgsl)
            handle = self.device.create_compute_pipeline(
                label=name, layout="auto", compute={"module": module, "entry_point": "main"}
            )
        except wgpu.GPUError as e:
            raise GpuError("create_pipeline", name, str(e)) from e
        return Pipeline(name, handle)

    def create_bind_group(
        self, name: str, pipeline: Pipeline, entries: dict[int, Buffer | BufferRange]
    ) -> BindGroup:
        wgpu_entries = []
        for binding, target in sorted(entries.items()):
            if isinstance(target, BufferRange):
                resource = {"buffer": target.buffer.handle, "offset": target.offset, "size": target.size}
            else:
                resource = {"buffer": target.handle, "offset": 0, "size": target.size}
            wgpu_entries.append({"binding": binding, "resource": resource})
        try:
            layout = pipeline.handle.get_bind_group_layout(0)
            handle = self.device.create_bind_group(label=name, layout=layout, entries=wgpu_entries)
        except wgpu.GPUError as e:
            raise GpuError("create_bind_group", f"{name} for {pipeline.name}", str(e)) from e
        return BindGroup(name, pipeline, handle)

    # ---- running

    def replay(self, plan: Plan, repeat: int = 1) -> None:
        steps = self._prepared.get(plan)
        if steps is None:
            steps = self._prepared[plan] = _raw_steps(plan)
        set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        encoder = self.device.create_command_encoder(label=plan.name)
        compute_pass = None
        dispatched, submit_at = 0, FIRST_SUBMIT_DISPATCHES if repeat == 1 else -1
        try:
            for _ in range(repeat):
                for step in steps:
                    if isinstance(step, Copy):
                        if compute_pass is not None:
                            compute_pass.end()
                            compute_pass = None
                        encoder.copy_buffer_to_buffer(
                            step.src.handle, step.src_offset, step.dst.handle, step.dst_offset, step.size
                        )
                        continue
                    if dispatched == submit_at:  # the GPU starts on what is recorded so far
                        if compute_pass is not None:
                            compute_pass.end()
                            compute_pass = None
                        self.queue.submit([encoder.finish()])
                        encoder = self.device.create_command_encoder(label=plan.name)
                        submit_at *= 2
                    if compute_pass is None:
                        compute_pass = encoder.begin_compute_pass(label=plan.name)
                        raw_pass = compute_pass._internal
                        last_pipeline = last_bind_group = None
                    pipeline, bind_group, x, y, z = step
                    # Skip state that is already set: consecutive dispatches often share a kernel.
                    if pipeline != last_pipeline:
                        set_pipeline(raw_pass, pipeline)
                        last_pipeline = pipeline
                    if bind_group != last_bind_group:
                        set_bind_group(raw_pass, 0, bind_group, 0, ffi.NULL)
                        last_bind_group = bind_group
                    dispatch(raw_pass, x, y, z)
                    dispatched += 1
            if compute_pass is not None:
                compute_pass.end()
            self.queue.submit([encoder.finish()])
        except wgpu.GPUError as e:
            raise GpuError("replay", plan.name, str(e)) from e

    def read_async(self, buffer: Buffer, offset: int = 0, size: int | None = None) -> PendingRead:
        size = buffer.size - offset if size is None else size
        padded = -(-size // 4) * 4
        staging = self.create_buffer(f"{buffer.name}.readback", padded, READBACK)
        try:
            encoder = self.device.create_command_encoder(label=staging.name)
            encoder.copy_buffer_to_buffer(buffer.handle, offset, staging.handle, 0, padded)
            self.queue.submit([encoder.finish()])
        except wgpu.GPUError as e:
            self.destroy_buffer(staging)
            raise GpuError("read", buffer.name, str(e)) from e
        return _NativePendingRead(self, staging, size, staging.handle.map_async(wgpu.MapMode.READ))

    def profile(self, plan: Plan) -> list[DispatchTime]:
        if "timestamp-query" not in self.features:
            raise GpuError("profile", plan.name, "the device has no timestamp-query feature")
        times: list[DispatchTime] = []
        steps = list(plan.steps)
        while steps:
            chunk, n_dispatches = [], 0
            while steps and n_dispatches < _PROFILE_CHUNK:
                n_dispatches += isinstance(steps[0], Dispatch)
                chunk.append(steps.pop(0))
            times += self._profile_chunk(plan.name, chunk, n_dispatches)
        return times

    def _profile_chunk(self, name: str, steps: list, n_dispatches: int) -> list[DispatchTime]:
        if n_dispatches == 0:
            self.replay(Plan(name, tuple(steps)))
            return []
        n_queries = 2 * n_dispatches
        query_set = self.device.create_query_set(
            label=f"{name}.timestamps", type="timestamp", count=n_queries
        )
        resolved = self.device.create_buffer(
            label=f"{name}.timestamps",
            size=8 * n_queries,
            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC,
        )
        encoder = self.device.create_command_encoder(label=f"{name}.profile")
        kernels = []
        try:
            for step in steps:
                if isinstance(step, Copy):
                    encoder.copy_buffer_to_buffer(
                        step.src.handle, step.src_offset, step.dst.handle, step.dst_offset, step.size
                    )
                    continue
                i = len(kernels)
                compute_pass = encoder.begin_compute_pass(
                    timestamp_writes={
                        "query_set": query_set,
                        "beginning_of_pass_write_index": 2 * i,
                        "end_of_pass_write_index": 2 * i + 1,
                    }
                )
                compute_pass.set_pipeline(step.pipeline.handle)
                compute_pass.set_bind_group(0, step.bind_group.handle)
                compute_pass.dispatch_workgroups(step.x, step.y, step.z)
                compute_pass.end()
                kernels.append(step.pipeline.name)
            encoder.resolve_query_set(query_set, 0, n_queries, resolved, 0)
            staging = self.create_buffer(f"{name}.timestamps.readback", 8 * n_queries, READBACK)
            encoder.copy_buffer_to_buffer(resolved, 0, staging.handle, 0, 8 * n_queries)
            self.queue.submit([encoder.finish()])
        except wgpu.GPUError as e:
            raise GpuError("profile", name, str(e)) from e
        pending = _NativePendingRead(
            self, staging, 8 * n_queries, staging.handle.map_async(wgpu.MapMode.READ)
        )
        ticks = struct.unpack(f"<{n_queries}Q", pending.wait())
        resolved.destroy()
        query_set.destroy()
        return [
            DispatchTime(kernel, (ticks[2 * i + 1] - ticks[2 * i]) * self._timestamp_period_ns * 1e-9)
            for i, kernel in enumerate(kernels)
        ]

    def _probe_subgroup_sizes(self) -> tuple[int, int]:
        pipeline = self.create_pipeline("subgroup_probe", _SUBGROUP_PROBE_WGSL)
        sizes = self.create_buffer("subgroup_probe.sizes", 8, STORAGE)
        self.write_buffer(sizes, struct.pack("<2I", 0xFFFFFFFF, 0))
        group = self.create_bind_group("subgroup_probe", pipeline, {0: sizes})
        self.replay(Plan("subgroup_probe", (Dispatch(pipeline, group, 1),)))
        low, high = struct.unpack("<2I", self.read(sizes))
        self.destroy_buffer(sizes)
        return low, high


def _raw_steps(plan: Plan) -> list:
    """The plan's steps with each Dispatch as (raw pipeline, raw bind group, x, y, z); the Plan
    keeps the wgpu objects alive."""
    return [
        step
        if isinstance(step, Copy)
        else (step.pipeline.handle._internal, step.bind_group.handle._internal, step.x, step.y, step.z)
        for step in plan.steps
    ]


class _NativePendingRead(PendingRead):
    def __init__(self, backend: NativeBackend, staging: Buffer, size: int, promise):
        self._backend = backend
        self._staging = staging
        self._size = size
        self._promise = promise  # resolved by wgpu-py's device poll thread
        self._data: bytes | None = None

    def done(self) -> bool:
        return self._data is not None or self._promise._state != "pending"

    def wait(self) -> bytes:
        if self._data is None:
            try:
                self._promise.sync_wait()
            except Exception as e:
                raise GpuError("read", self._staging.name, str(e)) from e
            self._data = bytes(self._staging.handle.read_mapped())[: self._size]
            self._staging.handle.unmap()
            self._backend.destroy_buffer(self._staging)
        return self._data
