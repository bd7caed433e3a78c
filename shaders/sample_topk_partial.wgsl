// sample_topk_partial: filtered sampling with top-k on, step 1 of 2: the best top_k tokens of each
// chunk of the vocabulary, best first, as candidates for sample_filtered (CANDIDATES), which then runs
// its filter chain over the candidate list instead of the whole vocabulary.
//
// Exact: the global top-k (penalized logit descending, id ascending: numpy's stable argsort of
// -logits) is the top-k of the union of the chunks' top-k, because a token beaten by top_k tokens of
// its own chunk is beaten by top_k tokens overall. Every later filter (top-p, min-p) keeps a prefix
// of the top-k, so the candidate list holds every token the distribution can give weight to.
//
// Only when 1 <= top_k <= K_MAX (the state's setting, read here on the GPU): otherwise every workgroup
// returns at once and sample_filtered, reading the same setting, scans the logits itself. So one plan
// serves every setting, with no round trip to the CPU.
//
// A workgroup loads its CHUNK logits (4 per invocation, the repetition penalty applied on the fly:
// lib/sample_penalty.wgsl), turns each into (order key, id) with order_key as sample_filtered does,
// and sorts them best first with a bitonic sort in workgroup memory (a total order: key descending,
// id ascending; ids past n_vocab sort last). Then it writes the first top_k.
//
// Bindings (group 0):
//   0  params      uniform             Params
//   1  state       storage, read       array<u32>        the engine state (top_k, repetition penalty, history)
//   2  logits      storage, read       array<vec4<f32>>  [ceil(n_vocab / 4)]  the output head's logits
//   3  candidates  storage, read_write array<vec2<u32>>  [n_groups * K_MAX]  (order key, id), chunk g in
//                  slots g * top_k .. g * top_k + top_k - 1, best first; id NO_ID past n_vocab
//
// Defines: K_MAX, the largest top_k served (<= CHUNK).
// Grid: ceil(n_vocab / CHUNK) workgroups (2-D past 65535); workgroup g takes ids g * CHUNK ..

struct Params {
    n_vocab: u32,  // logits
}

const WG = 256u;
const CHUNK = 1024u;  // ids per workgroup = 4 * WG (py/webgguf/plan.py's TOP_K_CHUNK)
const NO_ID = 0xFFFFFFFFu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> candidates: array<vec2<u32>>;

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"
#include "lib/sample_penalty.wgsl"

var<workgroup> keys: array<u32, CHUNK>;
var<workgroup> ids: array<u32, CHUNK>;

// Maps a logit's f32 bits to a u32 with the same order (as sample_filtered's order_key).
fn order_key(v: f32) -> u32 {
    var bits = bitcast<u32>(v);
    if (bits == 0x80000000u) {
        bits = 0u;  // -0 ties with +0, as in numpy
    }
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// Is (key a, id a) a better token than (key b, id b)? NO_ID loses to everything.
fn better(a: u32, a_id: u32, b: u32, b_id: u32) -> bool {
    return a_id != NO_ID && (b_id == NO_ID || a > b || (a == b && a_id < b_id));
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let part = group_index(grid);
    let top_k = state[TOP_K];
    if (part * CHUNK >= params.n_vocab || top_k == 0u || top_k > K_MAX) {
        return;
    }
    let penalty = load_penalty(li, WG);

    // Invocation li loads ids 4q .. 4q + 3 (the binding holds ceil(n_vocab / 4) vec4s).
    let q = part * (CHUNK / 4u) + li;
    var v4 = vec4<f32>();
    if (4u * q < params.n_vocab) {
        v4 = logits[q];
    }
    for (var j = 0u; j < 4u; j++) {
        let i = 4u * q + j;
        let valid = i < params.n_vocab;
        keys[4u * li + j] = select(0u, order_key(penalized(v4[j], i, penalty)), valid);
        ids[4u * li + j] = select(NO_ID, i, valid);
    }

    // Bitonic sort, best first: for each block size k, compare-exchange pairs (a, a + j); blocks with
    // bit k of a clear go best first, the others worst first, so that the merges see bitonic runs.
    for (var k = 2u; k <= CHUNK; k <<= 1u) {
        for (var j = k >> 1u; j > 0u; j >>= 1u) {
            workgroupBarrier();
            for (var t = li; t < CHUNK / 2u; t += WG) {
                let a = ((t & ~(j - 1u)) << 1u) | (t & (j - 1u));
                let b = a + j;
                let best_first = (a & k) == 0u;
                if (best_first != better(keys[a], ids[a], keys[b], ids[b])) {
                    let key = keys[a];
                    let id = ids[a];
                    keys[a] = keys[b];
                    ids[a] = ids[b];
                    keys[b] = key;
                    ids[b] = id;
                }
            }
        }
    }
    workgroupBarrier();
    for (var r = li; r < top_k; r += WG) {
        candidates[part * top_k + r] = vec2<u32>(keys[r], ids[r]);
    }
}
