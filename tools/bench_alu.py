"""Arithmetic rates a WGSL kernel gets on this adapter: f32 multiply-adds and dot4I8Packed (4 int8
multiply-adds), each as 8 independent chains per invocation in a fully unrolled loop.

A yardstick for the GEMMs: whether dot4I8Packed is a native instruction here (a polyfill of shifts and
multiplies runs at a small fraction of the f32 rate), and what a GEMM could reach at best. The
dot4I8Packed chains add each product to their sum as a GEMM does; "no add" replaces the sum by the
product: on an H100 the add costs ~40% more time per product (docs/PERF.md "gemm_q8: two words per step").

    python tools/bench_alu.py [--workgroups 8448] [--iterations 2048]
"""

import argparse
import statistics

from webgguf.gpu.base import STORAGE, UNIFORM, Dispatch, Plan
from webgguf.gpu.native import NativeBackend

WG = 256

# 8 chains, each step of each chain one operation on registers; the results are stored so nothing is
# dead. The loop bound comes from Params so the compiler cannot fold the loop away.
KERNELS = {
    "f32_fma": """
struct Params { iterations: u32, pad0: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = f32(gid.x) * 1e-9 + 0.999;
    var a0 = x; var a1 = x + 1.0; var a2 = x + 2.0; var a3 = x + 3.0;
    var a4 = x + 4.0; var a5 = x + 5.0; var a6 = x + 6.0; var a7 = x + 7.0;
    for (var i = 0u; i < params.iterations; i++) {
        a0 = fma(a0, x, 0.5); a1 = fma(a1, x, 0.5); a2 = fma(a2, x, 0.5); a3 = fma(a3, x, 0.5);
        a4 = fma(a4, x, 0.5); a5 = fma(a5, x, 0.5); a6 = fma(a6, x, 0.5); a7 = fma(a7, x, 0.5);
        a0 = fma(a0, x, 0.5); a1 = fma(a1, x, 0.5); a2 = fma(a2, x, 0.5); a3 = fma(a3, x, 0.5);
        a4 = fma(a4, x, 0.5); a5 = fma(a5, x, 0.5); a6 = fma(a6, x, 0.5); a7 = fma(a7, x, 0.5);
    }
    out[gid.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}""",
}


def dot4_kernel(step: str) -> str:
    """8 chains of dot4I8Packed: `step` is one chain's step, with A for its variable (a0 .. a7)."""
    line = " ".join(step.replace("A", f"a{i}") + ";" for i in range(8))
    return f"""
struct Params {{ iterations: u32, pad0: u32, pad1: u32, pad2: u32 }}
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let b = gid.x * 2654435761u + 12345u;
    var a0 = 0; var a1 = 1; var a2 = 2; var a3 = 3; var a4 = 4; var a5 = 5; var a6 = 6; var a7 = 7;
    for (var i = 0u; i < params.iterations; i++) {{
        {line}
        {line}
    }}
    out[gid.x] = f32(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
}}"""


# Each product added to its chain's sum (as a GEMM does), and the product alone.
KERNELS["dot4I8Packed"] = dot4_kernel("A += dot4I8Packed(b, u32(A))")
KERNELS["dot4I8Packed_no_add"] = dot4_kernel("A = dot4I8Packed(b, u32(A))")

# An FMA is 2 operations; a dot4I8Packed 4 multiply-adds.
OPS_PER_STEP = {"f32_fma": 2, "dot4I8Packed": 8, "dot4I8Packed_no_add": 8}
STEPS_PER_ITERATION = 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workgroups", type=int, default=132 * 64)
    parser.add_argument("--iterations", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    backend = NativeBackend()
    out = backend.create_buffer("out", args.workgroups * WG * 4, STORAGE)
    params = backend.create_buffer("params", 16, UNIFORM)
    backend.write_buffer(params, args.iterations.to_bytes(4, "little") + bytes(12))
    print(
        f"adapter {backend.adapter_name}; {args.workgroups} workgroups x {WG}, {args.iterations} iterations"
    )
    for name, wgsl in KERNELS.items():
        pipeline = backend.create_pipeline(name, wgsl)
        group = backend.create_bind_group(name, pipeline, {0: params, 1: out})
        step = Dispatch(pipeline, group, args.workgroups)
        seconds = statistics.median(t.seconds for t in backend.profile(Plan(name, (step,) * args.repeats)))
        ops = args.workgroups * WG * args.iterations * STEPS_PER_ITERATION * OPS_PER_STEP[name]
        print(f"  {name:20} {seconds * 1e3:8.3f} ms  {ops / seconds / 1e12:7.2f} T operations/s")


if __name__ == "__main__":
    main()
