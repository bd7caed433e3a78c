"""attn_decode.wgsl alone: GPU time per dispatch at a model's decode shape, and of variants of it.

python tools/bench_attention.py [--pos 600] [--baseline-shaders DIR] [--layers 30] [--repeat 10]

Each measurement is one compute pass holding `layers` attn_decode dispatches (each with its own KV
cache, as the layers of a decode step), `repeat` times over, with timestamps at the pass's ends: the
time per dispatch is what the kernel costs inside a decode step's chain of dependent dispatches
(launch and drain included), min of `trials` passes. Default shape: SmolLM2-135M (head size 64,
3 query heads per kv head, 3 kv heads, 64 splits at most, an f32 cache).

Variants are the kernel's WGSL with text edits (stages cut short with a return the compiler cannot
see through, so the work before it stays), other defines, or another shader directory
(--baseline-shaders: e.g. the committed kernels, to compare). Full variants are checked against
numpy (the merged split partials); cut-short ones only timed.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import wgpu

from webgguf.gpu.base import STORAGE, Plan
from webgguf.gpu.native import NativeBackend
from webgguf.kernels import Kernels
from webgguf.pipelines import SHADER_DIR

STATE_WORDS = 16 + 256
ALWAYS = "params.window < 4000000000u"  # true at run time; the compiler cannot know it


@dataclass
class Variant:
    label: str
    edits: list[tuple[str, str, str]] = field(default_factory=list)  # (file, old, new)
    defines: dict = field(default_factory=dict)
    shader_dir: Path | None = None
    check: bool = True  # compare with numpy
    group: int | None = None  # query heads per kv head (None: the shape's)
    n_splits: int | None = None
    tile_keys: int = 4096  # SPLIT_KEYS * HEAD_DIM (lib/attn_splits.wgsl)


def cut_after(anchor: str, store: str) -> tuple[str, str, str]:
    """An edit that returns after `anchor` (a unique line of attn_decode.wgsl), storing `store` first
    so that the work it depends on is kept."""
    return (
        "attn_decode.wgsl",
        anchor,
        f"{anchor}\n    if ({ALWAYS}) {{\n"
        f"        partials[(w % 32u) * WG + li] = {store};\n        return;\n    }}",
    )


TILES_END = "            run_max[g] = new_max;\n        }\n    }"  # the end of the tile loop
LOADS = "k.a + k.b + k.c + k.d + v.a + v.b + v.c + v.d"

SCORES_BY_SHARED_MEMORY = """            scratch[g4 * WG + li] = partial;
        }
        workgroupBarrier();

        // Scores: invocation (head g, key j) sums the TPK partials of key j.
        for (var c = li; c < GROUP * KEYS; c += WG) {
            let g = c / KEYS;
            let j = c % KEYS;
            var s = 0.0;
            for (var p = 0u; p < TPK; p++) {
                s += component(scratch[(g / 4u) * WG + j * TPK + p], g);
            }
            p_tile[c] = select(NEG_MAX, s * params.scale, tile + j < end);
        }
        workgroupBarrier();"""
# The TPK invocations of a key are consecutive lanes of one subgroup (NVIDIA: subgroups of 32 in
# invocation order): butterfly sums, then no scratch and one barrier less.
SCORES_BY_SHUFFLES = """            for (var m = 1u; m < TPK; m *= 2u) {
                partial += subgroupShuffleXor(partial, m);
            }
            if (part == 0u) {
                for (var c = 0u; c < 4u; c++) {
                    let g = 4u * g4 + c;
                    if (g < GROUP) {
                        let score = component(partial, c) * params.scale;
                        p_tile[g * KEYS + kk] = select(NEG_MAX, score, tile + kk < end);
                    }
                }
            }
        }
        workgroupBarrier();"""

VARIANTS = [
    Variant("current"),
    Variant(
        "empty (returns at once)",
        [
            (
                "attn_decode.wgsl",
                "    let li = inv.index;",
                f"    let li = inv.index;\n    if ({ALWAYS}) {{\n        return;\n    }}",
            )
        ],
        check=False,
    ),
    Variant(
        "returns after its splits",
        [
            (
                "attn_decode.wgsl",
                "    let begin = splits.first",
                f"    if ({ALWAYS}) {{\n        return;\n    }}\n    let begin = splits.first",
            )
        ],
        check=False,
    ),
    Variant(
        "returns after the loads",
        [cut_after("    var k = load_k(begin + kk, end, pos, cache_base, part);", "k.a + k.b + k.c + k.d")],
        check=False,
    ),
    Variant(
        "returns after the prologue",
        [
            cut_after(
                "        v_cache[(cache_base + pos) * HD4 + li] = vec4<kv_t>(projected(v_row / HD4, li));"
                "\n    }",
                f"rows[li % ((GROUP + 1u) * HD4)] + {LOADS}",
            )
        ],
        check=False,
    ),
    Variant(
        "returns after the tiles (no merge)",
        [cut_after(TILES_END, "acc[0] + acc[GROUP - 1u] + vec4<f32>(run_sum[0], run_max[0], 0.0, 0.0)")],
        check=False,
    ),
    Variant("2 tiles per split (n_splits 5)", n_splits=5),
    Variant("8 tiles per split (n_splits 2)", n_splits=2),
    Variant(
        "scores by subgroup shuffles (SUBGROUPS)",
        [("attn_decode.wgsl", SCORES_BY_SHARED_MEMORY, SCORES_BY_SHUFFLES)],
        defines={"SUBGROUPS": True},
    ),
    Variant(
        "tiles of 32 keys (128 invocations)",
        [
            ("attn_decode.wgsl", "const WG = 256u;", "const WG = 128u;"),
            (
                "lib/attn_splits.wgsl",
                "const SPLIT_KEYS = 4096u / HEAD_DIM;",
                "const SPLIT_KEYS = 2048u / HEAD_DIM;",
            ),
        ],
        tile_keys=2048,
    ),
    Variant("one query head per workgroup (GROUP 1, 9 kv heads)", group=1),
]


# Cut short where the committed kernel (before the per-lane softmax) had its stages.
BASELINE_VARIANTS = [
    VARIANTS[0],
    VARIANTS[4],
    Variant(
        "returns after the tiles (no merge)",
        [cut_after(TILES_END, "acc[0] + acc[GROUP - 1u] + vec4<f32>(run_sum[0], run_max[0], 0.0, 0.0)")],
        check=False,
    ),
]


def run_variant(backend, v: Variant, args, base_shaders: Path, rng) -> tuple[float, np.ndarray | None]:
    shader_dir = v.shader_dir or base_shaders
    edits = v.edits

    def source_of(path: str) -> str:
        text = (shader_dir / path).read_text()
        for file, old, new in edits:
            if file == path:
                if text.count(old) != 1:
                    raise ValueError(f"{v.label}: {old!r} is not one line of {path}")
                text = text.replace(old, new)
        return text

    kernels = Kernels(backend, source_of=source_of)
    group = v.group or args.group
    n_head = args.n_head_kv * args.group
    n_head_kv = n_head // group
    n_splits = v.n_splits or args.n_splits
    hd, n_ctx, pos = args.head_dim, args.pos + 42, args.pos
    kernel = kernels.get("attn_decode", HEAD_DIM=hd, GROUP=group, NEOX=False, F16=False, **v.defines)
    make = backend.create_buffer

    def upload(name, array):
        buffer = make(name, array.nbytes, STORAGE)
        backend.write_buffer(buffer, np.ascontiguousarray(array).tobytes())
        return buffer

    state = np.zeros(STATE_WORDS, np.uint32)
    state[0], state[1] = pos, 1
    qkv = rng.standard_normal((n_head + 2 * n_head_kv, hd)).astype(np.float32)
    keys = rng.standard_normal((n_head_kv, n_ctx, hd)).astype(np.float32)
    values = rng.standard_normal((n_head_kv, n_ctx, hd)).astype(np.float32)
    shared = {"state": upload("state", state), "qkv": upload("qkv", qkv)}
    partials = upload("partials", np.zeros((n_head, n_splits, hd + 4), np.float32))
    theta_scale = float(np.float32(10000.0 ** (-2.0 / hd)))
    steps = []
    for layer in range(args.layers):
        buffers = shared | {
            "k_cache": upload(f"k{layer}", keys),
            "v_cache": upload(f"v{layer}", values),
            "partials": partials,
        }
        steps.append(
            kernels.dispatch(
                kernel,
                f"attn_decode.{layer}",
                n_head_kv * n_splits,
                buffers,
                n_head_kv=n_head_kv,
                n_ctx=n_ctx,
                n_splits=n_splits,
                window=0,
                scale=1 / math.sqrt(hd),
                rope_dims=hd,
                theta_scale=theta_scale,
                freq_scale=1.0,
                eps=1e-6,
            )
        )
    backend.replay(Plan("warm-up", tuple(steps)))
    seconds = min(pass_time(backend, steps, args.repeat) for _ in range(args.trials)) / (
        args.layers * args.repeat
    )
    out = None
    if v.check:
        got = np.frombuffer(backend.read(partials), np.float32).reshape(n_head, n_splits, hd + 4)
        end, tile = pos + 1, v.tile_keys // hd
        chunk = math.ceil(math.ceil(end / n_splits) / tile) * tile
        count = math.ceil(end / chunk)
        o, m, total = got[:, :count, :hd], got[:, :count, hd], got[:, :count, hd + 1]
        weights = np.exp(m - m.max(axis=1, keepdims=True))
        out = (weights[..., None] * o).sum(axis=1) / (weights * total).sum(axis=1)[:, None]
        check_against_numpy(out, qkv, keys, values, pos, n_head, n_head_kv, hd, theta_scale)
    return seconds, out


def check_against_numpy(out, qkv, keys, values, pos, n_head, n_head_kv, hd, theta_scale) -> None:
    """The merged attention output against numpy (RoPE of q and k at pos, then softmax attention)."""
    pairs = np.arange(hd // 2)
    theta = np.float64(pos) * np.float64(theta_scale) ** pairs
    cos, sin = np.cos(theta), np.sin(theta)

    def rope(x):
        x = x.astype(np.float64)
        y = x.copy()
        y[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
        y[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
        return y

    q, k_new, v_new = rope(qkv[:n_head]), rope(qkv[n_head : n_head + n_head_kv]), qkv[n_head + n_head_kv :]
    k = keys[:, : pos + 1].astype(np.float64)
    v = values[:, : pos + 1].astype(np.float64)
    k[:, pos], v[:, pos] = k_new, v_new
    group = n_head // n_head_kv
    want = np.zeros((n_head, hd))
    for h in range(n_head):
        s = k[h // group] @ q[h] / math.sqrt(hd)
        p = np.exp(s - s.max())
        want[h] = p @ v[h // group] / p.sum()
    error = np.abs(out - want).max() / np.abs(v).max()
    if error > 1e-4:  # the RoPE angles here are float64, the kernel's llama.cpp's f32 running product
        raise AssertionError(f"attention output off by {error:.2e} of max |v|")


def pass_time(backend, steps, repeat: int) -> float:
    """GPU seconds of one compute pass holding `steps` `repeat` times (timestamps at its ends)."""
    dev = backend.device
    queries = dev.create_query_set(type="timestamp", count=2)
    resolved = dev.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    read = dev.create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    encoder = dev.create_command_encoder()
    writes = {"query_set": queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
    compute_pass = encoder.begin_compute_pass(timestamp_writes=writes)
    for _ in range(repeat):
        for s in steps:
            compute_pass.set_pipeline(s.pipeline.handle)
            compute_pass.set_bind_group(0, s.bind_group.handle)
            compute_pass.dispatch_workgroups(s.x, s.y, s.z)
    compute_pass.end()
    encoder.resolve_query_set(queries, 0, 2, resolved, 0)
    encoder.copy_buffer_to_buffer(resolved, 0, read, 0, 16)
    dev.queue.submit([encoder.finish()])
    read.map_sync(wgpu.MapMode.READ)
    start, stop = read.read_mapped().cast("Q")
    read.unmap()
    return (stop - start) * backend._timestamp_period_ns * 1e-9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pos", type=int, nargs="+", default=[600])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--group", type=int, default=3)
    parser.add_argument("--n-head-kv", type=int, default=3)
    parser.add_argument("--n-splits", type=int, default=64)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--baseline-shaders", type=Path, help="also time this directory's kernel (and cut-short variants)"
    )
    parser.add_argument("--only", nargs="*", help="variant labels (prefixes) to run")
    args = parser.parse_args()
    backend = NativeBackend()
    if "timestamp-query" not in backend.features:
        raise SystemExit("the device has no timestamp-query feature")
    variants = [(v, SHADER_DIR) for v in VARIANTS]
    if args.baseline_shaders:
        variants += [(v, args.baseline_shaders) for v in BASELINE_VARIANTS]
    if args.only:
        variants = [(v, d) for v, d in variants if any(v.label.startswith(o) for o in args.only)]
    for pos in args.pos:
        args.pos = pos
        print(
            f"attn_decode, head size {args.head_dim}, {args.n_head_kv} kv heads x {args.group}, pos {pos}, "
            f"{args.n_splits} splits at most, {args.layers} dispatches x {args.repeat} per pass",
            flush=True,
        )
        for v, shader_dir in variants:
            where = "" if shader_dir == SHADER_DIR else f" [{shader_dir}]"
            try:
                seconds, _ = run_variant(backend, v, args, shader_dir, np.random.default_rng(pos))
            except Exception as e:  # a variant that does not apply to this kernel
                print(f"  {v.label + where:60s} failed: {str(e)[:200]}", flush=True)
                continue
            print(
                f"  {v.label + where:60s} {seconds * 1e6:7.2f} us{'  (checked)' if v.check else ''}",
                flush=True,
            )


if __name__ == "__main__":
    main()
