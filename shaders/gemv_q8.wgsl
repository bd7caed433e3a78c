// gemv_q8: y = W x for one token with integer dot products: x comes as 8-bit blocks of 32
// (quantize_q8.wgsl), W in its GPU layout.
//
// Why: at 1-8B shapes a decode GEMV that turns every weight into a float (gemv.wgsl) is bound by the
// arithmetic of that conversion, not by memory: on an H100 it reads 4-bit weights at a third of the
// bandwidth, 8-bit ones at two thirds. Here 4 weights cost one mask and a quarter of a dot4I8Packed
// (lib/weights_q8.wgsl), and the scales are applied once per 32 (llama.cpp's GPU backends decode the
// same way). Each invocation reads one chunk of 32 weights of each of its ROWS rows per step (16-byte
// loads), and the activation chunk it loads serves all of them.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  xq      storage, read       array<vec4<u32>>  [n_in / 16]   activation quants (quantize_q8's xq,
//                                   or its xk for the K-quants: lib/weights_q8.wgsl says why)
//   2  y       storage, read_write array<f32>        [>= row_base + n_out]  output (and residual)
//   3..5       the weight arrays (lib/weights_q8.wgsl): n_out rows (2 n_out with GATE_UP) of n_in
//   6  xs      storage, read       array<vec4<f32>>  [n_in / 32]   activation block scales
//                                   (d, d sum q, sum x^2, d sum of the first 16 q)
//   QUANT_OUT only: the outputs as 8-bit blocks for the next linear (quantize_q8.wgsl's format; buffers
//   other than xq / xs: other workgroups still read those):
//   7  oq      storage, read_write array<vec4<u32>>  [(row_base + n_out) / 16]  quants, element order
//   8  ok      storage, read_write array<vec4<u32>>  [(row_base + n_out) / 16]  quants, K-quant order
//   9  os      storage, read_write array<vec4<f32>>  [(row_base + n_out) / 32]  block scales
//   10 onorm_w storage, read       array<vec4<f32>>  [(row_base + n_out) / 4]   NORM_OUT only: the next
//                                   RMSNorm's weight
//
// Specialization:
//   WEIGHTS      weight format: q4_0 q4_1 q5_0 q8_0 q4_k q5_k q6_k
//   N_IN         elements per weight row, a multiple of 32 (256 for the K-quants)
//   ROWS         output rows per invocation, 1..4 (1..2 with GATE_UP: 2 weight rows each)
//   ROW_THREADS  invocations that share a row's chunks (a power of two)
//   GROUPS       groups of ROW_THREADS invocations per workgroup (ROW_THREADS * GROUPS <= 256)
//   SUBGROUPS    every subgroup is exactly ROW_THREADS invocations (the host checks the adapter's
//                subgroup sizes): a row's sum is one subgroupAdd, no barrier; else a workgroup-memory
//                tree (lib/reduce.wgsl)
//   RESIDUAL, GATE_UP, GELU   as in gemv.wgsl
//   NORM         the input is RMSNorm(x) * norm_w: quantize_q8 applied norm_w (NORM_W), and the 1 / rms
//                comes here from the blocks' sums of x^2, applied to the row sums
//   QUANT_OUT    a workgroup's GROUPS * ROWS = 32 outputs (as stored to y, after the residual add) are
//                also quantized, as one block, into oq / ok / os: the next linear's input, without a
//                quantize_q8 dispatch of its own (passes.quantize_outputs). Needs n_out and row_base
//                multiples of 32.
//   NORM_OUT     with QUANT_OUT: the block quantized is y * onorm_w (the next linear's RMSNorm weight, as
//                quantize_q8's NORM_W; its sum of squares is y's)
// Grid: ceil(n_out / (GROUPS * ROWS)) workgroups; past max_compute_workgroups_per_dimension as a 2-D
// grid. Rows past n_out (the last workgroup's) read row n_out - 1 and write nothing.

struct Params {
    n_out: u32,     // output rows of this dispatch (rows of this weight part)
    row_base: u32,  // index in y of this dispatch's first output row (weights split into parts)
    eps: f32,       // RMSNorm epsilon (NORM)
}

const WG = ROW_THREADS * GROUPS;
const STEPS = (N_IN / 32u + ROW_THREADS - 1u) / ROW_THREADS;  // chunks per invocation (the last may be short)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> xs: array<vec4<f32>>;
#if QUANT_OUT
@group(0) @binding(7) var<storage, read_write> oq: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> ok: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read_write> os: array<vec4<f32>>;
#if NORM_OUT
@group(0) @binding(10) var<storage, read> onorm_w: array<vec4<f32>>;
#endif
// The workgroup's 32 outputs, as stored to y, for the block quantized after them.
var<workgroup> block_out: array<vec4<f32>, 8>;
#include "lib/q8_block.wgsl"
#endif

#include "lib/weights_q8.wgsl"
#include "lib/invocation.wgsl"
#if SUBGROUPS
#else
#include "lib/reduce.wgsl"
#endif
#if GATE_UP
#include "lib/gate.wgsl"
#endif

// The sum of v over this invocation's ROW_THREADS, to every one of them.
fn reduce(v: vec4<f32>, inv: Invocation) -> vec4<f32> {
#if SUBGROUPS
    return subgroupAdd(v);
#else
    let total = row_sum(v, inv);
    workgroupBarrier();  // everyone has read row_partials before the next reduce writes it
    return total;
#endif
}

// The output of one row from its dot product (and its up row's with GATE_UP), written to y; the value
// stored.
fn store(row: u32, dot_w: f32, dot_up: f32, inv_rms: f32) -> f32 {
    if (row >= params.n_out) {
        return 0.0;
    }
    var v = dot_w * inv_rms;
#if GATE_UP
    v = gate_activation(v) * (dot_up * inv_rms);
#endif
#if RESIDUAL
    v += y[params.row_base + row];
#endif
    y[params.row_base + row] = v;
    return v;
}

#if QUANT_OUT
// The workgroup's 32 outputs (block_out) as the 8-bit block of y rows first .. first + 31.
fn store_block_out(first: u32) {
    let x0 = block_out[0];
    let x1 = block_out[1];
    let x2 = block_out[2];
    let x3 = block_out[3];
    let x4 = block_out[4];
    let x5 = block_out[5];
    let x6 = block_out[6];
    let x7 = block_out[7];
    let sum_sq = dot(x0, x0) + dot(x1, x1) + dot(x2, x2) + dot(x3, x3) + dot(x4, x4) + dot(x5, x5)
        + dot(x6, x6) + dot(x7, x7);
    let b = first / 32u;
#if NORM_OUT
    let w = first / 4u;
    let block = q8_block(x0 * onorm_w[w], x1 * onorm_w[w + 1u], x2 * onorm_w[w + 2u], x3 * onorm_w[w + 3u],
        x4 * onorm_w[w + 4u], x5 * onorm_w[w + 5u], x6 * onorm_w[w + 6u], x7 * onorm_w[w + 7u], sum_sq);
#else
    let block = q8_block(x0, x1, x2, x3, x4, x5, x6, x7, sum_sq);
#endif
    os[b] = block.scales;
    oq[2u * b] = block.q_lo;
    oq[2u * b + 1u] = block.q_hi;
    ok[2u * b] = block.k_lo;
    ok[2u * b + 1u] = block.k_hi;
}

// Output r (0..31) of the workgroup into block_out.
fn keep_output(r: u32, v: f32) {
    block_out[r / 4u][r % 4u] = v;
}
#endif

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let group_first = group_index(grid) * GROUPS * ROWS;
    if (group_first >= params.n_out) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let lane = inv.index % ROW_THREADS;
    let first = group_first + (inv.index / ROW_THREADS) * ROWS;  // this invocation's rows: first ..
    let last_row = params.n_out - 1u;
    // Rows past the end read the last row (in bounds) and are not stored.
    let r0 = min(first, last_row);
    let r1 = min(first + 1u, last_row);
    let r2 = min(first + 2u, last_row);
    let r3 = min(first + 3u, last_row);
    var acc = vec4<f32>(0.0);  // rows first .. first + 3 (gate rows with GATE_UP)
    var up = vec4<f32>(0.0);   // GATE_UP: their up rows
    var sum_sq = 0.0;          // NORM: this invocation's share of sum(x^2)
    for (var step = 0u; step < STEPS; step++) {
        let c = lane + step * ROW_THREADS;
        if (c < CHUNKS) {
            let x = XQ32(xq[2u * c], xq[2u * c + 1u]);
            let s = xs[c];
            sum_sq += s.z;
            acc.x += chunk_dot(r0, c, x, s);
            if (ROWS > 1u) {
                acc.y += chunk_dot(r1, c, x, s);
            }
            if (ROWS > 2u) {
                acc.z += chunk_dot(r2, c, x, s);
            }
            if (ROWS > 3u) {
                acc.w += chunk_dot(r3, c, x, s);
            }
#if GATE_UP
            up.x += chunk_dot(r0 + params.n_out, c, x, s);
            if (ROWS > 1u) {
                up.y += chunk_dot(r1 + params.n_out, c, x, s);
            }
#endif
        }
    }
    acc = reduce(acc, inv);
#if GATE_UP
    up = reduce(up, inv);
#endif
    var inv_rms = 1.0;
#if NORM
    inv_rms = inverseSqrt(reduce(vec4<f32>(sum_sq), inv).x / f32(N_IN) + params.eps);
#endif
    if (lane == 0u) {
        var out = vec4<f32>(0.0);
        out.x = store(first, acc.x, up.x, inv_rms);
        if (ROWS > 1u) {
            out.y = store(first + 1u, acc.y, up.y, inv_rms);
        }
        if (ROWS > 2u) {
            out.z = store(first + 2u, acc.z, up.z, inv_rms);
        }
        if (ROWS > 3u) {
            out.w = store(first + 3u, acc.w, up.w, inv_rms);
        }
#if QUANT_OUT
        let r = first - group_first;
        keep_output(r, out.x);
        if (ROWS > 1u) {
            keep_output(r + 1u, out.y);
        }
        if (ROWS > 2u) {
            keep_output(r + 2u, out.z);
        }
        if (ROWS > 3u) {
            keep_output(r + 3u, out.w);
        }
#endif
    }
#if QUANT_OUT
    workgroupBarrier();
    if (inv.index == 0u) {
        store_block_out(params.row_base + group_first);
    }
#endif
}
