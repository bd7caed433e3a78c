"""`webgguf inspect MODEL --plan`: every dispatch of a model's decode step and of a prefill chunk, with the
kernel that runs it on an adapter, its specialization, its workgroups and why it was chosen.

The plans are the engine's own (GpuModel, the fusion passes, the lowering, selection.py), built against a
backend that allocates and runs nothing, so this answers for any model on any adapter description in
a second, without uploading weights.
"""

from __future__ import annotations

import dataclasses

from . import arch, selection
from .caps import AdapterCaps
from .gpu.base import BindGroup
from .lower import StepNote
from .preflight import WEBGPU_DEFAULT_LIMITS, SizingBackend

# The adapters a plan can be explained for besides this machine's ("native").
DESCRIBED_ADAPTERS = {
    # Chromium's SwiftShader (what the page gets without a GPU): no shader-f16, no subgroups, WebGPU's
    # default limits, a CPU adapter.
    "cpu": ("a CPU adapter (SwiftShader-like)", frozenset(), None, WEBGPU_DEFAULT_LIMITS, True),
    # A discrete GPU as wgpu-native sees an NVIDIA one under Vulkan: shader-f16, subgroups of 32, storage
    # bindings of 2 GiB - 4, workgroups of up to 1024 invocations and 48 KiB, 16 storage buffers per
    # stage (it reports far more); the other limits WebGPU's defaults.
    "gpu": (
        "a GPU (NVIDIA-like: subgroups of 32)",
        frozenset({"shader-f16", "subgroups", "timestamp-query"}),
        (32, 32),
        dataclasses.replace(
            WEBGPU_DEFAULT_LIMITS,
            max_storage_buffer_binding_size=(2 << 30) - 4,
            max_compute_invocations_per_workgroup=1024,
            max_compute_workgroup_size_x=1024,
            max_storage_buffers_per_shader_stage=16,
            max_compute_workgroup_storage_size=48 << 10,
        ),
        False,
    ),
}
ADAPTERS = ("native", *DESCRIBED_ADAPTERS)


class PlanningBackend(SizingBackend):
    """The pre-flight's backend (allocates nothing, records buffers) that also makes bind groups, so the
    engine's plans can be built; nothing is ever run."""

    def create_bind_group(self, name, pipeline, entries):
        return BindGroup(name, pipeline, None)


def planning_backend(adapter: str) -> PlanningBackend:
    """A backend that describes `adapter`: "native" (this machine's, as the engine would open it),
    "cpu" or "gpu" (DESCRIBED_ADAPTERS)."""
    if adapter == "native":
        from .gpu.native import NativeBackend

        try:
            native = NativeBackend()
        except Exception as e:  # no wgpu, no Vulkan driver, no adapter
            raise ValueError(f"no GPU adapter here ({e}); describe one with --adapter cpu or gpu") from None
        backend = PlanningBackend(native.limits, native.features, native.subgroup_sizes, native.cpu_adapter)
        backend.adapter_name = native.adapter_name
        return backend
    if adapter not in DESCRIBED_ADAPTERS:
        raise ValueError(f"unknown adapter {adapter!r} (have {', '.join(ADAPTERS)})")
    name, features, subgroup_sizes, limits, cpu = DESCRIBED_ADAPTERS[adapter]
    backend = PlanningBackend(limits, features, subgroup_sizes, cpu)
    backend.adapter_name = name
    return backend


def explain(
    header, backend: PlanningBackend, *, f16: bool = False, n_ctx: int = 2048, chunk: int | None = None
) -> dict:
    """The notes of the greedy decode step and of a last prefill chunk of `chunk` tokens (None: the
    engine's prefill step for the adapter), with what they were chosen for: {"adapter", "caps",
    "fusions", "plans": {title: [StepNote]}}."""
    from .plan import GpuModel, PlanShape

    caps = AdapterCaps.of(backend, f16=f16)
    chunk = selection.prefill_chunk(caps.cpu_shapes) if chunk is None else chunk
    if n_ctx < 1 or chunk < 1:
        raise ValueError("the context and the chunk need at least one token")
    config = arch.config_from_metadata(header.metadata, list(header.tensors))
    module = arch.gpu_module_for(config)
    n_ctx = min(n_ctx, config.n_ctx_train)
    shape = PlanShape(n_ctx=n_ctx, max_chunk=chunk, score_chunk=1, ring=4)
    gpu = GpuModel(config, module, backend, shape, caps)
    gpu.weight_targets(header.tensors)  # the weights as the engine creates (and splits) them
    decode = gpu.decode_plan(greedy=True)
    prefill = gpu.prefill_plan(chunk, last=True, greedy=True)
    return {
        "adapter": backend.adapter_name,
        "caps": caps.describe(),
        "fusions": sorted(gpu.fusions),
        "plans": {
            "decode step": gpu.explain(decode),
            f"prefill chunk of {chunk} tokens (the last: output head and sampler)": gpu.explain(prefill),
        },
    }


def matching(notes: list[StepNote], text: str | None) -> list[StepNote]:
    """The notes whose tensor or dispatch name contains `text` (all without one)."""
    if not text:
        return notes
    return [n for n in notes if text in n.tensor or text in n.name]


def as_json(result: dict, text: str | None) -> dict:
    plans = {
        title: [dataclasses.asdict(n) for n in matching(notes, text)]
        for title, notes in result["plans"].items()
    }
    return result | {"plans": plans}


def format_text(result: dict, text: str | None) -> str:
    lines = [f"adapter  {result['adapter']}: {result['caps']}", f"fusions  {', '.join(result['fusions'])}"]
    for title, notes in result["plans"].items():
        shown = matching(notes, text)
        count = sum(n.op != "copy" for n in notes)
        which = f"{len(shown)} of {len(notes)} steps shown" if text else f"{count} dispatches"
        lines += ["", f"{title}: {which}"]
        for n in shown:
            groups = "x".join(map(str, n.workgroups))
            lines.append(f"  {n.name}  [{n.op}, {groups} workgroups]  {n.kernel}")
            if n.reason:
                lines.append(f"      {n.reason}")
    return "\n".join(lines)
