"""What an adapter offers the kernels, as one frozen value built once per device.

Kernel selection (selection.py) and the fusion passes (passes.py) read only this value, never the backend:
the same caps give the same plans, whatever object carries them (a real device, the pre-flight's sizing
backend, `webgguf inspect --plan`). Nothing changes it after construction; a test that wants GPU shapes
on a CPU adapter builds another one: `dataclasses.replace(caps, cpu_shapes=False)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu.base import Backend, Limits

# Subgroups wider than this are not used: the kernels' subgroup reductions assume rows of at most 128
# invocations (gemv.wgsl ROW_THREADS <= 128).
MAX_SUBGROUP_USED = 128


@dataclass(frozen=True)
class AdapterCaps:
    features: frozenset[str]  # enabled optional features (WebGPU names: "shader-f16", "subgroups", ...)
    limits: Limits
    subgroup_sizes: tuple[int, int] | None  # (min, max) subgroup size; None without "subgroups"
    # The barrier-free kernel shapes of CPU adapters (lavapipe, SwiftShader: a workgroup barrier costs
    # ~2 us per invocation there, docs/GPU.md "CPU adapters"); by default what the adapter is.
    cpu_shapes: bool
    # f16 GEMM tiles and KV cache: the engine's precision choice (opt-in, docs/ENGINE.md "Precision"),
    # true only where the adapter has shader-f16.
    f16: bool
    # Large linears read 8-bit activation blocks with integer dot products (dot4I8Packed, core WGSL):
    # by default on GPU shapes (selection.int8_linear says which linears); CPU adapters keep their
    # barrier-free f32 kernels. Off, every linear stays f32 (the 1e-3 logits of docs/ENGINE.md).
    int8: bool = False
    # The least bytes of weights a linear takes the integer path for; None: selection.s
    # INT8_MIN_BYTES (tests set 0 to run every linear of a small model that way).
    int8_min_bytes: int | None = None
    # The least outputs a GEMV writes as the next linear's 8-bit blocks for (passes.quantize_outputs);
    # None: selection.QUANT_OUT_MIN_OUTPUTS (tests set 0 to fold in a small model too).
    quant_out_min_outputs: int | None = None
    # A GEMV shape fixed for every GEMV (tests); None: chosen per matrix (selection.gemv_shape).
    gemv_rows: int | None = None
    gemv_row_threads: int | None = None

    @classmethod
    def of(
        cls,
        backend: Backend,
        *,
        f16: bool = False,
        cpu_shapes: bool | None = None,
        int8: bool | None = None,
        int8_min_bytes: int | None = None,
        quant_out_min_outputs: int | None = None,
        gemv_rows: int | None = None,
        gemv_row_threads: int | None = None,
    ) -> AdapterCaps:
        """The caps of `backend`'s adapter. f16: use shader-f16 where the adapter has it; cpu_shapes:
        None follows the adapter (`backend.cpu_adapter`); int8: None for GPU shapes, not CPU ones."""
        cpu_shapes = backend.cpu_adapter if cpu_shapes is None else cpu_shapes
        return cls(
            features=frozenset(backend.features),
            limits=backend.limits,
            subgroup_sizes=backend.subgroup_sizes,
            cpu_shapes=cpu_shapes,
            f16=f16 and "shader-f16" in backend.features,
            int8=not cpu_shapes if int8 is None else int8,
            int8_min_bytes=int8_min_bytes,
            quant_out_min_outputs=quant_out_min_outputs,
            gemv_rows=gemv_rows,
            gemv_row_threads=gemv_row_threads,
        )

    @property
    def subgroups(self) -> bool:
        """Subgroup reductions are used (the feature, with subgroups the kernels can take)."""
        return self.subgroup_sizes is not None and self.subgroup_sizes[1] <= MAX_SUBGROUP_USED

    @property
    def max_subgroup(self) -> int:
        """The widest subgroup the kernels may see (0 without subgroup reductions)."""
        return self.subgroup_sizes[1] if self.subgroups else 0

    def describe(self) -> str:
        """One line for people: what the kernels are chosen for."""
        sizes = "no subgroups"
        if self.subgroup_sizes is not None:
            low, high = self.subgroup_sizes
            sizes = f"subgroups of {low}" if low == high else f"subgroups of {low}-{high}"
        return ", ".join(
            [
                "CPU-adapter shapes" if self.cpu_shapes else "GPU shapes",
                sizes,
                "f16" if self.f16 else "f32",
                "integer dot products" if self.int8 else "no integer dot products",
                f"storage bindings of {self.limits.max_storage_buffer_binding_size} bytes",
            ]
        )
