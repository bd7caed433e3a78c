// attn_prefill_rows: causal attention of a chunk of tokens over the KV cache (prefill), one invocation
// per query row and no workgroup memory: attn_prefill.wgsl's shape for CPU adapters.
//
// Why: on CPU adapters (lavapipe, SwiftShader) a workgroup barrier costs ~2 us per invocation
// (docs/GPU.md "CPU adapters"), and attn_prefill.wgsl has several per tile of keys: a 64-token chunk of
// SmolLM2 spent 45 ms per layer there. A row that walks its keys alone runs as plain SIMD loops.
//
// The chunk's tokens are at positions pos..pos+n_tokens-1 (state words 0 and 1, docs/ENGINE_STATE.md)
// and their keys / values are already in the cache (rope_kv ran before). Token t attends to positions
// first_t..pos+t, first_t = pos + t + 1 - window with a sliding window (window > 0), else 0.
//
// Bindings (group 0), as attn_prefill.wgsl (same Params: selection gives the op either kernel):
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
//   ROWS      query rows (invocations) per workgroup
//   F16       the caches hold f16 (needs shader-f16), else f32
//
// Invocation (workgroup w, index i) takes row r = (w / n_head_kv) * ROWS + i of kv head w % n_head_kv,
// rows being (token, head of the group) pairs, token major, as attn_prefill.wgsl's tiles: the same grid
// with ROWS for its TILE. The row runs an online softmax over its keys one at a time (running max m,
// sum l, o relative to m), in f32, and writes o / l.
// Grid: ceil(T * GROUP / ROWS) * n_head_kv workgroups (2-D past 65535), T the most tokens a step of the
// plan may have. Rows past state n_tokens do nothing.

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

const HD4 = HEAD_DIM / 4u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"

@compute @workgroup_size(ROWS)
fn main(inv: Invocation, grid: Grid) {
    let w = group_index(grid);
    let kv_head = w % params.n_head_kv;
    let row = (w / params.n_head_kv) * ROWS + inv.index;
    let pos = state[POS];
    if (row >= state[N_TOKENS] * GROUP) {
        return;
    }
    let t = row / GROUP;
    let n_head = params.n_head_kv * GROUP;
    let at = (t * n_head + kv_head * GROUP + row % GROUP) * HD4;  // the row's q and out
    let cache_base = kv_head * params.n_ctx;
    let end = min(pos + t + 1u, params.n_ctx);
    var begin = 0u;
    if (params.window > 0u && pos + t + 1u > params.window) {
        begin = pos + t + 1u - params.window;
    }

    var qs: array<vec4<f32>, HD4>;  // the scaled query (as attn_prefill.wgsl scales it)
    for (var d = 0u; d < HD4; d++) {
        qs[d] = q[at + d] * params.scale;
    }
    var o: array<vec4<f32>, HD4>;  // sum_j exp(s_j - m) v_j (function variables start at zero)
    var m = -3.0e38;                // running max of the scores (WGSL may have no infinities)
    var l = 0.0;                    // running sum of exp(s_j - m)
    for (var j = begin; j < end; j++) {
        let key = (cache_base + j) * HD4;
        var s = 0.0;
        for (var d = 0u; d < HD4; d++) {
            s += dot(qs[d], vec4<f32>(k_cache[key + d]));
        }
        let new_m = max(m, s);
        let factor = exp(m - new_m);
        let p = exp(s - new_m);
        l = l * factor + p;
        for (var d = 0u; d < HD4; d++) {
            o[d] = o[d] * factor + p * vec4<f32>(v_cache[key + d]);
        }
        m = new_m;
    }
    let inv_l = 1.0 / l;  // l >= 1: the row's own position always counts
    for (var d = 0u; d < HD4; d++) {
        out[at + d] = o[d] * inv_l;
    }
}
