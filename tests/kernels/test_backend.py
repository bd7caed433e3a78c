"""The native backend against the protocol: buffers, plans with copies and repeats, asynchronous
readback, errors that name their kernel / buffer / plan, memory accounting, profiling."""

import asyncio
import struct

import pytest

from webgguf.gpu import STORAGE, Copy, Dispatch, GpuError, Plan, time_by_kernel
from webgguf.kernels import Kernels

ADD_ONE = """
@group(0) @binding(0) var<storage, read_write> data: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) {
        data[id.x] += 1u;
    }
}
"""


def u32s(data: bytes):
    return list(struct.unpack(f"<{len(data) // 4}I", data))


@pytest.fixture(scope="module")
def add_one(native_backends):
    backend = native_backends("plain")
    return backend, backend.create_pipeline("add_one", ADD_ONE)


def test_features_of_the_feature_sets(native_backends):
    plain = native_backends("plain")
    assert not {"shader-f16", "subgroups"} & plain.features and plain.subgroup_sizes is None
    full = native_backends("full")
    if "subgroups" in full.features:
        low, high = full.subgroup_sizes
        assert 1 <= low <= high <= 128 and high & (high - 1) == 0
    assert full.limits.max_storage_buffer_binding_size >= 128 << 20


def test_unknown_feature_to_disable():
    from webgguf.gpu.native import NativeBackend

    with pytest.raises(ValueError, match="unknown features"):
        NativeBackend(disable_features={"shader-f64"})


def test_write_read_and_size_rounding(add_one):
    backend, _ = add_one
    buffer = backend.create_buffer("six", 6, STORAGE)
    assert buffer.size == 8
    backend.write_buffer(buffer, struct.pack("<2I", 5, 9))
    assert u32s(backend.read(buffer, 4, 4)) == [9]
    backend.destroy_buffer(buffer)


def test_replay_copies_end_the_pass_and_repeat(add_one):
    backend, pipeline = add_one
    a = backend.create_buffer("a", 4 * 100, STORAGE)
    b = backend.create_buffer("b", 4 * 100, STORAGE)
    group_a = backend.create_bind_group("a", pipeline, {0: a})
    group_b = backend.create_bind_group("b", pipeline, {0: b})
    plan = Plan(
        "copy_between",
        (
            Dispatch(pipeline, group_a, 2),
            Dispatch(pipeline, group_a, 2),
            Copy(a, b, 400),
            Dispatch(pipeline, group_b, 2),
        ),
    )
    assert plan.dispatch_count == 3
    backend.replay(plan, repeat=3)
    # a: +2 per repeat. b: a copy of a, +1 (each repeat overwrites b with a).
    assert u32s(backend.read(a)) == [6] * 100
    assert u32s(backend.read(b)) == [7] * 100
    for buffer in (a, b):
        backend.destroy_buffer(buffer)


def test_a_long_plan_replayed_once_runs_in_order_over_several_submits(add_one):
    """A plan replayed once is submitted in parts (native.FIRST_SUBMIT_DISPATCHES, then doubling): each
    dispatch still sees the one before it, copies included, across the submits' boundaries."""
    from webgguf.gpu.native import FIRST_SUBMIT_DISPATCHES

    backend, pipeline = add_one
    a = backend.create_buffer("a", 4 * 100, STORAGE)
    b = backend.create_buffer("b", 4 * 100, STORAGE)
    group_a = backend.create_bind_group("a", pipeline, {0: a})
    group_b = backend.create_bind_group("b", pipeline, {0: b})
    n = 4 * FIRST_SUBMIT_DISPATCHES + 3  # submits after 16, 32 and 64 dispatches, then the rest
    # b = a + 1 after every 5th increment of a: the last copy takes a's count at that point
    steps = []
    for i in range(n):
        steps.append(Dispatch(pipeline, group_a, 2))
        if i % 5 == 4:
            steps += [Copy(a, b, 400), Dispatch(pipeline, group_b, 2)]
    backend.replay(Plan("long", tuple(steps)))
    assert u32s(backend.read(a)) == [n] * 100
    assert u32s(backend.read(b)) == [n - n % 5 + 1] * 100
    for buffer in (a, b):
        backend.destroy_buffer(buffer)


def test_read_async_poll_and_await(add_one):
    backend, pipeline = add_one
    buffer = backend.create_buffer("counter", 4, STORAGE)
    group = backend.create_bind_group("counter", pipeline, {0: buffer})
    backend.replay(Plan("count", (Dispatch(pipeline, group, 1),)), repeat=5)
    pending = backend.read_async(buffer)
    assert u32s(asyncio.run(_await(pending))) == [5]
    assert pending.done() and u32s(pending.wait()) == [5]
    backend.destroy_buffer(buffer)


async def _await(pending):
    return await pending


def test_errors_name_the_kernel_buffer_and_plan(native_backends, add_one):
    backend, pipeline = add_one
    with pytest.raises(GpuError, match="create_pipeline 'broken'") as error:
        backend.create_pipeline("broken", "fn main( {")
    assert "broken" in error.value.message
    buffer = backend.create_buffer("data", 16, STORAGE)
    with pytest.raises(GpuError, match="create_bind_group 'wrong for add_one'"):
        backend.create_bind_group("wrong", pipeline, {1: buffer})
    with pytest.raises(GpuError, match="write_buffer 'data'"):
        backend.write_buffer(buffer, bytes(32))
    with pytest.raises(GpuError, match="create_buffer 'huge'"):
        backend.create_buffer("huge", backend.limits.max_buffer_size + 4, STORAGE)
    other = native_backends("full")  # a bind group from another device cannot be replayed here
    other_buffer = other.create_buffer("other", 16, STORAGE)
    other_group = other.create_bind_group(
        "other", other.create_pipeline("add_one", ADD_ONE), {0: other_buffer}
    )
    with pytest.raises(GpuError, match="replay 'mixed'"):
        backend.replay(Plan("mixed", (Dispatch(pipeline, other_group, 1),)))
    backend.destroy_buffer(buffer)
    other.destroy_buffer(other_buffer)


def test_a_pipeline_is_compiled_once_per_device(native_backends):
    backend = native_backends("plain")
    assert backend.pipeline("add_one", ADD_ONE) is backend.pipeline("add_one", ADD_ONE)
    assert backend.pipeline("add_one[B]", ADD_ONE) is not backend.pipeline("add_one", ADD_ONE)  # own label
    with pytest.raises(GpuError, match="create_pipeline 'broken'"):
        backend.pipeline("broken", "fn main( {")
    assert ("broken", "fn main( {") not in backend._pipelines  # a failure is not kept
    assert native_backends("full").pipeline("add_one", ADD_ONE) is not backend.pipeline("add_one", ADD_ONE)


def test_live_and_peak_bytes(add_one):
    backend, _ = add_one
    backend.reset_peak()
    live = backend.live_bytes
    a = backend.create_buffer("a", 1000, STORAGE)
    b = backend.create_buffer("b", 3000, STORAGE)
    backend.destroy_buffer(a)
    assert (backend.live_bytes, backend.peak_bytes) == (live + 3000, live + 4000)
    backend.destroy_buffer(b)
    assert backend.live_bytes == live


def test_profile_times_every_dispatch_by_kernel(native_backends):
    backend = native_backends("full")
    if "timestamp-query" not in backend.features:
        pytest.skip("adapter without timestamp-query")
    a = backend.create_buffer("a", 4 * 1000, STORAGE)
    pipeline = backend.create_pipeline("add_one", ADD_ONE)
    group = backend.create_bind_group("a", pipeline, {0: a})
    other = backend.create_pipeline("add_one_again", ADD_ONE)
    other_group = backend.create_bind_group("a2", other, {0: a})
    plan = Plan(
        "p", (Dispatch(pipeline, group, 16), Dispatch(other, other_group, 16), Dispatch(pipeline, group, 16))
    )
    times = backend.profile(plan)
    assert [t.kernel for t in times] == ["add_one", "add_one_again", "add_one"]
    assert all(t.seconds >= 0 for t in times)
    totals = time_by_kernel(times)
    assert {k: n for k, (n, _) in totals.items()} == {"add_one": 2, "add_one_again": 1}
    assert u32s(backend.read(a)) == [3] * 1000  # the profiled run did the work
    backend.destroy_buffer(a)


def test_grid_wraps_into_2d(native_backends):
    kernels = Kernels(native_backends("plain"))
    assert kernels.grid(65_535) == (65_535, 1, 1)
    assert kernels.grid(65_536) == (32_768, 2, 1)
    x, y, _ = kernels.grid(1_000_001)
    assert x <= 65_535 and x * y >= 1_000_001 and x * (y - 1) < 1_000_001
