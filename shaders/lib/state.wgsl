// Word indices of the engine state buffer (`state: array<u32>`); the layout is documented in
// docs/ENGINE_STATE.md and mirrored by py/webgguf/plan.py.

const POS = 0u;             // position of the first token of this step
const N_TOKENS = 1u;        // tokens in this step
const TOKEN = 2u;           // last sampled token id
const STEP = 3u;            // next slot of the output id ring (mod the ring length)
const RNG = 4u;             // RNG state (PCG, advanced by the sampler)
const TEMPERATURE = 5u;     // f32 bits; 0 = greedy
const TOP_K = 6u;           // 0 = off
const TOP_P = 7u;           // f32 bits; 1 = off
const MIN_P = 8u;           // f32 bits; 0 = off
const REPEAT_PENALTY = 9u;  // f32 bits; 1 = off
const REPEAT_LAST_N = 10u;  // tokens of history the penalty looks at (<= HISTORY_CAP)
const HISTORY_LEN = 11u;    // valid entries of the history ring
const HISTORY_HEAD = 12u;   // ring slot the next token goes to
const HISTORY = 16u;        // first word of the history ring
const HISTORY_CAP = 256u;   // history ring slots
