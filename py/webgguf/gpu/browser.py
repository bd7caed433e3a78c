"""The backend protocol in the browser: Pyodide → navigator.gpu, through web/gpu_bridge.js.

The only module of the package that touches `pyodide` (and through it, JS). The WebGPU calls live in
the JS bridge (registered by the worker as the JS module `webgguf_gpu_bridge`); this side keeps the
Python objects of the protocol and calls the bridge a few times per operation:
- a plan is flattened into a JS array once (cached per Plan object) and replayed by one call;
- weight bytes go from a JS byte source (fetch stream, File) into GPU buffers inside JS (`upload`,
  or `JsByteSource.write_to`), so they never enter the wasm heap;
- reads are asynchronous: `await backend.read_async(...)`. The browser cannot block, so
  `PendingRead.wait()` (and the blocking `read`) only work once `done()` is true.

Errors: WebGPU reports them asynchronously (error scopes, `uncapturederror`, `device.lost`); they are
raised as GpuError, naming the operation and object, when a PendingRead resolves or at
`synchronize()`, so no later than the next read of this backend.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import Any

from pyodide.ffi import JsException, JsProxy, create_proxy, to_js

from .base import (
    LIMIT_NAMES,
    OPTIONAL_FEATURES,
    Backend,
    BindGroup,
    Buffer,
    BufferRange,
    Copy,
    DispatchTime,
    GpuError,
    Limits,
    PendingRead,
    Pipeline,
    Plan,
)

BRIDGE_MODULE = "webgguf_gpu_bridge"  # the name the worker registers web/gpu_bridge.js under
DISPATCH, COPY = 0, 1  # step kinds of a flattened plan (gpu_bridge.js: DISPATCH, COPY)


def _bridge():
    import importlib

    return importlib.import_module(BRIDGE_MODULE)


class BrowserBackend(Backend):
    """One WebGPU device of the page. Create with `await BrowserBackend.create()`."""

    def __init__(self, context: Any):
        """`context`: a GpuContext of gpu_bridge.js (use `create`, which opens one)."""
        super().__init__()
        self._context = context
        self.adapter_name = str(context.adapterName)
        self.features = frozenset(str(f) for f in context.features)
        limits = context.limits
        self.limits = Limits(*(int(getattr(limits, _camel_case(name))) for name in LIMIT_NAMES))
        sizes = context.subgroupSizes
        self.subgroup_sizes = None if sizes is None else (int(sizes[0]), int(sizes[1]))
        # WebGPU's "fallback adapter": a CPU implementation (SwiftShader), much slower than a GPU and
        # with other costs (the engine picks CPU kernel shapes: GpuModel).
        self.fallback_adapter = bool(context.fallbackAdapter)
        self.cpu_adapter = self.fallback_adapter
        self._plans: weakref.WeakKeyDictionary[Plan, Any] = weakref.WeakKeyDictionary()  # Plan → JS array

    @classmethod
    async def create(
        cls, disable_features: set[str] | frozenset[str] = frozenset(), on_lost=None
    ) -> BrowserBackend:
        """Open the adapter and a device with the adapter's limits and its optional features (minus
        `disable_features`). `on_lost(message)` (a JS function or a Python callable) is called if the
        device is lost later."""
        unknown = set(disable_features) - set(OPTIONAL_FEATURES)
        if unknown:
            raise ValueError(f"unknown features to disable: {sorted(unknown)}; known: {OPTIONAL_FEATURES}")
        wanted = [f for f in OPTIONAL_FEATURES if f not in disable_features]
        if on_lost is not None and not isinstance(on_lost, JsProxy):
            on_lost = create_proxy(on_lost)  # a Python callback JS keeps: it is called later
        try:
            context = await _bridge().openDevice(to_js(wanted), to_js(list(LIMIT_NAMES)), on_lost)
        except JsException as e:
            raise GpuError("request_device", "WebGPU", _js_message(e)) from e
        return cls(context)

    def destroy(self) -> None:
        """Release the device (its buffers with it)."""
        self._context.destroy()

    @property
    def lost(self) -> str | None:
        """Why the device was lost, or None while it works (a lost device needs a new backend)."""
        lost = self._context.lost
        return None if lost is None else str(lost)

    # ---- buffers

    def create_buffer(self, name: str, size: int, usage: str) -> Buffer:
        size = max(4, -(-size // 4) * 4)
        handle = self._call("create_buffer", name, self._context.createBuffer, name, size, usage)
        self._count_alloc(size)
        return Buffer(name, size, usage, handle)

    def write_buffer(self, buffer: Buffer, data, offset: int = 0) -> None:
        view = memoryview(data).cast("B")
        if len(view) % 4 or offset % 4:
            raise GpuError("write_buffer", buffer.name, f"{len(view)} bytes at {offset}: not multiples of 4")
        if offset + len(view) > buffer.size:
            raise GpuError(
                "write_buffer", buffer.name, f"{len(view)} bytes at {offset} overflow {buffer.size}"
            )
        self._call("write_buffer", buffer.name, self._context.writeBuffer, buffer.handle, offset, view)

    def destroy_buffer(self, buffer: Buffer) -> None:
        self._context.destroyBuffer(buffer.handle)
        self._count_free(buffer.size)

    # ---- kernels

    def create_pipeline(self, name: str, wgsl: str) -> Pipeline:
        return Pipeline(name, self._call("create_pipeline", name, self._context.createPipeline, name, wgsl))

    def create_bind_group(
        self, name: str, pipeline: Pipeline, entries: dict[int, Buffer | BufferRange]
    ) -> BindGroup:
        flat = []
        for binding, target in sorted(entries.items()):
            if isinstance(target, BufferRange):
                flat += [binding, target.buffer.handle, target.offset, target.size]
            else:
                flat += [binding, target.handle, 0, target.size]
        handle = self._call(
            "create_bind_group", name, self._context.createBindGroup, name, pipeline.handle, to_js(flat)
        )
        return BindGroup(name, pipeline, handle)

    # ---- running

    def replay(self, plan: Plan, repeat: int = 1) -> None:
        steps = self._plans.get(plan)
        if steps is None:
            steps = self._plans[plan] = to_js(_flatten(plan))
        self._call("replay", plan.name, self._context.replay, plan.name, steps, repeat)

    def read_async(self, buffer: Buffer, offset: int = 0, size: int | None = None) -> PendingRead:
        size = buffer.size - offset if size is None else size
        read = self._call("read", buffer.name, self._context.readAsync, buffer.handle, offset, size)
        return _BrowserPendingRead(self, buffer.name, read)

    def profile(self, plan: Plan) -> list[DispatchTime]:
        raise GpuError("profile", plan.name, "profiling needs a blocking read: use the native backend")

    # ---- browser-only

    async def upload(
        self, buffer: Buffer, buffer_offset: int, source: Any, file_offset: int, size: int
    ) -> None:
        """Copy `size` bytes at `file_offset` of `source` (a JS byte source of web/sources.js) into
        `buffer` at `buffer_offset`, entirely in JS. A tail that is not a multiple of 4 bytes is
        zero-padded: the buffer needs room for the padding."""
        if buffer_offset % 4 or buffer_offset + -(-size // 4) * 4 > buffer.size:
            raise GpuError("upload", buffer.name, f"{size} bytes at {buffer_offset} do not fit {buffer.size}")
        try:
            await self._context.upload(buffer.handle, buffer_offset, source, file_offset, size)
        except JsException as e:
            raise GpuError("upload", buffer.name, _js_message(e)) from e

    async def synchronize(self) -> None:
        """Wait for all submitted work; raise the first GPU error it (or anything before it) caused."""
        await self._context.synchronize()
        self.raise_errors()

    def raise_errors(self) -> None:
        """Raise the first GPU error recorded so far (as GpuError), if any."""
        errors = self._context.takeErrors().to_py()
        if errors:
            operation, name, message = errors[0]
            more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
            raise GpuError(operation, name, message + more)

    def _call(self, operation: str, name: str, function, *args):
        """Call into the bridge; a JS exception (invalid arguments, lost device) becomes a GpuError."""
        try:
            return function(*args)
        except JsException as e:
            raise GpuError(operation, name, _js_message(e)) from e


class JsByteSource:
    """A file held by JS (a byte source of web/sources.js: a fetch stream or a File) as Python sees it:
    its header bytes come into Python; its tensor bytes go from JS into GPU buffers."""

    def __init__(self, backend: BrowserBackend, source: Any):
        self.backend = backend
        self.source = source
        self.name = str(source.name)
        self.size = None if source.size is None else int(source.size)  # bytes; None: unknown

    async def head(self, n: int) -> bytes:
        """The first n bytes (fewer if the file is shorter). Only before write_to has moved on."""
        try:
            return (await self.source.head(n)).to_bytes()
        except JsException as e:
            raise OSError(f"{self.name}: {_js_message(e)}") from e

    async def write_to(self, buffer: Buffer, buffer_offset: int, file_offset: int, size: int) -> None:
        """Bytes [file_offset, file_offset + size) into `buffer` at `buffer_offset` (see upload)."""
        await self.backend.upload(buffer, buffer_offset, self.source, file_offset, size)


class _BrowserPendingRead(PendingRead):
    def __init__(self, backend: BrowserBackend, name: str, read: Any):
        self._backend = backend
        self._name = name
        self._read = read  # the bridge's read: {done, data, error, promise}
        self._data: bytes | None = None

    def done(self) -> bool:
        return self._data is not None or bool(self._read.done)

    def wait(self) -> bytes:
        if self._data is None:
            if not self._read.done:
                raise RuntimeError("the browser cannot block on the GPU: await the read (or poll done())")
            self._backend.raise_errors()
            if self._read.error is not None:
                raise GpuError("read", self._name, str(self._read.error))
            self._data = self._read.data.to_bytes()
            self._read = None  # drop the JS objects
        return self._data

    def __await__(self) -> Generator[Any, None, bytes]:
        if self._data is None and not self._read.done:
            yield from self._read.promise.__await__()
        return self.wait()


def _flatten(plan: Plan) -> list:
    """A plan as the flat step array of gpu_bridge.js (6 slots per step)."""
    flat: list = []
    for step in plan.steps:
        if isinstance(step, Copy):
            flat += [COPY, step.src.handle, step.dst.handle, step.size, step.src_offset, step.dst_offset]
        else:
            flat += [DISPATCH, step.pipeline.handle, step.bind_group.handle, step.x, step.y, step.z]
    return flat


def _camel_case(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(word.capitalize() for word in rest)


def _js_message(error: JsException) -> str:
    return str(getattr(error, "message", "") or error)
