"""A model switch frees all the GPU memory of the model before it (GpuEngine.release → GpuModel.release),
measured by the backend's own allocation counter (`live_bytes`), natively on lavapipe: the same backend
loads, runs and releases real and synthetic models several times, and returns to its baseline each time.
The page's worker releases models the same way (tests/e2e/test_model_switch.py)."""

import pytest
from test_arch_parity import load_refs, load_tool

from webgguf.engine import GpuEngine, LoadedModel
from webgguf.gguf import read_header
from webgguf.gpu.base import STORAGE, GpuError
from webgguf.preflight import SizingBackend
from webgguf.sampling import SamplingParams

wgpu = pytest.importorskip("wgpu")

PROMPT = "The capital of France is"
N_TOKENS = 3  # a prefill chunk, then decode batches: every kind of plan the page runs is built


@pytest.fixture(scope="module")
def backend():
    from webgguf.gpu.native import NativeBackend

    return NativeBackend()


@pytest.fixture(scope="module")
def synthetic_path(model_path, tmp_path_factory):
    """synthetic-qwen3 (tied output, q/k norms, F32 and F16 weights), rebuilt from its recipe."""
    refs = next(
        m for m in load_refs("arch_synthetic.json")["models"] if m["recipe"]["name"] == "synthetic-qwen3"
    )
    tool = load_tool("make_synthetic_models")
    path = tmp_path_factory.mktemp("release") / "synthetic-qwen3.gguf"
    tool.write_model(tool.Recipe(**refs["recipe"]), path, model_path("smollm2-135m-instruct"))
    return path


def generate(engine: GpuEngine, params: SamplingParams) -> list[int]:
    import asyncio

    ids = engine.model.prompt_ids(PROMPT)
    return asyncio.run(engine.generate(ids, params, N_TOKENS)).ids


def test_switching_models_returns_gpu_memory_to_its_baseline(backend, model_path, synthetic_path):
    smollm2 = LoadedModel.open(model_path("smollm2-135m-instruct"))
    synthetic = LoadedModel.open(synthetic_path)
    baseline = backend.live_bytes
    first_ids = {}
    # SmolLM2's plans take seconds to build and run on lavapipe: the sampling plans run on the small model
    for round_number, model in enumerate([smollm2, synthetic, smollm2, synthetic]):
        engine = GpuEngine(model, backend, n_ctx=256, max_chunk=32, batch=4)
        engine.upload_from_file()
        loaded = backend.live_bytes - baseline
        greedy = generate(engine, SamplingParams())
        if model is synthetic:
            assert generate(engine, SamplingParams(temperature=0.8, top_k=40, seed=round_number))
        assert greedy  # (an end-of-generation token may come before N_TOKENS)
        # the plans' Params buffers came on top of the weights, caches and activations
        assert backend.live_bytes > baseline + loaded
        engine.release()
        assert backend.live_bytes == baseline, (
            f"round {round_number}: {backend.live_bytes - baseline} bytes left"
        )
        # the same model on the same backend gives the same tokens after a release of its former self
        assert first_ids.setdefault(model.path.name, greedy) == greedy
    assert len(first_ids) == 2


def test_a_released_engine_refuses_to_run_and_a_second_release_does_nothing(backend, synthetic_path):
    baseline = backend.live_bytes
    engine = GpuEngine(LoadedModel.open(synthetic_path), backend, n_ctx=64, max_chunk=16, batch=4)
    engine.upload_from_file()
    engine.release()
    engine.release()
    assert backend.live_bytes == baseline
    with pytest.raises(RuntimeError, match="released"):
        generate(engine, SamplingParams())


def test_a_model_loaded_again_on_the_same_device_compiles_no_kernel(backend, synthetic_path):
    """Backend.pipeline: the kernels of a released model serve the next one (a model switch costs no
    compile), and the reloaded model gives the same tokens."""
    model = LoadedModel.open(synthetic_path)
    compiled = []
    create = backend.create_pipeline
    try:
        backend.create_pipeline = lambda name, wgsl: compiled.append(name) or create(name, wgsl)
        ids = []
        for _ in range(2):
            engine = GpuEngine(model, backend, n_ctx=64, max_chunk=16, batch=4)
            engine.upload_from_file()
            ids.append(generate(engine, SamplingParams()))
            engine.release()
            compiled.append("--- released")
    finally:
        del backend.create_pipeline
    first, second = "\n".join(compiled).split("--- released")[:2]
    assert second.strip() == "", f"compiled again after a release: {second.split()}"
    assert ids[0] == ids[1]


class FailingBackend(SizingBackend):
    """A backend (that allocates nothing) whose create_buffer fails like a device out of memory after
    `budget` buffers; it counts frees, unlike pre-flight's."""

    def __init__(self, limits, budget: int):
        super().__init__(limits)
        self.budget = budget

    def create_buffer(self, name, size, usage):
        if len(self.buffers) == self.budget:
            raise GpuError("create_buffer", name, "out of memory")
        return super().create_buffer(name, size, usage)

    def destroy_buffer(self, buffer):
        self._count_free(buffer.size)


@pytest.mark.parametrize("budget", [0, 5, 15, 30, 46])
def test_a_model_that_runs_out_of_memory_while_it_is_built_frees_what_it_made(
    backend, synthetic_path, budget
):
    """Out of memory in the KV caches (budget 0, 5), the activations (15) or the weights (30, 46): the
    model has 6 caches, then 15 activations, then 26 weight and vector buffers."""
    model = LoadedModel.open(synthetic_path)
    failing = FailingBackend(backend.limits, budget)
    with pytest.raises(GpuError, match="out of memory"):
        engine = GpuEngine(model, failing, n_ctx=64, max_chunk=16, batch=4)
        engine.gpu.weight_targets(read_header(synthetic_path).tensors)  # creates the (empty) weights
    if budget >= 21:  # the engine was built, its weights failed: the caller releases it
        engine.release()
    assert failing.live_bytes == 0 and len(failing.buffers) == budget
    assert all(b.usage == STORAGE for b in failing.buffers)
