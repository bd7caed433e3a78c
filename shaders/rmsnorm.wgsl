// rmsnorm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for n_rows rows of n elements.
//
// For norms that cannot be folded into the GEMV that follows them (per-head q/k norms, Gemma's
// post-norms, the final norm when the output head is split).
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_rows * n / 4]  input (absent with IN_PLACE)
//   2  y       storage, read_write array<vec4<f32>>  [n_rows * n / 4]  output (the input with IN_PLACE)
//   3  w       storage, read       array<vec4<f32>>  [n / 4]           norm weight
//
// Specialization:
//   ROW_THREADS  invocations per workgroup (one row per workgroup)
//   SUBGROUPS    reduce with subgroupAdd
//   IN_PLACE     normalize y itself
//   ADD          y[r] += normalized x[r] (a post-norm added to the residual stream)
// Grid: n_rows workgroups (2-D past 65535).

struct Params {
    n: u32,       // elements per row, multiple of 4
    n_rows: u32,  // rows (workgroups) of this dispatch
    eps: f32,     // added to the mean square
}

const WG = ROW_THREADS;

@group(0) @binding(0) var<uniform> params: Params;
#if IN_PLACE
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;

#include "lib/reduce.wgsl"

fn load_x(i: u32) -> vec4<f32> {
#if IN_PLACE
    return y[i];
#else
    return x[i];
#endif
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let row = group_index(grid);
    if (row >= params.n_rows) {
        return;
    }
    let n4 = params.n / 4u;
    let base = row * n4;
    var sum_sq = 0.0;
    for (var i = inv.index; i < n4; i += WG) {
        let v = load_x(base + i);
        sum_sq += dot(v, v);
    }
    let inv_rms = inverseSqrt(row_sum(vec4<f32>(sum_sq, 0.0, 0.0, 0.0), inv).x / f32(params.n) + params.eps);
    for (var i = inv.index; i < n4; i += WG) {
        let v = load_x(base + i) * inv_rms * w[i];
#if ADD
        y[base + i] += v;
#else
        y[base + i] = v;
#endif
    }
}
