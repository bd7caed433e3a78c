// attn_prefill: causal attention of a chunk of tokens over the KV cache (prefill), online softmax
// over tiles of keys, grouped-query aware.
//
// The chunk's tokens are at positions pos..pos+n_tokens-1 (state words 0 and 1, see
// docs/ENGINE_STATE.md) and their keys / values are already in the cache (rope_kv ran before). Token
// t attends to positions first_t..pos+t, first_t = pos + t + 1 - window with a sliding window
// (window > 0), else 0.
//
// Bindings (group 0):
//   0  params   uniform             Params
//   1  state    storage, read       array<u32>        the engine state (pos, n_tokens)
//   2  q        storage, read       array<vec4<f32>>  [T][n_head][HEAD_DIM / 4]  roped queries, head h = kv * GROUP + g
//   3  k_cache  storage, read       array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]
//   4  v_cache  storage, read       array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]
//   5  out      storage, read_write array<vec4<f32>>  [T][n_head][HEAD_DIM / 4]  attention output
//
// Specialization:
//   HEAD_DIM  elements per head, multiple of 4
//   GROUP     query heads per kv head (n_head / n_head_kv)
//   F16       the caches hold f16 (needs shader-f16), else f32
//
// A workgroup takes ROWS query rows of one kv head: rows are (token, head of the group) pairs, token
// major, so the rows of a group share every key and value read. Per tile of KEYS positions: the
// scores (each invocation: one key, every other row), then invocation r < ROWS runs row r's online
// softmax over the tile (masked positions weigh 0), then each invocation accumulates its share of the
// ROWS x HEAD_DIM outputs (vec4s c = index + WG * a) over the tile's values. All in f32. ROWS =
// 2048 / HEAD_DIM (at most 32) keeps the staged queries at 8 KiB.
// Grid: ceil(T * GROUP / ROWS) * n_head_kv workgroups (2-D past 65535), T the most tokens a step of
// the plan may have; workgroup w takes kv head w % n_head_kv and row tile w / n_head_kv. Row tiles
// past state n_tokens do nothing.

struct Params {
    n_head_kv: u32,  // key / value heads
    n_ctx: u32,      // positions per head in the caches
    window: u32,     // sliding window in positions (attend to the last `window`, this one included); 0 = off
    scale: f32,      // multiplies q . k (1 / sqrt(HEAD_DIM), or the model's query scale)
}

#if F16
alias kv_t = f16;
#else
alias kv_t = f32;
#endif

const WG = 64u;
const KEYS = 32u;                                   // cache positions per tile
const LANES = WG / KEYS;                            // invocations per key in the score step
const HD4 = HEAD_DIM / 4u;
const ROWS = clamp(2048u / HEAD_DIM, 1u, 32u);      // query rows per workgroup
const ROWS_PER_LANE = (ROWS + LANES - 1u) / LANES;  // rows one invocation scores
const OUTS = ROWS * HD4;                            // output vec4s of the workgroup
const ACC = (OUTS + WG - 1u) / WG;                  // output vec4s per invocation
const NEG_MAX = -3.0e38;                           // "no score yet": below any score (WGSL may have no infinities)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"

var<workgroup> q_tile: array<vec4<f32>, OUTS>;    // [row][HD4] scaled queries
var<workgroup> p_tile: array<f32, ROWS * KEYS>;   // [row][key] scores, then exp(score - max) (0 if masked)
var<workgroup> rescale: array<f32, ROWS>;         // exp(old max - new max) of each row, this tile
var<workgroup> row_total: array<f32, ROWS>;       // the softmax denominators, at the end

// Does row `r` (token t = r / GROUP of the chunk) attend to cache position j?
fn attends(t: u32, j: u32, pos: u32) -> bool {
    return j <= pos + t && (params.window == 0u || j + params.window > pos + t);
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let w = group_index(grid);
    let kv_head = w % params.n_head_kv;
    let row0 = (w / params.n_head_kv) * ROWS;  // first (token, head) row of this workgroup
    let pos = state[POS];                       // uniform: state is read-only here
    let n_rows = state[N_TOKENS] * GROUP;
    if (row0 >= n_rows) {
        return;
    }
    let n_head = params.n_head_kv * GROUP;
    let cache_base = kv_head * params.n_ctx;

    // The positions any row of the tile attends to.
    let t_first = row0 / GROUP;
    let t_last = (min(row0 + ROWS, n_rows) - 1u) / GROUP;
    let kv_end = min(pos + t_last + 1u, params.n_ctx);
    var kv_begin = 0u;
    if (params.window > 0u && pos + t_first + 1u > params.window) {
        kv_begin = pos + t_first + 1u - params.window;
    }

    for (var c = li; c < OUTS; c += WG) {
        let row = row0 + c / HD4;
        if (row < n_rows) {
            let head = kv_head * GROUP + row % GROUP;
            q_tile[c] = q[((row / GROUP) * n_head + head) * HD4 + c % HD4] * params.scale;
        }
    }
    var acc: array<vec4<f32>, ACC>;
    var running_max = NEG_MAX;  // of row li (li < ROWS)
    var running_sum = 0.0;
    let my_t = (row0 + li) / GROUP;
    let my_row_active = li < ROWS && row0 + li < n_rows;

    for (var tile = kv_begin; tile < kv_end; tile += KEYS) {
        let n_keys = min(KEYS, kv_end - tile);
        workgroupBarrier();  // q_tile is staged / the previous tile's p_tile is consumed

        // Scores of key tile + key against rows lane, lane + LANES, ...
        let key = li % KEYS;
        let lane = li / KEYS;
        if (key < n_keys) {
            let k_row = (cache_base + tile + key) * HD4;
            // An explicit zero: naga does not re-zero a loop-local var without one (gfx-rs/wgpu#9489).
            var s = array<f32, ROWS_PER_LANE>();
            for (var d = 0u; d < HD4; d++) {
                let k = vec4<f32>(k_cache[k_row + d]);
                for (var i = 0u; i < ROWS_PER_LANE; i++) {
                    let r = lane + i * LANES;
                    if (r < ROWS) {
                        s[i] += dot(q_tile[r * HD4 + d], k);
                    }
                }
            }
            for (var i = 0u; i < ROWS_PER_LANE; i++) {
                let r = lane + i * LANES;
                if (r < ROWS) {
                    p_tile[r * KEYS + key] = s[i];
                }
            }
        }
        workgroupBarrier();

        // Online softmax of row li over the tile.
        if (li < ROWS) {
            var tile_max = NEG_MAX;
            for (var j = 0u; j < n_keys; j++) {
                if (my_row_active && attends(my_t, tile + j, pos)) {
                    tile_max = max(tile_max, p_tile[li * KEYS + j]);
                }
            }
            let new_max = max(running_max, tile_max);
            var tile_sum = 0.0;
            for (var j = 0u; j < n_keys; j++) {
                var p = 0.0;
                if (my_row_active && attends(my_t, tile + j, pos)) {
                    p = exp(p_tile[li * KEYS + j] - new_max);
                }
                p_tile[li * KEYS + j] = p;
                tile_sum += p;
            }
            let factor = exp(running_max - new_max);
            rescale[li] = factor;
            running_sum = running_sum * factor + tile_sum;
            running_max = new_max;
        }
        workgroupBarrier();

        // o[r] = o[r] * rescale[r] + sum_j p[r][j] v_j, for this invocation's output vec4s.
        for (var a = 0u; a < ACC; a++) {
            let c = li + a * WG;
            if (c < OUTS) {
                let r = c / HD4;
                let d = c % HD4;
                var o = acc[a] * rescale[r];
                for (var j = 0u; j < n_keys; j++) {
                    o += p_tile[r * KEYS + j] * vec4<f32>(v_cache[(cache_base + tile + j) * HD4 + d]);
                }
                acc[a] = o;
            }
        }
    }

    if (li < ROWS) {
        row_total[li] = running_sum;
    }
    workgroupBarrier();
    for (var a = 0u; a < ACC; a++) {
        let c = li + a * WG;
        let row = row0 + c / HD4;
        if (c < OUTS && row < n_rows) {
            let head = kv_head * GROUP + row % GROUP;
            out[((row / GROUP) * n_head + head) * HD4 + c % HD4] = acc[a] / row_total[c / HD4];
        }
    }
}
