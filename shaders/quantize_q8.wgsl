// quantize_q8: activation rows as 8-bit blocks of 32, the input of the integer dot-product GEMV
// (gemv_q8.wgsl).
//
// Block b of a row (elements 32b .. 32b+31 of v = x, or x * norm_w with NORM_W): d = max|v| / 127,
// q_i = round(v_i / d) (WGSL round: half to even; q = 0 when d = 0), as int8; the block's scales are
// (d, d * sum q, sum x^2, 0). A dot product with a block of a weight row is then d_w * d * (q_w . q) in
// integers, and a weight format's offset (Q4_0's -8, Q4_K's min) costs one multiply by d * sum q
// (llama.cpp's GPU backends feed their quantized matrix-vector kernels the same way: its q8_1 blocks).
//
// An RMSNorm before a GEMV is split in two: the norm weight is applied here (NORM_W), and the 1 / rms(x)
// by the GEMV to its sums (gemv_q8 NORM), from the blocks' sums of x^2. So no block waits for the whole
// row: one invocation per block, no barriers, any number of workgroups.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_rows * n / 4]   input rows
//   2  xq      storage, read_write array<u32>        [n_rows * n / 4]   the quants, 4 int8 per u32,
//                                                     element order (byte 0 first)
//   3  xs      storage, read_write array<vec4<f32>>  [n_rows * n / 32]  (d, d * sum q, sum x^2, 0)
//                                                     per block
//   4  xk      storage, read_write array<u32>        [n_rows * n / 4]   K_ORDER only: the same quants
//                                                     in K-quant order: per 8 elements e0..e7, the words
//                                                     (e0 e2 e4 e6), (e1 e3 e5 e7) (lib/weights_q8.wgsl)
//   6  norm_w  storage, read       array<vec4<f32>>  [n / 4]            RMSNorm weight (NORM_W only)
//
// Specialization:
//   WG       invocations per workgroup (one block each)
//   NORM_W   v = x * norm_w
//   K_ORDER  also write xk
// Grid: ceil(n_rows * n / 32 / WG) workgroups (2-D past 65535).

struct Params {
    n: u32,         // elements per row, a multiple of 32
    n_blocks: u32,  // blocks of all rows: n_rows * n / 32
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> xs: array<vec4<f32>>;
#if K_ORDER
@group(0) @binding(4) var<storage, read_write> xk: array<u32>;
#endif
#if NORM_W
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif

#include "lib/invocation.wgsl"

// Quantizes 4 values by 1 / d.
fn quant4(v: vec4<f32>, inv_d: f32) -> vec4<i32> {
    return vec4<i32>(round(v * inv_d));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let b = group_index(grid) * WG + inv.index;  // block (of all rows)
    if (b >= params.n_blocks) {
        return;
    }
    let at = 8u * b;  // its first vec4
    let x0 = x[at];
    let x1 = x[at + 1u];
    let x2 = x[at + 2u];
    let x3 = x[at + 3u];
    let x4 = x[at + 4u];
    let x5 = x[at + 5u];
    let x6 = x[at + 6u];
    let x7 = x[at + 7u];
    let sum_sq = dot(x0, x0) + dot(x1, x1) + dot(x2, x2) + dot(x3, x3) + dot(x4, x4) + dot(x5, x5)
        + dot(x6, x6) + dot(x7, x7);
#if NORM_W
    let w = (at % (params.n / 4u));  // the block's first vec4 in the row
    let v0 = x0 * norm_w[w];
    let v1 = x1 * norm_w[w + 1u];
    let v2 = x2 * norm_w[w + 2u];
    let v3 = x3 * norm_w[w + 3u];
    let v4 = x4 * norm_w[w + 4u];
    let v5 = x5 * norm_w[w + 5u];
    let v6 = x6 * norm_w[w + 6u];
    let v7 = x7 * norm_w[w + 7u];
#else
    let v0 = x0;
    let v1 = x1;
    let v2 = x2;
    let v3 = x3;
    let v4 = x4;
    let v5 = x5;
    let v6 = x6;
    let v7 = x7;
#endif
    let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    let d = max(max(m.x, m.y), max(m.z, m.w)) / 127.0;
    let inv_d = select(0.0, 1.0 / d, d > 0.0);
    let q0 = quant4(v0, inv_d);
    let q1 = quant4(v1, inv_d);
    let q2 = quant4(v2, inv_d);
    let q3 = quant4(v3, inv_d);
    let q4 = quant4(v4, inv_d);
    let q5 = quant4(v5, inv_d);
    let q6 = quant4(v6, inv_d);
    let q7 = quant4(v7, inv_d);
    let sums = q0 + q1 + q2 + q3 + q4 + q5 + q6 + q7;
    xs[b] = vec4<f32>(d, d * f32(sums.x + sums.y + sums.z + sums.w), sum_sq, 0.0);
    xq[at] = pack4xI8(q0);
    xq[at + 1u] = pack4xI8(q1);
    xq[at + 2u] = pack4xI8(q2);
    xq[at + 3u] = pack4xI8(q3);
    xq[at + 4u] = pack4xI8(q4);
    xq[at + 5u] = pack4xI8(q5);
    xq[at + 6u] = pack4xI8(q6);
    xq[at + 7u] = pack4xI8(q7);
#if K_ORDER
    // Per 8 elements (two vec4s): the even ones, then the odd ones.
    xk[at] = pack4xI8(vec4<i32>(q0.xz, q1.xz));
    xk[at + 1u] = pack4xI8(vec4<i32>(q0.yw, q1.yw));
    xk[at + 2u] = pack4xI8(vec4<i32>(q2.xz, q3.xz));
    xk[at + 3u] = pack4xI8(vec4<i32>(q2.yw, q3.yw));
    xk[at + 4u] = pack4xI8(vec4<i32>(q4.xz, q5.xz));
    xk[at + 5u] = pack4xI8(vec4<i32>(q4.yw, q5.yw));
    xk[at + 6u] = pack4xI8(vec4<i32>(q6.xz, q7.xz));
    xk[at + 7u] = pack4xI8(vec4<i32>(q6.yw, q7.yw));
#endif
}
