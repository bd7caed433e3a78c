// What the GEMM kernels with register tiles (gemm.wgsl, gemm_q8.wgsl) share: the weight row a tile row
// reads, and the stores of an invocation's 4 x 8 outputs (tokens x rows 4 tx + 0..3 and 4 (tx + WG_N)
// + 0..3 of the tile), with the RESIDUAL and GATE_UP epilogues.
//
// Needs from the including kernel: Params with n_out, n_tokens, y_stride, row_base; y; the constants BN
// (weight rows per tile) and WG_N; lib/gate.wgsl with GATE_UP.

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
