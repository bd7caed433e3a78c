// What a sampler does with its token, and its random numbers. Needs from the including kernel:
// `state` and `out_ids` (read_write array<u32>), `params.ring` (slots of out_ids) and lib/state.wgsl.

// PCG-RXS-M-XS 32/32 (O'Neill's PCG family): a 32-bit LCG state, output permuted from the new state.
fn next_random() -> u32 {
    let s = state[RNG] * 747796405u + 2891336453u;
    state[RNG] = s;
    let word = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (word >> 22u) ^ word;
}

// A uniform f32 in [0, 1): the top 24 bits of a random word (every value exact in f32).
fn next_uniform() -> f32 {
    return f32(next_random() >> 8u) * (1.0 / 16777216.0);
}

// Record the sampled token and set the state up for the next decode step (one invocation calls it):
// the embedding lookup reads state[TOKEN], the host reads the ring, the penalty sees the token.
fn commit_token(token: u32) {
    state[TOKEN] = token;
    out_ids[state[STEP] % params.ring] = token;
    state[STEP] += 1u;
    let head = state[HISTORY_HEAD] % HISTORY_CAP;
    state[HISTORY + head] = token;
    state[HISTORY_HEAD] = (head + 1u) % HISTORY_CAP;
    state[HISTORY_LEN] = min(state[HISTORY_LEN] + 1u, HISTORY_CAP);
    state[POS] += state[N_TOKENS];
    state[N_TOKENS] = 1u;
}
