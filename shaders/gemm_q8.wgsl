// gemm_q8: Y[t] = W X[t] for a chunk of tokens (prefill) with integer dot products: X as 8-bit blocks
// (quantize_rows.wgsl), W's quants unpacked to int8, 4 multiply-adds per dot4I8Packed.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x_q     storage, read       array<vec4<u32>>  [n_tokens * n_in / 16]  X's int8 quants, 4 per u32
//   2  y       storage, read_write array<f32>        [n_tokens * y_stride]   output rows (and residual)
//   3..5       the weight arrays (lib/weights_i8.wgsl): n_out rows (2 n_out with GATE_UP) of n_in
//   6  x_ds    storage, read       array<vec2<f32>>  [n_tokens * n_in / 32]  X's (d, d * sum(q)) per block
//
// Specialization:
//   WEIGHTS   weight format: q8_0 q4_0 q4_1 q5_0 q4_k q5_k q6_k
//   TM, TN    tokens and weight rows per invocation (multiples of 4; TN of 8 with GATE_UP)
//   WG_T, WG_N  invocations along tokens and along rows: a tile is BM = TM * WG_T tokens by BN = TN * WG_N
//             weight rows, WG_T * WG_N invocations
//   KB        blocks of 32 columns per stage (one barrier per stage)
//   CONVERT_BY_BITS  i32 -> f32 as an integer add and a float subtract (exact for |v| < 2^22, which every
//             block sum is) instead of a conversion instruction, which runs at a quarter of the rate
//             on NVIDIA GPUs
//   RESIDUAL, GATE_UP, GELU   as in gemm.wgsl (GATE_UP: the first BN / 2 rows of a tile are gate rows,
//             the others their up rows, giving BN / 2 outputs)
//
// Per output and block of 32 columns: i32 sums of dot4I8Packed over the quants (one per 16 columns for
// Q6_K, whose scales cover 16), then in f32: y += sum * (d_w * d_x) (+ m_w * s_x with a min, s_x =
// d_x * sum(q_x)). Weight rows past n_out and tokens past n_tokens are staged as zero scales and zero
// quants, so they add nothing.
//
// Tiling: workgroup memory holds two stages (double buffering: the loads of stage k+1 are issued before
// the products of stage k, and unpacked and stored after them; one barrier per stage), each KB blocks of
// BN weight rows and BM tokens as int8 words, column-word major ([word][row]) so that an invocation reads
// 4 consecutive rows (or tokens) of one word with one vec4 load: invocation (tx, ty) owns rows
// 4 (tx + i WG_N) + 0..3 (i < TN / 4) and tokens 4 (ty + j WG_T) + 0..3 (j < TM / 4), so the invocations
// of a subgroup read consecutive vec4s of the weights (no bank conflicts) and broadcast the tokens.
// Workgroup memory: 2 stages x KB x (32 (BM + BN) bytes of quants + 4 (W_SUBS BN + BM) bytes of scales
// [+ 4 (BN + BM) bytes with a min]); gemm_q8.py's TileConfig.workgroup_bytes computes it.
// Grid: row_tiles * ceil(n_tokens / BM) workgroups (2-D past 65535); workgroup g takes row tile
// g % row_tiles and token tile g / row_tiles.

struct Params {
    n_in: u32,       // elements per weight row, multiple of 32 (256 for K-quants)
    n_out: u32,      // output rows of this dispatch (rows of this weight part; pairs with GATE_UP)
    row_base: u32,   // column of Y of this dispatch's first output row
    n_tokens: u32,   // rows of X and Y
    y_stride: u32,   // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / OUT_ROWS)
}

const BM = TM * WG_T;  // tokens per tile
const BN = TN * WG_N;  // weight rows per tile
const WG = WG_T * WG_N;
const WORDS = 8u * KB;  // int8 words (4 columns each) per row of a stage
#if GATE_UP
const OUT_ROWS = BN / 2u;
const OUT_GROUPS = TN / 8u;  // vec4 groups of output rows per invocation; group i + OUT_GROUPS is its up
#else
const OUT_ROWS = BN;
const OUT_GROUPS = TN / 4u;
#endif
const W_UNITS = (BN * KB + WG - 1u) / WG;      // (row, block) pairs each invocation stages
const X_UNITS = (2u * BM * KB + WG - 1u) / WG;  // (token, half block) pairs each invocation stages
const ACC = TM * TN / 4u;                       // vec4 accumulators: [token][row group]

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x_q: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> x_ds: array<vec2<f32>>;

#include "lib/weights_i8.wgsl"
#include "lib/invocation.wgsl"
#if GATE_UP
#include "lib/gate.wgsl"
#endif

// Two stages each: [stage][word][row / 4] and [stage][word][token / 4] (quants), [stage][block][sub][row / 4]
// and [stage][block][token / 4] (scales). Arrays of the min terms keep one vec4 for formats without.
var<workgroup> w_tile: array<vec4<u32>, 2u * WORDS * BN / 4u>;
var<workgroup> x_tile: array<vec4<u32>, 2u * WORDS * BM / 4u>;
var<workgroup> w_scale: array<vec4<f32>, 2u * KB * W_SUBS * BN / 4u>;
var<workgroup> w_min: array<vec4<f32>, max(1u, 2u * KB * W_HAS_MIN * BN / 4u)>;
var<workgroup> x_scale: array<vec4<f32>, 2u * KB * BM / 4u>;
var<workgroup> x_sum: array<vec4<f32>, max(1u, 2u * KB * W_HAS_MIN * BM / 4u)>;

// What this invocation loaded for the next stage (held across the products of the current one).
var<private> w_raw: array<BlockRaw, W_UNITS>;
var<private> x_raw: array<vec4<u32>, X_UNITS>;
var<private> x_raw_ds: array<vec2<f32>, X_UNITS>;

// Weight row of tile row `r` (GATE_UP: the up rows follow the gate rows in the tile), or n_rows past
// the dispatch's rows.
fn weight_row(row0: u32, r: u32) -> u32 {
#if GATE_UP
    if (r >= BN / 2u) {
        let out_row = row0 + r - BN / 2u;
        return select(2u * params.n_out, params.n_out + out_row, out_row < params.n_out);
    }
    return select(2u * params.n_out, row0 + r, row0 + r < params.n_out);
#else
    return select(params.n_out, row0 + r, row0 + r < params.n_out);
#endif
}

fn fetch_stage(li: u32, stage: u32, row0: u32, token0: u32) {
    let nb = params.n_in / 32u;
#if GATE_UP
    let n_rows = 2u * params.n_out;
#else
    let n_rows = params.n_out;
#endif
    for (var k = 0u; k < W_UNITS; k++) {
        let u = li + k * WG;
        let row = weight_row(row0, u / KB);
        let b = stage * KB + u % KB;
        var raw = BlockRaw();  // zeros: zero scales (explicit: see `sums` below)
        if (u < BN * KB && row < n_rows && b < nb) {
            raw = fetch_block(row, b, nb);
        }
        w_raw[k] = raw;
    }
    for (var k = 0u; k < X_UNITS; k++) {
        let u = li + k * WG;
        let token = token0 + u / (2u * KB);
        let b = stage * KB + (u / 2u) % KB;
        var q = vec4<u32>(0u);
        var ds = vec2<f32>(0.0);
        if (u < 2u * BM * KB && token < params.n_tokens && b < nb) {
            q = x_q[token * (params.n_in / 16u) + 2u * b + u % 2u];
            ds = x_ds[token * nb + b];
        }
        x_raw[k] = q;
        x_raw_ds[k] = ds;
    }
}

fn store_stage(li: u32, stage: u32, buffer: u32) {
    for (var k = 0u; k < W_UNITS; k++) {
        let u = li + k * WG;
        if (u < BN * KB) {
            let r = u / KB;
            let kb = u % KB;
            let block = unpack_block(w_raw[k], stage * KB + kb);
            let words = (buffer * WORDS + kb * 8u) * (BN / 4u) + r / 4u;
            for (var c = 0u; c < 4u; c++) {
                w_tile[words + c * (BN / 4u)][r % 4u] = block.lo[c];
                w_tile[words + (c + 4u) * (BN / 4u)][r % 4u] = block.hi[c];
            }
            for (var h = 0u; h < W_SUBS; h++) {
                w_scale[((buffer * KB + kb) * W_SUBS + h) * (BN / 4u) + r / 4u][r % 4u] = block.d[h];
            }
            if (W_HAS_MIN == 1u) {
                w_min[(buffer * KB + kb) * (BN / 4u) + r / 4u][r % 4u] = block.m;
            }
        }
    }
    for (var k = 0u; k < X_UNITS; k++) {
        let u = li + k * WG;
        if (u < 2u * BM * KB) {
            let t = u / (2u * KB);
            let kb = (u / 2u) % KB;
            let words = (buffer * WORDS + kb * 8u + 4u * (u % 2u)) * (BM / 4u) + t / 4u;
            for (var c = 0u; c < 4u; c++) {
                x_tile[words + c * (BM / 4u)][t % 4u] = x_raw[k][c];
            }
            if (u % 2u == 0u) {
                let at = (buffer * KB + kb) * (BM / 4u) + t / 4u;
                x_scale[at][t % 4u] = x_raw_ds[k].x;
                if (W_HAS_MIN == 1u) {
                    x_sum[at][t % 4u] = x_raw_ds[k].y;
                }
            }
        }
    }
}

// The 4 dot products of the int8 word x with the words of w.
fn dot4(x: u32, w: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(x, w.x), dot4I8Packed(x, w.y), dot4I8Packed(x, w.z), dot4I8Packed(x, w.w));
}

fn to_f32(v: vec4<i32>) -> vec4<f32> {
#if CONVERT_BY_BITS
    // 0x4B400000 is 1.5 * 2^23, whose float has a unit last place: its mantissa field plus v is exactly
    // 1.5 * 2^23 + v for |v| < 2^22.
    return bitcast<vec4<f32>>(v + vec4<i32>(0x4B400000)) - vec4<f32>(12582912.0);
#else
    return vec4<f32>(v);
#endif
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let g = group_index(grid);
    let token0 = (g / params.row_tiles) * BM;
    if (token0 >= params.n_tokens) {
        return;  // the overhang of a 2-D grid: whole workgroups leave, so this stays uniform
    }
    let row0 = (g % params.row_tiles) * OUT_ROWS;
    let li = inv.index;
    let tx = li % WG_N;
    let ty = li / WG_N;

    var acc: array<vec4<f32>, ACC>;  // acc[token * TN / 4 + row group]: 4 rows each
    let stages = (params.n_in / 32u + KB - 1u) / KB;
    fetch_stage(li, 0u, row0, token0);
    store_stage(li, 0u, 0u);
    workgroupBarrier();
    for (var s = 0u; s < stages; s++) {
        let buffer = s % 2u;
        if (s + 1u < stages) {
            fetch_stage(li, s + 1u, row0, token0);
        }
        for (var kb = 0u; kb < KB; kb++) {
            for (var h = 0u; h < W_SUBS; h++) {
                // Zeroed explicitly: naga hoists a declaration without initializer out of the loop
                // and zeroes it once, not on every iteration as WGSL says.
                var sums = array<vec4<i32>, ACC>();
                for (var c = 0u; c < 8u / W_SUBS; c++) {
                    let word = buffer * WORDS + kb * 8u + h * (8u / W_SUBS) + c;
                    var w: array<vec4<u32>, TN / 4u>;
                    for (var i = 0u; i < TN / 4u; i++) {
                        w[i] = w_tile[word * (BN / 4u) + tx + i * WG_N];
                    }
                    for (var j = 0u; j < TM / 4u; j++) {
                        let x = x_tile[word * (BM / 4u) + ty + j * WG_T];  // 4 tokens
                        for (var i = 0u; i < TN / 4u; i++) {
                            let at = 4u * j * (TN / 4u) + i;
                            sums[at] += dot4(x.x, w[i]);
                            sums[at + TN / 4u] += dot4(x.y, w[i]);
                            sums[at + 2u * (TN / 4u)] += dot4(x.z, w[i]);
                            sums[at + 3u * (TN / 4u)] += dot4(x.w, w[i]);
                        }
                    }
                }
                let w_scales = ((buffer * KB + kb) * W_SUBS + h) * (BN / 4u) + tx;
                let x_scales = (buffer * KB + kb) * (BM / 4u) + ty;
                for (var j = 0u; j < TM / 4u; j++) {
                    let dx = x_scale[x_scales + j * WG_T];
                    for (var i = 0u; i < TN / 4u; i++) {
                        let dw = w_scale[w_scales + i * WG_N];
                        let at = 4u * j * (TN / 4u) + i;
                        acc[at] += to_f32(sums[at]) * (dw * dx.x);
                        acc[at + TN / 4u] += to_f32(sums[at + TN / 4u]) * (dw * dx.y);
                        acc[at + 2u * (TN / 4u)] += to_f32(sums[at + 2u * (TN / 4u)]) * (dw * dx.z);
                        acc[at + 3u * (TN / 4u)] += to_f32(sums[at + 3u * (TN / 4u)]) * (dw * dx.w);
                    }
                }
            }
            if (W_HAS_MIN == 1u) {
                let w_mins = (buffer * KB + kb) * (BN / 4u) + tx;
                let x_sums = (buffer * KB + kb) * (BM / 4u) + ty;
                for (var j = 0u; j < TM / 4u; j++) {
                    let sx = x_sum[x_sums + j * WG_T];
                    for (var i = 0u; i < TN / 4u; i++) {
                        let mw = w_min[w_mins + i * WG_N];
                        let at = 4u * j * (TN / 4u) + i;
                        acc[at] += mw * sx.x;
                        acc[at + TN / 4u] += mw * sx.y;
                        acc[at + 2u * (TN / 4u)] += mw * sx.z;
                        acc[at + 3u * (TN / 4u)] += mw * sx.w;
                    }
                }
            }
        }
        if (s + 1u < stages) {
            store_stage(li, s + 1u, 1u - buffer);
        }
        workgroupBarrier();
    }

    for (var j = 0u; j < TM; j++) {
        let token = token0 + 4u * (ty + (j / 4u) * WG_T) + j % 4u;
        if (token >= params.n_tokens) {
            continue;
        }
        for (var i = 0u; i < OUT_GROUPS; i++) {
            var v = acc[j * (TN / 4u) + i];
#if GATE_UP
            let up = acc[j * (TN / 4u) + i + OUT_GROUPS];
            v = vec4<f32>(gate_activation(v.x), gate_activation(v.y), gate_activation(v.z), gate_activation(v.w)) * up;
#endif
            let first = row0 + 4u * (tx + i * WG_N);
            for (var r = 0u; r < 4u; r++) {
                if (first + r < params.n_out) {
                    let at = token * params.y_stride + params.row_base + first + r;
#if RESIDUAL
                    y[at] += v[r];
#else
                    y[at] = v[r];
#endif
                }
            }
        }
    }
}
