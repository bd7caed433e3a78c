"""GPU access: the backend protocol (base.py) and its implementations.

`native.NativeBackend` needs the `wgpu` package and is imported from `webgguf.gpu.native` explicitly;
`browser.BrowserBackend` runs in Pyodide. Nothing outside this package touches a GPU API.
"""

from .base import (
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
    time_by_kernel,
)

__all__ = [
    "READBACK",
    "STORAGE",
    "UNIFORM",
    "Backend",
    "BindGroup",
    "Buffer",
    "BufferRange",
    "Copy",
    "Dispatch",
    "DispatchTime",
    "GpuError",
    "Limits",
    "PendingRead",
    "Pipeline",
    "Plan",
    "time_by_kernel",
]
