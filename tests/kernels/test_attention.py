"""attn_decode.wgsl + attn_combine.wgsl (split-K decode) and attn_prefill.wgsl against numpy.

Shapes: head_dim 64 / 128 / 256, GQA ratios 1, 3, 4, 1 to 300 cached positions, 1 to 32 splits
(including splits left empty, and splits of several key tiles), chunks of 1 and 37 tokens,
sliding windows narrower and wider than the span, f32 and f16 caches.

Tolerance: 1e-5 of the largest |v| (the output is a convex combination of value rows; scores are f32
dot products of <= 256 terms of size ~1, softmax weights carry a few f32 roundings). The f16 cache
needs no looser bound: the reference attends over the same f16-rounded keys and values the cache
holds, so only the f32 arithmetic differs.
"""

import math

import numpy as np
import pytest
from gpu_helpers import read_f32, upload

from webgguf.gpu import Plan

STATE_WORDS = 16 + 256
SENTINEL = 7.0


def state_words(pos: int, n_tokens: int) -> np.ndarray:
    state = np.zeros(STATE_WORDS, np.uint32)
    state[0], state[1] = pos, n_tokens  # docs/ENGINE_STATE.md: pos, n_tokens
    return state


def reference(q, keys, values, pos, window):
    """q [T, n_head, hd] at positions pos.., keys / values [n_head_kv, n_ctx, hd] -> [T, n_head, hd]."""
    n_tokens, n_head, head_dim = q.shape
    group = n_head // keys.shape[0]
    out = np.zeros_like(q)
    for t in range(n_tokens):
        p = pos + t
        first = max(0, p + 1 - window) if window else 0
        for h in range(n_head):
            k = keys[h // group, first : p + 1]  # [n, hd]
            v = values[h // group, first : p + 1]
            scores = k @ q[t, h] / math.sqrt(head_dim)
            weights = np.exp(scores - scores.max())
            out[t, h] = weights @ v / weights.sum()
    return out


def random_inputs(n_tokens, n_head_kv, group, head_dim, n_ctx, f16, seed):
    rng = np.random.default_rng(seed)
    cache_type = np.float16 if f16 else np.float32
    q = rng.standard_normal((n_tokens, n_head_kv * group, head_dim)).astype(np.float32)
    keys = rng.standard_normal((n_head_kv, n_ctx, head_dim)).astype(cache_type)
    values = rng.standard_normal((n_head_kv, n_ctx, head_dim)).astype(cache_type)
    return q, keys, values


def run_decode(kernels, *, head_dim, group, n_head_kv, pos, n_splits, window=0, f16=False, n_ctx=None):
    backend = kernels.backend
    n_ctx = n_ctx or pos + 5
    n_head = n_head_kv * group
    q, keys, values = random_inputs(1, n_head_kv, group, head_dim, n_ctx, f16, seed=pos + head_dim + n_splits)
    buffers = {
        "state": upload(backend, "state", state_words(pos, 1)),
        "q": upload(backend, "q", q),
        "k_cache": upload(backend, "k_cache", keys),
        "v_cache": upload(backend, "v_cache", values),
        "partials": upload(backend, "partials", np.zeros((n_head, n_splits, head_dim + 4), np.float32)),
        "out": upload(backend, "out", np.full((n_head, head_dim), SENTINEL, np.float32)),
    }
    decode = kernels.get("attn_decode", HEAD_DIM=head_dim, GROUP=group, F16=f16)
    combine = kernels.get("attn_combine", HEAD_DIM=head_dim)
    split_step = kernels.dispatch(
        decode,
        "attn_decode",
        n_head_kv * n_splits,
        {name: buffers[name] for name in ("state", "q", "k_cache", "v_cache", "partials")},
        n_head_kv=n_head_kv,
        n_ctx=n_ctx,
        n_splits=n_splits,
        window=window,
        scale=1 / math.sqrt(head_dim),
    )
    combine_step = kernels.dispatch(
        combine,
        "attn_combine",
        n_head,
        {"partials": buffers["partials"], "out": buffers["out"]},
        n_head=n_head,
        n_splits=n_splits,
    )
    backend.replay(Plan("attn_decode", (split_step, combine_step)))
    got = read_f32(backend, buffers["out"], (1, n_head, head_dim))
    for buffer in buffers.values():
        backend.destroy_buffer(buffer)
    want = reference(q.astype(np.float64), keys.astype(np.float64), values.astype(np.float64), pos, window)
    return got, want, np.abs(values).max()


DECODE_CASES = {
    # name: (head_dim, group, n_head_kv, pos, n_splits, window)
    "one_position": (64, 3, 3, 0, 1, 0),
    "17_positions_4_splits": (64, 3, 3, 16, 4, 0),
    "more_splits_than_positions": (64, 4, 2, 16, 32, 0),
    "gemma_300_positions": (256, 4, 1, 299, 8, 0),
    "mha_5_splits": (64, 1, 4, 299, 5, 0),
    "window_100": (128, 4, 2, 299, 3, 100),
    "window_wider_than_span": (256, 4, 1, 299, 16, 512),
    "window_1": (64, 3, 1, 40, 2, 1),
    "one_split_of_300": (64, 3, 1, 299, 1, 0),
    "two_splits_of_150": (256, 4, 1, 299, 2, 0),
    "gemma_one_split_of_300": (256, 4, 1, 299, 1, 0),
}


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_attn_decode(kernels, case):
    head_dim, group, n_head_kv, pos, n_splits, window = DECODE_CASES[case]
    got, want, v_max = run_decode(
        kernels,
        head_dim=head_dim,
        group=group,
        n_head_kv=n_head_kv,
        pos=pos,
        n_splits=n_splits,
        window=window,
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


@pytest.mark.parametrize("head_dim,group,pos,n_splits,window", [(64, 3, 16, 4, 0), (256, 4, 299, 8, 64)])
def test_attn_decode_f16_cache(kernels, head_dim, group, pos, n_splits, window):
    if not kernels.f16:
        pytest.skip("the device has no shader-f16")
    got, want, v_max = run_decode(
        kernels,
        head_dim=head_dim,
        group=group,
        n_head_kv=1,
        pos=pos,
        n_splits=n_splits,
        window=window,
        f16=True,
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


def test_attn_decode_reads_only_positions_up_to_pos(kernels):
    """Cache positions past pos hold stale data (n_ctx > pos + 1): they must not be attended."""
    got, want, v_max = run_decode(kernels, head_dim=64, group=3, n_head_kv=1, pos=20, n_splits=3, n_ctx=64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


def run_prefill(kernels, *, head_dim, group, n_head_kv, n_tokens, pos, window=0, f16=False, grid_tokens=None):
    backend = kernels.backend
    grid_tokens = grid_tokens or n_tokens
    n_ctx = pos + grid_tokens + 3
    n_head = n_head_kv * group
    q, keys, values = random_inputs(grid_tokens, n_head_kv, group, head_dim, n_ctx, f16, seed=n_tokens + pos)
    kernel = kernels.get("attn_prefill", HEAD_DIM=head_dim, GROUP=group, F16=f16)
    buffers = {
        "state": upload(backend, "state", state_words(pos, n_tokens)),
        "q": upload(backend, "q", q),
        "k_cache": upload(backend, "k_cache", keys),
        "v_cache": upload(backend, "v_cache", values),
        "out": upload(backend, "out", np.full((grid_tokens, n_head, head_dim), SENTINEL, np.float32)),
    }
    rows_per_group = min(32, max(1, 2048 // head_dim))  # ROWS of attn_prefill.wgsl
    step = kernels.dispatch(
        kernel,
        "attn_prefill",
        -(-grid_tokens * group // rows_per_group) * n_head_kv,
        buffers,
        n_head_kv=n_head_kv,
        n_ctx=n_ctx,
        window=window,
        scale=1 / math.sqrt(head_dim),
    )
    backend.replay(Plan("attn_prefill", (step,)))
    got = read_f32(backend, buffers["out"], (grid_tokens, n_head, head_dim))
    for buffer in buffers.values():
        backend.destroy_buffer(buffer)
    want = reference(
        q[:n_tokens].astype(np.float64), keys.astype(np.float64), values.astype(np.float64), pos, window
    )
    return got, want, np.abs(values).max()


PREFILL_CASES = {
    # name: (head_dim, group, n_head_kv, n_tokens, pos, window)
    "first_chunk_37": (64, 3, 3, 37, 0, 0),
    "chunk_37_after_263": (64, 4, 2, 37, 263, 0),
    "one_token": (64, 3, 1, 1, 16, 0),
    "mha": (64, 1, 4, 5, 12, 0),
    "gemma_head_256_window": (256, 4, 1, 37, 10, 16),
    "head_128_window_in_chunk": (128, 3, 1, 37, 0, 7),
}


@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_attn_prefill(kernels, case):
    head_dim, group, n_head_kv, n_tokens, pos, window = PREFILL_CASES[case]
    got, want, v_max = run_prefill(
        kernels,
        head_dim=head_dim,
        group=group,
        n_head_kv=n_head_kv,
        n_tokens=n_tokens,
        pos=pos,
        window=window,
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


def test_attn_prefill_f16_cache(kernels):
    if not kernels.f16:
        pytest.skip("the device has no shader-f16")
    got, want, v_max = run_prefill(kernels, head_dim=64, group=3, n_head_kv=2, n_tokens=37, pos=20, f16=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


def test_attn_prefill_grid_larger_than_the_chunk(kernels):
    """A plan built for 40 tokens replayed for a chunk of 37: rows past state n_tokens are not written."""
    got, want, v_max = run_prefill(
        kernels, head_dim=64, group=3, n_head_kv=1, n_tokens=37, pos=5, grid_tokens=40
    )
    np.testing.assert_allclose(got[:37], want, rtol=0, atol=1e-5 * v_max)
    assert np.all(got[37:] == SENTINEL)
