// norm_inputs: a NORM GEMV's inputs prepared once for gemv_rows.wgsl (PREPARED) on a CPU adapter:
// out[i] = x[i] * norm_w[i], and after them the sum of squares of x, summed in the order in which the
// GEMV's steps read x (lib/weights.wgsl: vec4s 2s and 2s + 1 of step s, or for the Q4/Q5/IQ4 nibble
// order vec4s 8b + s % 4 and 8b + 4 + s % 4 of step s in block b).
//
// Why: with NORM every invocation of gemv_rows loads the norm weights and sums the squares of x again
// (SwiftShader: each of those loads is a gather of 4 lanes); one invocation doing it once gives the
// same values bit for bit, since every product and the sum are the same f32 operations in the same
// order, and the 1 / rms factor is still applied to each row's dot product as before.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_in / 4]       the GEMV's input
//   2  out     storage, read_write array<vec4<f32>>  [n_in / 4 + 1]   x * norm_w, then (sum of squares, 0, 0, 0)
//   6  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]       the RMSNorm weight
//
// Specialization:
//   NIBBLES  the Q4/Q5/IQ4 step order (see above), else the sequential one
// Grid: 1 workgroup of 1 invocation.

struct Params {
    n_in: u32,  // elements of x (a multiple of 8; of 32 with NIBBLES)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;

@compute @workgroup_size(1)
fn main() {
    var sum_sq = 0.0;
    for (var s = 0u; s < params.n_in / 8u; s++) {
#if NIBBLES
        let lo_at = 8u * (s / 4u) + s % 4u;
        let hi_at = lo_at + 4u;
#else
        let lo_at = 2u * s;
        let hi_at = 2u * s + 1u;
#endif
        let x_lo = x[lo_at];
        let x_hi = x[hi_at];
        sum_sq += dot(x_lo, x_lo) + dot(x_hi, x_hi);
        out[lo_at] = x_lo * norm_w[lo_at];
        out[hi_at] = x_hi * norm_w[hi_at];
    }
    out[params.n_in / 4u] = vec4<f32>(sum_sq, 0.0, 0.0, 0.0);
}
