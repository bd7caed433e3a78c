"""Pre-flight: will this model run on this GPU? Answered from the GGUF header and the adapter's limits
before a single weight byte is downloaded or allocated.

The sizes are not estimated by a separate formula: the engine's own `GpuModel` is built against a
backend that only records buffers (`SizingBackend`), so the weights are split into parts under
maxStorageBufferBindingSize exactly as the real load splits them, and the KV cache and activations
have exactly the sizes the real load creates. Then every buffer is checked against the limits:

- maxBufferSize: no buffer may be larger;
- maxStorageBufferBindingSize: every buffer is bound whole by some kernel (weights are split into
  parts that fit; the KV cache of a layer, the activations and a fused [gate; up] matrix are not);
- memory: WebGPU does not say how much memory a GPU has. The caller may pass an estimate (the page:
  navigator.deviceMemory); needing more than half of it gives a warning, never a refusal, since the
  estimate is rough (Chrome caps it at 8 GiB) and a discrete GPU has its own memory.

What does not fit is said plainly, with what would: the longest context whose KV cache fits, and the
smallest common quantization whose weights fit.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from . import arch, selection
from .gpu.base import Backend, Buffer, Limits, Pipeline
from .quants import TYPE_BY_NAME
from .weights import raw_row_bytes, weight_row_bytes

MEMORY_WARNING_FRACTION = 0.5  # of the memory estimate: above it, the model may not fit
# Quantizations suggested when the weights are too large, best quality first (GGUF file types name
# the mix; the type here is that of the large matrices).
SMALLER_QUANTS = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_0", "Q3_K", "Q2_K")
CONTEXT_STEP = 256  # suggested contexts are multiples of this


class PreflightError(ValueError):
    """The model does not fit the adapter; the message says what and what would."""


@dataclass
class Report:
    n_ctx: int
    weight_bytes: int  # the model's matrices and vectors on the GPU (repacked layout)
    kv_bytes: int  # K and V caches of every layer at n_ctx
    activation_bytes: int  # per-step working buffers
    staging_bytes: int  # the repack staging buffer, alive during the load only
    largest_binding: tuple[str, int]  # (buffer name, bytes): the largest buffer a kernel binds whole
    limits: dict[str, int]
    memory_bytes: int | None  # the caller's estimate of the memory available, if any
    problems: list[str] = field(default_factory=list)  # what does not fit: the load would fail
    warnings: list[str] = field(default_factory=list)  # what may not fit
    suggestions: list[str] = field(default_factory=list)  # what would fit

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def total_bytes(self) -> int:
        """GPU memory at the peak of the load (the staging buffer is freed after it)."""
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + self.staging_bytes

    def message(self) -> str:
        """One paragraph for a person: what the model needs, what does not fit, what would."""
        needs = (
            f"needs {_mib(self.total_bytes)} of GPU memory (weights {_mib(self.weight_bytes)}, "
            f"KV cache at a context of {self.n_ctx} {_mib(self.kv_bytes)}, "
            f"working buffers {_mib(self.activation_bytes + self.staging_bytes)})"
        )
        lines = [f"The model {needs}."]
        if self.problems:
            lines.append("It does not fit this GPU: " + "; ".join(self.problems) + ".")
        if self.warnings:
            lines.append(" ".join(self.warnings))
        if self.suggestions:
            lines.append("What would fit: " + "; ".join(self.suggestions) + ".")
        return " ".join(lines)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["largest_binding"] = {"name": self.largest_binding[0], "bytes": self.largest_binding[1]}
        out.update(fits=self.fits, total_bytes=self.total_bytes, message=self.message())
        return out


class SizingBackend(Backend):
    """A backend that allocates nothing: it records the buffers the engine would create."""

    def __init__(self, limits: Limits, features=frozenset(), subgroup_sizes=None, cpu_adapter=False):
        super().__init__()
        self.adapter_name = "pre-flight"
        self.limits = limits
        self.features = frozenset(features)
        self.subgroup_sizes = subgroup_sizes
        self.cpu_adapter = cpu_adapter
        self.buffers: list[Buffer] = []

    def create_buffer(self, name: str, size: int, usage: str) -> Buffer:
        size = max(4, -(-size // 4) * 4)
        buffer = Buffer(name, size, usage, None)
        self.buffers.append(buffer)
        self._count_alloc(size)
        return buffer

    def write_buffer(self, buffer, data, offset=0) -> None:
        pass

    def destroy_buffer(self, buffer) -> None:
        pass

    def create_pipeline(self, name, wgsl):
        return Pipeline(name, None)

    def create_bind_group(self, name, pipeline, entries):
        raise NotImplementedError("pre-flight builds no plans")

    def replay(self, plan, repeat=1) -> None:
        raise NotImplementedError("pre-flight runs nothing")

    def read_async(self, buffer, offset=0, size=None):
        raise NotImplementedError("pre-flight reads nothing")

    def profile(self, plan):
        raise NotImplementedError("pre-flight runs nothing")


def plan_shape(config, limits: Limits, n_ctx: int, max_chunk: int, batch: int):
    """The PlanShape GpuEngine chooses for these arguments (engine.GpuEngine.__init__)."""
    from .plan import PlanShape

    score_chunk = selection.score_chunk(max_chunk, config.n_vocab, limits.max_storage_buffer_binding_size)
    n_ctx = min(n_ctx, config.n_ctx_train)
    return PlanShape(
        n_ctx=n_ctx, max_chunk=max_chunk, score_chunk=score_chunk, ring=4 * batch + 4, n_splits=64
    )


def check(
    header,
    limits: Limits,
    n_ctx: int = 2048,
    *,
    max_chunk: int | None = None,
    batch: int = 4,
    memory_bytes: int | None = None,
    features=frozenset(),
    subgroup_sizes=None,
    cpu_adapter: bool = False,
) -> Report:
    """What the model of `header` needs at context `n_ctx` (capped at its training context) against
    the adapter's `limits` (and `memory_bytes`, an estimate of the memory available, if known)."""
    config = arch.config_from_metadata(header.metadata, list(header.tensors))
    module = arch.gpu_module_for(config)
    max_chunk = max_chunk or selection.prefill_chunk(cpu_adapter)
    shape = plan_shape(config, limits, n_ctx, max_chunk, batch)
    sizes = _sizes(config, module, header, limits, shape, features, subgroup_sizes, cpu_adapter)
    report = Report(
        n_ctx=shape.n_ctx,
        weight_bytes=sizes["weights"],
        kv_bytes=sizes["kv"],
        activation_bytes=sizes["activations"],
        staging_bytes=sizes["staging"],
        largest_binding=sizes["largest"],
        limits={
            "max_buffer_size": limits.max_buffer_size,
            "max_storage_buffer_binding_size": limits.max_storage_buffer_binding_size,
        },
        memory_bytes=memory_bytes,
    )
    binding, max_buffer = limits.max_storage_buffer_binding_size, limits.max_buffer_size
    kv_layer = sizes["kv_layer"]
    too_large: dict[tuple[str, int, str], int] = {}  # (buffer, bytes, limit) -> how many such buffers
    for name, size in sizes["unsplit"]:
        limit = (
            "maxBufferSize" if size > max_buffer else "maxStorageBufferBindingSize" if size > binding else ""
        )
        if limit:
            kind = re.sub(r"^blk\.\d+\.", "blk.N.", name)  # one line for the same buffer of every layer
            too_large[kind, size, limit] = too_large.get((kind, size, limit), 0) + 1
    for (kind, size, limit), count in too_large.items():
        value = max_buffer if limit == "maxBufferSize" else binding
        what = f"the {count} buffers {kind} need" if count > 1 else f"the buffer {kind} needs"
        each = " each" if count > 1 else ""
        report.problems.append(f"{what} {_mib(size)}{each} in one binding, over {limit} ({_mib(value)})")
    if memory_bytes and report.total_bytes > MEMORY_WARNING_FRACTION * memory_bytes:
        report.warnings.append(
            f"It needs {_mib(report.total_bytes)} and this device reports about {_mib(memory_bytes)} "
            "of memory: it may not fit."
        )
    # What would fit: a shorter context when the KV cache is the problem (or much of the memory).
    memory_short = bool(report.warnings)
    kv_too_large = kv_layer > min(binding, max_buffer)
    if kv_too_large or (memory_short and report.kv_bytes > report.weight_bytes / 4):
        budget = None
        if memory_short:
            budget = MEMORY_WARNING_FRACTION * memory_bytes - (report.total_bytes - report.kv_bytes)
        longest = _longest_context(config, shape.n_ctx, kv_layer, min(binding, max_buffer), budget)
        if longest:
            kv_then = kv_layer * longest // shape.n_ctx * 2 * config.n_layer
            report.suggestions.append(f"a context of {longest} tokens (KV cache {_mib(kv_then)})")
        else:
            report.suggestions.append(f"no context of {CONTEXT_STEP} tokens or more fits")
    # ... a smaller quantization when the weights are the problem.
    unsplit_weights = [
        name for name, size in sizes["unsplit"] if size > binding and name in sizes["weight_names"]
    ]
    if memory_short or unsplit_weights:
        quant = _smaller_quant(sizes, memory_bytes, binding, unsplit_weights)
        if quant:
            report.suggestions.append(quant)
    return report


def _sizes(config, module, header, limits, shape, features, subgroup_sizes, cpu_adapter) -> dict:
    """Buffer sizes of the real load, from GpuModel built on a SizingBackend."""
    from .plan import GpuModel

    # GpuModel refuses a KV cache over one binding while it is built: build it against unbounded
    # limits and check every buffer against the real ones afterwards (weights are split by the
    # real binding size: the limits are put back before they are created).
    unbounded = dataclasses.replace(limits, max_storage_buffer_binding_size=1 << 62, max_buffer_size=1 << 62)
    backend = SizingBackend(unbounded, features, subgroup_sizes, cpu_adapter)
    gpu = GpuModel(config, module, backend, shape)  # caps from the backend: its cpu_adapter
    kv_buffers = {id(b) for b in (*gpu.k_cache, *gpu.v_cache)}
    kv = sum(b.size for b in backend.buffers if id(b) in kv_buffers)
    activations = backend.live_bytes - kv
    n_before = len(backend.buffers)
    backend.limits = limits
    targets = gpu.weight_targets(header.tensors)  # the engine's own weight creation and splitting
    weights = backend.live_bytes - kv - activations
    # The repack staging buffer holds the raw bytes of the largest (tensor, part) piece of a block format.
    staging = 0
    for info, target, row in targets:
        if getattr(target, "type_name", "F32") in ("F32", "F16"):
            continue
        raw_row = raw_row_bytes(target.type_name, target.n_in)
        for part in target.parts:
            rows = min(row + _rows(info), part.row_end) - max(row, part.row_begin)
            staging = max(staging, rows * raw_row)
    staging = -(-staging // 4) * 4
    # Buffers bound whole that the engine does not split: all but the weight parts (which are cut to
    # fit), plus a fused [gate; up] matrix of more than one part (its kernel takes one part).
    unsplit = [(b.name, b.size) for b in backend.buffers[:n_before]]
    matrices = {id(t): t for _, t, _ in targets if hasattr(t, "parts")}  # a matrix of several tensors: once
    weight_names = set()
    for weight in matrices.values():
        if "ffn_gate_up" in weight.name and len(weight.parts) > 1:
            row_bytes = sum(weight_row_bytes(weight.type_name, weight.n_in).values())
            unsplit.append((weight.name, weight.n_out * row_bytes))
            weight_names.add(weight.name)
    if staging:
        unsplit.append(("repack.staging", staging))
    whole = [(b.name, b.size) for b in backend.buffers] + unsplit
    return {
        "weights": weights,
        "kv": kv,
        "kv_layer": gpu.k_cache[0].size if gpu.k_cache else 0,
        "activations": activations,
        "staging": staging,
        "largest": max(whole, key=lambda t: t[1]),
        "unsplit": unsplit,
        "weight_names": weight_names,
        "matrices": list(matrices.values()),
        "vector_bytes": sum(t.size for _, t, _ in targets if not hasattr(t, "parts")),
    }


def _longest_context(config, n_ctx: int, kv_layer: int, per_buffer: int, budget: float | None) -> int:
    """The longest context (a multiple of CONTEXT_STEP below n_ctx) whose KV cache fits one buffer of
    `per_buffer` bytes and, if given, `budget` bytes in total; 0 if none."""
    per_token_layer = kv_layer / n_ctx  # bytes per position of one layer's K (or V) cache
    longest = int(per_buffer // per_token_layer)
    if budget is not None:
        longest = min(longest, int(max(0, budget) // (per_token_layer * 2 * config.n_layer)))
    longest = min(longest, n_ctx - 1) // CONTEXT_STEP * CONTEXT_STEP
    return longest if longest >= CONTEXT_STEP else 0


def _smaller_quant(sizes, memory_bytes, binding, unsplit_weights) -> str | None:
    """The best quantization (of SMALLER_QUANTS) of the model's matrices that would fit, as a phrase."""
    others = sizes["kv"] + sizes["activations"]
    for quant in SMALLER_QUANTS:
        block = TYPE_BY_NAME[quant].block_elems
        if any(w.n_in % block for w in sizes["matrices"]):
            continue  # the matrices' width does not take this format
        sized = [(w.name, w.n_out * sum(weight_row_bytes(quant, w.n_in).values())) for w in sizes["matrices"]]
        total = sum(size for _, size in sized) + sizes["vector_bytes"]
        if total >= sizes["weights"] or any(n in unsplit_weights and b > binding for n, b in sized):
            continue
        if memory_bytes and total + others > MEMORY_WARNING_FRACTION * memory_bytes:
            continue
        return f"a {quant} quantization of this model (weights about {_mib(total)})"
    return None


def _rows(info) -> int:
    return info.shape[1] if len(info.shape) > 1 else 1


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


# WebGPU's default limits: what every adapter offers (a page that asks for nothing more gets these).
WEBGPU_DEFAULT_LIMITS = Limits(
    max_storage_buffer_binding_size=128 << 20,
    max_buffer_size=256 << 20,
    max_storage_buffers_per_shader_stage=8,
    max_compute_workgroups_per_dimension=65535,
    max_compute_invocations_per_workgroup=256,
    max_compute_workgroup_storage_size=16384,
    max_uniform_buffer_binding_size=65536,
    min_storage_buffer_offset_alignment=256,
    min_uniform_buffer_offset_alignment=256,
    max_compute_workgroup_size_x=256,
)


def main(argv=None) -> int:
    """`python -m webgguf.preflight MODEL.gguf [--n-ctx N] [--max-binding B] [--max-buffer B]
    [--memory B]`: the report for a file against WebGPU's default limits (or the ones given).
    Exit status 1 when it does not fit."""
    import argparse

    from .gguf import read_header

    parser = argparse.ArgumentParser(prog="python -m webgguf.preflight", description=main.__doc__)
    parser.add_argument("model", help="a .gguf file")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument(
        "--max-binding", type=int, default=WEBGPU_DEFAULT_LIMITS.max_storage_buffer_binding_size
    )
    parser.add_argument("--max-buffer", type=int, default=WEBGPU_DEFAULT_LIMITS.max_buffer_size)
    parser.add_argument("--memory", type=int, default=None, help="bytes of memory the device has")
    args = parser.parse_args(argv)
    limits = dataclasses.replace(
        WEBGPU_DEFAULT_LIMITS,
        max_storage_buffer_binding_size=args.max_binding,
        max_buffer_size=args.max_buffer,
    )
    report = check(read_header(args.model), limits, args.n_ctx, memory_bytes=args.memory)
    print(report.message())
    return 0 if report.fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
