// sample_filtered: draw the step's token from the filtered distribution of webgguf.sampling:
// repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw (llama.cpp's order), or the
// argmax of the penalized logits when temperature is 0. The settings come from the state buffer.
//
// No sort. The candidates "best first" are ordered by (logit descending, id ascending), as numpy's
// stable argsort of -logits orders them, and every filter keeps a prefix of that order. A prefix is a
// cut (key, id): token i survives iff key_i > key, or key_i == key and i <= id, where key_i maps the
// logit's f32 bits to an order-preserving u32. One workgroup finds each cut with a radix select over
// the keys, most significant 4 bits first (16 bins per invocation, summed in a fixed order), counting
// tokens for top-k and summing exp(logit - max) for top-p; it stops early once the chosen bin holds a
// single token, and only when a run of equal logits straddles the cut does one more pass, in id
// order, place the cut inside the run. min-p is a plain threshold: exp(logit - max) >= min_p. The draw
// is an inverse CDF over the survivors' weights exp((logit - max) / temperature) with one uniform
// number, in a fixed order (invocation, then id). Every sum has a fixed order, so a seed gives the
// same ids on every run.
//
// With min-p on, the searches start at the min-p floor (top + log(min_p)): few tokens are above it,
// and the keys there share their high bits, which the radix skips.
//
// With CANDIDATES (top-k on, 1 <= top_k <= K_MAX): sample_topk_partial has already written the best
// top_k tokens of every chunk of the vocabulary, penalized and best first, to `candidates`; the
// passes below then read that list (a few thousand tokens) instead of the whole vocabulary. The
// global top-k is the top-k of the list, and every later filter keeps a prefix of it, so the
// distribution is the same. Within the list, tokens with equal keys come in id order (a chunk's are
// sorted by key, then id; chunk g's ids are below chunk g + 1's), which the tie pass relies on. With
// top_k 0 or > K_MAX the partial kernel writes nothing and this kernel scans the logits, as without
// CANDIDATES: both paths are in one plan, chosen here from the state (no CPU round trip).
//
// Passes over the tokens: 1 (max) + per active filter (top-k; top-p, which first sums its mass)
// at most 8 radix passes (+ 1 to read a lone token's key, + 1 to split a tie; + 1 count above the
// floor for top-k with top-p) + 1 to draw (then one invocation rescans its share).
//
// Bindings (group 0):
//   0  params   uniform             Params
//   1  state    storage, read_write array<u32>  the engine state (docs/ENGINE_STATE.md)
//   2  logits   storage, read       array<vec4<f32>>  [ceil(n_vocab / 4)]  the output head's logits
//                (not modified; the binding is padded to a multiple of 4 floats, the padding is ignored)
//   3  out_ids  storage, read_write array<u32>  [ring]  sampled ids, slot step % ring
//   4  candidates  storage, read    array<vec2<u32>>  (CANDIDATES only) sample_topk_partial's output:
//                (order key, id) [ceil(n_vocab / chunk) * top_k], id NO_ID for none
//
// Defines: CANDIDATES (bool) and then K_MAX (sample_topk_partial's).
//
// The token is committed like sample_argmax_final's (lib/sample_commit.wgsl); a draw (temperature
// > 0) advances the RNG state by one step.
// Grid: 1 workgroup.

struct Params {
    n_vocab: u32,  // logits
    ring: u32,     // slots of out_ids
#if CANDIDATES
    chunk: u32,    // ids per workgroup of sample_topk_partial
#endif
}

const WG = 256u;                     // = 16 x 16: the fixed-order sums below rely on it
const BINS = 16u;                    // radix digit of 4 bits
const HALF = WG / 2u;
const NO_ID = 0xFFFFFFFFu;
const COUNT = 0u;                    // find_cut modes: count tokens (top-k) ...
const MASS = 1u;                     // ... or sum exp(logit - max) (top-p)

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out_ids: array<u32>;
#if CANDIDATES
@group(0) @binding(4) var<storage, read> candidates: array<vec2<u32>>;
#endif

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"
#include "lib/sample_penalty.wgsl"
#include "lib/sample_commit.wgsl"

struct Settings {
    temperature: f32,
    top_k: u32,
    top_p: f32,
    min_p: f32,
}

// The tokens the passes read: the vocabulary (slot s = id s), or the candidate list. Only uniform
// values (from params and the settings), so that branches on them may hold barriers.
struct Source {
    list: u32,    // 1: the candidate list, 0: the logits
    slots: u32,   // positions to read
    tokens: u32,  // tokens among them (the rest are NO_ID)
}

// Four positions 4q .. 4q + 3: order keys, logits (penalized), ids (NO_ID: no token).
struct Quad {
    keys: vec4<u32>,
    values: vec4<f32>,
    ids: vec4<u32>,
}

// A prefix of the candidates best first: tokens with key > key, and those with key == key and id <= id.
struct Cut {
    key: u32,
    id: u32,
}

const ALL = Cut(0u, NO_ID);

// What invocation 0 decides for the others: who rescans its share, for what, and the answer.
struct Pick {
    owner: u32,  // the invocation that rescans its share
    rank: f32,   // what it looks for: a tie's rank, or a running weight to pass
    id: u32,     // the token found
}

var<workgroup> settings_shared: Settings;
var<workgroup> sums: array<f32, WG>;                  // one value per invocation
var<workgroup> words: array<u32, WG>;                 // one value per invocation
var<workgroup> sums16: array<f32, 16>;                // partial sums of 16 values each
var<workgroup> words16: array<u32, 16>;
var<workgroup> bins_shared: array<vec4<f32>, BINS / 4u * HALF>;  // [bin / 4][invocation] radix sums,
                                                                 // bin % 4 the component
var<workgroup> bin_totals: array<f32, BINS>;
var<workgroup> total_f: f32;
var<workgroup> total_u: vec2<u32>;
var<workgroup> pick: Pick;

fn order_key(v: f32) -> u32 {
    var bits = bitcast<u32>(v);
    if (bits == 0x80000000u) {
        bits = 0u;  // -0 ties with +0, as in numpy
    }
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

fn key_value(key: u32) -> f32 {
    return bitcast<f32>(select(~key, key & 0x7FFFFFFFu, (key & 0x80000000u) != 0u));
}

fn survives(cut: Cut, key: u32, id: u32) -> bool {
    return key > cut.key || (key == cut.key && id <= cut.id);
}

// Penalized logits 4q .. 4q + 3. Every pass reads the logits 4 at a time: one invocation's loads are
// what limits a single workgroup, so each load brings 4 (ids past n_vocab are skipped by the caller).
fn logits4(q: u32, penalty: f32) -> vec4<f32> {
    let v = logits[q];
    if (penalty == 1.0) {
        return v;
    }
    let i = 4u * q;
    return vec4<f32>(
        penalized(v.x, i, penalty), penalized(v.y, i + 1u, penalty),
        penalized(v.z, i + 2u, penalty), penalized(v.w, i + 3u, penalty)
    );
}

fn n4(src: Source) -> u32 {
    return (src.slots + 3u) / 4u;
}

// The tokens at positions 4q .. 4q + 3 of the source (the penalty applies to the logits only: the
// candidates are penalized already).
fn quad(src: Source, q: u32, penalty: f32) -> Quad {
    var t = Quad();
#if CANDIDATES
    if (src.list != 0u) {
        for (var j = 0u; j < 4u; j++) {
            var c = vec2<u32>(0u, NO_ID);
            if (4u * q + j < src.slots) {
                c = candidates[4u * q + j];
            }
            t.keys[j] = c.x;
            t.values[j] = key_value(c.x);
            t.ids[j] = c.y;
        }
        return t;
    }
#endif
    t.values = logits4(q, penalty);
    let i = vec4<u32>(4u * q) + vec4<u32>(0u, 1u, 2u, 3u);
    t.ids = select(i, vec4<u32>(NO_ID), i >= vec4<u32>(params.n_vocab));
    t.keys = vec4<u32>(order_key(t.values.x), order_key(t.values.y), order_key(t.values.z), order_key(t.values.w));
    return t;
}

// (order key, id) of the token at position s of the source (s < src.slots).
fn slot(src: Source, s: u32, penalty: f32) -> vec2<u32> {
#if CANDIDATES
    if (src.list != 0u) {
        return candidates[s];
    }
#endif
    return vec2<u32>(order_key(penalized(logits[s / 4u][s % 4u], s, penalty)), s);
}

// ---- workgroup reductions, each in a fixed order (16 invocations take 16 values each, then one
// takes those 16), returning a uniform result. Call from uniform control flow.

fn sum_all(value: f32, li: u32) -> f32 {
    workgroupBarrier();
    sums[li] = value;
    workgroupBarrier();
    if (li < 16u) {
        var s = 0.0;
        for (var j = 0u; j < 16u; j++) {
            s += sums[li * 16u + j];
        }
        sums16[li] = s;
    }
    workgroupBarrier();
    if (li == 0u) {
        var s = 0.0;
        for (var j = 0u; j < 16u; j++) {
            s += sums16[j];
        }
        total_f = s;
    }
    return workgroupUniformLoad(&total_f);
}

fn max_all(value: u32, li: u32) -> u32 {
    workgroupBarrier();
    words[li] = value;
    workgroupBarrier();
    if (li < 16u) {
        var m = 0u;
        for (var j = 0u; j < 16u; j++) {
            m = max(m, words[li * 16u + j]);
        }
        words16[li] = m;
    }
    workgroupBarrier();
    if (li == 0u) {
        var m = 0u;
        for (var j = 0u; j < 16u; j++) {
            m = max(m, words16[j]);
        }
        total_u = vec2<u32>(m, 0u);
    }
    return workgroupUniformLoad(&total_u).x;
}

// One invocation's sums per radix bin: bin 4i + c is component c of element i. Four vec4 operations
// per token instead of sixteen scalar ones (the bins' index is not known at compile time, and a private
// array indexed at run time would leave the registers); on CPU adapters the sampler's time went there.
alias Bins = array<vec4<f32>, 4>;

fn add_to_bin(bins: ptr<function, Bins>, bin: u32, w: f32) {
    for (var i = 0u; i < 4u; i++) {
        (*bins)[i] += select(vec4<f32>(0.0), vec4<f32>(w), vec4<u32>(4u * i) + vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(bin));
    }
}

// Is (key a, id a) a better token than (key b, id b)? NO_ID loses to everything.
fn better(a: u32, a_id: u32, b: u32, b_id: u32) -> bool {
    return a_id != NO_ID && (b_id == NO_ID || a > b || (a == b && a_id < b_id));
}

// The best (key, id) of the workgroup, ties to the lowest id.
fn argmax_all(key: u32, id: u32, li: u32) -> vec2<u32> {
    workgroupBarrier();
    words[li] = key;
    bins_shared[li].x = bitcast<f32>(id);  // free here; ids travel as bits
    workgroupBarrier();
    if (li < 16u) {
        var best = vec2<u32>(0u, NO_ID);
        for (var j = li * 16u; j < li * 16u + 16u; j++) {
            let other_id = bitcast<u32>(bins_shared[j].x);
            if (better(words[j], other_id, best.x, best.y)) {
                best = vec2<u32>(words[j], other_id);
            }
        }
        words16[li] = best.x;
        sums16[li] = bitcast<f32>(best.y);
    }
    workgroupBarrier();
    if (li == 0u) {
        var best = vec2<u32>(0u, NO_ID);
        for (var j = 0u; j < 16u; j++) {
            let other_id = bitcast<u32>(sums16[j]);
            if (better(words16[j], other_id, best.x, best.y)) {
                best = vec2<u32>(words16[j], other_id);
            }
        }
        total_u = best;
    }
    return workgroupUniformLoad(&total_u);
}

// Per-bin sums over the workgroup.
fn sum_bins(bins: Bins, li: u32) -> array<f32, BINS> {
    workgroupBarrier();
    if (li >= HALF) {
        for (var i = 0u; i < 4u; i++) {
            bins_shared[i * HALF + li - HALF] = bins[i];
        }
    }
    workgroupBarrier();
    if (li < HALF) {
        for (var i = 0u; i < 4u; i++) {
            bins_shared[i * HALF + li] += bins[i];
        }
    }
    workgroupBarrier();
    var s = 0.0;  // invocation li: eighth li % 16 of bin li / 16
    let bin = li / 16u;
    for (var j = 0u; j < HALF / 16u; j++) {
        s += bins_shared[(bin / 4u) * HALF + (li % 16u) * (HALF / 16u) + j][bin % 4u];
    }
    sums[li] = s;
    workgroupBarrier();
    if (li < BINS) {
        var t = 0.0;
        for (var j = 0u; j < 16u; j++) {
            t += sums[li * 16u + j];
        }
        bin_totals[li] = t;
    }
    return workgroupUniformLoad(&bin_totals);
}

// ---- the cuts

// The shortest prefix of the candidates inside `within` whose weight (COUNT: 1 per token, MASS:
// exp(logit - top)) reaches `goal`: the cut at the first candidate, best first, where the running
// weight is >= goal. The candidates' keys lie in [low, high]; `top` is the largest logit.
fn find_cut(
    mode: u32, goal: f32, within: Cut, low: u32, high: u32, top: f32, src: Source, penalty: f32, li: u32
) -> Cut {
    var prefix = low;            // the key bits decided so far: those set in `known`
    var known = 0xFFFFFFFFu;
    var above = 0.0;             // weight of the candidates whose keys are above every key with the prefix
    var ties = 0.0;              // candidates with the prefix (0: not counted)
    var digit = 0u;
    let differ = low ^ high;
    if (differ != 0u) {
        digit = (31u - countLeadingZeros(differ)) / 4u;
        known = ~((2u << (4u * digit + 3u)) - 1u);  // the bits above that digit: equal in low and high
        prefix = low & known;
    }
    var searching = differ != 0u;
    while (searching) {
        let shift = 4u * digit;
        // Explicit zeros: naga does not re-zero a loop-local var without one (gfx-rs/wgpu#9489).
        var counts = Bins();
        var masses = Bins();
        for (var q = li; q < n4(src); q += WG) {
            let t = quad(src, q, penalty);
            for (var j = 0u; j < 4u; j++) {
                let i = t.ids[j];
                let v = t.values[j];
                let key = t.keys[j];
                if (i != NO_ID && (key & known) == prefix && survives(within, key, i)) {
                    let bin = (key >> shift) & 15u;
                    var w = 1.0;
                    if (mode == MASS) {
                        w = exp(v - top);
                    }
                    add_to_bin(&counts, bin, 1.0);
                    add_to_bin(&masses, bin, w);
                }
            }
        }
        let tokens = sum_bins(counts, li);
        var weights = tokens;
        if (mode == MASS) {
            weights = sum_bins(masses, li);
        }
        // The bin where the running weight, from the top bin down, reaches the goal; if rounding
        // keeps it short of the goal everywhere, the last bin with weight (all of them survive).
        var chosen = 0u;
        var chosen_above = above;
        var running = above;
        var found = false;
        for (var b = i32(BINS) - 1; b >= 0 && !found; b--) {
            if (weights[b] > 0.0) {
                chosen = u32(b);
                chosen_above = running;
                found = running + weights[b] >= goal;
            }
            running += weights[b];
        }
        prefix |= chosen << shift;
        known |= 15u << shift;
        above = chosen_above;
        ties = tokens[chosen];
        if (ties == 1.0 && digit > 0u) {
            // One token left: read its key instead of narrowing it down digit by digit.
            var key = 0u;
            for (var q = li; q < n4(src); q += WG) {
                let t = quad(src, q, penalty);
                for (var j = 0u; j < 4u; j++) {
                    let i = t.ids[j];
                    let k = t.keys[j];
                    if (i != NO_ID && (k & known) == prefix && survives(within, k, i)) {
                        key = k;
                    }
                }
            }
            prefix = max_all(key, li);
            digit = 0u;
        }
        searching = digit > 0u;
        digit -= select(0u, 1u, searching);
    }
    // The candidates with key == prefix tie; the first `need` of them in id order survive.
    var need = goal - above;
    if (mode == MASS) {
        need = ceil(need / exp(key_value(prefix) - top));
    }
    need = max(need, 1.0);
    if (ties > 0.0 && need >= ties) {
        return Cut(prefix, NO_ID);
    }
    return Cut(prefix, tie_cut(prefix, within, need, src, penalty, li));
}

// The id of the `need`-th candidate in id order with key `key` (inside `within`), or NO_ID if there
// are fewer (all of them survive). Invocation li counts the positions li * chunk .. in order: the
// source's tokens with one key come in id order (the vocabulary, or the candidate list: see above).
fn tie_cut(key: u32, within: Cut, need: f32, src: Source, penalty: f32, li: u32) -> u32 {
    let chunk = (src.slots + WG - 1u) / WG;
    let begin = min(li * chunk, src.slots);
    let end = min(begin + chunk, src.slots);
    var count = 0u;
    for (var s = begin; s < end; s++) {
        let c = slot(src, s, penalty);
        if (c.y != NO_ID && c.x == key && survives(within, key, c.y)) {
            count += 1u;
        }
    }
    workgroupBarrier();
    words[li] = count;
    workgroupBarrier();
    if (li == 0u) {
        pick = Pick(NO_ID, 0.0, NO_ID);
        var before = 0u;
        for (var t = 0u; t < WG; t++) {
            if (pick.owner == NO_ID && f32(before + words[t]) >= need) {
                pick.owner = t;
                pick.rank = need - f32(before);
            }
            before += words[t];
        }
    }
    workgroupBarrier();
    if (li == pick.owner) {
        var seen = 0.0;
        for (var s = begin; s < end; s++) {
            let c = slot(src, s, penalty);
            if (c.y != NO_ID && c.x == key && survives(within, key, c.y)) {
                seen += 1.0;
                if (seen == pick.rank) {
                    pick.id = c.y;
                    break;
                }
            }
        }
    }
    return workgroupUniformLoad(&pick.id);
}

@compute @workgroup_size(WG)
fn main(inv: Invocation) {
    let li = inv.index;
    let n = params.n_vocab;
    if (li == 0u) {
        settings_shared = Settings(
            bitcast<f32>(state[TEMPERATURE]), state[TOP_K], bitcast<f32>(state[TOP_P]), bitcast<f32>(state[MIN_P])
        );
    }
    let settings = workgroupUniformLoad(&settings_shared);
    let penalty = load_penalty(li, WG);
    var src = Source(0u, n, n);
#if CANDIDATES
    if (settings.top_k > 0u && settings.top_k <= K_MAX) {
        // top_k slots per chunk; the last chunk may hold fewer tokens.
        let groups = (n + params.chunk - 1u) / params.chunk;
        let last = n - (groups - 1u) * params.chunk;
        src = Source(1u, groups * settings.top_k, (groups - 1u) * settings.top_k + min(settings.top_k, last));
    }
#endif

    // The best token (ties to the lowest id) and the smallest key.
    var best = vec2<u32>(0u, NO_ID);
    var low = 0xFFFFFFFFu;
    for (var q = li; q < n4(src); q += WG) {
        let t = quad(src, q, penalty);
        for (var j = 0u; j < 4u; j++) {
            let i = t.ids[j];
            let key = t.keys[j];
            if (better(key, i, best.x, best.y)) {
                best = vec2<u32>(key, i);
            }
            if (i != NO_ID) {
                low = min(low, key);
            }
        }
    }
    best = argmax_all(best.x, best.y, li);
    low = ~max_all(~low, li);
    if (settings.temperature == 0.0) {
        if (li == 0u) {
            commit_token(best.y);
        }
        return;
    }
    let high = best.x;
    let top = key_value(high);

    // min-p keeps only tokens with exp(logit - top) >= min_p, so no survivor lies below the floor
    // top + log(min_p) (less a margin for the rounding of exp and log). A search that starts at the
    // floor is much shorter, and exact whenever the cut it looks for is above the floor; if it is below,
    // the search ends with everything down to the floor, and min-p then decides.
    var floor_key = low;
    if (settings.min_p > 0.0) {
        floor_key = max(low, order_key(top + log(settings.min_p) - (0.01 + abs(top) * 1e-5)));
    }
    // top-k: the first top_k candidates.
    var cut = ALL;
    if (settings.top_k > 0u && settings.top_k < src.tokens) {
        var search_low = floor_key;
        if (floor_key > low && settings.top_p < 1.0) {
            // top-p weighs every token of the top-k prefix, so this cut must be exact: start at the
            // floor only if the top_k-th token is above it.
            var above_floor = 0.0;
            for (var q = li; q < n4(src); q += WG) {
                let t = quad(src, q, penalty);
                for (var j = 0u; j < 4u; j++) {
                    above_floor += select(0.0, 1.0, t.ids[j] != NO_ID && t.keys[j] >= floor_key);
                }
            }
            if (sum_all(above_floor, li) < f32(settings.top_k)) {
                search_low = low;
            }
        }
        cut = find_cut(COUNT, f32(settings.top_k), ALL, search_low, high, top, src, penalty, li);
    }
    // top-p: the shortest prefix of those whose probability (renormalized over them) reaches top_p.
    if (settings.top_p < 1.0) {
        var mass = 0.0;
        for (var q = li; q < n4(src); q += WG) {
            let t = quad(src, q, penalty);
            for (var j = 0u; j < 4u; j++) {
                if (t.ids[j] != NO_ID && survives(cut, t.keys[j], t.ids[j])) {
                    mass += exp(t.values[j] - top);
                }
            }
        }
        let goal = settings.top_p * sum_all(mass, li);
        cut = find_cut(MASS, goal, cut, max(floor_key, cut.key), high, top, src, penalty, li);
    }

    // min-p and temperature, then the draw: invocation li sums the weights of its positions
    // 4q .. 4q + 3, q = li, li + WG, ...
    var share = 0.0;
    for (var q = li; q < n4(src); q += WG) {
        let t = quad(src, q, penalty);
        for (var j = 0u; j < 4u; j++) {
            let i = t.ids[j];
            let v = t.values[j];
            if (i != NO_ID && survives(cut, t.keys[j], i) && exp(v - top) >= settings.min_p) {
                share += exp((v - top) / settings.temperature);
            }
        }
    }
    workgroupBarrier();
    sums[li] = share;
    workgroupBarrier();
    if (li == 0u) {
        // Shares in invocation order: the owner is the last non-empty share starting at or below the
        // goal (the last non-empty one if rounding puts the goal past the total).
        var total = 0.0;
        for (var t = 0u; t < WG; t++) {
            total += sums[t];
        }
        let goal = next_uniform() * total;
        pick = Pick(NO_ID, 0.0, NO_ID);
        var before = 0.0;
        for (var t = 0u; t < WG; t++) {
            if (sums[t] > 0.0 && (pick.owner == NO_ID || before <= goal)) {
                pick.owner = t;
                pick.rank = goal - before;
            }
            before += sums[t];
        }
    }
    workgroupBarrier();
    if (li == pick.owner) {
        var running = 0.0;  // the same sum, in the same order, as `share`
        var passed = false;
        for (var q = li; q < n4(src) && !passed; q += WG) {
            let t = quad(src, q, penalty);
            for (var j = 0u; j < 4u && !passed; j++) {
                let i = t.ids[j];
                let v = t.values[j];
                if (i != NO_ID && survives(cut, t.keys[j], i) && exp(v - top) >= settings.min_p) {
                    running += exp((v - top) / settings.temperature);
                    pick.id = i;  // the last survivor so far: the answer if rounding never passes the goal
                    passed = running > pick.rank;
                }
            }
        }
    }
    workgroupBarrier();
    if (li == 0u) {
        commit_token(pick.id);
    }
}
