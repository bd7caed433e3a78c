// sample_argmax_final: greedy sampling, step 2 of 2: the best of the chunk maxima of
// sample_argmax_partial (ties to the lowest id), committed as the step's token.
//
// Committing (lib/sample_commit.wgsl) writes the token to state[TOKEN] and to the output ring,
// pushes it into the history ring, advances the ring step, and moves pos past this step's tokens
// (pos += n_tokens, n_tokens = 1) for the next decode step. The RNG state is not used.
//
// Bindings (group 0):
//   0  params    uniform             Params
//   1  state     storage, read_write array<u32>        the engine state (docs/ENGINE_STATE.md)
//   2  partials  storage, read       array<vec2<u32>>  [n_parts]  (f32 bits of a chunk's max, its id)
//   3  out_ids   storage, read_write array<u32>        [ring]  sampled ids, slot step % ring
//
// Grid: 1 workgroup.

struct Params {
    n_parts: u32,  // partials (workgroups of sample_argmax_partial)
    ring: u32,     // slots of out_ids
}

const WG = 64u;
const NO_ID = 0xFFFFFFFFu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read> partials: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> out_ids: array<u32>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"
#include "lib/sample_commit.wgsl"

var<workgroup> best_value: array<f32, WG>;
var<workgroup> best_id: array<u32, WG>;

// Is (value a, id a) a better pick than (value b, id b)? NO_ID loses to everything.
fn better(a: f32, a_id: u32, b: f32, b_id: u32) -> bool {
    return a_id != NO_ID && (b_id == NO_ID || a > b || (a == b && a_id < b_id));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation) {
    let li = inv.index;
    var value = 0.0;
    var id = NO_ID;
    for (var p = li; p < params.n_parts; p += WG) {
        let partial = partials[p];
        if (better(bitcast<f32>(partial.x), partial.y, value, id)) {
            value = bitcast<f32>(partial.x);
            id = partial.y;
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
        commit_token(best_id[0]);
    }
}
