// attn_merge_q8: a decode step's attention output, merged from attn_decode's split partials and
// quantized as quantize_q8.wgsl quantizes activations: the input of the output projection when that
// is an integer dot-product GEMV (gemv_q8.wgsl).
//
// gemv.wgsl COMBINE merges the splits in the projection's own prologue, in every workgroup: cheap when
// the projection is small. At 1-8B shapes the projection wants many workgroups (it reads 4-30 MB), so
// the merge is a dispatch of its own, fused with the quantization the GEMV needs anyway. Invocation i
// merges vec4 i % 8 of block i / 8 (one head's elements 32b' .. 32b'+31: HEAD_DIM is a multiple of 32)
// over the splits of the state's position (lib/attn_splits.wgsl, as attn_decode cut them): per element
// sum_s exp(max_s - M) o_s / sum_s exp(max_s - M) sum_s, online, as gemv.wgsl merges them, four splits at
// a time with their loads issued together (a merge is a chain of dependent steps: one load round trip per
// four splits, not per split). The block's 8 vec4s then meet in workgroup memory, where invocation
// 8 b' quantizes them (lib/quant8.wgsl).
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read       array<u32>        the engine state (pos)
//   2  xq        storage, read_write array<vec4<u32>>  [n_head HEAD_DIM / 16]  quants, element order
//   3  xs        storage, read_write array<vec4<f32>>  [n_head HEAD_DIM / 32]  (d, d sum q, sum x^2,
//                                                        d sum q_0..15)
//   4  xk        storage, read_write array<vec4<u32>>  [n_head HEAD_DIM / 16]  K-quant order (K_ORDER only)
//   5  partials  storage, read       array<vec4<f32>>  [n_head][n_splits][HEAD_DIM / 4 + 1]  attn_decode's
//
// Specialization:
//   HEAD_DIM  elements per head, a multiple of 32
//   K_ORDER   also write xk (quantize_q8.wgsl)
//   WG        invocations per workgroup (8 per block), a multiple of 8
// Grid: ceil(n_head HEAD_DIM / 4 / WG) workgroups.

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
@group(0) @binding(2) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> xs: array<vec4<f32>>;
#if K_ORDER
@group(0) @binding(4) var<storage, read_write> xk: array<vec4<u32>>;
#endif
@group(0) @binding(5) var<storage, read> partials: array<vec4<f32>>;

#include "lib/state.wgsl"
#include "lib/attn_splits.wgsl"
#include "lib/invocation.wgsl"
#include "lib/quant8.wgsl"

var<workgroup> merged: array<vec4<f32>, WG>;  // the workgroup's merged vec4s, block after block

// The online merge of splits so far: the largest max, the sum and o weighted relative to it.
struct Merge {
    m: f32,
    total: f32,
    acc: vec4<f32>,
}

fn merge(so_far: Merge, stats: vec4<f32>, o: vec4<f32>) -> Merge {
    let new_max = max(so_far.m, stats.x);
    let old_weight = exp(so_far.m - new_max);
    let weight = exp(stats.x - new_max);
    return Merge(new_max, so_far.total * old_weight + stats.y * weight, so_far.acc * old_weight + o * weight);
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let i = group_index(grid) * WG + inv.index;  // vec4 i % 8 of block i / 8
    let b = i / 8u;
    var v = vec4<f32>(0.0);
    if (b < params.n_blocks) {
        let c = (8u * b) % HD4 + i % 8u;  // the vec4 in its head
        let head = (32u * b) / HEAD_DIM;
        let first = head * params.n_splits * RECORD + c;       // split 0's vec4
        let stats_first = head * params.n_splits * RECORD + HD4;  // split 0's (max, sum)
        let splits = attn_splits(state[POS], params.n_ctx, params.window, params.n_splits);
        let last = splits.count - 1u;
        var m = Merge(NEG_MAX, 0.0, vec4<f32>(0.0));
        for (var s = 0u; s <= last; s += 4u) {
            // Past the last split: the last one's record again, skipped below.
            let s1 = min(s + 1u, last) * RECORD;
            let s2 = min(s + 2u, last) * RECORD;
            let s3 = min(s + 3u, last) * RECORD;
            let stats0 = partials[stats_first + s * RECORD];
            let stats1 = partials[stats_first + s1];
            let stats2 = partials[stats_first + s2];
            let stats3 = partials[stats_first + s3];
            let o0 = partials[first + s * RECORD];
            let o1 = partials[first + s1];
            let o2 = partials[first + s2];
            let o3 = partials[first + s3];
            m = merge(m, stats0, o0);
            if (s + 1u <= last) {
                m = merge(m, stats1, o1);
            }
            if (s + 2u <= last) {
                m = merge(m, stats2, o2);
            }
            if (s + 3u <= last) {
                m = merge(m, stats3, o3);
            }
        }
        v = m.acc / m.total;
    }
    merged[inv.index] = v;
    workgroupBarrier();
    if (inv.index % 8u != 0u || b >= params.n_blocks) {
        return;
    }
    let at = inv.index;
    let v0 = merged[at];
    let v1 = merged[at + 1u];
    let v2 = merged[at + 2u];
    let v3 = merged[at + 3u];
    let v4 = merged[at + 4u];
    let v5 = merged[at + 5u];
    let v6 = merged[at + 6u];
    let v7 = merged[at + 7u];
    let sum_sq = dot(v0, v0) + dot(v1, v1) + dot(v2, v2) + dot(v3, v3) + dot(v4, v4) + dot(v5, v5)
        + dot(v6, v6) + dot(v7, v7);
    store_block_q8(b, v0, v1, v2, v3, v4, v5, v6, v7, sum_sq);
}
