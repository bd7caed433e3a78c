"""Pre-flight (py/webgguf/preflight.py) against the real SmolLM2 header: the sizes equal those of a
real engine build, and limits that are too small give plain problems and suggestions that hold."""

import dataclasses

import pytest

from webgguf import preflight
from webgguf.gguf import read_header

MODEL = "smollm2-135m-instruct"
# SwiftShader's limits in Chromium (the browser tests' adapter)
LIMITS = dataclasses.replace(
    preflight.WEBGPU_DEFAULT_LIMITS,
    max_storage_buffer_binding_size=1 << 30,
    max_buffer_size=1 << 30,
    max_storage_buffers_per_shader_stage=10,
)


@pytest.fixture(scope="module")
def header(model_path):
    return read_header(model_path(MODEL))


def test_fits_and_sizes_match_the_engine(header, model_path):
    report = preflight.check(header, LIMITS, 2048)
    assert report.fits and not report.problems and not report.suggestions
    config = _config(header)
    # K and V: n_layer x 2 x n_head_kv x n_ctx x head_dim f32
    assert report.kv_bytes == config.n_layer * 2 * config.n_head_kv * 2048 * config.head_dim * 4
    # the repacked weights are about the file's tensor data (Q4_1 keeps its size on the GPU)
    tensor_bytes = sum(t.nbytes for t in header.tensors.values())
    assert 0.95 * tensor_bytes <= report.weight_bytes <= 1.05 * tensor_bytes
    assert report.total_bytes == (
        report.weight_bytes + report.kv_bytes + report.activation_bytes + report.staging_bytes
    )
    assert report.largest_binding[1] <= LIMITS.max_storage_buffer_binding_size
    assert report.to_dict()["fits"] is True
    assert "needs" in report.message()


def test_sizes_equal_a_real_engine_build(header, model_path):
    """The same buffers a GpuEngine creates on a backend that only records them (no GPU needed)."""
    from webgguf.engine import GpuEngine, LoadedModel

    backend = preflight.SizingBackend(LIMITS)
    engine = GpuEngine(LoadedModel.open(model_path(MODEL)), backend, n_ctx=1024, batch=4)  # default chunk
    engine.gpu.weight_targets(header.tensors)
    report = preflight.check(header, LIMITS, 1024)
    assert backend.live_bytes == report.weight_bytes + report.kv_bytes + report.activation_bytes


def test_context_is_capped_at_the_training_context(header):
    config = _config(header)
    report = preflight.check(header, LIMITS, 10 * config.n_ctx_train)
    assert report.n_ctx == config.n_ctx_train


def test_small_binding_says_what_does_not_fit_and_what_would(header):
    limits = dataclasses.replace(LIMITS, max_storage_buffer_binding_size=1 << 20)
    report = preflight.check(header, limits, 8192)
    assert not report.fits
    message = report.message()
    assert "does not fit" in message and "maxStorageBufferBindingSize (1.0 MiB)" in message
    # one line per kind of buffer, not one per layer
    assert "the 30 buffers blk.N.k_cache" in message and "blk.0." not in message
    # the suggested context really fits: check it again
    context = next(s for s in report.suggestions if s.startswith("a context of"))
    n_ctx = int(context.split()[3])
    assert 256 <= n_ctx < 8192
    shorter = preflight.check(header, limits, n_ctx)
    assert not any("k_cache" in p or "v_cache" in p for p in shorter.problems)
    # the fused [gate; up] matrix cannot be split: a smaller quantization is suggested
    assert any("ffn_gate_up" in p for p in report.problems)
    assert any("Q4_0 quantization" in s for s in report.suggestions)


def test_max_buffer_size_is_checked(header):
    limits = dataclasses.replace(LIMITS, max_buffer_size=1 << 20, max_storage_buffer_binding_size=1 << 20)
    report = preflight.check(header, limits, 2048)  # a layer's K cache: 1.5 MiB
    assert not report.fits
    assert any("k_cache" in p and "over maxBufferSize (1.0 MiB)" in p for p in report.problems)


def test_memory_estimate_warns_but_does_not_refuse(header):
    report = preflight.check(header, LIMITS, 8192, memory_bytes=512 << 20)
    assert report.fits  # the estimate is rough: a warning, not a refusal
    assert report.warnings and "may not fit" in report.message()
    context = [s for s in report.suggestions if s.startswith("a context of")]
    assert context, report.suggestions
    n_ctx = int(context[0].split()[3])
    again = preflight.check(header, LIMITS, n_ctx, memory_bytes=512 << 20)
    assert not again.warnings


def test_plenty_of_memory_gives_no_warning(header):
    report = preflight.check(header, LIMITS, 2048, memory_bytes=16 << 30)
    assert report.fits and not report.warnings and not report.suggestions


def test_unsupported_architecture_is_a_clear_error(header):
    metadata = dict(header.metadata, **{"general.architecture": "mamba"})
    broken = dataclasses.replace(header, metadata=metadata)
    with pytest.raises(Exception, match="unsupported architecture"):
        preflight.check(broken, LIMITS)


def _config(header):
    from webgguf import arch

    return arch.config_from_metadata(header.metadata, list(header.tensors))


def test_command_line(model_path, capsys):
    path = str(model_path(MODEL))
    assert preflight.main([path]) == 0  # fits WebGPU's default limits
    assert "The model needs" in capsys.readouterr().out
    assert preflight.main([path, "--n-ctx", "8192", "--max-binding", str(1 << 20)]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "a context of" in out
