// attn_decode: attention of one decode token with its RoPE and KV-cache write fused in; one split of
// the attended span per workgroup (flash decoding), written as an unnormalized partial that the
// output projection (gemv.wgsl COMBINE) merges.
//
// The token is at position pos = state word 0 (docs/ENGINE_STATE.md); its q, k and v rows come
// straight from the fused QKV projection. Each workgroup ropes the q rows of its kv head and the k row
// itself (GROUP + 1 rows: cheaper than a dispatch of its own), after the projection bias (BIAS) and
// the per-head RMSNorm (QK_NORM), in rope_kv.wgsl's order. Positions before pos are read from the
// cache; position pos is taken from the projection in f32, and the workgroup whose split holds pos
// writes its k and v into the cache (rounded there with F16). No workgroup reads the cache at pos, so
// that write races with nothing.
//
// Splits: lib/attn_splits.wgsl (count <= n_splits non-empty splits of whole tiles). Workgroup
// (kv head, split) takes all GROUP query heads of its kv head (grouped-query attention: each key and
// value is read once for the group); workgroups past `count` return at once.
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read       array<u32>        the engine state (pos)
//   2  qkv       storage, read       array<vec4<f32>>  [n_head + 2 n_head_kv][HEAD_DIM / 4]  this token's q, k, v rows (not roped)
//   3  k_cache   storage, read_write array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]  roped keys
//   4  v_cache   storage, read_write array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]
//   5  partials  storage, read_write array<vec4<f32>>  [n_head][n_splits][HEAD_DIM / 4 + 1]  per (head, split):
//                o[HEAD_DIM] = sum_j exp(s_j - max) v_j, then (max, sum_j exp(s_j - max), 0, 0)
//   6  q_norm        storage, read  array<vec4<f32>>  [HEAD_DIM / 4]  q RMSNorm weight (QK_NORM only)
//   7  k_norm        storage, read  array<vec4<f32>>  [HEAD_DIM / 4]  k RMSNorm weight (QK_NORM only)
//   8  bias          storage, read  array<vec4<f32>>  [(n_head + 2 n_head_kv) HEAD_DIM / 4]  q|k|v bias (BIAS only)
//   9  freq_factors  storage, read  array<f32>        [rope_dims / 2]  divide each pair's angle (FREQ_FACTORS only)
//
// Specialization:
//   HEAD_DIM  elements per head: a power of two, 16..1024
//   GROUP     query heads per kv head (n_head / n_head_kv)
//   NEOX      rotate pairs (i, i + rope_dims / 2) (NeoX layout; rope_dims % 8 == 0), else (2i, 2i + 1)
//             (rope_dims % 4 == 0), as rope_kv.wgsl
//   QK_NORM   RMSNorm each q and k head row (qwen3, gemma3) before RoPE
//   BIAS      add the projection bias to q, k and v first (qwen2)
//   FREQ_FACTORS  rope_freqs.weight (Llama 3.1 long-context factors)
//   F16       the caches hold f16 (needs shader-f16), else f32
// Workgroup memory: (GROUP + 1) * HEAD_DIM * 4 + max(ceil(GROUP / 4), MERGE) * 4 KiB + GROUP * SPLIT_KEYS
// * 4 bytes and a little (QK_NORM: (GROUP + 1) * HEAD_DIM bytes more), MERGE chosen so this stays within
// WebGPU's default 16 KiB (up to GROUP 8 at HEAD_DIM 128).
//
// Latency is what counts here (a few thousand positions at most, one token): every load is issued
// as early as possible into named registers (a loaded value that lands in a private array indexed at
// run time goes through local memory, which serializes the loads), there are few barriers (a split
// of one tile, i.e. attended spans up to n_splits * SPLIT_KEYS, has 4 when GROUP <= MERGE) and no
// invocation runs a long serial chain of workgroup-memory reads. A tile is KEYS = SPLIT_KEYS =
// 4096 / HEAD_DIM positions:
// 1. Before the prologue, so the loads overlap it: invocation i loads vec4s 4c..4c+3 (c = i % TPK) of
//    key i / TPK (score step), and vec4 i % HD4 of keys l, l + LANES, l + 2 LANES, l + 3 LANES
//    (l = i / HD4; value step).
// 2. RoPE prologue, one vec4 (NeoX: a vec4 and its partner) per invocation, its angles computed by
//    itself (llama.cpp's running product, as rope_kv.wgsl); barrier.
// 3. Partial dot products of the 4 vec4s with every q row; barrier.
// 4. Invocation (head, key) sums the TPK partials of its key into the score; barrier.
// 5. Invocation (lane, d), for every head g: o[g][d] += exp(s - m) v over its 4 keys, m its own
//    running max of the scores it has seen (an online softmax per lane: no tile max, so no reduction
//    and no barrier for it). After the last tile the LANES shares of (m, sum, o) are merged, MERGE
//    heads at a time (one barrier each), rescaled to the split's max. All in f32.
// Grid: n_head_kv * n_splits workgroups (2-D past 65535); workgroup w takes kv head w % n_head_kv and
// split w / n_head_kv.

struct Params {
    n_head_kv: u32,    // key / value heads
    n_ctx: u32,        // positions per head in the caches
    n_splits: u32,     // most splits (partials has room for this many per head)
    window: u32,       // sliding window in positions (attend to the last `window`, this one included); 0 = off
    scale: f32,        // multiplies q . k (1 / sqrt(HEAD_DIM), or the model's query scale)
    rope_dims: u32,    // leading elements of each q / k head that rotate (see NEOX)
    theta_scale: f32,  // powf(rope_base, -2.0 / rope_dims) computed in f32
    freq_scale: f32,   // angle multiplier: 1 / linear rope-scaling factor (1.0 without scaling)
    eps: f32,          // RMSNorm epsilon of the q / k norm (QK_NORM only)
}

#if F16
alias kv_t = f16;
#else
alias kv_t = f32;
#endif

const WG = 256u;
const HD4 = HEAD_DIM / 4u;
const TPK = HD4 / 4u;              // score step: invocations per key, 4 vec4s each
const KEYS = WG / TPK;             // positions per tile (= SPLIT_KEYS)
const LANES = WG / HD4;            // value step: invocations per vec4 of o; KEYS = 4 LANES
const G4 = (GROUP + 3u) / 4u;      // heads in fours (partial dot products as vec4s)
// Heads whose lane shares are merged in one round at the end (WG vec4s of workgroup memory each):
// as many as fit 15 KiB with the other arrays.
#if QK_NORM
const NORM_BYTES = (GROUP + 1u) * (HD4 + 1u) * 4u;  // squares and row_scale
#else
const NORM_BYTES = 0u;
#endif
const USED = (GROUP + 1u) * HEAD_DIM * 4u + GROUP * KEYS * 4u + NORM_BYTES;
const MERGE = min(GROUP, max(1u, (max(USED, 15360u) - USED) / (WG * 16u)));
const NEG_MAX = -3.0e38;           // "masked": below any score (WGSL may have no infinities)
// 2 pi in two parts for the angle reduction (see rope_kv.wgsl).
const TWO_PI_HI = 6.28125;
const TWO_PI_LO = 1.9353071795864769e-3;
const INV_TWO_PI = 0.15915494309189535;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> k_cache: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;
#if QK_NORM
@group(0) @binding(6) var<storage, read> q_norm: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> k_norm: array<vec4<f32>>;
#endif
#if BIAS
@group(0) @binding(8) var<storage, read> bias: array<vec4<f32>>;
#endif
#if FREQ_FACTORS
@group(0) @binding(9) var<storage, read> freq_factors: array<f32>;
#endif

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"
#include "lib/attn_splits.wgsl"

var<workgroup> rows: array<vec4<f32>, (GROUP + 1u) * HD4>;  // [g][HD4] roped q rows, then the roped k row
var<workgroup> scratch: array<vec4<f32>, max(G4, MERGE) * WG>;  // [g / 4][invocation] partial dot products
                                                                // (head g in component g % 4), then
                                                                // [g % MERGE][lane][d] shares of o
var<workgroup> p_tile: array<f32, GROUP * KEYS>;                // [g][key] scores (NEG_MAX where masked)
var<workgroup> lane_stats: array<vec2<f32>, MERGE * LANES>;     // [g % MERGE][lane] (running max, sum)
#if QK_NORM
var<workgroup> squares: array<f32, (GROUP + 1u) * HD4>;         // [row][vec4] x . x of the rows to normalize
var<workgroup> row_scale: array<f32, GROUP + 1u>;               // 1 / rms of each row
#endif

// Four vec4s in registers (a struct, not an array: no run-time index can move them to local memory).
struct Quad {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

// Angles of pairs j .. j + n - 1 (n = 2 or 4, in x, y (, z, w)), reduced to [-pi, pi]:
// llama.cpp's running product pos * theta_scale^j, rounded at every step, times freq_scale.
fn rope_angles(pos: u32, j: u32) -> vec4<f32> {
    let step = params.theta_scale;
    var theta = f32(pos);
    for (var i = 0u; i < j; i++) {
        theta *= step;
    }
    let t1 = theta * step;
    let t2 = t1 * step;
    var thetas = vec4<f32>(theta, t1, t2, t2 * step);
#if FREQ_FACTORS
    let last = params.rope_dims / 2u - 1u;  // pairs past the last one are computed but never used
    thetas /= vec4<f32>(
        freq_factors[min(j, last)], freq_factors[min(j + 1u, last)], freq_factors[min(j + 2u, last)],
        freq_factors[min(j + 3u, last)]
    );
#endif
    thetas *= params.freq_scale;
    let turns = round(thetas * INV_TWO_PI);
    return (thetas - turns * TWO_PI_HI) - turns * TWO_PI_LO;
}

// Vec4 c of qkv row `src` plus its bias (BIAS).
fn projected(src: u32, c: u32) -> vec4<f32> {
#if BIAS
    return qkv[src * HD4 + c] + bias[src * HD4 + c];
#else
    return qkv[src * HD4 + c];
#endif
}

// Vec4 c of row r of the prologue (the group's q rows, then the k row; qkv row `src`) before RoPE:
// biased, and normalized with QK_NORM (row_scale must hold the row's 1 / rms).
fn unroped(r: u32, src: u32, c: u32) -> vec4<f32> {
#if QK_NORM
    let w = select(k_norm[c], q_norm[c], r < GROUP);
    return projected(src, c) * row_scale[r] * w;
#else
    return projected(src, c);
#endif
}

// Vec4 c of RoPE row r (the group's q rows, then the k row) from qkv row `src` into `rows`.
fn rope_vec4(r: u32, src: u32, c: u32, pos: u32) {
    let x = unroped(r, src, c);
#if NEOX
    let half4 = params.rope_dims / 8u;  // vec4s of the first half; vec4 c pairs with c + half4
    if (c < half4) {
        let y = unroped(r, src, c + half4);
        let angles = rope_angles(pos, 4u * c);
        let cs = cos(angles);
        let sn = sin(angles);
        rows[r * HD4 + c] = x * cs - y * sn;
        rows[r * HD4 + c + half4] = x * sn + y * cs;
    } else if (c >= 2u * half4) {
        rows[r * HD4 + c] = x;
    }
#else
    if (4u * c < params.rope_dims) {
        let angles = rope_angles(pos, 2u * c).xy;
        let cs = cos(angles);
        let sn = sin(angles);
        rows[r * HD4 + c] = vec4<f32>(
            x.x * cs.x - x.y * sn.x, x.x * sn.x + x.y * cs.x, x.z * cs.y - x.w * sn.y, x.z * sn.y + x.w * cs.y
        );
    } else {
        rows[r * HD4 + c] = x;
    }
#endif
}

// Vec4s 4 part .. 4 part + 3 of key `key` from the cache (zeros past `end` and at pos, not cached yet).
fn load_k(key: u32, end: u32, pos: u32, cache_base: u32, part: u32) -> Quad {
    if (key >= end || key == pos) {
        return Quad();
    }
    let at = (cache_base + key) * HD4 + 4u * part;
    return Quad(
        vec4<f32>(k_cache[at]), vec4<f32>(k_cache[at + 1u]), vec4<f32>(k_cache[at + 2u]), vec4<f32>(k_cache[at + 3u])
    );
}

// Vec4 d of the value at position `key` (zeros past `end`; position pos from this token's qkv row).
fn load_v(key: u32, end: u32, pos: u32, cache_base: u32, v_row: u32, d: u32) -> vec4<f32> {
    if (key >= end) {
        return vec4<f32>(0.0);
    }
    if (key == pos) {
        return projected(v_row / HD4, d);
    }
    return vec4<f32>(v_cache[(cache_base + key) * HD4 + d]);
}

// Component g % 4 of v (a dot product with a one-hot vector: no run-time component index).
fn component(v: vec4<f32>, g: u32) -> f32 {
    let i = g % 4u;
    return dot(v, vec4<f32>(vec4<bool>(i == 0u, i == 1u, i == 2u, i == 3u)));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let w = group_index(grid);
    let kv_head = w % params.n_head_kv;
    let split = w / params.n_head_kv;
    let pos = state[POS];  // uniform: state is read-only here
    let splits = attn_splits(pos, params.n_ctx, params.window, params.n_splits);
    if (split >= splits.count) {
        return;
    }
    let begin = splits.first + split * splits.chunk;
    let end = min(begin + splits.chunk, splits.end);
    let cache_base = kv_head * params.n_ctx;  // row of position 0 of this kv head
    let n_head = params.n_head_kv * GROUP;
    let v_row = (n_head + params.n_head_kv + kv_head) * HD4;  // this token's v row in qkv
    let kk = li / TPK;    // score step: key kk of the tile, vec4s 4 part .. 4 part + 3
    let part = li % TPK;
    let lane = li / HD4;  // value step: vec4 d of keys lane + LANES i of the tile, every head
    let d = li % HD4;

    // The first tile's loads, in flight during the prologue.
    var k = load_k(begin + kk, end, pos, cache_base, part);
    var v = Quad(
        load_v(begin + lane, end, pos, cache_base, v_row, d),
        load_v(begin + lane + LANES, end, pos, cache_base, v_row, d),
        load_v(begin + lane + 2u * LANES, end, pos, cache_base, v_row, d),
        load_v(begin + lane + 3u * LANES, end, pos, cache_base, v_row, d),
    );

#if QK_NORM
    // 1 / rms of each row (the group's q rows, then the k row), for `unroped`.
    for (var c = li; c < (GROUP + 1u) * HD4; c += WG) {
        let r = c / HD4;
        let x = projected(select(kv_head * GROUP + r, n_head + kv_head, r == GROUP), c % HD4);
        squares[c] = dot(x, x);
    }
    workgroupBarrier();
    if (li <= GROUP) {
        var sum = 0.0;
        for (var c = 0u; c < HD4; c++) {
            sum += squares[li * HD4 + c];
        }
        row_scale[li] = inverseSqrt(sum / f32(HEAD_DIM) + params.eps);
    }
    workgroupBarrier();
#endif
    // RoPE prologue: this token's q rows of the group and its k row into `rows`.
    for (var c = li; c < (GROUP + 1u) * HD4; c += WG) {
        let r = c / HD4;
        rope_vec4(r, select(kv_head * GROUP + r, n_head + kv_head, r == GROUP), c % HD4, pos);
    }
    workgroupBarrier();
    if (begin <= pos && pos < end && li < HD4) {  // this split holds pos: its k and v go to the cache
        k_cache[(cache_base + pos) * HD4 + li] = vec4<kv_t>(rows[GROUP * HD4 + li]);
        v_cache[(cache_base + pos) * HD4 + li] = vec4<kv_t>(projected(v_row / HD4, li));
    }

    var acc: array<vec4<f32>, GROUP>;  // this invocation's share of o[g][d] (relative to run_max[g])
    var run_sum: array<f32, GROUP>;    // its share of the sum of exp(s - run_max) of head g
    var run_max: array<f32, GROUP>;    // the largest score of head g among this invocation's keys
    for (var g = 0u; g < GROUP; g++) {
        run_max[g] = NEG_MAX;
    }
    // No barrier at the top of a tile: scratch was last read (step 4) and p_tile is next written
    // (step 4) on opposite sides of the barrier after step 4.
    for (var tile = begin; tile < end; tile += KEYS) {
        if (tile != begin) {
            k = load_k(tile + kk, end, pos, cache_base, part);
            v = Quad(
                load_v(tile + lane, end, pos, cache_base, v_row, d),
                load_v(tile + lane + LANES, end, pos, cache_base, v_row, d),
                load_v(tile + lane + 2u * LANES, end, pos, cache_base, v_row, d),
                load_v(tile + lane + 3u * LANES, end, pos, cache_base, v_row, d),
            );
        }
        if (tile + kk == pos) {
            let at = GROUP * HD4 + 4u * part;
            k = Quad(rows[at], rows[at + 1u], rows[at + 2u], rows[at + 3u]);
        }

        // Partial dot products of this invocation's 4 vec4s of key kk with every q row.
        for (var g4 = 0u; g4 < G4; g4++) {
            var partial = vec4<f32>(0.0);
            for (var c = 0u; c < 4u; c++) {
                let g = min(4u * g4 + c, GROUP - 1u);  // heads past GROUP: a valid row, unused
                let q_at = g * HD4 + 4u * part;
                let s = dot(rows[q_at], k.a) + dot(rows[q_at + 1u], k.b) + dot(rows[q_at + 2u], k.c) +
                    dot(rows[q_at + 3u], k.d);
                partial += s * vec4<f32>(vec4<bool>(c == 0u, c == 1u, c == 2u, c == 3u));
            }
            scratch[g4 * WG + li] = partial;
        }
        workgroupBarrier();

        // Scores: invocation (head g, key j) sums the TPK partials of key j.
        for (var c = li; c < GROUP * KEYS; c += WG) {
            let g = c / KEYS;
            let j = c % KEYS;
            var s = 0.0;
            for (var p = 0u; p < TPK; p++) {
                s += component(scratch[(g / 4u) * WG + j * TPK + p], g);
            }
            p_tile[c] = select(NEG_MAX, s * params.scale, tile + j < end);
        }
        workgroupBarrier();

        // Per head: o[g][d] += sum exp(s - run_max) v over this invocation's 4 keys (masked keys weigh 0).
        for (var g = 0u; g < GROUP; g++) {
            let at = g * KEYS + lane;
            let scores = vec4<f32>(p_tile[at], p_tile[at + LANES], p_tile[at + 2u * LANES], p_tile[at + 3u * LANES]);
            let new_max = max(run_max[g], max(max(scores.x, scores.y), max(scores.z, scores.w)));
            let factor = exp(run_max[g] - new_max);
            let p = select(vec4<f32>(0.0), exp(scores - new_max), scores > vec4<f32>(NEG_MAX));
            acc[g] = acc[g] * factor + p.x * v.a + p.y * v.b + p.z * v.c + p.w * v.d;
            run_sum[g] = run_sum[g] * factor + (p.x + p.y + p.z + p.w);
            run_max[g] = new_max;
        }
    }

    // The partial of head kv_head * GROUP + g, this split: the split's max M (the lanes' largest), and
    // o and the sum with every lane's share rescaled from its own max to M; MERGE heads per round.
    // No barrier before the first round: step 4 of the last tile read scratch before the barrier
    // that followed it.
    for (var g0 = 0u; g0 < GROUP; g0 += MERGE) {
        if (g0 != 0u) {
            workgroupBarrier();  // the previous round is done with scratch and lane_stats
        }
        for (var r = 0u; r < MERGE; r++) {
            let g = min(g0 + r, GROUP - 1u);  // past GROUP (in the last round): written, unused
            scratch[r * WG + li] = acc[g];  // [r][lane][d]
            if (d == 0u) {
                lane_stats[r * LANES + lane] = vec2<f32>(run_max[g], run_sum[g]);
            }
        }
        workgroupBarrier();
        for (var c = li; c < MERGE * HD4; c += WG) {
            let r = c / HD4;
            let g = g0 + r;
            if (g < GROUP) {
                let at = c % HD4;
                var top = NEG_MAX;
                for (var l = 0u; l < LANES; l++) {
                    top = max(top, lane_stats[r * LANES + l].x);
                }
                var o = vec4<f32>(0.0);
                var total = 0.0;
                for (var l = 0u; l < LANES; l++) {
                    let stats = lane_stats[r * LANES + l];
                    let weight = exp(stats.x - top);  // a lane that saw only masked keys: 0
                    o += weight * scratch[r * WG + l * HD4 + at];
                    total += weight * stats.y;
                }
                let record = ((kv_head * GROUP + g) * params.n_splits + split) * (HD4 + 1u);
                partials[record + at] = o;
                if (at == 0u) {
                    partials[record + HD4] = vec4<f32>(top, total, 0.0, 0.0);
                }
            }
        }
    }
}
