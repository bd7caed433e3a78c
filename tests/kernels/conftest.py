"""GPU fixtures for kernel tests: one device per feature set for the whole session.

"full" enables every optional feature the adapter has (on lavapipe: shader-f16, subgroups,
timestamp-query); "plain" turns shader-f16 and subgroups off, the browser's SwiftShader case.
Tests that take `backend` or `kernels` run once per feature set. Without wgpu or a Vulkan adapter the
kernel tests are skipped with the reason, and fail when CI is set (tests/conftest.py).
"""

import importlib.util

import pytest

FEATURE_SETS = {"full": frozenset(), "plain": frozenset({"shader-f16", "subgroups"})}


@pytest.fixture(scope="session")
def native_backends(require):
    require(importlib.util.find_spec("wgpu") is not None, "no wgpu: pip install -e '.[native,test]'")
    from webgguf.gpu.native import NativeBackend

    cache = {}
    failures = {}

    def get(feature_set: str):
        if feature_set not in cache and feature_set not in failures:
            try:
                cache[feature_set] = NativeBackend(disable_features=FEATURE_SETS[feature_set])
            except Exception as e:  # no adapter at all (no Vulkan driver): nothing to test on
                failures[feature_set] = f"no GPU adapter (NativeBackend failed: {e})"
        require(feature_set in cache, failures.get(feature_set, ""))
        return cache[feature_set]

    return get


@pytest.fixture(scope="session", params=sorted(FEATURE_SETS))
def backend(request, native_backends):
    return native_backends(request.param)


@pytest.fixture(scope="session")
def kernels(backend):
    """The kernels of `backend` with every feature it has (f16 tiles included) and the GPU shapes."""
    from webgguf.kernels import Kernels

    return Kernels(backend)


@pytest.fixture(scope="session")
def cpu_shaped_kernels(kernels):
    """`kernels` with the CPU adapters' barrier-free kernels (gemv_rows.wgsl, gemm_rows.wgsl), sharing
    the compiled pipelines."""
    import dataclasses

    return kernels.with_caps(dataclasses.replace(kernels.caps, cpu_shapes=True))


@pytest.fixture(scope="session")
def f16_kernels(native_backends):
    """Kernels on the full feature set, for the f16 paths (the plain set has no shader-f16 by design)."""
    from webgguf.kernels import Kernels

    backend = native_backends("full")
    if "shader-f16" not in backend.features:
        pytest.skip(f"the adapter ({backend.adapter_name}) has no shader-f16")
    return Kernels(backend)


@pytest.fixture(params=[False, True], ids=["tiles", "rows"])
def gemm_kernels(request, kernels, cpu_shaped_kernels):
    """`kernels` with gemm.wgsl (tiles) or with the CPU adapters' barrier-free kernels (rows:
    gemm_rows.wgsl)."""
    return cpu_shaped_kernels if request.param else kernels


@pytest.fixture(params=[False, True], ids=["gemv", "rows"])
def gemv_kernels(request, kernels, cpu_shaped_kernels):
    """`kernels` with gemv.wgsl or with the CPU adapters' barrier-free GEMV (rows: gemv_rows.wgsl)."""
    return cpu_shaped_kernels if request.param else kernels
