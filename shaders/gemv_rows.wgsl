// gemv_rows: y = W x for one token (decode) on a CPU adapter (lavapipe, SwiftShader): each invocation
// computes ROWS (2 or 4) consecutive output rows, no workgroup memory and no barriers.
//
// Why a second GEMV: a CPU implementation runs a workgroup's invocations as SIMD lanes and switches
// between them at every barrier (~2 µs per invocation), so gemv.wgsl's row reductions and its COMBINE
// prologue (both need barriers) spend most of their time switching. With one row per invocation
// (gemv.wgsl at ROW_THREADS = 1) every row loads the same inputs again: the input (and its norm
// weight) are 4 vec4 loads per step of 8 weights, against 1-3 loads of the weights themselves. Here
// the inputs of a step are loaded (normalized, or merged from attention splits) once for ROWS rows.
// Each row is summed in the same order as gemv.wgsl at ROW_THREADS = 1, so without COMBINE the
// results are the same bits.
//
// Bindings (group 0), as gemv.wgsl:
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_in / 4]        input activations (PREPARED:
//                                  [n_in / 4 + 1], from norm_inputs.wgsl)
//   2  y       storage, read_write array<f32>        [>= row_base + n_out]  output (and residual)
//   3..5       the weight arrays of lib/weights.wgsl: n_out rows (2 n_out with GATE_UP) of n_in
//   6  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]        RMSNorm weight (NORM only)
//   7  state   storage, read       array<u32>        the engine state (pos) (COMBINE only, instead of x)
//   8  partials storage, read      array<vec4<f32>>  [n_in / HEAD_DIM][n_splits][HEAD_DIM / 4 + 1]
//                                  attn_decode's split partials (COMBINE only, instead of x)
//
// Specialization:
//   WEIGHTS   weight format (lib/weights.wgsl)
//   N_IN      elements per weight row (a constant: the row loop's trip count is known)
//   ROWS      output rows per invocation, 2 or 4 (more rows share the input loads, but hold more
//             registers: SwiftShader's code slows down past ~4 weight rows in flight)
//   WG        invocations per workgroup (ROWS * WG rows per workgroup)
//   RESIDUAL, GATE_UP, GELU, NORM   as in gemv.wgsl
//   PREPARED  with NORM: x is norm_inputs.wgsl's output (x * norm_w, then the sum of squares of x in
//             this format's step order), so the steps load no norm weights and sum no squares; the
//             same bits as NORM without it
//   COMBINE   x is attn_decode's split partials, as in gemv.wgsl, but each invocation merges the
//             inputs it reads itself (no workgroup memory): cheap with the one split of CPU shapes
//   HEAD_DIM  elements per attention head (COMBINE only)
//   SUBGROUPS the inputs of 8 steps loaded (normalized, merged) one step per lane and handed to every lane
//             with subgroupShuffle (needs subgroups of at least 8): all invocations read the same inputs,
//             which a CPU adapter gathers per lane; the rows' sums keep their step order (the same bits)
// Grid: ceil(n_out / (ROWS WG)) workgroups (2-D past 65535).

struct Params {
    n_out: u32,     // output rows of this dispatch (rows of this weight part)
    row_base: u32,  // index in y of this dispatch's first output row (weights split into parts)
    eps: f32,       // RMSNorm epsilon (NORM only)
#if COMBINE
    n_ctx: u32,     // positions per head in the KV cache (the attention's)
    window: u32,    // the attention's sliding window (0 = off)
    n_splits: u32,  // most splits per head (the partials' stride)
#endif
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#if NORM
#if PREPARED
#else
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif
#endif
#if COMBINE
@group(0) @binding(7) var<storage, read> state: array<u32>;
@group(0) @binding(8) var<storage, read> partials: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif

#include "lib/weights.wgsl"
#include "lib/invocation.wgsl"
#if GATE_UP
#include "lib/gate.wgsl"
#endif

#if COMBINE
#include "lib/state.wgsl"
#include "lib/attn_splits.wgsl"

const HD4 = HEAD_DIM / 4u;
const NEG_MAX = -3.0e38;  // below any score

// Input vec4 c of the attention output: its head's splits merged in order, as gemv.wgsl does.
fn x_at(c: u32, splits: Splits) -> vec4<f32> {
    let record = HD4 + 1u;
    let first = (c / HD4) * params.n_splits * record + c % HD4;  // the head's split 0, this vec4
    let stats_first = first - c % HD4 + HD4;
    var m = NEG_MAX;
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < splits.count; s++) {
        let stats = partials[stats_first + s * record];
        let o = partials[first + s * record];
        let new_max = max(m, stats.x);
        let old_weight = exp(m - new_max);
        let weight = exp(stats.x - new_max);
        total = total * old_weight + stats.y * weight;
        acc = acc * old_weight + o * weight;
        m = new_max;
    }
    return acc / total;
}
#else
fn x_at(c: u32) -> vec4<f32> {
    return x[c];
}
#endif

// The output of one row from its sums (gate or only row . x, up row . x) and the sum of squares of x.
fn finish(row: u32, dot_x: f32, dot_up: f32, sum_sq: f32) {
    if (row >= params.n_out) {
        return;
    }
    var v = dot_x;
#if NORM
    let inv_rms = inverseSqrt(sum_sq / f32(N_IN) + params.eps);
    v *= inv_rms;
#endif
#if GATE_UP
    var up = dot_up;
#if NORM
    up *= inv_rms;
#endif
    v = gate_activation(v) * up;
#endif
#if RESIDUAL
    y[params.row_base + row] += v;
#else
    y[params.row_base + row] = v;
#endif
}

// The accumulators of the invocation's rows: gate (or only) row . x and up row . x (GATE_UP).
var<private> acc: vec4<f32>;
var<private> acc_up: vec4<f32>;

// Step s of rows row0..row3 (rows past ROWS unused) against the inputs x_lo, x_hi.
fn step_rows(s: u32, row0: u32, row1: u32, row2: u32, row3: u32, x_lo: vec4<f32>, x_hi: vec4<f32>) {
    let w0 = load_w8(row0, s, N_IN);
    let w1 = load_w8(row1, s, N_IN);
    acc.x += dot(w0.lo, x_lo) + dot(w0.hi, x_hi);
    acc.y += dot(w1.lo, x_lo) + dot(w1.hi, x_hi);
#if ROWS == 4
    let w2 = load_w8(row2, s, N_IN);
    let w3 = load_w8(row3, s, N_IN);
    acc.z += dot(w2.lo, x_lo) + dot(w2.hi, x_hi);
    acc.w += dot(w3.lo, x_lo) + dot(w3.hi, x_hi);
#endif
#if GATE_UP
    let u0 = load_w8(row0 + params.n_out, s, N_IN);
    let u1 = load_w8(row1 + params.n_out, s, N_IN);
    acc_up.x += dot(u0.lo, x_lo) + dot(u0.hi, x_hi);
    acc_up.y += dot(u1.lo, x_lo) + dot(u1.hi, x_hi);
#if ROWS == 4
    let u2 = load_w8(row2 + params.n_out, s, N_IN);
    let u3 = load_w8(row3 + params.n_out, s, N_IN);
    acc_up.z += dot(u2.lo, x_lo) + dot(u2.hi, x_hi);
    acc_up.w += dot(u3.lo, x_lo) + dot(u3.hi, x_hi);
#endif
#endif
}

// The inputs of step s (normalized with NORM, merged from the splits with COMBINE) and, with NORM
// (not PREPARED), the sum of squares of the raw inputs.
struct StepInputs {
    lo: vec4<f32>,
    hi: vec4<f32>,
    squares: f32,
}

#if COMBINE
var<private> combine_splits: Splits;  // the attention's splits, found once per invocation
#endif

fn step_inputs(s: u32, row0: u32) -> StepInputs {
    let w = load_w8(row0, s, N_IN);  // only its vec4 indices are used (the same for every row)
#if COMBINE
    var x_lo = x_at(w.lo_at, combine_splits);
    var x_hi = x_at(w.hi_at, combine_splits);
#else
    var x_lo = x_at(w.lo_at);
    var x_hi = x_at(w.hi_at);
#endif
    var squares = 0.0;
#if NORM
#if PREPARED
#else
    squares = dot(x_lo, x_lo) + dot(x_hi, x_hi);
    x_lo *= norm_w[w.lo_at];
    x_hi *= norm_w[w.hi_at];
#endif
#endif
    return StepInputs(x_lo, x_hi, squares);
}

#if SUBGROUPS
const STEPS = N_IN / 8u;
const GROUPS8 = STEPS / 8u;  // groups of 8 steps whose inputs the 8 lanes load, one step each
#endif

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let row0 = (group_index(grid) * WG + inv.index) * ROWS;
#if SUBGROUPS
    // No early return: every lane takes part in the broadcasts (rows past n_out write nothing).
#else
    if (row0 >= params.n_out) {
        return;  // no barriers follow: a per-invocation return is fine
    }
#endif
    // Rows past n_out read the last row again (a valid address) and write nothing.
    let last = params.n_out - 1u;
    let r0 = min(row0, last);
    let row1 = min(row0 + 1u, last);
    var row2 = row1;
    var row3 = row1;
#if ROWS == 4
    row2 = min(row0 + 2u, last);
    row3 = min(row0 + 3u, last);
#endif
#if COMBINE
    combine_splits = attn_splits(state[POS], params.n_ctx, params.window, params.n_splits);
#endif
#if PREPARED
    let sum_sq = x[N_IN / 4u].x;
#else
    var sum_sq = 0.0;
#endif
    var first = 0u;  // the first step of the plain loop
#if SUBGROUPS
    // Lane l loads (normalizes, merges) the inputs of step 8 g + l; subgroupShuffle hands step
    // 8 g + j to every lane, which runs it in step order (the same sums, in the same order).
    let lane = inv.subgroup_lane % 8u;
    for (var g = 0u; g < GROUPS8; g++) {
        let base = 8u * g;
        let mine = step_inputs(base + lane, r0);
        for (var j = 0u; j < 8u; j++) {
            let x_lo = subgroupShuffle(mine.lo, j);
            let x_hi = subgroupShuffle(mine.hi, j);
#if NORM
#if PREPARED
#else
            sum_sq += subgroupShuffle(mine.squares, j);
#endif
#endif
            step_rows(base + j, r0, row1, row2, row3, x_lo, x_hi);
        }
    }
    first = 8u * GROUPS8;
#endif
    for (var s = first; s < N_IN / 8u; s++) {
        let inputs = step_inputs(s, r0);
#if NORM
#if PREPARED
#else
        sum_sq += inputs.squares;
#endif
#endif
        step_rows(s, r0, row1, row2, row3, inputs.lo, inputs.hi);
    }
    finish(row0, acc.x, acc_up.x, sum_sq);
    finish(row0 + 1u, acc.y, acc_up.y, sum_sq);
#if ROWS == 4
    finish(row0 + 2u, acc.z, acc_up.z, sum_sq);
    finish(row0 + 3u, acc.w, acc_up.w, sum_sq);
#endif
}
