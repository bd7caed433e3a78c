// gemm: Y[t] = W X[t] for a chunk of tokens (prefill), W read in its GPU layout, f32 arithmetic.
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
//   WG_T, WG_N  invocations along tokens and along weight rows: a tile is BM = 4 WG_T tokens by BN =
//             8 WG_N weight rows, each invocation computing 4 tokens x 8 rows. WG_T in {8, 16, 32} (a
//             block's weight steps split evenly), WG_N in {8, 16, 32} (a block's x vec4s likewise)
//   RESIDUAL, GATE_UP, GELU, NORM   as in gemv.wgsl (GATE_UP: the first BN / 2 rows of a tile are gate
//             rows, the others their up rows, giving BN / 2 outputs; NORM: X is RMSNorm(x) * norm_w,
//             the tile holds x * norm_w and each token's 1 / rms(x), summed while staging, scales its
//             outputs at the end)
//
// Register tiling (an outer product per column): workgroup memory holds one 32-column block of the
// inner dimension, column major ([column][row], [column][token]), so that one vec4 load gives 4 rows
// (or 4 tokens) at one column. Per column an invocation loads 1 vec4 of tokens and 2 vec4s of rows and
// does 8 vec4 multiply-adds: 32 multiply-adds per 3 loads (the earlier form of this kernel, a dot of a
// row's vec4 with a token's vec4 per output, did 32 per 6 and ran at ~3-5 TFLOP/s on an H100:
// docs/PERF.md). Invocation (tx, ty) owns rows 4 tx + 0..3 and 4 (tx + WG_N) + 0..3 of the tile and
// tokens 4 ty + 0..3. Staging: invocation li dequantizes row li % BN (32 / WG_T steps of 8 weights per
// block) and loads token li % BM (32 / WG_N vec4s per block): within a subgroup consecutive rows or
// tokens of one column, so the scalar stores into the column-major tiles hit distinct banks. The next
// block's loads go to registers before the current block's products and into the tiles after them
// (fetch_stage / store_stage): a small matrix has about one workgroup per multiprocessor, so its time
// is the chain of blocks, and a block whose loads waited one after the other cost ~3.6 us on an H100.
// Workgroup memory: 128 (BM + BN) bytes (16 KiB at 16 x 8, WebGPU's guaranteed minimum).
// Weight rows past n_out read the last row and tokens past n_tokens the last token; their outputs are
// not stored.
// Grid: row_tiles * ceil(n_tokens / BM) workgroups (2-D past 65535); workgroup g takes row tile
// g % row_tiles and token tile g / row_tiles.

struct Params {
    n_in: u32,       // elements per weight row, multiple of 32
    n_out: u32,      // output rows of this dispatch (rows of this weight part; pairs with GATE_UP)
    row_base: u32,   // column of Y of this dispatch's first output row
    eps: f32,        // RMSNorm epsilon (NORM only)
    n_tokens: u32,   // rows of X and Y
    y_stride: u32,   // elements from one token's row of Y to the next
    row_tiles: u32,  // ceil(n_out / OUT_ROWS)
}

const BM = 4u * WG_T;  // tokens per tile
const BN = 8u * WG_N;  // weight rows per tile
const WG = WG_T * WG_N;
const BM4 = BM / 4u;
const BN4 = BN / 4u;
const W_STEPS = 32u / WG_T;  // steps of 8 weights each invocation stages per block (4 per row): 1, 2, 4
const X_VECS = 32u / WG_N;   // vec4s of its token each invocation stages per block (8 per token): 1, 2, 4
#if GATE_UP
const OUT_ROWS = BN / 2u;
#else
const OUT_ROWS = BN;
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
#include "lib/gemm_tile.wgsl"

var<workgroup> w_tile: array<vec4<f32>, 32u * BN4>;  // [column][row / 4]
var<workgroup> x_tile: array<vec4<f32>, 32u * BM4>;  // [column][token / 4]; NORM: then the sums of x^2

// Column `col` of the block (0..31) of tile row `r` = v.
fn store_w(col: u32, r: u32, v: vec4<f32>) {
    let at = col * BN4 + r / 4u;
    let c = r % 4u;
    w_tile[at][c] = v.x;
    w_tile[at + BN4][c] = v.y;
    w_tile[at + 2u * BN4][c] = v.z;
    w_tile[at + 3u * BN4][c] = v.w;
}

// What an invocation loaded for the next block (held across the current block's products): its
// W_STEPS steps of 8 weights and X_VECS vec4s of its token, as named registers (a private array indexed
// in a loop may be put in local memory).
var<private> w_next0: W8;
var<private> w_next1: W8;
var<private> w_next2: W8;
var<private> w_next3: W8;
var<private> x_next0: vec4<f32>;
var<private> x_next1: vec4<f32>;
var<private> x_next2: vec4<f32>;
var<private> x_next3: vec4<f32>;
var<private> sum_sq: f32;  // NORM: the staged token's sum of x^2 over the vec4s this invocation staged

// Loads block kb's share: x first (plain loads), then the weight steps (load_w8 dequantizes as soon as
// its words arrive), every load issued before any result is used.
fn fetch_stage(w_row: u32, w_first: u32, x_at: u32, kb: u32) {
    let xb = x_at + kb * 8u;
    x_next0 = x[xb];
    if (X_VECS > 1u) {
        x_next1 = x[xb + 1u];
    }
    if (X_VECS > 2u) {
        x_next2 = x[xb + 2u];
        x_next3 = x[xb + 3u];
    }
    let s = kb * 4u + w_first;
    w_next0 = load_w8(w_row, s, params.n_in);
    if (W_STEPS > 1u) {
        w_next1 = load_w8(w_row, s + 1u, params.n_in);
    }
    if (W_STEPS > 2u) {
        w_next2 = load_w8(w_row, s + 2u, params.n_in);
        w_next3 = load_w8(w_row, s + 3u, params.n_in);
    }
}

fn store_w8(w: W8, r: u32, kb: u32) {
    store_w(4u * (w.lo_at - 8u * kb), r, w.lo);
    store_w(4u * (w.hi_at - 8u * kb), r, w.hi);
}

// vec4 v of the block's columns 4 v4 .. 4 v4 + 3 of tile token t (NORM: times norm_w, its x^2 summed).
fn store_x(v: vec4<f32>, v4: u32, t: u32, kb: u32) {
    var value = v;
#if NORM
    sum_sq += dot(v, v);
    value *= norm_w[kb * 8u + v4];
#endif
    let at = 4u * v4 * BM4 + t / 4u;
    let c = t % 4u;
    x_tile[at][c] = value.x;
    x_tile[at + BM4][c] = value.y;
    x_tile[at + 2u * BM4][c] = value.z;
    x_tile[at + 3u * BM4][c] = value.w;
}

// Stores what fetch_stage loaded for block kb into the tiles.
fn store_stage(w_r: u32, x_t: u32, x_first: u32, kb: u32) {
    store_w8(w_next0, w_r, kb);
    if (W_STEPS > 1u) {
        store_w8(w_next1, w_r, kb);
    }
    if (W_STEPS > 2u) {
        store_w8(w_next2, w_r, kb);
        store_w8(w_next3, w_r, kb);
    }
    store_x(x_next0, x_first, x_t, kb);
    if (X_VECS > 1u) {
        store_x(x_next1, x_first + 1u, x_t, kb);
    }
    if (X_VECS > 2u) {
        store_x(x_next2, x_first + 2u, x_t, kb);
        store_x(x_next3, x_first + 3u, x_t, kb);
    }
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
    let n4 = params.n_in / 4u;

    // What this invocation stages: steps w_first.. of tile row w_r, vec4s x_first.. of tile token x_t.
    let w_r = li % BN;
    let w_row = weight_row(row0, w_r);
    let w_first = (li / BN) * W_STEPS;
    let x_t = li % BM;
    let x_row = min(token0 + x_t, params.n_tokens - 1u) * n4;
    let x_first = (li / BM) * X_VECS;
    let nb = params.n_in / 32u;

    fetch_stage(w_row, w_first, x_row + x_first, 0u);
    store_stage(w_r, x_t, x_first, 0u);
    workgroupBarrier();
    for (var kb = 0u; kb < nb; kb++) {
        // The next block's loads are issued before this block's products, so that their latency is
        // paid once per block (a tile's workgroups are few: nothing else hides it).
        if (kb + 1u < nb) {
            fetch_stage(w_row, w_first, x_row + x_first, kb + 1u);
        }
        for (var col = 0u; col < 32u; col++) {
            let xv = x_tile[col * BM4 + ty];  // tokens 4 ty + 0..3
            let wa = w_tile[col * BN4 + tx];
            let wb = w_tile[col * BN4 + tx + WG_N];
            acc_0a += wa * xv.x;
            acc_0b += wb * xv.x;
            acc_1a += wa * xv.y;
            acc_1b += wb * xv.y;
            acc_2a += wa * xv.z;
            acc_2b += wb * xv.z;
            acc_3a += wa * xv.w;
            acc_3b += wb * xv.w;
        }
        workgroupBarrier();
        if (kb + 1u < nb) {
            store_stage(w_r, x_t, x_first, kb + 1u);
        }
        workgroupBarrier();
    }

    var inv_rms = vec4<f32>(1.0);
#if NORM
    // Each token's sum of x^2 from the WG / BM invocations that staged it (invocations t, t + BM, ...).
    x_tile[li / 4u][li % 4u] = sum_sq;
    workgroupBarrier();
    var sums = vec4<f32>(0.0);
    for (var k = 0u; k < WG / BM; k++) {
        sums += x_tile[k * BM4 + ty];
    }
    inv_rms = inverseSqrt(sums / f32(params.n_in) + params.eps);
#endif
    store_outputs(token0 + 4u * ty, row0, tx, inv_rms);
}
