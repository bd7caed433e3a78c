// gemv: y = W x for one token, reading W in its GPU layout (quantized blocks stay quantized).
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_in / 4]        input activations
//   2  y       storage, read_write array<f32>        [>= row_base + n_out]  output (and residual)
//   3..5       the weight arrays of lib/weights.wgsl: n_out rows (2 n_out with GATE_UP) of n_in
//   6  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]        RMSNorm weight (NORM only)
//
// Specialization:
//   WEIGHTS      weight format (lib/weights.wgsl)
//   N_IN         elements per weight row (multiple of 32 for block formats, of 8 for f32/f16): a
//                constant, so the row loop has a known trip count and the compiler can unroll it and
//                issue all its loads at once (decode GEMVs are latency-bound)
//   ROWS         output rows per workgroup (ROWS * ROW_THREADS <= 256)
//   ROW_THREADS  invocations per row, a power of two (with SUBGROUPS: >= the largest subgroup size);
//                chosen per matrix by Kernels.gemv_shape
//   SUBGROUPS    reduce partial sums with subgroupAdd, else a shared-memory tree
//   RESIDUAL     y[r] += (W x)[r]: the residual add fused into the projection
//   GATE_UP      W is [gate; up] (rows 0..n_out-1 gate, n_out..2 n_out-1 up): y[r] = silu(g_r) * u_r
//   NORM         x is replaced by x / rms(x) * norm_w; the sum of squares is accumulated in the same
//                pass over x, so the norm costs no extra dispatch and no extra read of x
//
// Each row is handled by ROW_THREADS invocations that stride over its n_in / 8 steps of 8 weights
// (consecutive invocations read consecutive words), accumulate in f32, then sum via row_sum.
// Grid: ceil(n_out / ROWS) workgroups; past max_compute_workgroups_per_dimension as a 2-D grid.

struct Params {
    n_out: u32,     // output rows of this dispatch (rows of this weight part)
    row_base: u32,  // index in y of this dispatch's first output row (weights split into parts)
    eps: f32,       // RMSNorm epsilon (NORM only)
}

const WG = ROWS * ROW_THREADS;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#if NORM
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif

#include "lib/weights.wgsl"
#include "lib/reduce.wgsl"

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let first_row = group_index(grid) * ROWS;
    if (first_row >= params.n_out) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let row = first_row + inv.index / ROW_THREADS;
    // acc = (gate or only row . x, up row . x, sum of x^2, unused)
    var acc = vec4<f32>(0.0);
    if (row < params.n_out) {
        for (var s = inv.index % ROW_THREADS; s < N_IN / 8u; s += ROW_THREADS) {
            let w = load_w8(row, s, N_IN);
            var x_lo = x[w.lo_at];
            var x_hi = x[w.hi_at];
#if NORM
            acc.z += dot(x_lo, x_lo) + dot(x_hi, x_hi);
            x_lo *= norm_w[w.lo_at];
            x_hi *= norm_w[w.hi_at];
#endif
            acc.x += dot(w.lo, x_lo) + dot(w.hi, x_hi);
#if GATE_UP
            let up = load_w8(row + params.n_out, s, N_IN);
            acc.y += dot(up.lo, x_lo) + dot(up.hi, x_hi);
#endif
        }
    }
    let total = row_sum(acc, inv);
    if (inv.index % ROW_THREADS != 0u || row >= params.n_out) {
        return;
    }
    var v = total.x;
#if NORM
    let inv_rms = inverseSqrt(total.z / f32(N_IN) + params.eps);
    v *= inv_rms;
#endif
#if GATE_UP
    var up = total.y;
#if NORM
    up *= inv_rms;
#endif
    v = v / (1.0 + exp(-v)) * up;
#endif
#if RESIDUAL
    y[params.row_base + row] += v;
#else
    y[params.row_base + row] = v;
#endif
}
