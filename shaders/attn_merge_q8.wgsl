// attn_merge_q8: a decode step's attention output, merged from attn_decode's split partials and
// quantized as quantize_q8.wgsl quantizes activations: the input of the output projection when that
// is an integer dot-product GEMV (gemv_q8.wgsl).
//
// gemv.wgsl COMBINE merges the splits in the projection's own prologue, in every workgroup: cheap when
// the projection is small. At 1-8B shapes the projection wants many workgroups (it reads 4-30 MB), so
// the merge is a dispatch of its own, fused with the quantization the GEMV needs anyway. Invocation b
// merges the 32 outputs of block b (one head's elements 32b' .. 32b'+31: HEAD_DIM is a multiple of 32)
// over the splits of the state's position (lib/attn_splits.wgsl, as attn_decode cut them): per
// element sum_s exp(max_s - M) o_s / sum_s exp(max_s - M) sum_s, online, as gemv.wgsl merges them.
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read       array<u32>        the engine state (pos)
//   2  xq        storage, read_write array<u32>        [n_head HEAD_DIM / 4]   quants, element order
//   3  xs        storage, read_write array<vec4<f32>>  [n_head HEAD_DIM / 32]  (d, d sum q, sum x^2,
//                                                        d sum q_0..15)
//   4  xk        storage, read_write array<u32>        [n_head HEAD_DIM / 4]   K-quant order (K_ORDER only)
//   5  partials  storage, read       array<vec4<f32>>  [n_head][n_splits][HEAD_DIM / 4 + 1]  attn_decode's
//
// Specialization:
//   HEAD_DIM  elements per head, a multiple of 32
//   WG        invocations per workgroup (one block each)
//   K_ORDER   also write xk (quantize_q8.wgsl)
// Grid: ceil(n_head HEAD_DIM / 32 / WG) workgroups.

struct Params {
    n_blocks: u32,  // n_head * HEAD_DIM / 32
    n_ctx: u32,     // positions per head in the KV cache (the attention's)
    window: u32,    // the attention's sliding window (0 = off)
    n_splits: u32,  // most splits per head (the partials' stride)
}

const HD4 = HEAD_DIM / 4u;
const RECORD = HD4 + 1u;  // vec4s per (head, split): o, then (max, sum, 0, 0)
const NEG_MAX = -3.0e38;  // below any score

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> xs: array<vec4<f32>>;
#if K_ORDER
@group(0) @binding(4) var<storage, read_write> xk: array<u32>;
#endif
@group(0) @binding(5) var<storage, read> partials: array<vec4<f32>>;

#include "lib/state.wgsl"
#include "lib/attn_splits.wgsl"
#include "lib/invocation.wgsl"
#include "lib/quant8.wgsl"

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let b = group_index(grid) * WG + inv.index;
    if (b >= params.n_blocks) {
        return;
    }
    let head = (32u * b) / HEAD_DIM;
    let first = head * params.n_splits * RECORD + (8u * b) % HD4;  // the block's vec4 0 in split 0
    let stats_at = head * params.n_splits * RECORD + HD4;           // split 0's (max, sum)
    let splits = attn_splits(state[POS], params.n_ctx, params.window, params.n_splits);
    // The running merge: the largest max so far, the sum and the 32 outputs weighted relative to it.
    var m = NEG_MAX;
    var total = 0.0;
    var o0 = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0);
    var o3 = vec4<f32>(0.0);
    var o4 = vec4<f32>(0.0);
    var o5 = vec4<f32>(0.0);
    var o6 = vec4<f32>(0.0);
    var o7 = vec4<f32>(0.0);
    for (var s = 0u; s < splits.count; s++) {
        let at = first + s * RECORD;
        let stats = partials[stats_at + s * RECORD];
        let new_max = max(m, stats.x);
        let old_weight = exp(m - new_max);
        let weight = exp(stats.x - new_max);
        m = new_max;
        total = total * old_weight + stats.y * weight;
        o0 = o0 * old_weight + partials[at] * weight;
        o1 = o1 * old_weight + partials[at + 1u] * weight;
        o2 = o2 * old_weight + partials[at + 2u] * weight;
        o3 = o3 * old_weight + partials[at + 3u] * weight;
        o4 = o4 * old_weight + partials[at + 4u] * weight;
        o5 = o5 * old_weight + partials[at + 5u] * weight;
        o6 = o6 * old_weight + partials[at + 6u] * weight;
        o7 = o7 * old_weight + partials[at + 7u] * weight;
    }
    let v0 = o0 / total;
    let v1 = o1 / total;
    let v2 = o2 / total;
    let v3 = o3 / total;
    let v4 = o4 / total;
    let v5 = o5 / total;
    let v6 = o6 / total;
    let v7 = o7 / total;
    let sum_sq = dot(v0, v0) + dot(v1, v1) + dot(v2, v2) + dot(v3, v3) + dot(v4, v4) + dot(v5, v5)
        + dot(v6, v6) + dot(v7, v7);
    store_block_q8(b, v0, v1, v2, v3, v4, v5, v6, v7, sum_sq);
}
