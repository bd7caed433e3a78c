// attn_prefill: causal attention of a chunk of tokens over the KV cache (prefill), flash-attention
// style: tiles of query rows against tiles of keys, online softmax, grouped-query aware.
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
//   HEAD_DIM  elements per head, multiple of 4, at most 1024
//   GROUP     query heads per kv head (n_head / n_head_kv)
//   F16       the caches hold f16 (needs shader-f16), else f32
//   WIDE      tiles of 2 TILE keys instead of TILE (head sizes of 128 and more, where TILE is 8 or 4 rows:
//             half the tiles, so half the barriers and load round trips per row; ~22 KiB of workgroup
//             memory instead of ~13: selection.attn_prefill checks the adapter's limit)
//
// A workgroup takes TILE query rows of one kv head: rows are (token, head of the group) pairs, token
// major, so the rows of a workgroup share every key and value read. TILE = min(16, 1024 / HEAD_DIM)
// makes TILE x HEAD_DIM / 4 = 256 output vec4s (one per invocation for power-of-two head sizes) and
// keeps the staged queries, keys and values at 4 KiB each (keys and values 8 KiB with WIDE). Per tile of
// KEYS keys (staged in workgroup memory from registers loaded during the previous tile): the TILE x KEYS
// scores, TPS invocations per
// score (each a slice of the head, summed in workgroup memory when TPS > 1); then invocation
// (row, vec4 d) runs the row's online softmax over the tile (every invocation of a row computes the
// same max and weights: no extra barrier) and accumulates its vec4 of o. Masked positions weigh 0.
// All in f32.
// Grid: ceil(T * GROUP / TILE) * n_head_kv workgroups (2-D past 65535), T the most tokens a step of
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

const WG = 256u;
const HD4 = HEAD_DIM / 4u;
const TILE = clamp(1024u / HEAD_DIM, 1u, 16u);  // query rows per workgroup = keys per tile
const OUTS = TILE * HD4;                         // output vec4s (<= WG)
#if WIDE
const KEYS = 2u * TILE;                          // keys per tile
#else
const KEYS = TILE;
#endif
const KV_VECS = KEYS * HD4;                      // staged vec4s of a tile's keys (and of its values): <= 2 WG
const TPS = WG / (TILE * KEYS);                  // invocations per score (>= 1: selection.attn_prefill)
const K_STRIDE = HD4 + 1u;                       // vec4s per staged key: rows start in different banks
const NEG_MAX = -3.0e38;                        // "masked": below any score (WGSL may have no infinities)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"

var<workgroup> q_tile: array<vec4<f32>, OUTS>;            // [row][HD4] scaled queries
var<workgroup> k_tile: array<vec4<f32>, KEYS * K_STRIDE>; // [key][K_STRIDE]
var<workgroup> v_tile: array<vec4<f32>, KV_VECS>;          // [key][HD4]
var<workgroup> s_tile: array<f32, TILE * KEYS>;            // [row][key] scores, NEG_MAX where masked
var<workgroup> s_parts: array<f32, WG>;                   // partial scores (TPS > 1)

// Does token t of the chunk attend to cache position j?
fn attends(t: u32, j: u32, pos: u32) -> bool {
    return j <= pos + t && (params.window == 0u || j + params.window > pos + t);
}

// Staged vec4 `i` of the tile at `tile`: vec4 (i % HD4) of key i / HD4, keys then values; zeros past
// `end`. Invocation li stages i = li (and li + WG with WIDE).
fn load_kv(cache_base: u32, tile: u32, end: u32, i: u32) -> array<vec4<f32>, 2> {
    var kv: array<vec4<f32>, 2>;
    let key = tile + i / HD4;
    if (i < KV_VECS && key < end) {
        let at = (cache_base + key) * HD4 + i % HD4;
        kv[0] = vec4<f32>(k_cache[at]);
        kv[1] = vec4<f32>(v_cache[at]);
    }
    return kv;
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let w = group_index(grid);
    let kv_head = w % params.n_head_kv;
    let row0 = (w / params.n_head_kv) * TILE;  // first (token, head) row of this workgroup
    let pos = state[POS];                       // uniform: state is read-only here
    let n_rows = state[N_TOKENS] * GROUP;
    if (row0 >= n_rows) {
        return;
    }
    let n_head = params.n_head_kv * GROUP;
    let cache_base = kv_head * params.n_ctx;

    // The positions any row of the tile attends to.
    let t_first = row0 / GROUP;
    let t_last = (min(row0 + TILE, n_rows) - 1u) / GROUP;
    let kv_end = min(pos + t_last + 1u, params.n_ctx);
    var kv_begin = 0u;
    if (params.window > 0u && pos + t_first + 1u > params.window) {
        kv_begin = pos + t_first + 1u - params.window;
    }

    // This invocation's output: vec4 d of row r (invocations past OUTS only help with the scores).
    let r = li / HD4;
    let d = li % HD4;
    let row = row0 + r;
    if (li < OUTS && row < n_rows) {
        let head = kv_head * GROUP + row % GROUP;
        q_tile[li] = q[((row / GROUP) * n_head + head) * HD4 + d] * params.scale;
    } else if (li < OUTS) {
        q_tile[li] = vec4<f32>(0.0);
    }
    // This invocation's score: key j of row s_row, head slice s_part.
    let score = li / TPS;
    let s_part = li % TPS;
    let s_row = score / KEYS;
    let s_key = score % KEYS;
    let s_t = (row0 + s_row) / GROUP;
    let s_row_valid = score < TILE * KEYS && row0 + s_row < n_rows;

    var acc = vec4<f32>(0.0);
    var run_max = NEG_MAX;
    var run_sum = 0.0;
    var kv = load_kv(cache_base, kv_begin, kv_end, li);
#if WIDE
    var kv_b = load_kv(cache_base, kv_begin, kv_end, li + WG);
#endif
    for (var tile = kv_begin; tile < kv_end; tile += KEYS) {
        workgroupBarrier();  // q_tile is staged / the previous tile is consumed
        if (li < KV_VECS) {
            k_tile[r * K_STRIDE + d] = kv[0];
            v_tile[li] = kv[1];
        }
#if WIDE
        let lb = li + WG;
        if (lb < KV_VECS) {
            k_tile[(lb / HD4) * K_STRIDE + lb % HD4] = kv_b[0];
            v_tile[lb] = kv_b[1];
        }
#endif
        workgroupBarrier();
        if (tile + KEYS < kv_end) {
            kv = load_kv(cache_base, tile + KEYS, kv_end, li);  // in flight during this tile
#if WIDE
            kv_b = load_kv(cache_base, tile + KEYS, kv_end, li + WG);
#endif
        }

        // Scores.
        var dot_sum = 0.0;
        if (score < TILE * KEYS) {
            for (var i = s_part; i < HD4; i += TPS) {
                dot_sum += dot(q_tile[s_row * HD4 + i], k_tile[s_key * K_STRIDE + i]);
            }
        }
        if (TPS > 1u) {
            s_parts[li] = dot_sum;
            workgroupBarrier();
            if (s_part == 0u) {
                for (var i = 1u; i < TPS; i++) {
                    dot_sum += s_parts[li + i];
                }
            }
        }
        if (s_part == 0u && score < TILE * KEYS) {
            let key = tile + s_key;
            let valid = s_row_valid && key < kv_end && attends(s_t, key, pos);
            s_tile[score] = select(NEG_MAX, dot_sum, valid);
        }
        workgroupBarrier();

        // Online softmax of row r over the tile, and o[r][d] += sum_j p_j v_j.
        if (li < OUTS) {
            var tile_max = NEG_MAX;
            for (var j = 0u; j < KEYS; j++) {
                tile_max = max(tile_max, s_tile[r * KEYS + j]);
            }
            let new_max = max(run_max, tile_max);
            let factor = exp(run_max - new_max);
            var o = acc * factor;
            var sum = run_sum * factor;
            for (var j = 0u; j < KEYS; j++) {
                let s = s_tile[r * KEYS + j];
                let p = select(0.0, exp(s - new_max), s > NEG_MAX);
                o += p * v_tile[j * HD4 + d];
                sum += p;
            }
            acc = o;
            run_sum = sum;
            run_max = new_max;
        }
    }

    if (li < OUTS && row < n_rows) {  // every row attends at least to its own position: run_sum > 0
        let head = kv_head * GROUP + row % GROUP;
        out[((row / GROUP) * n_head + head) * HD4 + d] = acc / run_sum;
    }
}
