// The repetition penalty of the samplers: the last repeat_last_n history tokens, each penalized
// once, as llama.cpp and webgguf.sampling.penalize do (logit / penalty if > 0, else * penalty).
//
// The recent ids go into a small open-addressing hash set in workgroup memory, so a logit's lookup is
// one or two workgroup loads, whatever the vocabulary size. Needs from the including kernel:
// `state` (array<u32>, any access) and lib/state.wgsl.

const PENALTY_SLOTS = 512u;    // power of two, twice HISTORY_CAP: a probe ends at an empty slot
const EMPTY_SLOT = 0xFFFFFFFFu;

var<workgroup> penalized_ids: array<u32, PENALTY_SLOTS>;

fn penalty_slot(id: u32) -> u32 {
    return (id * 0x9E3779B1u) >> 23u;  // Fibonacci hashing: the top 9 bits
}

// Fill the set from the state; returns the penalty factor (1.0: no penalty). Call once, from uniform
// control flow, by every invocation (`index`: local invocation index, `wg`: workgroup size).
fn load_penalty(index: u32, wg: u32) -> f32 {
    for (var slot = index; slot < PENALTY_SLOTS; slot += wg) {
        penalized_ids[slot] = EMPTY_SLOT;
    }
    workgroupBarrier();
    let penalty = bitcast<f32>(state[REPEAT_PENALTY]);
    let n_recent = min(min(state[REPEAT_LAST_N], state[HISTORY_LEN]), HISTORY_CAP);
    if (index == 0u && penalty != 1.0) {
        let head = state[HISTORY_HEAD];
        for (var j = 0u; j < n_recent; j++) {
            let id = state[HISTORY + (head + HISTORY_CAP - 1u - j) % HISTORY_CAP];
            var slot = penalty_slot(id);
            while (penalized_ids[slot] != EMPTY_SLOT && penalized_ids[slot] != id) {
                slot = (slot + 1u) % PENALTY_SLOTS;
            }
            penalized_ids[slot] = id;
        }
    }
    workgroupBarrier();
    return select(1.0, penalty, n_recent > 0u);
}

// Logit v of token i, penalized when i is a recent token.
fn penalized(v: f32, i: u32, penalty: f32) -> f32 {
    if (penalty == 1.0) {
        return v;
    }
    var slot = penalty_slot(i);
    for (var probe = 0u; probe < PENALTY_SLOTS; probe++) {  // ends at an empty slot long before
        let id = penalized_ids[slot];
        if (id == i) {
            return select(v * penalty, v / penalty, v > 0.0);
        }
        if (id == EMPTY_SLOT) {
            break;
        }
        slot = (slot + 1u) % PENALTY_SLOTS;
    }
    return v;
}
