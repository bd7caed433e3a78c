"""attn_decode.wgsl (RoPE + KV-cache write + split attention of a decode token) and attn_prefill.wgsl
against numpy.

Decode: head_dim 32 / 64 / 128 / 256, GQA ratios 1, 3, 4, 7, 8, 1 to 300 cached positions, 1 to 64
splits (splits of one and of several key tiles, fewer splits used than allowed), sliding windows narrower and
wider than the span, normal and NeoX RoPE over all or part of the head, f32 and f16 caches. The
partials are merged in numpy here (gemv.wgsl's COMBINE merge is tested in test_gemv.py).
Prefill: chunks of 1 to 100 tokens, after earlier positions, windows, head sizes 32 / 64 / 128 / 256.

Tolerance: 1e-5 of the largest |v| (the output is a convex combination of value rows; scores are f32
dot products of <= 256 terms of size ~1, softmax weights carry a few f32 roundings). The f16 cache
needs no looser bound: the reference attends over the same f16-rounded keys and values the cache
holds (and the decode token's own k and v in f32, as the kernel does), so only the f32 arithmetic
differs. The decode token's roped key in the cache is checked like rope_kv's (test_rope_kv.py).
"""

import math

import numpy as np
import pytest
from gpu_helpers import read_f32, upload
from test_rope_kv import apply_rope, rope_angles, theta_scale

from webgguf import selection
from webgguf.gpu import Plan
from webgguf.selection import prefill_tile

STATE_WORDS = 16 + 256
SENTINEL = 7.0
ROPE_BASE = 10000.0
EPS = 1e-6


def state_words(pos: int, n_tokens: int) -> np.ndarray:
    state = np.zeros(STATE_WORDS, np.uint32)
    state[0], state[1] = pos, n_tokens  # docs/ENGINE_STATE.md: pos, n_tokens
    return state


def reference(q, keys, values, pos, window, scale=None):
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
            scores = k @ q[t, h] * (scale or 1 / math.sqrt(head_dim))
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


def split_count(pos, n_ctx, window, n_splits, head_dim) -> int:
    """Non-empty splits of lib/attn_splits.wgsl: chunks of whole tiles of 4096 / head_dim positions."""
    end = min(pos + 1, n_ctx)
    first = end - window if window and end > window else 0
    span, tile = end - first, 4096 // head_dim
    chunk = math.ceil(math.ceil(span / n_splits) / tile) * tile
    return math.ceil(span / chunk)


def merge_partials(partials, count, head_dim):
    """partials [n_head, n_splits, hd + 4] -> attention output [n_head, hd] of the first `count` splits."""
    o, m, total = (
        partials[:, :count, :head_dim],
        partials[:, :count, head_dim],
        partials[:, :count, head_dim + 1],
    )
    weights = np.exp(m - m.max(axis=1, keepdims=True))  # [n_head, count]
    return (weights[..., None] * o).sum(axis=1) / (weights * total).sum(axis=1)[:, None]


def run_decode(
    kernels,
    *,
    head_dim,
    group,
    n_head_kv,
    pos,
    n_splits,
    window=0,
    f16=False,
    n_ctx=None,
    rope_dims=None,
    neox=False,
    qk_norm=False,
    bias=False,
    freq_factors=False,
    scale=None,
):
    """Returns (attention output [n_head, hd], its reference, max |v|) after checking the cache write,
    the roped key at pos and that no partial past the used splits was written. qk_norm, bias and
    freq_factors add random per-head norm weights, a q|k|v bias and RoPE frequency factors."""
    backend = kernels.backend
    n_ctx = n_ctx or pos + 5
    rope_dims = rope_dims or head_dim
    n_head = n_head_kv * group
    rng = np.random.default_rng(pos + head_dim + n_splits)
    qkv = rng.standard_normal((n_head + 2 * n_head_kv, head_dim)).astype(np.float32)
    _, keys, values = random_inputs(1, n_head_kv, group, head_dim, n_ctx, f16, seed=pos + n_splits)
    cache_type = keys.dtype
    scale = scale or 1 / math.sqrt(head_dim)
    options = {}
    if qk_norm:
        q_norm_w, k_norm_w = rng.uniform(0.5, 1.5, (2, head_dim)).astype(np.float32)
        options |= {
            "q_norm": upload(backend, "q_norm", q_norm_w),
            "k_norm": upload(backend, "k_norm", k_norm_w),
        }
    if bias:
        bias_rows = rng.standard_normal(qkv.shape).astype(np.float32)
        options["bias"] = upload(backend, "bias", bias_rows)
    factors = None
    if freq_factors:
        factors = rng.uniform(1.0, 8.0, rope_dims // 2).astype(np.float32)
        options["freq_factors"] = upload(backend, "freq_factors", factors)
    buffers = {
        "state": upload(backend, "state", state_words(pos, 1)),
        "qkv": upload(backend, "qkv", qkv),
        "k_cache": upload(backend, "k_cache", keys),
        "v_cache": upload(backend, "v_cache", values),
        "partials": upload(
            backend, "partials", np.full((n_head, n_splits, head_dim + 4), SENTINEL, np.float32)
        ),
    } | options
    kernel = kernels.get(
        "attn_decode",
        HEAD_DIM=head_dim,
        GROUP=group,
        NEOX=neox,
        F16=f16,
        QK_NORM=qk_norm,
        BIAS=bias,
        FREQ_FACTORS=freq_factors,
    )
    step = kernels.dispatch(
        kernel,
        "attn_decode",
        n_head_kv * n_splits,
        buffers,
        n_head_kv=n_head_kv,
        n_ctx=n_ctx,
        n_splits=n_splits,
        window=window,
        scale=scale,
        rope_dims=rope_dims,
        theta_scale=float(theta_scale(ROPE_BASE, rope_dims)),
        freq_scale=1.0,
        eps=EPS,
    )
    backend.replay(Plan("attn_decode", (step,)))
    partials = read_f32(backend, buffers["partials"], (n_head, n_splits, head_dim + 4))
    n_bytes = keys.nbytes
    got_k, got_v = (
        np.frombuffer(backend.read(buffers[name], 0, n_bytes), cache_type).reshape(keys.shape)
        for name in ("k_cache", "v_cache")
    )
    for buffer in buffers.values():
        backend.destroy_buffer(buffer)

    # The cache: position pos holds the roped k and the v of qkv; nothing else changed.
    rows = qkv.astype(np.float64) + (bias_rows if bias else 0)  # bias, norm, RoPE: rope_kv's order
    if qk_norm:
        rows[:n_head] = rms_norm(rows[:n_head], q_norm_w)
        rows[n_head : n_head + n_head_kv] = rms_norm(rows[n_head : n_head + n_head_kv], k_norm_w)
    angles = rope_angles([pos], rope_dims, ROPE_BASE, 1.0, factors)
    roped = apply_rope(rows[None, : n_head + n_head_kv], angles, rope_dims, neox)[0]
    q, k_new, v_new = roped[:n_head], roped[n_head:], rows[n_head + n_head_kv :]
    rounding = 2.0**-11 if f16 else 0.0
    tol = 1e-5 * np.abs(k_new).max()
    np.testing.assert_allclose(got_k[:, pos].astype(np.float64), k_new, rtol=rounding, atol=tol)
    np.testing.assert_allclose(got_v[:, pos].astype(np.float64), v_new, rtol=rounding, atol=tol)
    others = np.arange(n_ctx) != pos
    assert np.array_equal(got_k[:, others], keys[:, others])
    assert np.array_equal(got_v[:, others], values[:, others])

    count = split_count(pos, n_ctx, window, n_splits, head_dim)
    assert np.all(partials[:, count:] == SENTINEL), "splits past the used ones must not be written"
    got = merge_partials(partials, count, head_dim)
    # The token's own k and v enter its attention in f32 (the cache holds them rounded with F16).
    # Positions past pos hold stale data (n_ctx > pos + 1): the reference never looks at them.
    ref_k, ref_v = got_k.astype(np.float64), got_v.astype(np.float64)
    ref_k[:, pos], ref_v[:, pos] = k_new, v_new
    want = reference(q[None], ref_k, ref_v, pos, window, scale)[0]
    return got, want, np.abs(ref_v).max()


def rms_norm(rows, weight):
    """Each row [..., hd] to unit root-mean-square, times weight [hd] (float64)."""
    return rows / np.sqrt(np.mean(rows * rows, axis=-1, keepdims=True) + EPS) * weight


DECODE_CASES = {
    # name: (head_dim, group, n_head_kv, pos, n_splits, window)
    "one_position": (64, 3, 3, 0, 1, 0),
    "17_positions_4_splits": (64, 3, 3, 16, 4, 0),
    "more_splits_than_positions": (64, 4, 2, 16, 32, 0),
    "smollm2_300_positions_64_splits": (64, 3, 3, 299, 64, 0),
    "gemma_300_positions": (256, 4, 1, 299, 8, 0),
    "mha_5_splits": (64, 1, 4, 299, 5, 0),
    "group_8": (128, 8, 1, 100, 4, 0),
    "head_32_group_7": (32, 7, 2, 150, 4, 0),
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


@pytest.mark.parametrize("rope_dims,neox", [(64, True), (32, True), (48, False)])
def test_attn_decode_rope_layouts(kernels, rope_dims, neox):
    got, want, v_max = run_decode(
        kernels, head_dim=64, group=3, n_head_kv=1, pos=77, n_splits=4, rope_dims=rope_dims, neox=neox
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


HEAD_OPTION_CASES = {
    # name: (head_dim, group, n_head_kv, pos, n_splits, window, options)
    "gemma3_qk_norm_neox_window": (256, 4, 1, 299, 8, 100, dict(qk_norm=True, neox=True, scale=0.0625)),
    "qwen3_qk_norm_one_split": (128, 8, 1, 100, 1, 0, dict(qk_norm=True, neox=True)),
    "qwen3_qk_norm_head_64": (64, 4, 2, 150, 4, 0, dict(qk_norm=True, neox=True)),
    "qwen2_bias": (32, 4, 2, 150, 4, 0, dict(bias=True, neox=True)),
    "qwen2_bias_one_split": (64, 7, 1, 40, 1, 0, dict(bias=True, neox=True)),
    "llama31_freq_factors": (64, 4, 1, 200, 4, 0, dict(freq_factors=True)),
    "freq_factors_neox_partial_rope": (64, 2, 1, 60, 2, 0, dict(freq_factors=True, neox=True, rope_dims=32)),
    "all_options": (64, 3, 1, 90, 3, 0, dict(qk_norm=True, bias=True, freq_factors=True, neox=True)),
}


@pytest.mark.parametrize("case", sorted(HEAD_OPTION_CASES))
def test_attn_decode_head_options(kernels, case):
    """Per-head q/k RMSNorm, the q|k|v bias and RoPE frequency factors in the prologue (rope_kv's order)."""
    head_dim, group, n_head_kv, pos, n_splits, window, options = HEAD_OPTION_CASES[case]
    got, want, v_max = run_decode(
        kernels,
        head_dim=head_dim,
        group=group,
        n_head_kv=n_head_kv,
        pos=pos,
        n_splits=n_splits,
        window=window,
        **options,
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


@pytest.mark.parametrize("head_dim,group,pos,n_splits,window", [(64, 3, 16, 4, 0), (256, 4, 299, 8, 64)])
def test_attn_decode_f16_cache(f16_kernels, head_dim, group, pos, n_splits, window):
    kernels = f16_kernels
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


def run_prefill(
    kernels,
    *,
    head_dim,
    group,
    n_head_kv,
    n_tokens,
    pos,
    window=0,
    f16=False,
    grid_tokens=None,
    wide=False,
    rows=None,
):
    """attn_prefill.wgsl, or attn_prefill_rows.wgsl with `rows` query rows per workgroup."""
    backend = kernels.backend
    grid_tokens = grid_tokens or n_tokens
    n_ctx = pos + grid_tokens + 3
    n_head = n_head_kv * group
    q, keys, values = random_inputs(grid_tokens, n_head_kv, group, head_dim, n_ctx, f16, seed=n_tokens + pos)
    if rows:
        kernel = kernels.get("attn_prefill_rows", HEAD_DIM=head_dim, GROUP=group, F16=f16, ROWS=rows)
    else:
        kernel = kernels.get("attn_prefill", HEAD_DIM=head_dim, GROUP=group, F16=f16, WIDE=wide)
    groups = -(-grid_tokens * group // (rows or prefill_tile(head_dim))) * n_head_kv
    buffers = {
        "state": upload(backend, "state", state_words(pos, n_tokens)),
        "q": upload(backend, "q", q),
        "k_cache": upload(backend, "k_cache", keys),
        "v_cache": upload(backend, "v_cache", values),
        "out": upload(backend, "out", np.full((grid_tokens, n_head, head_dim), SENTINEL, np.float32)),
    }
    step = kernels.dispatch(
        kernel,
        "attn_prefill",
        groups,
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
    "100_tokens_after_40_window_50": (64, 3, 2, 100, 40, 50),
    "head_32": (32, 2, 1, 21, 3, 0),
}


def check_prefill(kernels, case, wide=False, rows=None):
    head_dim, group, n_head_kv, n_tokens, pos, window = case
    got, want, v_max = run_prefill(
        kernels,
        head_dim=head_dim,
        group=group,
        n_head_kv=n_head_kv,
        n_tokens=n_tokens,
        pos=pos,
        window=window,
        wide=wide,
        rows=rows,
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_attn_prefill(kernels, case):
    check_prefill(kernels, PREFILL_CASES[case])


WIDE_CASES = {
    # name: (head_dim, group, n_head_kv, n_tokens, pos, window): tiles of 2 TILE keys (head sizes >= 128)
    "gemma_head_256_window": (256, 4, 1, 37, 10, 16),
    "head_256_after_263": (256, 4, 1, 19, 263, 0),
    "head_128_group_7_window_in_chunk": (128, 7, 2, 40, 3, 9),
    "head_128_one_token": (128, 2, 1, 1, 30, 0),
}


@pytest.mark.parametrize("case", sorted(WIDE_CASES))
def test_attn_prefill_wide_key_tiles(kernels, case):
    check_prefill(kernels, WIDE_CASES[case], wide=True)


@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_attn_prefill_rows(kernels, case):
    """The CPU adapters' kernel (one invocation per query row), 16 rows per workgroup as the engine runs
    it, and 7 (a workgroup's rows end inside a token's group of heads)."""
    check_prefill(kernels, PREFILL_CASES[case], rows=selection.PREFILL_ROWS_CPU)
    check_prefill(kernels, PREFILL_CASES[case], rows=7)


def test_attn_prefill_rows_f16_cache_and_a_grid_larger_than_the_chunk(f16_kernels):
    got, want, v_max = run_prefill(
        f16_kernels, head_dim=64, group=3, n_head_kv=2, n_tokens=37, pos=20, f16=True, grid_tokens=40, rows=16
    )
    np.testing.assert_allclose(got[:37], want, rtol=0, atol=1e-5 * v_max)
    assert np.all(got[37:] == SENTINEL)


def test_attn_prefill_f16_cache(f16_kernels):
    kernels = f16_kernels
    got, want, v_max = run_prefill(kernels, head_dim=64, group=3, n_head_kv=2, n_tokens=37, pos=20, f16=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * v_max)


def test_attn_prefill_grid_larger_than_the_chunk(kernels):
    """A plan built for 40 tokens replayed for a chunk of 37: rows past state n_tokens are not written."""
    got, want, v_max = run_prefill(
        kernels, head_dim=64, group=3, n_head_kv=1, n_tokens=37, pos=5, grid_tokens=40
    )
    np.testing.assert_allclose(got[:37], want, rtol=0, atol=1e-5 * v_max)
    assert np.all(got[37:] == SENTINEL)
