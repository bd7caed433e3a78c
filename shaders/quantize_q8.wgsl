// quantize_q8: activation rows as 8-bit blocks of 32, the input of the integer dot-product GEMV and
// GEMM (gemv_q8.wgsl, gemm_q8.wgsl).
//
// Block b of a row (elements 32b .. 32b+31 of v = x, or x * norm_w with NORM_W): d = max|v| / 127,
// q_i = v_i / d rounded half away from zero (lib/quant8.wgsl), as int8; the block's scales are
// (d, d * sum q, sum x^2, d * sum q_0..15). A dot product with a block of a weight row is then
// d_w * d * (q_w . q) in integers, and a weight format's offset (Q4_0's -8, Q4_K's min) costs one
// multiply by d * sum q (llama.cpp's GPU backends feed their quantized matrix-vector kernels the same
// way: its q8_1 blocks; Q6_K's offset applies per 16, hence the first half's sum too).
//
// An RMSNorm before a GEMV or GEMM is split in two: the norm weight is applied here (NORM_W), and the
// 1 / rms(x) by the GEMV / GEMM to its sums (NORM), from the blocks' sums of x^2. So no block waits for the whole
// row: one invocation per block, no barriers, any number of workgroups.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_rows * n / 4]   input rows
//   2  xq      storage, read_write array<vec4<u32>>  [n_rows * n / 16]  the quants, 4 int8 per u32,
//                                                     element order (byte 0 first)
//   3  xs      storage, read_write array<vec4<f32>>  [n_rows * n / 32]  (d, d * sum q, sum x^2,
//                                                     d * sum q_0..15) per block
//   4  xk      storage, read_write array<vec4<u32>>  [n_rows * n / 16]  K_ORDER only: the same quants
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
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> xs: array<vec4<f32>>;
#if K_ORDER
@group(0) @binding(4) var<storage, read_write> xk: array<vec4<u32>>;
#endif
#if NORM_W
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif

#include "lib/invocation.wgsl"
#include "lib/quant8.wgsl"

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
    store_block_q8(b, v0, v1, v2, v3, v4, v5, v6, v7, sum_sq);
}
