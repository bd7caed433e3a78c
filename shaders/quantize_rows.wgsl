// quantize_rows: rows of X (RMS-normalized first with NORM) as 8-bit blocks of 32, llama.cpp's q8_1, the
// input of gemm_q8.wgsl.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x       storage, read       array<vec4<f32>>  [n_tokens * n_in / 4]   input rows
//   2  x_q     storage, read_write array<vec4<u32>>  [n_tokens * n_in / 16]  int8 quants, 4 per u32
//   3  x_ds    storage, read_write array<vec2<f32>>  [n_tokens * n_in / 32]  (d, d * sum(q)) per block
//   4  norm_w  storage, read       array<vec4<f32>>  [n_in / 4]              RMSNorm weight (NORM only)
//
// Layout: token t's row is n_in / 16 vec4s of x_q, element i in byte i % 4 of word i / 4 (two's
// complement int8), and n_in / 32 (d, s) pairs of x_ds. Element i of the row is d[i / 32] * q[i].
//
// Per block of 32 values v (NORM: v = x * (norm_w * inv_rms), inv_rms = 1 / sqrt(mean(x^2) + eps), as
// gemm.wgsl's NORM): d = max|v| * (1 / 127) (a product, so exactly rounded), q = round(v * (1 / d)), rounding
// half away from zero (C's roundf, what llama.cpp's quantize_row_q8_1 uses); all-zero blocks get
// d = 0, q = 0. s = d * sum(q), the block's sum as the weights with a min need it (Q4_1, Q4_K, Q5_K).
// WGSL's division is accurate to 2.5 ulp, not exactly rounded: a q may differ by one from an exactly
// rounded 1 / d where v / d lies within ~1e-5 of a half integer.
//
// Specialization:
//   ROW_THREADS  invocations per workgroup (one token row per workgroup; blocks strided over them)
//   SUBGROUPS    NORM's sum of squares with subgroupAdd (the subgroup size divides ROW_THREADS)
//   NORM         normalize the row first
// Grid: n_tokens workgroups (2-D past 65535).

struct Params {
    n_in: u32,      // elements per row, multiple of 32
    n_tokens: u32,  // rows (workgroups) of this dispatch
    eps: f32,       // RMSNorm epsilon (NORM only)
}

const WG = ROW_THREADS;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> x_q: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> x_ds: array<vec2<f32>>;
#if NORM
@group(0) @binding(4) var<storage, read> norm_w: array<vec4<f32>>;

#include "lib/reduce.wgsl"
#else
#include "lib/invocation.wgsl"
#endif

// Round half away from zero: round() rounds half to even, so exact halves (v - trunc(v) is exact) go
// one away from trunc(v) instead.
fn round_away(v: vec4<f32>) -> vec4<i32> {
    let t = trunc(v);
    return vec4<i32>(select(round(v), t + sign(v), abs(v - t) == vec4<f32>(0.5)));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let token = group_index(grid);
    if (token >= params.n_tokens) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let n4 = params.n_in / 4u;
    let base = token * n4;
    var scale = vec4<f32>(1.0);  // the per-element factor (norm_w * inv_rms) is applied with NORM
#if NORM
    var sum_sq = 0.0;
    for (var i = inv.index; i < n4; i += WG) {
        let v = x[base + i];
        sum_sq += dot(v, v);
    }
    let inv_rms = inverseSqrt(workgroup_sum(vec4<f32>(sum_sq, 0.0, 0.0, 0.0), inv).x / f32(params.n_in) + params.eps);
#endif
    let nb = params.n_in / 32u;
    for (var b = inv.index; b < nb; b += WG) {
        var v: array<vec4<f32>, 8>;
        var amax = vec4<f32>(0.0);
        for (var k = 0u; k < 8u; k++) {
#if NORM
            scale = norm_w[8u * b + k] * inv_rms;
#endif
            v[k] = x[base + 8u * b + k] * scale;
            amax = max(amax, abs(v[k]));
        }
        let d = max(max(amax.x, amax.y), max(amax.z, amax.w)) * (1.0 / 127.0);
        let id = select(0.0, 1.0 / d, d > 0.0);
        var words: array<u32, 8>;
        var sum = vec4<i32>(0);
        for (var k = 0u; k < 8u; k++) {
            let q = clamp(round_away(v[k] * id), vec4<i32>(-127), vec4<i32>(127));
            sum += q;
            words[k] = pack4xI8(q);
        }
        let at = token * (n4 / 4u) + 2u * b;
        x_q[at] = vec4<u32>(words[0], words[1], words[2], words[3]);
        x_q[at + 1u] = vec4<u32>(words[4], words[5], words[6], words[7]);
        x_ds[token * nb + b] = vec2<f32>(d, d * f32(sum.x + sum.y + sum.z + sum.w));
    }
}
