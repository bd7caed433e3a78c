// gemm_q8: Y[t] = W X[t] for a chunk of tokens (prefill) with integer dot products: X as 8-bit blocks
// (quantize_q8.wgsl), W's quants unpacked to int8, 4 multiply-adds per dot4I8Packed.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  x_q     storage, read       array<vec4<u32>>  [n_tokens * n_in / 16]  X's int8 quants, 4 per u32
//   2  y       storage, read_write array<f32>        [n_tokens * y_stride]   output rows (and residual)
//   3..5       the weight arrays (lib/weights_i8.wgsl): n_out rows (2 n_out with GATE_UP) of n_in
//   6  xs      storage, read       array<vec4<f32>>  [n_tokens * n_in / 32]  X's block scales (d, d * sum(q),
//                                   sum x^2, d * sum of q_0..15: quantize_q8.wgsl)
//
// Specialization:
//   WEIGHTS   weight format: q8_0 q4_0 q4_1 q5_0 q4_k q5_k q6_k
//   WG_T, WG_N  invocations along tokens and along weight rows: a tile is BM = 4 WG_T tokens by
//             BN = 8 WG_N weight rows (each invocation 4 tokens x 8 rows), WG_T * WG_N invocations
//   CONVERT_BY_BITS  i32 -> f32 as an integer add and a float subtract (exact for |v| < 2^22, which every
//             block sum is) instead of a conversion instruction, which runs at a quarter of the rate
//             on NVIDIA GPUs
//   RESIDUAL, GATE_UP, GELU   as in gemm.wgsl (GATE_UP: the first BN / 2 rows of a tile are gate rows,
//             the others their up rows, giving BN / 2 outputs)
//   NORM      X is RMSNorm(x) * norm_w: quantize_q8 applied norm_w; each token's 1 / rms(x) comes from its
//             blocks' sums of x^2, summed along the way, and scales its outputs
//
// Per output and block of 32 columns: i32 sums of dot4I8Packed over the quants (one per 16 columns for
// Q6_K, whose scales cover 16), then in f32: y += sum * (d_w * d_x) (+ m_w * s_x with a min, s_x =
// d_x * sum(q_x)). Weight rows past n_out read the last row and tokens past n_tokens the last token; their
// outputs are not stored.
//
// Every value an invocation works on is a named variable: its 4 x 8 outputs are 8 vec4 accumulators
// (tokens x row groups) and 8 vec4<i32> block sums, never a private array indexed in a loop, which
// compilers may put in local memory (an earlier form of this kernel with such arrays ran at 5 TOP/s on
// an H100, on which dot4I8Packed itself does 89: tools/bench_alu.py).
//
// Tiling: workgroup memory holds two stages (double buffering: stage k+1 is loaded into registers before
// the products of stage k and stored after them; one barrier per stage), each one block of 32 columns:
// BN weight rows and BM tokens as int8 words, column-word major ([word][row]) so that an invocation reads
// 4 consecutive rows (or tokens) of one word with one vec4 load: invocation (tx, ty) owns rows 4 tx + 0..3
// and 4 (tx + WG_N) + 0..3 and tokens 4 ty + 0..3; the invocations of a subgroup read consecutive vec4s
// of the weights (no bank conflicts) and broadcast the tokens. Weight blocks are unpacked by invocations
// 0..BN-1 (one row each), token halves loaded by invocations BN.. and below (see stage_x).
// Workgroup memory: 2 stages x (32 (BM + BN) bytes of quants + 4 (W_SUBS BN + BM) bytes of scales) +
// 2 x 4 (BN + BM) bytes of min terms (formats with a min); gemm_q8.py's TileConfig computes it.
// Grid: row_tiles * ceil(n_tokens / BM) workgroups (2-D past 65535); workgroup g takes row tile
// g % row_tiles and token tile g / row_tiles.

struct Params {
    n_in: u32,       // elements per weight row, multiple of 32 (256 for K-quants)
    n_out: u32,      // output rows of this dispatch (rows of this weight part; pairs with GATE_UP)
    row_base: u32,   // column of Y of this dispatch's first output row
    n_tokens: u32,   // rows of X and Y
    y_stride: u32,   // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / OUT_ROWS)
    eps: f32,        // RMSNorm epsilon (NORM)
}

const BM = 4u * WG_T;  // tokens per tile
const BN = 8u * WG_N;  // weight rows per tile
const WG = WG_T * WG_N;
const BN4 = BN / 4u;   // vec4 groups of rows
const BM4 = BM / 4u;   // vec4 groups of tokens
#if GATE_UP
const OUT_ROWS = BN / 2u;
#else
const OUT_ROWS = BN;
#endif

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x_q: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read> xs: array<vec4<f32>>;

#include "lib/weights_i8.wgsl"
#include "lib/invocation.wgsl"
#if GATE_UP
#include "lib/gate.wgsl"
#endif
#include "lib/gemm_tile.wgsl"

// Two stages each: quants [stage][word][row / 4] and [stage][word][token / 4]; scales
// [stage][sub][row / 4] and [stage][token / 4]; min terms [stage][row / 4] and [stage][token / 4] (one
// vec4 each for formats without).
var<workgroup> w_tile: array<vec4<u32>, 2u * 8u * BN4>;
var<workgroup> x_tile: array<vec4<u32>, 2u * 8u * BM4>;
var<workgroup> w_scale: array<vec4<f32>, 2u * W_SUBS * BN4>;
var<workgroup> x_scale: array<vec4<f32>, 2u * BM4>;
var<workgroup> w_min: array<vec4<f32>, max(1u, 2u * W_HAS_MIN * BN4)>;
var<workgroup> x_sum: array<vec4<f32>, max(1u, 2u * W_HAS_MIN * BM4)>;
#if NORM
var<workgroup> x_sum_sq: array<vec4<f32>, 2u * BM4>;  // [stage][token / 4]: the block's sum of x^2
#endif

// What this invocation loaded for the next stage (held across the products of the current one).
var<private> w_raw: BlockRaw;
var<private> x_raw: vec4<u32>;
var<private> x_raw_s: vec4<f32>;

// Loads block b of this invocation's share of the stage into registers: invocation li < BN a weight
// row's block; invocations from WG - 2 BM (or BN, whichever is larger) on a half block of a token.
fn fetch_stage(li: u32, b: u32, row0: u32, token0: u32, nb: u32) {
    if (li < BN) {
        w_raw = fetch_block(weight_row(row0, li), b, nb);
    }
    let u = li + 2u * BM - WG;  // which (token, half) this invocation loads, if any
    if (li + 2u * BM >= WG) {
        let token = min(token0 + u / 2u, params.n_tokens - 1u);
        x_raw = x_q[token * (params.n_in / 16u) + 2u * b + u % 2u];
        x_raw_s = xs[token * nb + b];
    }
}

fn store_stage(li: u32, b: u32, buffer: u32) {
    if (li < BN) {
        let block = unpack_block(w_raw, b);
        let at = buffer * 8u * BN4 + li / 4u;
        let c = li % 4u;
        w_tile[at][c] = block.lo.x;
        w_tile[at + BN4][c] = block.lo.y;
        w_tile[at + 2u * BN4][c] = block.lo.z;
        w_tile[at + 3u * BN4][c] = block.lo.w;
        w_tile[at + 4u * BN4][c] = block.hi.x;
        w_tile[at + 5u * BN4][c] = block.hi.y;
        w_tile[at + 6u * BN4][c] = block.hi.z;
        w_tile[at + 7u * BN4][c] = block.hi.w;
        let scale = (buffer * W_SUBS) * BN4 + li / 4u;
        w_scale[scale][c] = block.d.x;
        if (W_SUBS == 2u) {
            w_scale[scale + BN4][c] = block.d.y;
        }
        if (W_HAS_MIN == 1u) {
            w_min[buffer * BN4 + li / 4u][c] = block.m;
        }
    }
    let u = li + 2u * BM - WG;
    if (li + 2u * BM >= WG) {
        let t = u / 2u;
        let at = (buffer * 8u + 4u * (u % 2u)) * BM4 + t / 4u;
        let c = t % 4u;
        x_tile[at][c] = x_raw.x;
        x_tile[at + BM4][c] = x_raw.y;
        x_tile[at + 2u * BM4][c] = x_raw.z;
        x_tile[at + 3u * BM4][c] = x_raw.w;
        if (u % 2u == 0u) {
            x_scale[buffer * BM4 + t / 4u][c] = x_raw_s.x;
            if (W_HAS_MIN == 1u) {
                x_sum[buffer * BM4 + t / 4u][c] = x_raw_s.y;
            }
#if NORM
            x_sum_sq[buffer * BM4 + t / 4u][c] = x_raw_s.z;
#endif
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

// The accumulators acc_* are lib/gemm_tile.wgsl's; multiply_words' s_* hold the current block's integer
// sums in the same layout.
var<private> sum_sq: vec4<f32>;  // NORM: the sums of x^2 of tokens 4 ty + 0..3 so far

// Products of words first .. first + count - 1 of the stage's block (count even: 4 or 8), scaled by
// sub-block `sub`'s weight scales.
fn multiply_words(tx: u32, ty: u32, buffer: u32, first: u32, count: u32, sub: u32) {
    var s_0a = vec4<i32>(0);
    var s_0b = vec4<i32>(0);
    var s_1a = vec4<i32>(0);
    var s_1b = vec4<i32>(0);
    var s_2a = vec4<i32>(0);
    var s_2b = vec4<i32>(0);
    var s_3a = vec4<i32>(0);
    var s_3b = vec4<i32>(0);
    // Two words per step, their products summed before they meet the block sums: 20-30% faster on an
    // H100 than one word per step (docs/PERF.md "gemm_q8: two words per step").
    for (var k = first; k < first + count; k += 2u) {
        let word = buffer * 8u + k;
        let xv = x_tile[word * BM4 + ty];  // 4 tokens, word k
        let wa = w_tile[word * BN4 + tx];
        let wb = w_tile[word * BN4 + tx + WG_N];
        let xv1 = x_tile[(word + 1u) * BM4 + ty];  // word k + 1
        let wa1 = w_tile[(word + 1u) * BN4 + tx];
        let wb1 = w_tile[(word + 1u) * BN4 + tx + WG_N];
        s_0a += dot4(xv.x, wa) + dot4(xv1.x, wa1);
        s_0b += dot4(xv.x, wb) + dot4(xv1.x, wb1);
        s_1a += dot4(xv.y, wa) + dot4(xv1.y, wa1);
        s_1b += dot4(xv.y, wb) + dot4(xv1.y, wb1);
        s_2a += dot4(xv.z, wa) + dot4(xv1.z, wa1);
        s_2b += dot4(xv.z, wb) + dot4(xv1.z, wb1);
        s_3a += dot4(xv.w, wa) + dot4(xv1.w, wa1);
        s_3b += dot4(xv.w, wb) + dot4(xv1.w, wb1);
    }
    let dx = x_scale[buffer * BM4 + ty];
    let scales = (buffer * W_SUBS + sub) * BN4;
    let dwa = w_scale[scales + tx];
    let dwb = w_scale[scales + tx + WG_N];
    acc_0a += to_f32(s_0a) * (dwa * dx.x);
    acc_0b += to_f32(s_0b) * (dwb * dx.x);
    acc_1a += to_f32(s_1a) * (dwa * dx.y);
    acc_1b += to_f32(s_1b) * (dwb * dx.y);
    acc_2a += to_f32(s_2a) * (dwa * dx.z);
    acc_2b += to_f32(s_2b) * (dwb * dx.z);
    acc_3a += to_f32(s_3a) * (dwa * dx.w);
    acc_3b += to_f32(s_3b) * (dwb * dx.w);
}

// The min terms of a stage's block: m_w * s_x per output.
fn add_mins(tx: u32, ty: u32, buffer: u32) {
    let sx = x_sum[buffer * BM4 + ty];
    let ma = w_min[buffer * BN4 + tx];
    let mb = w_min[buffer * BN4 + tx + WG_N];
    acc_0a += ma * sx.x;
    acc_0b += mb * sx.x;
    acc_1a += ma * sx.y;
    acc_1b += mb * sx.y;
    acc_2a += ma * sx.z;
    acc_2b += mb * sx.z;
    acc_3a += ma * sx.w;
    acc_3b += mb * sx.w;
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
    let nb = params.n_in / 32u;

    fetch_stage(li, 0u, row0, token0, nb);
    store_stage(li, 0u, 0u);
    workgroupBarrier();
    for (var b = 0u; b < nb; b++) {
        let buffer = b % 2u;
        if (b + 1u < nb) {
            fetch_stage(li, b + 1u, row0, token0, nb);
        }
        if (W_SUBS == 2u) {
            multiply_words(tx, ty, buffer, 0u, 4u, 0u);
            multiply_words(tx, ty, buffer, 4u, 4u, 1u);
        } else {
            multiply_words(tx, ty, buffer, 0u, 8u, 0u);
        }
        if (W_HAS_MIN == 1u) {
            add_mins(tx, ty, buffer);
        }
#if NORM
        sum_sq += x_sum_sq[buffer * BM4 + ty];
#endif
        if (b + 1u < nb) {
            store_stage(li, b + 1u, 1u - buffer);
        }
        workgroupBarrier();
    }
    var inv_rms = vec4<f32>(1.0);
#if NORM
    inv_rms = inverseSqrt(sum_sq / f32(params.n_in) + params.eps);
#endif
    store_outputs(token0 + 4u * ty, row0, tx, inv_rms);
}
