// gemv: y = W x for one token, reading W in its GPU layout (quantized blocks stay quantized).
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_in / 4]        input activations
//                (ADD_NORM: read_write, the two halves of the residual stream, below)
//   2  y       storage, read_write array<f32>        [>= row_base + n_out]  output (and residual)
//   3..5       the weight arrays of lib/weights.wgsl: n_out rows (2 n_out with GATE_UP) of n_in
//   6  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]        RMSNorm weight (NORM only)
//   7  state   storage, read       array<u32>        the engine state (pos) (COMBINE only, instead of x)
//   8  partials storage, read      array<vec4<f32>>  [n_in / HEAD_DIM][n_splits][HEAD_DIM / 4 + 1]
//                                  attn_decode's split partials (COMBINE only, instead of x)
//   9  proj    storage, read       array<vec4<f32>>  [n_in / 4]        a block's output (ADD_NORM only)
//   10 post_w  storage, read       array<vec4<f32>>  [n_in / 4]        its post-norm weight (ADD_NORM only)
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
//   GATE_UP      W is [gate; up] (rows 0..n_out-1 gate, n_out..2 n_out-1 up): y[r] = act(g_r) * u_r
//   GELU         with GATE_UP: act is GELU (tanh approximation), else SiLU (lib/gate.wgsl)
//   NORM         x is replaced by x / rms(x) * norm_w; the sum of squares is accumulated in the same
//                pass over x, so the norm costs no extra dispatch and no extra read of x
//   COMBINE      x is a decode step's attention output, still as attn_decode's split partials: each
//                workgroup first merges them into workgroup memory (the splits of the state's
//                position, lib/attn_splits.wgsl), 2048 inputs at a time, so the merge costs no
//                dispatch of its own. Pick few workgroups (many ROWS): each one reads all the partials
//   HEAD_DIM     elements per attention head (COMBINE only)
//   ADD_NORM     a post-norm residual add still pending (Gemma's sandwich norms, plan.Graph.add_norm):
//                the input is x' = x + proj / rms(proj) * post_w, and NORM (if set) normalizes x'.
//                x holds two halves of the residual stream: x' is read from the half at x_in (the old
//                x plus the add, formed on the fly) and workgroup 0 stores it to the half at x_out
//                (when write_x), for the rest of the layer. Other workgroups still read the old half
//                while it is written, hence two halves: one binding, so that with 3 weight arrays the
//                kernel binds 8 storage buffers (WebGPU's default limit per stage). Every workgroup
//                first sums proj's squares itself (n_in floats, one workgroup reduction): the fold
//                costs no dispatch of its own.
//
// Each row is handled by ROW_THREADS invocations that stride over its n_in / 8 steps of 8 weights
// (consecutive invocations read consecutive words), accumulate in f32, then sum via row_sum.
// Grid: ceil(n_out / ROWS) workgroups; past max_compute_workgroups_per_dimension as a 2-D grid.

struct Params {
    n_out: u32,     // output rows of this dispatch (rows of this weight part)
    row_base: u32,  // index in y of this dispatch's first output row (weights split into parts)
    eps: f32,       // RMSNorm epsilon (NORM; with ADD_NORM also the post-norm's)
#if ADD_NORM
    x_in: u32,      // vec4 index in x of the half read (the residual before the add)
    x_out: u32,     // vec4 index in x of the half x' is stored to (the other half)
    write_x: u32,   // 1: this dispatch's workgroup 0 stores x' (one dispatch of those that read it)
#endif
#if COMBINE
    n_ctx: u32,     // positions per head in the KV cache (the attention's)
    window: u32,    // the attention's sliding window (0 = off)
    n_splits: u32,  // most splits per head (the partials' stride)
#endif
}

const WG = ROWS * ROW_THREADS;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#if NORM
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif
#if COMBINE
@group(0) @binding(7) var<storage, read> state: array<u32>;
@group(0) @binding(8) var<storage, read> partials: array<vec4<f32>>;
#else
#if ADD_NORM
@group(0) @binding(1) var<storage, read_write> x: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> proj: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read> post_w: array<vec4<f32>>;
#else
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
#endif
#endif

#include "lib/weights.wgsl"
#include "lib/reduce.wgsl"
#if GATE_UP
#include "lib/gate.wgsl"
#endif

#if ADD_NORM
var<private> post_inv_rms: f32;  // 1 / rms(proj), from the prologue

// Input vec4 i: x' = x + proj / rms(proj) * post_w, as rmsnorm.wgsl ADD would have stored it.
fn load_input(i: u32) -> vec4<f32> {
    return x[params.x_in + i] + proj[i] * post_inv_rms * post_w[i];
}
#else
#if COMBINE
#else
fn load_input(i: u32) -> vec4<f32> {
    return x[i];
}
#endif
#endif

#if COMBINE
#include "lib/state.wgsl"
#include "lib/attn_splits.wgsl"

const HD4 = HEAD_DIM / 4u;
const X_BLOCK = min(N_IN, 2048u);  // inputs merged at a time (8 KiB of workgroup memory)
const NEG_MAX = -3.0e38;           // below any score

var<workgroup> x_tile: array<vec4<f32>, X_BLOCK / 4u>;  // inputs x0 .. x0 + X_BLOCK of the attention output

// The online merge of splits so far: the largest max, the sum and o weighted relative to it.
struct Merge {
    m: f32,
    total: f32,
    acc: vec4<f32>,
}

fn merge(so_far: Merge, stats: vec4<f32>, o: vec4<f32>) -> Merge {
    let new_max = max(so_far.m, stats.x);
    let old_weight = exp(so_far.m - new_max);
    let weight = exp(stats.x - new_max);
    return Merge(new_max, so_far.total * old_weight + stats.y * weight, so_far.acc * old_weight + o * weight);
}

// x_tile = inputs x0 .. x0 + X_BLOCK: per head, sum_s exp(max_s - M) o_s / sum_s exp(max_s - M) sum_s
// over its splits (M: the largest max_s), merged online, four splits at a time: their 8 loads go
// into named registers and are issued together.
fn combine_splits(li: u32, x0: u32) {
    let splits = attn_splits(state[POS], params.n_ctx, params.window, params.n_splits);
    let record = HD4 + 1u;
    let last = splits.count - 1u;
    for (var c = x0 / 4u + li; c < min(x0 + X_BLOCK, N_IN) / 4u; c += WG) {
        let first = (c / HD4) * params.n_splits * record + c % HD4;  // the head's split 0, this vec4
        let stats_first = first - c % HD4 + HD4;
        var m = Merge(NEG_MAX, 0.0, vec4<f32>(0.0));
        for (var s = 0u; s <= last; s += 4u) {
            // Past the last split: the last one's record again, skipped below.
            let s1 = min(s + 1u, last) * record;
            let s2 = min(s + 2u, last) * record;
            let s3 = min(s + 3u, last) * record;
            let stats0 = partials[stats_first + s * record];
            let stats1 = partials[stats_first + s1];
            let stats2 = partials[stats_first + s2];
            let stats3 = partials[stats_first + s3];
            let o0 = partials[first + s * record];
            let o1 = partials[first + s1];
            let o2 = partials[first + s2];
            let o3 = partials[first + s3];
            m = merge(m, stats0, o0);
            if (s + 1u <= last) {
                m = merge(m, stats1, o1);
            }
            if (s + 2u <= last) {
                m = merge(m, stats2, o2);
            }
            if (s + 3u <= last) {
                m = merge(m, stats3, o3);
            }
        }
        x_tile[c - x0 / 4u] = m.acc / m.total;
    }
    workgroupBarrier();
}
#endif

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let first_row = group_index(grid) * ROWS;
    if (first_row >= params.n_out) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let row = first_row + inv.index / ROW_THREADS;
    // acc = (gate or only row . x, up row . x, sum of x^2, unused)
    var acc = vec4<f32>(0.0);
#if COMBINE
    for (var x0 = 0u; x0 < N_IN; x0 += X_BLOCK) {
        combine_splits(inv.index, x0);
        if (row < params.n_out) {
            // A constant trip count (X_BLOCK / 8 steps per block), so the loads can all be issued at once.
            for (var i = inv.index % ROW_THREADS; i < X_BLOCK / 8u; i += ROW_THREADS) {
                let s = x0 / 8u + i;
                if (s < N_IN / 8u) {
                    let w = load_w8(row, s, N_IN);
                    acc.x += dot(w.lo, x_tile[w.lo_at - x0 / 4u]) + dot(w.hi, x_tile[w.hi_at - x0 / 4u]);
                }
            }
        }
        workgroupBarrier();  // everyone is done with x_tile before the next block replaces it
    }
#else
#if ADD_NORM
    var sum_sq = 0.0;
    for (var i = inv.index; i < N_IN / 4u; i += WG) {
        let p = proj[i];
        sum_sq += dot(p, p);
    }
    post_inv_rms = inverseSqrt(workgroup_sum(vec4<f32>(sum_sq, 0.0, 0.0, 0.0), inv).x / f32(N_IN) + params.eps);
    if (group_index(grid) == 0u && params.write_x != 0u) {
        for (var i = inv.index; i < N_IN / 4u; i += WG) {
            x[params.x_out + i] = load_input(i);
        }
    }
#endif
    if (row < params.n_out) {
        for (var s = inv.index % ROW_THREADS; s < N_IN / 8u; s += ROW_THREADS) {
            let w = load_w8(row, s, N_IN);
            var x_lo = load_input(w.lo_at);
            var x_hi = load_input(w.hi_at);
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
#endif
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
    v = gate_activation(v) * up;
#endif
#if RESIDUAL
    y[params.row_base + row] += v;
#else
    y[params.row_base + row] = v;
#endif
}
