"""Pre-flight at the sizes people run: the 7B and 8B models of the scale ladder (tools/ladder.py
headers: every tensor with llama.cpp's Q4_K_M types, no tokenizer needed for sizing) under the storage
binding limits browsers give: WebGPU's default 128 MiB, NVIDIA Vulkan and D3D12's 2 GiB - 4, Apple's
~4 GiB.

The answers that hold: each fits, every weight larger than a binding is split into parts that fit, and
the total is the weights and the KV cache plus the working buffers."""

import dataclasses
import sys
from pathlib import Path

import pytest

from webgguf import preflight
from webgguf.gguf import parse_header

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import ladder  # noqa: E402

BROWSER_LIMITS = {
    "webgpu-default": dataclasses.replace(preflight.WEBGPU_DEFAULT_LIMITS),
    "nvidia-d3d12": dataclasses.replace(
        preflight.WEBGPU_DEFAULT_LIMITS,
        max_storage_buffer_binding_size=(2 << 30) - 4,
        max_buffer_size=4 << 30,
    ),
    "apple": dataclasses.replace(
        preflight.WEBGPU_DEFAULT_LIMITS, max_storage_buffer_binding_size=4 << 30, max_buffer_size=4 << 30
    ),
}


@pytest.fixture(scope="module", params=["qwen2.5-7b", "llama-3.1-8b"])
def big_header(request):
    raw, _ = ladder.header_bytes(ladder.RECIPES[request.param], None)
    return parse_header(raw)


@pytest.mark.parametrize("limits_name", sorted(BROWSER_LIMITS))
def test_big_models_fit_browser_limits(big_header, limits_name):
    limits = BROWSER_LIMITS[limits_name]
    report = preflight.check(big_header, limits, 2048)
    assert report.fits, report.message()
    # The sizing build splits every weight past a binding into parts (the embedding and the output head
    # are 282-447 MB, past the default 128 MiB): none of its buffers is larger than a binding.
    assert report.largest_binding[1] <= limits.max_storage_buffer_binding_size
    if limits_name == "webgpu-default":
        assert big_header.tensors["token_embd.weight"].nbytes > limits.max_storage_buffer_binding_size
    tensor_bytes = sum(t.nbytes for t in big_header.tensors.values())
    assert 0.98 * tensor_bytes <= report.weight_bytes <= 1.02 * tensor_bytes
    config = big_header.metadata
    arch = config["general.architecture"]
    kv_heads, layers = config[f"{arch}.attention.head_count_kv"], config[f"{arch}.block_count"]
    assert report.kv_bytes == layers * 2 * kv_heads * 2048 * 128 * 4  # f32 K and V, head_dim 128
    assert report.total_bytes == (
        report.weight_bytes + report.kv_bytes + report.activation_bytes + report.staging_bytes
    )


def test_an_8_gib_estimate_warns_for_a_7b_model(big_header):
    """WebGPU does not say how much memory a GPU has; the page's estimate (Chrome caps it at 8 GiB)
    makes a 5+ GiB model a warning, never a refusal."""
    report = preflight.check(big_header, BROWSER_LIMITS["nvidia-d3d12"], 2048, memory_bytes=8 << 30)
    assert report.fits and report.warnings and "may not fit" in report.message()
