// gemm: Y[t] = W X[t] for a chunk of tokens (prefill), W read in its GPU layout.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_tokens * n_in / 4]   input rows
//   2  y       storage, read_write array<f32>        [n_tokens * y_stride]   output rows (and residual)
//   3..5       the weight arrays of lib/weights.wgsl: n_out rows (2 n_out with GATE_UP) of n_in
//   6  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]              RMSNorm weight (NORM only)
//
// Specialization:
//   WEIGHTS   weight format (lib/weights.wgsl)
//   F16       shared-memory tiles and the 4-wide products in f16 (sums stay f32): half the tile
//             memory and twice the arithmetic rate where f16 is native; inputs must stay < 65504
//   RESIDUAL, GATE_UP, GELU, NORM   as in gemv.wgsl (NORM: each workgroup first computes the 1/rms of its
//             tokens, so the tile holds normalized values, which also keeps f16 tiles in range)
//
// Tiling: 256 invocations compute 32 tokens x 64 weight rows (with GATE_UP: 32 gate rows and their 32
// up rows, giving 32 outputs), one 32-column block of the inner dimension at a time. Per block, each
// invocation dequantizes one step of 8 weights and loads one vec4 of X into shared memory; then it
// accumulates tokens ty, ty+16 x weight rows tx, tx+16, tx+32, tx+48 in f32.
// Grid: row_tiles * ceil(n_tokens / 32) workgroups (2-D past 65535); workgroup g takes row tile
// g % row_tiles and token tile g / row_tiles.

struct Params {
    n_in: u32,       // elements per weight row, multiple of 32 (8 for f32/f16)
    n_out: u32,      // output rows of this dispatch (rows of this weight part)
    row_base: u32,   // column of Y of this dispatch's first output row
    eps: f32,        // RMSNorm epsilon (NORM only)
    n_tokens: u32,   // rows of X and Y
    y_stride: u32,   // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / OUT_ROWS)
}

#if F16
alias tile_t = f16;
#else
alias tile_t = f32;
#endif

const TOKENS = 32u;  // tokens per tile
const W_ROWS = 64u;  // weight rows per tile
const PAD = 9u;      // vec4s per tile row: 8 + 1 so that rows start in different memory banks
#if GATE_UP
const OUT_ROWS = 32u;
#else
const OUT_ROWS = 64u;
#endif

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#if NORM
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;
#endif

#include "lib/weights.wgsl"
#include "lib/invocation.wgsl"
#if GATE_UP
#include "lib/gate.wgsl"
#endif

var<workgroup> w_tile: array<vec4<tile_t>, W_ROWS * PAD>;  // [weight row][column / 4]
var<workgroup> x_tile: array<vec4<tile_t>, TOKENS * PAD>;  // [token][column / 4]
#if NORM
var<workgroup> sum_sq: array<f32, 256>;                    // [token][8 partial sums]
var<workgroup> inv_rms: array<f32, TOKENS>;
#endif

@compute @workgroup_size(256)
fn main(inv: Invocation, grid: Grid) {
    let g = group_index(grid);
    let token0 = (g / params.row_tiles) * TOKENS;
    if (token0 >= params.n_tokens) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let row0 = (g % params.row_tiles) * OUT_ROWS;
    let li = inv.index;
    let n4 = params.n_in / 4u;

    // What this invocation stages: weight row w_local of the tile (its step li % 4 of each block),
    // and vec4 li % 8 of token x_local of the tile.
    let w_local = li / 4u;
    var w_row = row0 + w_local;
    var w_valid = w_row < params.n_out;
#if GATE_UP
    if (w_local >= OUT_ROWS) {  // the second half of the tile holds the up rows
        w_row = params.n_out + row0 + w_local - OUT_ROWS;
        w_valid = row0 + w_local - OUT_ROWS < params.n_out;
    }
#endif
    let x_local = li / 8u;
    let x_valid = token0 + x_local < params.n_tokens;
    let x_row = (token0 + x_local) * n4;

#if NORM
    var ss = 0.0;
    if (x_valid) {
        for (var i = li % 8u; i < n4; i += 8u) {
            let v = x[x_row + i];
            ss += dot(v, v);
        }
    }
    sum_sq[li] = ss;
    workgroupBarrier();
    if (li < TOKENS) {
        var total = 0.0;
        for (var j = 0u; j < 8u; j++) {
            total += sum_sq[li * 8u + j];
        }
        inv_rms[li] = inverseSqrt(total / f32(params.n_in) + params.eps);
    }
    workgroupBarrier();
    let x_scale = inv_rms[x_local];
#endif

    let tx = li % 16u;  // computes weight rows tx + 16 i, i < 4
    let ty = li / 16u;  // computes tokens ty + 16 j, j < 2
    var acc: array<vec4<f32>, 2>;  // acc[j][i]

    for (var kb = 0u; kb < params.n_in / 32u; kb++) {
        // Zeros for rows past n_out still fill all 8 vec4s of the row (2 per step).
        var lo = vec4<f32>(0.0);
        var hi = vec4<f32>(0.0);
        var lo_at = 2u * (li % 4u);
        var hi_at = lo_at + 1u;
        if (w_valid) {
            let w = load_w8(w_row, kb * 4u + li % 4u, params.n_in);
            lo = w.lo;
            hi = w.hi;
            lo_at = w.lo_at - 8u * kb;
            hi_at = w.hi_at - 8u * kb;
        }
        w_tile[w_local * PAD + lo_at] = vec4<tile_t>(lo);
        w_tile[w_local * PAD + hi_at] = vec4<tile_t>(hi);
        var xv = vec4<f32>(0.0);
        if (x_valid) {
            xv = x[x_row + kb * 8u + li % 8u];
#if NORM
            xv *= norm_w[kb * 8u + li % 8u] * x_scale;
#endif
        }
        x_tile[x_local * PAD + li % 8u] = vec4<tile_t>(xv);
        workgroupBarrier();
        for (var c = 0u; c < 8u; c++) {
            let x0 = x_tile[ty * PAD + c];
            let x1 = x_tile[(ty + 16u) * PAD + c];
            for (var i = 0u; i < 4u; i++) {
                let wv = w_tile[(tx + 16u * i) * PAD + c];
                acc[0][i] += f32(dot(wv, x0));
                acc[1][i] += f32(dot(wv, x1));
            }
        }
        workgroupBarrier();
    }

    for (var j = 0u; j < 2u; j++) {
        let token = token0 + ty + 16u * j;
        if (token >= params.n_tokens) {
            continue;
        }
        for (var i = 0u; i < OUT_ROWS / 16u; i++) {
            let row = row0 + tx + 16u * i;
            if (row >= params.n_out) {
                continue;
            }
            var v = acc[j][i];
#if GATE_UP
            let up = acc[j][i + 2u];
            v = gate_activation(v) * up;
#endif
            let at = token * params.y_stride + params.row_base + row;
#if RESIDUAL
            y[at] += v;
#else
            y[at] = v;
#endif
        }
    }
}
