"""Decode GEMVs at the shapes of 1-8B models: the engine's gemv.wgsl against gemv_q8.wgsl configurations.

For each shape (a matrix of a model of the ladder, tools/ladder.py, with its epilogue), times every
candidate with timestamp queries (Backend.profile: one dispatch per pass, median of the repeats) and
prints GPU time and the weight-read bandwidth it implies. The weights are random bytes (no all-zero
pages a memory system might compress).

    python tools/bench_gemv.py [--quick] [--repeats 15] [--json OUT.json] [--shapes NAME,...]
"""

import argparse
import itertools
import json
import statistics
import sys
import time as time_module
from pathlib import Path

import numpy as np

from webgguf import ops
from webgguf.gpu.base import STORAGE, Plan
from webgguf.gpu.native import NativeBackend
from webgguf.kernels import Kernels
from webgguf.quants import TYPE_BY_NAME

# name: (weight type, n_out (output rows), n_in, epilogue)
SHAPES = {
    "8b.qkv.q4_k": ("Q4_K", 5120, 4096, "norm"),
    "8b.v.q6_k": ("Q6_K", 1024, 4096, "norm"),
    "8b.o.q4_k": ("Q4_K", 4096, 4096, "residual"),
    "8b.gate_up.q4_k": ("Q4_K", 14336, 4096, "norm,gate_up"),
    "8b.down.q4_k": ("Q4_K", 4096, 14336, "residual"),
    "8b.down.q6_k": ("Q6_K", 4096, 14336, "residual"),
    "8b.head.q6_k": ("Q6_K", 128256, 4096, "norm"),
    "8b.gate_up.q4_0": ("Q4_0", 14336, 4096, "norm,gate_up"),
    "8b.gate_up.q8_0": ("Q8_0", 14336, 4096, "norm,gate_up"),
    "8b.down.q8_0": ("Q8_0", 4096, 14336, "residual"),
    "7b.gate_up.q4_k": ("Q4_K", 18944, 3584, "norm,gate_up"),
    "7b.down.q6_k": ("Q6_K", 3584, 18944, "residual"),
    "3b.gate_up.q4_k": ("Q4_K", 8192, 3072, "norm,gate_up"),
    "1b.gate_up.q4_k": ("Q4_K", 8192, 2048, "norm,gate_up"),
    "1b.qkv.q4_k": ("Q4_K", 2560, 2048, "norm"),
    "0.5b.gate_up.q5_0": ("Q5_0", 4864, 896, "norm,gate_up"),
}
QUICK_SHAPES = {
    "tiny.gate_up.q4_k": ("Q4_K", 64, 512, "norm,gate_up"),
    "tiny.o.q8_0": ("Q8_0", 96, 256, "residual"),
}


def configs(gate_up: bool, subgroup: int | None, quick: bool, groups=(2, 4, 8)):
    """(ROWS, ROW_THREADS, GROUPS, SUBGROUPS) candidates of gemv_q8 (workgroups past the adapter's
    invocation limit left out)."""
    rows = (1, 2) if gate_up else (1, 2, 4)
    threads = subgroup or 32
    groups = (4,) if quick else groups
    for r, g in itertools.product(rows, groups):
        yield r, threads, g, subgroup is not None and threads == subgroup


def random_weight(kernels, name: str, type_name: str, rows: int, n_in: int, rng, data: str):
    t = TYPE_BY_NAME[type_name]
    if data == "ladder":  # the bytes tools/ladder.py writes into a stand-in
        import io

        sys.path.insert(0, str(Path(__file__).parent))
        from ladder import write_random_tensor

        out = io.BytesIO()
        write_random_tensor(out, type_name, rows * n_in, rng)
        return kernels.uploads.upload_weight(name, type_name, n_in, rows, out.getbuffer())
    raw = rng.integers(0, 256, (rows, n_in // t.block_elems * t.block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, t.block_bytes)
    scale = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    for at in {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (208,)}[type_name]:  # fmt: skip
        blocks[:, at : at + 2] = scale
    return kernels.uploads.upload_weight(name, type_name, n_in, rows, raw)


def dispatches(kernels, kernel, weight, buffers, rows_per_group: int, gate_up: bool):
    """One gemv_q8 dispatch per weight part."""
    steps = []
    for part in weight.parts:
        n_out = part.n_out(gate_up)
        params = dict(n_out=n_out, row_base=part.row_begin) | (
            {"eps": 1e-5} if "eps" in dict(kernel.params) else {}
        )
        steps.append(
            kernels.dispatch(
                kernel, kernel.name, -(-n_out // rows_per_group), buffers | part.buffers, **params
            )
        )
    return steps


def bench_shape(backend, kernels, name, spec, repeats, quick, rng, data, sweep=(2, 4, 8)):
    type_name, n_out, n_in, epilogue = spec
    gate_up, norm, residual = "gate_up" in epilogue, "norm" in epilogue, "residual" in epilogue
    w_rows = 2 * n_out if gate_up else n_out
    weight = random_weight(kernels, name, type_name, w_rows, n_in, rng, data)
    x = backend.create_buffer("x", 4 * n_in, STORAGE)
    backend.write_buffer(x, rng.standard_normal(n_in).astype(np.float32).tobytes())
    y = backend.create_buffer("y", 4 * n_out, STORAGE)
    xq = backend.create_buffer("xq", n_in, STORAGE)
    xk = backend.create_buffer("xk", n_in, STORAGE)
    xs = backend.create_buffer("xs", n_in // 32 * 16, STORAGE)
    norm_w = backend.create_buffer("norm_w", 4 * n_in, STORAGE)
    backend.write_buffer(norm_w, np.ones(n_in, np.float32).tobytes())
    weight_bytes = sum(b.size for p in weight.parts for b in p.arrays.values())
    results = []

    def time(label, steps):
        times = [t.seconds for t in backend.profile(Plan(label, tuple(steps) * repeats))]
        per = statistics.median(times) * len(steps)
        # Also the wall time of many back to back in one pass (as a plan runs them), ~20 ms in all.
        n = max(5, int(0.02 / per))
        plan = Plan(label, tuple(steps) * n)
        backend.replay(plan)
        backend.read(y, 0, 4)
        start = time_module.perf_counter()
        backend.replay(plan)
        backend.read(y, 0, 4)
        wall = (time_module.perf_counter() - start) / n
        results.append(
            {
                "kernel": label,
                "us": round(per * 1e6, 2),
                "gb_s": round(weight_bytes / per / 1e9, 1),
                "wall_us": round(wall * 1e6, 2),
            }
        )

    kw = dict(residual=residual, gate_up=gate_up, norm=norm_w if norm else None, eps=1e-5)
    engine = ops.linear.gemv(kernels, weight, x, y, **kw)
    backend.replay(Plan("warm-up", tuple(engine) * 50))  # clocks up before the first timing
    time("gemv (engine)", engine)
    sizes = backend.subgroup_sizes
    subgroup = sizes[0] if sizes and sizes[0] == sizes[1] else None
    epilogue = dict(RESIDUAL=residual, GATE_UP=gate_up)
    for rows, threads, groups, subgroups in configs(gate_up, subgroup, quick, sweep):
        if threads * groups > backend.limits.max_compute_invocations_per_workgroup:
            continue
        shape = dict(WEIGHTS=type_name.lower(), N_IN=n_in, ROWS=rows, ROW_THREADS=threads, GROUPS=groups)
        q8 = kernels.get("gemv_q8", **shape, SUBGROUPS=subgroups, NORM=norm, **epilogue)
        buffers = {"xq": xk if type_name in ("Q4_K", "Q5_K", "Q6_K") else xq, "xs": xs, "y": y}
        time(
            f"q8 rows={rows} groups={groups}",
            dispatches(kernels, q8, weight, buffers, rows * groups, gate_up),
        )
    quantize = kernels.get("quantize_q8", WG=64, NORM_W=norm, K_ORDER=True)
    buffers = {"x": x, "xq": xq, "xk": xk, "xs": xs} | ({"norm_w": norm_w} if norm else {})
    blocks = n_in // 32
    time(
        "quantize_q8",
        [kernels.dispatch(quantize, "quantize_q8", -(-blocks // 64), buffers, n=n_in, n_blocks=blocks)],
    )
    for buffer in (x, y, norm_w, xq, xk, xs, *[b for p in weight.parts for b in p.arrays.values()]):
        backend.destroy_buffer(buffer)
    return {"shape": name, "weight_bytes": weight_bytes, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few configs (a smoke run)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", default="", help="comma-separated names (default: all)")
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--data", choices=["bench", "ladder"], default="bench", help="weight bytes: see random_weight"
    )
    parser.add_argument(
        "--groups", default="2,4,8", help="gemv_q8 GROUPS to sweep (rows of ROW_THREADS per workgroup)"
    )
    args = parser.parse_args()
    groups = tuple(int(g) for g in args.groups.split(","))
    backend = NativeBackend()
    kernels = Kernels(backend)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = {name: SHAPES[name] for name in args.shapes.split(",")}
    rng = np.random.default_rng(0)
    report = {"adapter": backend.adapter_name, "shapes": []}
    for name, spec in shapes.items():
        shape = bench_shape(backend, kernels, name, spec, args.repeats, args.quick, rng, args.data, groups)
        report["shapes"].append(shape)
        base = shape["results"][0]
        quantize = shape["results"][-1]
        best = min(shape["results"][1:-1], key=lambda r: r["us"])
        print(
            f"{name:22} {shape['weight_bytes'] / 2**20:7.1f} MiB  engine {base['us']:8.1f} us "
            f"{base['gb_s']:7.1f} GB/s (wall {base['wall_us']:.1f}) | best {best['us']:8.1f} us "
            f"{best['gb_s']:7.1f} GB/s (wall {best['wall_us']:.1f}; {best['kernel']}); "
            f"quantize {quantize['us']:.1f} us",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
