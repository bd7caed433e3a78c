// gemm_rows: Y[t] = W X[t] for a chunk of tokens (prefill) on a CPU adapter (lavapipe, SwiftShader):
// one invocation per 4 weight rows and 8 tokens, no workgroup memory and no barriers.
//
// Why a second GEMM: a CPU implementation runs a workgroup's invocations as SIMD lanes and switches
// between them at every barrier (~2 us per invocation), so gemm.wgsl's shared-memory tiles (two
// barriers per 32 columns) spend most of their time switching. Here everything stays in registers.
// What bounds it is loads: in a loop, llvmpipe loads storage per lane (a gather) even where every lane
// reads the same address, as all lanes do for the inputs. So each invocation shares every input load
// among 4 rows and every weight load among 8 tokens: 8 tokens x 8 inputs + 4 rows x 8 weights loaded
// per 256 multiply-adds (one row per invocation loaded 72 per 64; Gemma 3's prefill ran ~3x slower).
// The 4 rows' sums of a token are one vec4 (x * W: the dot products with the columns of W = the 4
// rows' weights), the 8 tokens' named registers g0..g7 (no arrays indexed in loops: CPU compilers keep
// those in memory). With NORM the inputs' squares are summed once per token, not once per row.
// Results equal gemm.wgsl's up to f32 summation order.
//
// Bindings (group 0), as gemm.wgsl:
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_tokens * N_IN / 4]   input rows
//   2  y       storage, read_write array<f32>        [n_tokens * y_stride]   output rows (and residual)
//   3..5       the weight arrays of lib/weights.wgsl: n_out rows (2 n_out with GATE_UP) of N_IN
//   6  norm_w  storage, read       array<vec4<f32>>  [N_IN / 4]              RMSNorm weight (NORM only)
//
// Specialization:
//   WEIGHTS   weight format (lib/weights.wgsl)
//   N_IN      elements per weight row (a constant: the row loop's trip count is known)
//   WG        invocations per workgroup: 4 WG weight rows per workgroup
//   RESIDUAL, GATE_UP, GELU, NORM   as in gemv.wgsl
//   SUBGROUPS the 8 tokens' inputs of a step are loaded one token per lane and handed to the other lanes
//             with subgroupShuffle (needs subgroups of at least 8): every invocation of a workgroup
//             reads the same inputs, and a CPU adapter gathers them per lane, so the 16 vec4 loads per
//             step were ~60% of the kernel's time on lavapipe (SmolLM2's gate/up GEMM 139 -> 61 ms)
// Grid: row_tiles * ceil(n_tokens / 8) workgroups (2-D past 65535); workgroup g takes rows
// (g % row_tiles) * 4 WG .. + 4 WG (invocation i: 4 consecutive rows from 4 i) and tokens
// (g / row_tiles) * 8 .. + 8.

struct Params {
    n_out: u32,       // output rows of this dispatch (rows of this weight part)
    row_base: u32,    // column of Y of this dispatch's first output row
    eps: f32,         // RMSNorm epsilon (NORM only)
    n_tokens: u32,    // rows of X and Y
    y_stride: u32,    // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / (4 WG))
}

const N4 = N_IN / 4u;
const TOKENS = 8u;  // tokens per invocation (g0..g7 below)

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

// The 4 rows' 8 weights of a step as two matrices whose column k is row k's: x * m = the 4 dot products;
// and which of the row's vec4s they are (the same for every row).
struct Rows4 {
    lo: mat4x4<f32>,
    hi: mat4x4<f32>,
    lo_at: u32,
    hi_at: u32,
}

fn load_rows4(row0: u32, s: u32, matrix_row: u32) -> Rows4 {
    // matrix_row: where the matrix starts (the up matrix of GATE_UP at n_out); rows past n_out read
    // its last row (not stored)
    let last = params.n_out - 1u;
    let w0 = load_w8(matrix_row + min(row0, last), s, N_IN);
    let w1 = load_w8(matrix_row + min(row0 + 1u, last), s, N_IN);
    let w2 = load_w8(matrix_row + min(row0 + 2u, last), s, N_IN);
    let w3 = load_w8(matrix_row + min(row0 + 3u, last), s, N_IN);
    return Rows4(
        mat4x4<f32>(w0.lo, w1.lo, w2.lo, w3.lo), mat4x4<f32>(w0.hi, w1.hi, w2.hi, w3.hi), w0.lo_at, w0.hi_at
    );
}

// The 8 inputs of token t at one step (times the norm weight with NORM), and the sum of their squares.
struct TokenInputs {
    lo: vec4<f32>,
    hi: vec4<f32>,
    squares: f32,
}

fn token_inputs(token0: u32, t: u32, w: Rows4, n_lo: vec4<f32>, n_hi: vec4<f32>) -> TokenInputs {
    let token = min(token0 + t, params.n_tokens - 1u);  // past n_tokens: a valid address, not stored
    let lo = x[token * N4 + w.lo_at];
    let hi = x[token * N4 + w.hi_at];
    return TokenInputs(lo * n_lo, hi * n_hi, dot(lo, lo) + dot(hi, hi));
}

#if SUBGROUPS
// Token t's inputs from the lane that loaded them (lane t: every lane loads token lane % TOKENS's).
fn from_lane(mine: TokenInputs, t: u32) -> TokenInputs {
    return TokenInputs(subgroupShuffle(mine.lo, t), subgroupShuffle(mine.hi, t), subgroupShuffle(mine.squares, t));
}
#endif

fn row_dots(inputs: TokenInputs, rows: Rows4) -> vec4<f32> {
    return inputs.lo * rows.lo + inputs.hi * rows.hi;
}

// Writes token t's outputs of the 4 rows from row0: gate (or only) sums g, up sums u, squares q.
fn store(token0: u32, t: u32, row0: u32, g: vec4<f32>, u: vec4<f32>, q: f32) {
    if (token0 + t >= params.n_tokens) {
        return;
    }
    var v = g;
#if NORM
    let inv_rms = inverseSqrt(q / f32(N_IN) + params.eps);
    v *= inv_rms;
#endif
#if GATE_UP
    var up = u;
#if NORM
    up *= inv_rms;
#endif
    v = vec4<f32>(gate_activation(v.x), gate_activation(v.y), gate_activation(v.z), gate_activation(v.w)) * up;
#endif
    for (var k = 0u; k < 4u; k++) {
        let row = row0 + k;
        if (row >= params.n_out) {
            return;
        }
        let at = (token0 + t) * params.y_stride + params.row_base + row;
#if RESIDUAL
        y[at] += v[k];
#else
        y[at] = v[k];
#endif
    }
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let g = group_index(grid);
    let token0 = (g / params.row_tiles) * TOKENS;
    let row0 = (g % params.row_tiles) * (4u * WG) + 4u * inv.index;
#if SUBGROUPS
    if (token0 >= params.n_tokens) {
        return;  // whole workgroups: the subgroup broadcasts below stay in uniform control flow
    }
#else
    if (token0 >= params.n_tokens || row0 >= params.n_out) {
        return;  // no barriers follow: a per-invocation return is fine
    }
#endif
    // g*: gate (or only) rows' sums, u*: up rows' sums (GATE_UP), q*: squares of the inputs (NORM)
    var g0 = vec4<f32>();
    var g1 = vec4<f32>();
    var g2 = vec4<f32>();
    var g3 = vec4<f32>();
    var g4 = vec4<f32>();
    var g5 = vec4<f32>();
    var g6 = vec4<f32>();
    var g7 = vec4<f32>();
    var u0 = vec4<f32>();
    var u1 = vec4<f32>();
    var u2 = vec4<f32>();
    var u3 = vec4<f32>();
    var u4 = vec4<f32>();
    var u5 = vec4<f32>();
    var u6 = vec4<f32>();
    var u7 = vec4<f32>();
    var q0 = vec4<f32>();  // tokens 0-3
    var q1 = vec4<f32>();  // tokens 4-7
    for (var s = 0u; s < N_IN / 8u; s++) {
        let rows = load_rows4(row0, s, 0u);
#if GATE_UP
        let up_rows = load_rows4(row0, s, params.n_out);
#endif
        var n_lo = vec4<f32>(1.0);
        var n_hi = vec4<f32>(1.0);
#if NORM
        n_lo = norm_w[rows.lo_at];
        n_hi = norm_w[rows.hi_at];
#endif
#if SUBGROUPS
        let mine = token_inputs(token0, inv.subgroup_lane % TOKENS, rows, n_lo, n_hi);
        let x0 = from_lane(mine, 0u);
        let x1 = from_lane(mine, 1u);
        let x2 = from_lane(mine, 2u);
        let x3 = from_lane(mine, 3u);
        let x4 = from_lane(mine, 4u);
        let x5 = from_lane(mine, 5u);
        let x6 = from_lane(mine, 6u);
        let x7 = from_lane(mine, 7u);
#else
        let x0 = token_inputs(token0, 0u, rows, n_lo, n_hi);
        let x1 = token_inputs(token0, 1u, rows, n_lo, n_hi);
        let x2 = token_inputs(token0, 2u, rows, n_lo, n_hi);
        let x3 = token_inputs(token0, 3u, rows, n_lo, n_hi);
        let x4 = token_inputs(token0, 4u, rows, n_lo, n_hi);
        let x5 = token_inputs(token0, 5u, rows, n_lo, n_hi);
        let x6 = token_inputs(token0, 6u, rows, n_lo, n_hi);
        let x7 = token_inputs(token0, 7u, rows, n_lo, n_hi);
#endif
        g0 += row_dots(x0, rows);
        g1 += row_dots(x1, rows);
        g2 += row_dots(x2, rows);
        g3 += row_dots(x3, rows);
        g4 += row_dots(x4, rows);
        g5 += row_dots(x5, rows);
        g6 += row_dots(x6, rows);
        g7 += row_dots(x7, rows);
#if GATE_UP
        u0 += row_dots(x0, up_rows);
        u1 += row_dots(x1, up_rows);
        u2 += row_dots(x2, up_rows);
        u3 += row_dots(x3, up_rows);
        u4 += row_dots(x4, up_rows);
        u5 += row_dots(x5, up_rows);
        u6 += row_dots(x6, up_rows);
        u7 += row_dots(x7, up_rows);
#endif
#if NORM
        q0 += vec4<f32>(x0.squares, x1.squares, x2.squares, x3.squares);
        q1 += vec4<f32>(x4.squares, x5.squares, x6.squares, x7.squares);
#endif
    }
    store(token0, 0u, row0, g0, u0, q0.x);
    store(token0, 1u, row0, g1, u1, q0.y);
    store(token0, 2u, row0, g2, u2, q0.z);
    store(token0, 3u, row0, g3, u3, q0.w);
    store(token0, 4u, row0, g4, u4, q1.x);
    store(token0, 5u, row0, g5, u5, q1.y);
    store(token0, 6u, row0, g6, u6, q1.z);
    store(token0, 7u, row0, g7, u7, q1.w);
}
