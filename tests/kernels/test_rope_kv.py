"""rope_kv.wgsl against numpy: normal and NeoX rope, partial rotary dims, q/k RMSNorm (w and 1 + w),
bias, frequency factors, linear scaling, f32 and f16 caches, positions read from the state buffer.

The numpy reference computes the angles exactly as the kernel and llama.cpp's CPU rope do (theta =
f32(pos) times theta_scale once per pair, in f32), then cos / sin in float64. Tolerance: 1e-5 of the
row's largest element (f32 rounding of the norm, one f32 sin / cos, the rotation). The f16 cache adds
the rounding of each stored element to 11 significant bits: within 2^-11 of its value (an f32 result
next to a rounding boundary may round the other way than the float64 reference, so the comparison is
with the unrounded reference).
"""

import numpy as np
import pytest
from gpu_helpers import read_f32, upload

from webgguf.gpu import Plan

STATE_WORDS = 16 + 256
SENTINEL = 7.0  # cache contents that must stay untouched


def state_words(pos: int, n_tokens: int) -> np.ndarray:
    state = np.zeros(STATE_WORDS, np.uint32)
    state[0], state[1] = pos, n_tokens  # docs/ENGINE_STATE.md: pos, n_tokens
    return state


def theta_scale(base: float, rope_dims: int) -> np.float32:
    """powf(base, -2.0f / rope_dims), as llama.cpp computes it."""
    return np.float32(base) ** (np.float32(-2.0) / np.float32(rope_dims))


def rope_angles(positions, rope_dims, base, freq_scale, freq_factors):
    """[T, rope_dims / 2] float32 angles: llama.cpp's running f32 product."""
    scale = theta_scale(base, rope_dims)
    angles = np.zeros((len(positions), rope_dims // 2), np.float32)
    for t, pos in enumerate(positions):
        theta = np.float32(pos)
        for i in range(rope_dims // 2):
            factor = np.float32(1.0 if freq_factors is None else freq_factors[i])
            angles[t, i] = (theta / factor) * np.float32(freq_scale)
            theta = theta * scale
    return angles


def apply_rope(x, angles, rope_dims, neox):
    """x [T, heads, hd] float64 rotated by angles [T, rope_dims / 2] (float32 values, exact cos / sin)."""
    half = rope_dims // 2
    cos = np.cos(angles.astype(np.float64))[:, None, :]
    sin = np.sin(angles.astype(np.float64))[:, None, :]
    out = x.copy()
    if neox:
        first, second = x[..., :half], x[..., half:rope_dims]
        out[..., :half] = first * cos - second * sin
        out[..., half:rope_dims] = first * sin + second * cos
    else:
        first, second = x[..., 0:rope_dims:2], x[..., 1:rope_dims:2]
        out[..., 0:rope_dims:2] = first * cos - second * sin
        out[..., 1:rope_dims:2] = first * sin + second * cos
    return out


def reference(
    qkv, pos, n_head, n_head_kv, rope_dims, base, freq_scale, neox, qk_norm, plus_one, eps, bias, factors
):
    """(q, k, v) [T, heads, hd] float64 from qkv [T, n_head + 2 n_head_kv, hd]."""
    x = qkv.astype(np.float64)
    if bias is not None:
        x = x + bias.reshape(x.shape[1:])
    q, k, v = x[:, :n_head], x[:, n_head : n_head + n_head_kv], x[:, n_head + n_head_kv :]
    if qk_norm is not None:
        q_w, k_w = (w + 1.0 if plus_one else w for w in qk_norm)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + eps) * q_w
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True) + eps) * k_w
    angles = rope_angles(range(pos, pos + len(qkv)), rope_dims, base, freq_scale, factors)
    return apply_rope(q, angles, rope_dims, neox), apply_rope(k, angles, rope_dims, neox), v


def run_rope_kv(
    kernels,
    *,
    n_tokens,
    n_head,
    n_head_kv,
    head_dim,
    rope_dims,
    pos,
    n_ctx,
    grid_tokens=None,
    base=10000.0,
    freq_scale=1.0,
    neox=False,
    qk_norm=False,
    plus_one=False,
    bias=False,
    factors=False,
    f16=False,
    eps=1e-6,
):
    backend = kernels.backend
    grid_tokens = grid_tokens or n_tokens
    n_rows = n_head + 2 * n_head_kv
    rng = np.random.default_rng(head_dim + n_tokens + pos)
    qkv = rng.standard_normal((grid_tokens, n_rows, head_dim)).astype(np.float32)
    norms = tuple(rng.uniform(0.5, 1.5, head_dim).astype(np.float32) for _ in range(2)) if qk_norm else None
    bias_w = rng.standard_normal(n_rows * head_dim).astype(np.float32) if bias else None
    freq = rng.uniform(1.0, 8.0, rope_dims // 2).astype(np.float32) if factors else None

    kernel = kernels.get(
        "rope_kv",
        HEAD_DIM=head_dim,
        NEOX=neox,
        QK_NORM=qk_norm,
        NORM_PLUS_ONE=plus_one,
        BIAS=bias,
        FREQ_FACTORS=factors,
        F16=f16,
    )
    cache_type = np.float16 if f16 else np.float32
    buffers = {
        "state": upload(backend, "state", state_words(pos, n_tokens)),
        "qkv": upload(backend, "qkv", qkv),
        "q": upload(backend, "q", np.full((grid_tokens, n_head, head_dim), SENTINEL, np.float32)),
        "k_cache": upload(backend, "k_cache", np.full((n_head_kv, n_ctx, head_dim), SENTINEL, cache_type)),
        "v_cache": upload(backend, "v_cache", np.full((n_head_kv, n_ctx, head_dim), SENTINEL, cache_type)),
    }
    if qk_norm:
        buffers["q_norm"], buffers["k_norm"] = (
            upload(backend, n, w) for n, w in zip(("q_norm", "k_norm"), norms, strict=True)
        )
    if bias:
        buffers["bias"] = upload(backend, "bias", bias_w)
    if factors:
        buffers["freq_factors"] = upload(backend, "freq_factors", freq)
    step = kernels.dispatch(
        kernel,
        "rope_kv",
        grid_tokens * n_rows,
        buffers,
        n_head=n_head,
        n_head_kv=n_head_kv,
        rope_dims=rope_dims,
        n_ctx=n_ctx,
        theta_scale=float(theta_scale(base, rope_dims)),
        freq_scale=freq_scale,
        eps=eps,
    )
    backend.replay(Plan("rope_kv", (step,)))
    got_q = read_f32(backend, buffers["q"], (grid_tokens, n_head, head_dim))
    n_bytes = n_head_kv * n_ctx * head_dim * np.dtype(cache_type).itemsize
    got_k, got_v = (
        np.frombuffer(backend.read(buffers[name], 0, n_bytes), cache_type)
        .reshape(n_head_kv, n_ctx, head_dim)
        .astype(np.float64)
        for name in ("k_cache", "v_cache")
    )
    for buffer in buffers.values():
        backend.destroy_buffer(buffer)
    want = reference(
        qkv[:n_tokens],
        pos,
        n_head,
        n_head_kv,
        rope_dims,
        base,
        freq_scale,
        neox,
        norms,
        plus_one,
        eps,
        bias_w,
        freq,
    )
    return (got_q, got_k, got_v), want, cache_type


def check(got, want, n_tokens, pos, n_ctx, cache_type):
    got_q, got_k, got_v = got
    want_q, want_k, want_v = want
    tol = 1e-5 * max(np.abs(w).max() for w in want)
    np.testing.assert_allclose(got_q[:n_tokens], want_q, rtol=0, atol=tol)
    assert np.all(got_q[n_tokens:] == SENTINEL), "tokens past state n_tokens must not be written"
    stored = min(n_tokens, max(0, n_ctx - pos))  # positions past n_ctx are not written
    rounding = 2.0**-11 if cache_type == np.float16 else 0.0
    for got_cache, want_rows in ((got_k, want_k), (got_v, want_v)):
        want_cache = want_rows[:stored].transpose(1, 0, 2)
        np.testing.assert_allclose(got_cache[:, pos : pos + stored], want_cache, rtol=rounding, atol=tol)
        untouched = np.ones(n_ctx, bool)
        untouched[pos : pos + stored] = False
        assert np.all(got_cache[:, untouched] == SENTINEL), "cache positions outside the step were written"


CASES = {
    # name: (n_tokens, n_head, n_head_kv, head_dim, rope_dims, pos, n_ctx, options)
    "llama_decode": (1, 9, 3, 64, 64, 17, 40, {}),
    "llama_prefill_37": (37, 4, 4, 64, 64, 0, 64, {}),
    "neox_partial_rotary_far_position": (3, 4, 1, 64, 32, 5000, 5010, {"neox": True}),
    "normal_partial_rotary": (5, 3, 1, 64, 48, 100, 128, {}),
    "qwen3_qk_norm": (7, 8, 2, 128, 128, 3, 16, {"neox": True, "qk_norm": True, "base": 1e6}),
    "gemma3_head_256": (2, 4, 1, 256, 256, 300, 310, {"neox": True, "qk_norm": True, "plus_one": True}),
    "qwen2_bias": (4, 6, 2, 64, 64, 9, 20, {"neox": True, "bias": True}),
    "llama31_freq_factors_scaled": (2, 4, 2, 64, 64, 1000, 1024, {"factors": True, "freq_scale": 0.25}),
    "past_n_ctx_not_written": (6, 2, 1, 64, 64, 12, 15, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rope_kv(kernels, case):
    n_tokens, n_head, n_head_kv, head_dim, rope_dims, pos, n_ctx, options = CASES[case]
    got, want, cache_type = run_rope_kv(
        kernels,
        n_tokens=n_tokens,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rope_dims=rope_dims,
        pos=pos,
        n_ctx=n_ctx,
        **options,
    )
    check(got, want, n_tokens, pos, n_ctx, cache_type)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_kv_f16_cache(f16_kernels, neox):
    kernels = f16_kernels
    args = dict(n_tokens=37, n_head=4, n_head_kv=1, head_dim=256, rope_dims=256, pos=11, n_ctx=50, neox=neox)
    got, want, cache_type = run_rope_kv(kernels, f16=True, qk_norm=neox, **args)
    assert cache_type is np.float16
    check(got, want, 37, 11, 50, cache_type)


def test_rope_kv_grid_larger_than_the_step(kernels):
    """A prefill plan built for 8 tokens replayed for a chunk of 3: the state's n_tokens decides."""
    got, want, cache_type = run_rope_kv(
        kernels, n_tokens=3, grid_tokens=8, n_head=2, n_head_kv=2, head_dim=64, rope_dims=64, pos=4, n_ctx=16
    )
    check(got, want, 3, 4, 16, cache_type)
