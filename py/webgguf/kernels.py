"""The kernels of one device as the engine uses them: the pipeline cache, the adapter capabilities that
kernel selection reads, and the weight uploads.

Where the rest lives:
  pipelines.py  WGSL specialization, the pipeline cache, dispatches that bind buffers by name
  caps.py       AdapterCaps: what the adapter offers, built once
  selection.py  which kernel runs for an op, a weight format, a shape and an adapter, and why
  weights.py    weights in their GPU layout, and their upload (repacked on the GPU)
  ops/          dispatch builders: gemv, gemm, attention, norms, embedding, samplers
"""

from __future__ import annotations

from collections.abc import Callable

from .caps import AdapterCaps
from .gpu.base import STORAGE, Backend, Buffer
from .pipelines import SHADER_DIR, Pipelines
from .weights import WeightUploads

__all__ = ["SHADER_DIR", "Kernels"]  # SHADER_DIR: the page's worker reads the shader directory here


class Kernels(Pipelines):
    """The pipelines of one backend (Pipelines: get, dispatch, grid), with the caps the ops choose
    kernels for (`caps`) and the weight uploads that use them (`uploads`)."""

    def __init__(
        self,
        backend: Backend,
        caps: AdapterCaps | None = None,
        *,
        source_of: Callable[[str], str] | None = None,
    ):
        super().__init__(backend, source_of)
        # Without caps: every feature the adapter has, f16 included, and the GPU shapes whatever the
        # adapter is (what the kernel tests exercise). The engine passes the caps it decided on.
        self.caps = caps or AdapterCaps.of(backend, f16=True, cpu_shapes=False)
        self.uploads = WeightUploads(self)
        self._scratch: dict[str, Buffer] = {}

    def scratch(self, name: str, size: int) -> Buffer:
        """A working buffer of the ops (e.g. norm_inputs.wgsl's output), one per name: every dispatch
        that asks for it shares it, which is safe because dispatches run in order and each reader comes
        right after its writer."""
        if name not in self._scratch:
            self._scratch[name] = self.backend.create_buffer(name, size, STORAGE)
        return self._scratch[name]

    def release(self) -> None:
        """Free every buffer these kernels made (the Params of the dispatches built so far, the scratch
        buffers, the upload buffers): the plans built on them must not run again. Weights are the
        caller's."""
        self.uploads.release_upload_buffers()
        self.release_params()
        for buffer in self._scratch.values():
            self.backend.destroy_buffer(buffer)
        self._scratch = {}

    def with_caps(self, caps: AdapterCaps) -> Kernels:
        """These kernels chosen for other caps (e.g. a CPU adapter's shapes in a test), sharing the
        pipelines compiled so far: a pipeline depends on its defines only, never on the caps."""
        other = Kernels(self.backend, caps, source_of=self.source_of)
        other._cache = self._cache
        return other
