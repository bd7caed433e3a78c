// gemm_rows: Y[t] = W X[t] for a chunk of tokens (prefill) on a CPU adapter (lavapipe, SwiftShader):
// one invocation per weight row and TOKENS tokens, no workgroup memory and no barriers.
//
// Why a second GEMM: a CPU implementation runs a workgroup's invocations as SIMD lanes and switches
// between them at every barrier (~2 µs per invocation), so gemm.wgsl's shared-memory tiles (two
// barriers per 32 columns) spend most of their time switching. Here each invocation dequantizes each
// weight of its row once and multiplies it with TOKENS tokens' inputs (which every lane reads alike),
// all in registers. Results equal gemm.wgsl's up to f32 summation order.
// Mesa's llvmpipe ends a loop nest after 65,535 iterations in all: N_IN / 8 * (TOKENS + 1) must stay
// below that (kernels.py falls back to gemm.wgsl past it).
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
//   ROWS      invocations (weight rows) per workgroup
//   TOKENS    tokens per invocation
//   RESIDUAL, GATE_UP, GELU, NORM   as in gemv.wgsl (NORM: every invocation sums the squares of its
//             tokens' inputs in the same pass; on a CPU that is cheaper than a barrier)
// Grid: row_tiles * ceil(n_tokens / TOKENS) workgroups (2-D past 65535); workgroup g takes rows
// (g % row_tiles) * ROWS .. + ROWS and tokens (g / row_tiles) * TOKENS .. + TOKENS.

struct Params {
    n_out: u32,       // output rows of this dispatch (rows of this weight part)
    row_base: u32,    // column of Y of this dispatch's first output row
    eps: f32,         // RMSNorm epsilon (NORM only)
    n_tokens: u32,    // rows of X and Y
    y_stride: u32,    // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / ROWS)
}

const N4 = N_IN / 4u;

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

// Input vec4 `at` of token t of this invocation's tokens (zeros past n_tokens: a valid address).
fn x_at(token0: u32, t: u32, at: u32) -> vec4<f32> {
    let token = min(token0 + t, params.n_tokens - 1u);
    return x[token * N4 + at];
}

@compute @workgroup_size(ROWS)
fn main(inv: Invocation, grid: Grid) {
    let g = group_index(grid);
    let token0 = (g / params.row_tiles) * TOKENS;
    let row = (g % params.row_tiles) * ROWS + inv.index;
    if (token0 >= params.n_tokens || row >= params.n_out) {
        return;  // no barriers follow: a per-invocation return is fine
    }
    var acc: array<f32, TOKENS>;  // gate (or only) row . x[t]
#if GATE_UP
    var acc_up: array<f32, TOKENS>;
#endif
#if NORM
    var squares: array<f32, TOKENS>;
#endif
    for (var s = 0u; s < N_IN / 8u; s++) {
        let w = load_w8(row, s, N_IN);
#if GATE_UP
        let up = load_w8(row + params.n_out, s, N_IN);
#endif
#if NORM
        let n_lo = norm_w[w.lo_at];
        let n_hi = norm_w[w.hi_at];
#endif
        for (var t = 0u; t < TOKENS; t++) {
            var x_lo = x_at(token0, t, w.lo_at);
            var x_hi = x_at(token0, t, w.hi_at);
#if NORM
            squares[t] += dot(x_lo, x_lo) + dot(x_hi, x_hi);
            x_lo *= n_lo;
            x_hi *= n_hi;
#endif
            acc[t] += dot(w.lo, x_lo) + dot(w.hi, x_hi);
#if GATE_UP
            acc_up[t] += dot(up.lo, x_lo) + dot(up.hi, x_hi);
#endif
        }
    }
    for (var t = 0u; t < TOKENS; t++) {
        if (token0 + t >= params.n_tokens) {
            break;
        }
        var v = acc[t];
#if NORM
        let inv_rms = inverseSqrt(squares[t] / f32(N_IN) + params.eps);
        v *= inv_rms;
#endif
#if GATE_UP
        var up_v = acc_up[t];
#if NORM
        up_v *= inv_rms;
#endif
        v = gate_activation(v) * up_v;
#endif
        let at = (token0 + t) * params.y_stride + params.row_base + row;
#if RESIDUAL
        y[at] += v;
#else
        y[at] = v;
#endif
    }
}
