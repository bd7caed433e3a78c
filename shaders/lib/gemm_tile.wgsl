// What the GEMM kernels with register tiles (gemm.wgsl, gemm_q8.wgsl) share: the weight row a tile row
// reads, an invocation's 4 x 8 outputs (tokens x rows 4 tx + 0..3 and 4 (tx + WG_N) + 0..3 of the tile)
// as named registers, and their stores with the RESIDUAL and GATE_UP epilogues.
//
// Needs from the including kernel: Params with n_out, n_tokens, y_stride, row_base; y; the constants BN
// (weight rows per tile) and WG_N; lib/gate.wgsl with GATE_UP.

// The invocation's 4 x 8 outputs: acc_ta holds token t's rows 4 tx + 0..3, acc_tb its rows 4 (tx + WG_N)
// + 0..3 (named registers: a private array indexed in a loop may be put in local memory).
var<private> acc_0a: vec4<f32>;
var<private> acc_0b: vec4<f32>;
var<private> acc_1a: vec4<f32>;
var<private> acc_1b: vec4<f32>;
var<private> acc_2a: vec4<f32>;
var<private> acc_2b: vec4<f32>;
var<private> acc_3a: vec4<f32>;
var<private> acc_3b: vec4<f32>;

// Weight row of tile row `r`, clamped to the dispatch's rows (GATE_UP: the up rows follow the gate rows
// in the tile).
fn weight_row(row0: u32, r: u32) -> u32 {
#if GATE_UP
    if (r >= BN / 2u) {
        return params.n_out + min(row0 + r - BN / 2u, params.n_out - 1u);
    }
#endif
    return min(row0 + r, params.n_out - 1u);
}

// Stores token `token`'s outputs: rows 4 tx + 0..3 from a (and 4 (tx + WG_N) + 0..3 from b; with
// GATE_UP, b holds their up rows instead).
fn store_token(token: u32, row0: u32, tx: u32, a: vec4<f32>, b: vec4<f32>) {
    if (token >= params.n_tokens) {
        return;
    }
    let base = token * params.y_stride + params.row_base;
#if GATE_UP
    let outs = vec4<f32>(gate_activation(a.x) * b.x, gate_activation(a.y) * b.y, gate_activation(a.z) * b.z,
        gate_activation(a.w) * b.w);
    store_rows(base, row0 + 4u * tx, outs);
#else
    store_rows(base, row0 + 4u * tx, a);
    store_rows(base, row0 + 4u * (tx + WG_N), b);
#endif
}

fn store_rows(base: u32, first: u32, v: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        if (first + i < params.n_out) {
#if RESIDUAL
            y[base + first + i] += v[i];
#else
            y[base + first + i] = v[i];
#endif
        }
    }
}

// Stores the invocation's outputs, tokens `token` .. `token` + 3, each scaled by its inv_rms component
// (1 without NORM).
fn store_outputs(token: u32, row0: u32, tx: u32, inv_rms: vec4<f32>) {
    store_token(token, row0, tx, acc_0a * inv_rms.x, acc_0b * inv_rms.x);
    store_token(token + 1u, row0, tx, acc_1a * inv_rms.y, acc_1b * inv_rms.y);
    store_token(token + 2u, row0, tx, acc_2a * inv_rms.z, acc_2b * inv_rms.z);
    store_token(token + 3u, row0, tx, acc_3a * inv_rms.w, acc_3b * inv_rms.w);
}
