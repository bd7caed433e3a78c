// sample_argmax_partial: greedy sampling, step 1 of 2: the largest (penalized) logit of each chunk of
// the vocabulary, ties to the lowest id (numpy's argmax).
//
// Many workgroups share the scan of a large vocabulary (262144 logits for Gemma 3); the repetition
// penalty is applied on the fly (lib/sample_penalty.wgsl), so greedy decoding with a penalty picks the
// argmax of the penalized logits, as webgguf.sampling does. The logits are not modified.
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read       array<u32>        the engine state (repetition penalty, history)
//   2  logits    storage, read       array<f32>        [n_vocab]  the output head's logits
//   3  partials  storage, read_write array<vec2<u32>>  [ceil(n_vocab / chunk)]  (f32 bits of the max, its id)
//
// Specialization:
//   NARROW  4 invocations per workgroup, not 256: for CPU adapters, where a barrier costs ~2 µs per
//           invocation (256 invocations spend ~1 ms per workgroup in the reduction's barriers)
//
// Grid: ceil(n_vocab / chunk) workgroups (2-D past 65535); workgroup w scans ids w * chunk ..
// (w + 1) * chunk - 1, then sample_argmax_final (one workgroup) reduces the partials.

struct Params {
    n_vocab: u32,  // logits
    chunk: u32,    // ids per workgroup
}

#if NARROW
const WG = 4u;  // CPU adapters: one SIMD group, whose barriers cost little (docs/GPU.md "CPU adapters")
#else
const WG = 256u;
#endif
const NO_ID = 0xFFFFFFFFu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> partials: array<vec2<u32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"
#include "lib/sample_penalty.wgsl"

var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_id: array<u32, WG>;

// Is (value a, id a) a better pick than (value b, id b)? NO_ID loses to everything.
fn better(a: f32, a_id: u32, b: f32, b_id: u32) -> bool {
    return a_id != NO_ID && (b_id == NO_ID || a > b || (a == b && a_id < b_id));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let part = group_index(grid);
    let begin = part * params.chunk;
    if (begin >= params.n_vocab) {
        return;
    }
    let end = min(begin + params.chunk, params.n_vocab);
    let penalty = load_penalty(li, WG);

    var value = 0.0;
    var id = NO_ID;
    for (var i = begin + li; i < end; i += WG) {  // ascending ids: a tie keeps the earlier one
        let v = penalized(logits[i], i, penalty);
        if (id == NO_ID || v > value) {
            value = v;
            id = i;
        }
    }
    best_value[li] = value;
    best_id[li] = id;
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (li < stride && better(best_value[li + stride], best_id[li + stride], best_value[li], best_id[li])) {
            best_value[li] = best_value[li + stride];
            best_id[li] = best_id[li + stride];
        }
    }
    if (li == 0u) {
        partials[part] = vec2<u32>(bitcast<u32>(best_value[0]), best_id[0]);
    }
}
