// attn_combine: merge the split partials of attn_decode into each head's attention output.
//
// out[h] = sum_s exp(max_s - M) o_s / sum_s exp(max_s - M) sum_s, with M the largest max_s of the head.
// Empty splits (sum 0) weigh nothing. Split 0 is never empty (the attended span has >= 1 position).
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  partials  storage, read       array<vec4<f32>>  [n_head][n_splits][HEAD_DIM / 4 + 1]  (see attn_decode.wgsl)
//   2  out       storage, read_write array<vec4<f32>>  [n_head][HEAD_DIM / 4]  attention output of the token
//
// Specialization: HEAD_DIM (elements per head, multiple of 4, at most 4 * WG = 1024).
// Grid: n_head workgroups (2-D past 65535). The split statistics of the head are staged in workgroup
// memory; then LANES invocations share each output vec4, lane l adding up splits l, l + LANES, ...
// four loads at a time (the loads of one invocation are what limits this kernel), and the lanes'
// sums are added in workgroup memory.

struct Params {
    n_head: u32,    // query heads
    n_splits: u32,  // split partials per head (<= MAX_SPLITS)
}

const WG = 256u;
const HD4 = HEAD_DIM / 4u;
const SPAN = min(HD4, WG);     // invocations of one lane
const LANES = WG / SPAN;       // invocations per output vec4
const MAX_SPLITS = 256u;
const NEG_MAX = -3.0e38;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

#include "lib/invocation.wgsl"

var<workgroup> split_max: array<f32, MAX_SPLITS>;
var<workgroup> split_weight: array<f32, MAX_SPLITS>;  // the split's sum, then exp(max_s - M) (0 if empty)
var<workgroup> lane_sums: array<vec4<f32>, WG>;       // [lane][SPAN]

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let head = group_index(grid);
    if (head >= params.n_head) {
        return;
    }
    let n_splits = params.n_splits;
    let record = HD4 + 1u;
    let first = head * n_splits * record;  // this head's split 0
    for (var s = li; s < n_splits; s += WG) {
        let stats = partials[first + s * record + HD4];
        split_max[s] = select(NEG_MAX, stats.x, stats.y > 0.0);
        split_weight[s] = stats.y;
    }
    workgroupBarrier();
    var top = NEG_MAX;
    for (var s = 0u; s < n_splits; s++) {
        top = max(top, split_max[s]);
    }
    var total = 0.0;
    for (var s = 0u; s < n_splits; s++) {
        total += exp(split_max[s] - top) * split_weight[s];
    }
    workgroupBarrier();  // every invocation has its total before the weights replace the sums
    for (var s = li; s < n_splits; s += WG) {
        split_weight[s] = select(0.0, exp(split_max[s] - top), split_weight[s] > 0.0);
    }
    workgroupBarrier();

    // Invocation li: output vec4 d of lane `lane` (HD4 <= WG, so each lane covers the head once).
    let lane = li / SPAN;
    let d = li % SPAN;
    let last = n_splits - 1u;
    var o = vec4<f32>(0.0);
    if (lane < LANES) {
        for (var s = lane; s < n_splits; s += 4u * LANES) {
            // Four splits per step; past the last one, weight 0 on a valid record.
            let s1 = min(s + LANES, last);
            let s2 = min(s + 2u * LANES, last);
            let s3 = min(s + 3u * LANES, last);
            let a = partials[first + s * record + d];
            let b = partials[first + s1 * record + d];
            let c = partials[first + s2 * record + d];
            let e = partials[first + s3 * record + d];
            o += split_weight[s] * a;
            o += select(0.0, split_weight[s1], s + LANES <= last) * b;
            o += select(0.0, split_weight[s2], s + 2u * LANES <= last) * c;
            o += select(0.0, split_weight[s3], s + 3u * LANES <= last) * e;
        }
    }
    lane_sums[li] = o;
    workgroupBarrier();
    if (lane == 0u) {
        for (var l = 1u; l < LANES; l++) {
            o += lane_sums[l * SPAN + d];
        }
        out[head * HD4 + d] = o / total;
    }
}
