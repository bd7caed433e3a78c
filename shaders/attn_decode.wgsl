// attn_decode: one split of flash-decoding attention for one token: the query heads of one KV head
// over a slice of the KV cache, written as an unnormalized partial (max, sum, o) for attn_combine.
//
// The token is at position pos = state word 0 (docs/ENGINE_STATE.md), so it attends to cache
// positions first..pos, first = pos + 1 - window with a sliding window (window > 0), else 0. That
// span is cut into n_splits slices of ceil(span / n_splits) positions; workgroup (kv head, split)
// handles all GROUP query heads of the kv head (grouped-query attention), so each key and value is
// read once for the whole group. A slice past the span is empty: max = -FLT_MAX, sum = 0, o = 0.
// Choosing n_splits: enough workgroups to fill the GPU (n_head_kv * n_splits >= 2 per compute unit;
// e.g. 64 splits on an H100 for 1-8 kv heads); slices of <= 256 positions are a single tile.
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read       array<u32>        the engine state (pos)
//   2  q         storage, read       array<vec4<f32>>  [n_head][HEAD_DIM / 4]  roped query, head h = kv * GROUP + g
//   3  k_cache   storage, read       array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]
//   4  v_cache   storage, read       array<vec4<kv_t>> [n_head_kv][n_ctx][HEAD_DIM / 4]
//   5  partials  storage, read_write array<vec4<f32>>  [n_head][n_splits][HEAD_DIM / 4 + 1]  per (head, split):
//                o[HEAD_DIM] = sum_j exp(s_j - max) v_j, then (max, sum_j exp(s_j - max), 0, 0)
//
// Specialization:
//   HEAD_DIM  elements per head, multiple of 4
//   GROUP     query heads per kv head (n_head / n_head_kv); workgroup memory is GROUP * (HEAD_DIM +
//             256) * 4 bytes (+ 4 KiB when GROUP * HEAD_DIM < 1024): within WebGPU's default 16 KiB
//             for GROUP <= 8 and GROUP * HEAD_DIM <= 2048
//   F16       the caches hold f16 (needs shader-f16), else f32
//
// Per tile of KEYS = 256 positions: invocation t scores key t against the GROUP scaled queries
// (staged in workgroup memory) and keeps its scores in registers; a tree finds each head's tile max;
// t turns its scores into exp(s - max) and adds them to its own running sums; then the GROUP x
// HEAD_DIM outputs are accumulated over the tile's values, LANES invocations per output vec4 (each
// taking every LANES-th key) when the outputs are fewer than the invocations. At the end of the split
// one tree sums the running sums and the lanes are added up. All in f32.
// Grid: n_head_kv * n_splits workgroups (2-D past 65535); workgroup w takes kv head w % n_head_kv and
// split w / n_head_kv.

struct Params {
    n_head_kv: u32,  // key / value heads
    n_ctx: u32,      // positions per head in the caches
    n_splits: u32,   // slices of the attended span (partials has room for this many per head)
    window: u32,     // sliding window in positions (attend to the last `window`, this one included); 0 = off
    scale: f32,      // multiplies q . k (1 / sqrt(HEAD_DIM), or the model's query scale)
}

#if F16
alias kv_t = f16;
#else
alias kv_t = f32;
#endif

const WG = 256u;
const KEYS = WG;                          // cache positions per tile: one per invocation
const HD4 = HEAD_DIM / 4u;
const OUTS = GROUP * HD4;                 // output vec4s of the workgroup
const SPAN = min(OUTS, WG);               // invocations of one lane
const LANES = max(1u, WG / OUTS);         // invocations per output vec4 in the value step
const ACC = (OUTS + WG - 1u) / WG;        // output vec4s per invocation
const LANE_SUMS = select(1u, WG, LANES > 1u);
const NEG_MAX = -3.0e38;                  // "no score yet": below any score (WGSL may have no infinities)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec4<kv_t>>;
@group(0) @binding(4) var<storage, read> v_cache: array<vec4<kv_t>>;
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"

var<workgroup> q_tile: array<vec4<f32>, OUTS>;     // [g][HD4] scaled queries
var<workgroup> p_tile: array<f32, GROUP * KEYS>;   // [g][key] tree scratch, then exp(score - max)
var<workgroup> rescale: array<f32, GROUP>;         // exp(old max - new max) of each head, this tile
var<workgroup> lane_sums: array<vec4<f32>, LANE_SUMS>;  // [lane][SPAN] value sums, added up at the end

// Tree over the invocations of p_tile[g][0..KEYS) for every head g (max or sum); the result lands in
// p_tile[g][0]. Uniform control flow: it has barriers.
fn reduce_tile(li: u32, take_max: bool) {
    for (var stride = KEYS / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (li < stride) {
            for (var g = 0u; g < GROUP; g++) {
                let a = p_tile[g * KEYS + li];
                let b = p_tile[g * KEYS + li + stride];
                p_tile[g * KEYS + li] = select(a + b, max(a, b), take_max);
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let w = group_index(grid);
    let kv_head = w % params.n_head_kv;
    let split = w / params.n_head_kv;
    if (split >= params.n_splits) {
        return;
    }
    let n_kv = min(state[POS] + 1u, params.n_ctx);  // uniform: state is read-only here
    var first = 0u;
    if (params.window > 0u && n_kv > params.window) {
        first = n_kv - params.window;
    }
    let chunk = (n_kv - first + params.n_splits - 1u) / params.n_splits;
    let begin = min(first + split * chunk, n_kv);
    let end = min(begin + chunk, n_kv);
    let cache_base = kv_head * params.n_ctx;  // row of position 0 of this kv head

    for (var c = li; c < OUTS; c += WG) {
        q_tile[c] = q[kv_head * OUTS + c] * params.scale;
    }
    let lane = li / SPAN;
    var acc = array<vec4<f32>, ACC>();
    var running_max = array<f32, GROUP>();  // the same in every invocation
    var my_sum = array<f32, GROUP>();       // sum of exp(s - running_max) over this invocation's keys
    for (var g = 0u; g < GROUP; g++) {
        running_max[g] = NEG_MAX;
    }

    for (var tile = begin; tile < end; tile += KEYS) {
        let n_keys = min(KEYS, end - tile);
        workgroupBarrier();  // q_tile is staged / the previous tile's p_tile is consumed

        // Scores of key tile + li against every query of the group.
        // An explicit zero: naga does not re-zero a loop-local var without one (gfx-rs/wgpu#9489).
        var s = array<f32, GROUP>();
        if (li < n_keys) {
            let k_row = (cache_base + tile + li) * HD4;
            for (var d = 0u; d < HD4; d++) {
                let k = vec4<f32>(k_cache[k_row + d]);
                for (var g = 0u; g < GROUP; g++) {
                    s[g] += dot(q_tile[g * HD4 + d], k);
                }
            }
        }
        for (var g = 0u; g < GROUP; g++) {
            p_tile[g * KEYS + li] = select(NEG_MAX, s[g], li < n_keys);
        }
        reduce_tile(li, true);

        // New maxima, the rescale of what came before, and this key's exp(s - max).
        var tile_max = array<f32, GROUP>();
        for (var g = 0u; g < GROUP; g++) {
            tile_max[g] = p_tile[g * KEYS];
        }
        workgroupBarrier();  // everyone has read the maxima before p_tile is overwritten
        for (var g = 0u; g < GROUP; g++) {
            let new_max = max(running_max[g], tile_max[g]);
            let factor = exp(running_max[g] - new_max);
            running_max[g] = new_max;
            var p = 0.0;
            if (li < n_keys) {
                p = exp(s[g] - new_max);
            }
            p_tile[g * KEYS + li] = p;
            my_sum[g] = my_sum[g] * factor + p;
            if (li == 0u) {
                rescale[g] = factor;
            }
        }
        workgroupBarrier();

        // o[g] = o[g] * rescale[g] + sum_j p[g][j] v_j over this lane's keys j = lane, lane + LANES, ...
        if (lane < LANES) {
            for (var a = 0u; a < ACC; a++) {
                let c = li % SPAN + a * WG;
                if (c < OUTS) {
                    let g = c / HD4;
                    let d = c % HD4;
                    var o = acc[a] * rescale[g];
                    for (var j = lane; j < n_keys; j += LANES) {
                        o += p_tile[g * KEYS + j] * vec4<f32>(v_cache[(cache_base + tile + j) * HD4 + d]);
                    }
                    acc[a] = o;
                }
            }
        }
    }

    // The softmax denominators: one tree over the invocations' running sums.
    workgroupBarrier();
    for (var g = 0u; g < GROUP; g++) {
        p_tile[g * KEYS + li] = my_sum[g];
    }
    reduce_tile(li, false);

    // partials record of head (kv_head * GROUP + g), this split: o (lanes added up), then (max, sum, 0, 0).
    let record = HD4 + 1u;
    if (LANES > 1u) {
        if (lane < LANES) {
            lane_sums[li] = acc[0];
        }
        workgroupBarrier();
        if (li < OUTS) {
            var o = lane_sums[li];
            for (var l = 1u; l < LANES; l++) {
                o += lane_sums[l * SPAN + li];
            }
            let head = kv_head * GROUP + li / HD4;
            partials[(head * params.n_splits + split) * record + li % HD4] = o;
        }
    } else {
        for (var a = 0u; a < ACC; a++) {
            let c = li + a * WG;
            if (c < OUTS) {
                let head = kv_head * GROUP + c / HD4;
                partials[(head * params.n_splits + split) * record + c % HD4] = acc[a];
            }
        }
    }
    if (li < GROUP) {
        let head = kv_head * GROUP + li;
        let stats = vec4<f32>(running_max[li], p_tile[li * KEYS], 0.0, 0.0);
        partials[(head * params.n_splits + split) * record + HD4] = stats;
    }
}
