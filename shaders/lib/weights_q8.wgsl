// Integer dot products of weight chunks with 8-bit activation blocks: the weight side of gemv_q8.wgsl.
//
// Same buffers as lib/weights.wgsl (bindings 3 w_q, 4 w_s, 5 w_h; layouts there and in docs/GPU.md),
// viewed through wide element types: chunk c of a row (elements 32c .. 32c+31: one block of the
// 32-element formats, one sub-block of the K-quants) is one vec4<u32> of 4-bit quants, or two of
// Q8_0's bytes. The activations come as quantize_q8.wgsl writes them: 32 int8 per block (XQ32: two
// vec4<u32>) with (d, d * sum q).
//
// chunk_dot(row, c, xq, xs) returns the chunk's sum_i w_i * x_i, xs being the block's scales
// (d, d * sum q, sum x^2, d * sum of q_0 .. q_15). The weight quants are unpacked into
// bytes with masks (4 elements per u32) and multiplied by the activation quants 4 at a time
// (dot4I8Packed); the scales are applied once per chunk (per 16 elements for Q6_K), and a format's
// offset through d * sum q: w = d_w (q_w - o) gives d_w (d q_w . q - o d sum q).
//
// Element orders. The 32-element formats keep GGUF's order: word j of a block holds elements
// 4j .. 4j+3 in its low nibbles and 16+4j .. 16+4j+3 in its high nibbles, so (q & 0x0F0F0F0F) and
// ((q >> 4) & 0x0F0F0F0F) line up with the activation bytes as they are (XQ32 in element order). The
// K-quants keep element order in nibbles (word j: elements 8j .. 8j+7 in nibbles 0..7): the two masks
// give the even and the odd elements of the 8, so they read the activations in K order (quantize_q8's
// xk: per 8 elements the even ones, then the odd ones).
//
// Needs from the including kernel: a string define WEIGHTS (q4_0 q4_1 q5_0 q8_0 q4_k q5_k q6_k) and
// const N_IN (elements per row).

// The 32 activation quants of a chunk: a = int8 0..15 of the order the format reads, b = 16..31.
struct XQ32 {
    a: vec4<u32>,
    b: vec4<u32>,
}

const CHUNKS = N_IN / 32u;  // chunks per row
const LOW_NIBBLES = 0x0F0F0F0Fu;

fn dot4(a: vec4<u32>, b: vec4<u32>) -> i32 {
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}

// Bits `first` .. `first + 3` of h, as 0x10 in bytes 0..3 (a 5th bit above a nibble).
fn bits_to_bytes(h: u32, first: u32) -> u32 {
    let b = h >> first;
    return ((b & 1u) | ((b & 2u) << 7u) | ((b & 4u) << 14u) | ((b & 8u) << 21u)) << 4u;
}

// Q4_0, Q5_0, Q8_0 keep the f16 scales of blocks 2k and 2k + 1 of a row in word k of the row's
// ceil(CHUNKS / 2) words of w_s.
fn pair_word(row: u32, b: u32) -> u32 {
    return row * ((CHUNKS + 1u) / 2u) + b / 2u;
}

fn pair_scale(word: u32, b: u32) -> f32 {
    return unpack2x16float(word)[b % 2u];
}

#if WEIGHTS == q4_0
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // 16 bytes per block
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let q = w_q[row * CHUNKS + c];
    let dot_q = dot4(q & vec4<u32>(LOW_NIBBLES), xq.a) + dot4((q >> vec4<u32>(4u)) & vec4<u32>(LOW_NIBBLES), xq.b);
    return pair_scale(w_s[pair_word(row, c)], c) * (xs.x * f32(dot_q) - 8.0 * xs.y);
}
#endif

#if WEIGHTS == q4_1
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;  // f16 d | f16 m << 16 per block

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let q = w_q[row * CHUNKS + c];
    let dm = unpack2x16float(w_s[row * CHUNKS + c]);
    let dot_q = dot4(q & vec4<u32>(LOW_NIBBLES), xq.a) + dot4((q >> vec4<u32>(4u)) & vec4<u32>(LOW_NIBBLES), xq.b);
    return dm.x * xs.x * f32(dot_q) + dm.y * xs.y;
}
#endif

#if WEIGHTS == q5_0
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;
@group(0) @binding(5) var<storage, read> w_h: array<u32>;  // bit j: the 5th bit of element j

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let at = row * CHUNKS + c;
    let q = w_q[at];
    let h = w_h[at];
    let lo = (q & vec4<u32>(LOW_NIBBLES))
        | vec4<u32>(bits_to_bytes(h, 0u), bits_to_bytes(h, 4u), bits_to_bytes(h, 8u), bits_to_bytes(h, 12u));
    let hi = ((q >> vec4<u32>(4u)) & vec4<u32>(LOW_NIBBLES))
        | vec4<u32>(bits_to_bytes(h, 16u), bits_to_bytes(h, 20u), bits_to_bytes(h, 24u), bits_to_bytes(h, 28u));
    return pair_scale(w_s[pair_word(row, c)], c) * (xs.x * f32(dot4(lo, xq.a) + dot4(hi, xq.b)) - 16.0 * xs.y);
}
#endif

#if WEIGHTS == q8_0
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // 32 int8 = two vec4<u32> per block
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let at = 2u * (row * CHUNKS + c);
    let dot_q = dot4(w_q[at], xq.a) + dot4(w_q[at + 1u], xq.b);
    return pair_scale(w_s[pair_word(row, c)], c) * xs.x * f32(dot_q);
}
#endif

// ---- K-quants: chunk c of a row is sub-block c % 8 of super-block c / 8; activations in K order
// (XQ32.a: elements 0..15 as (evens of 0..7, odds of 0..7, evens of 8..15, odds of 8..15), b likewise
// for 16..31), so nibble word j's (q & mask, (q >> 4) & mask) meet words 2j, 2j + 1 of the 8.

// The even and the odd nibbles of q (elements 8j, 8j+2, .. and 8j+1, 8j+3, ..) as bytes.
fn k_pairs(q: u32) -> vec2<u32> {
    return vec2<u32>(q & LOW_NIBBLES, (q >> 4u) & LOW_NIBBLES);
}

// q . x of a chunk of K-ordered nibbles, as (elements 0..15, 16..31).
fn k_nibble_dots(q: vec4<u32>, xq: XQ32) -> vec2<i32> {
    let p0 = k_pairs(q.x);
    let p1 = k_pairs(q.y);
    let p2 = k_pairs(q.z);
    let p3 = k_pairs(q.w);
    let lo = dot4(vec4<u32>(p0, p1), xq.a);
    let hi = dot4(vec4<u32>(p2, p3), xq.b);
    return vec2<i32>(lo, hi);
}

// Q4_K/Q5_K: (d * scale, dmin * min) of sub-block j (lib/weights.wgsl k4_scale_min).
fn k4_dm(sb: vec4<u32>, j: u32) -> vec2<f32> {
    let shift = 8u * (j % 4u);
    let b0 = vec2<u32>(sb.y >> shift, sb.z >> shift) & vec2<u32>(255u);
    let b8 = (sb.w >> shift) & 255u;
    let low = b0 & vec2<u32>(63u);
    let high = vec2<u32>(b8 & 15u, b8 >> 4u) | ((b0 >> vec2<u32>(6u)) << vec2<u32>(4u));
    return unpack2x16float(sb.x) * vec2<f32>(select(high, low, j < 4u));
}

#if WEIGHTS == q4_k
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // 32 nibbles per chunk
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let dots = k_nibble_dots(w_q[row * CHUNKS + c], xq);
    let dm = k4_dm(w_s[row * (CHUNKS / 8u) + c / 8u], c % 8u);
    return dm.x * xs.x * f32(dots.x + dots.y) - dm.y * xs.y;
}
#endif

// The fifth bits of elements 8j .. 8j+7 (bits 0..7 of b) as 0x10 in the bytes of (evens, odds).
fn k_fifth_bits(b: u32) -> vec2<u32> {
    let even = (b & 1u) | ((b & 4u) << 6u) | ((b & 16u) << 12u) | ((b & 64u) << 18u);
    let odd = ((b >> 1u) & 1u) | ((b & 8u) << 5u) | ((b & 32u) << 11u) | ((b & 128u) << 17u);
    return vec2<u32>(even, odd) << vec2<u32>(4u);
}

#if WEIGHTS == q5_k
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // low 4 bits, 32 per chunk
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> w_h: array<u32>;        // 5th bits, one u32 per chunk

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let at = row * CHUNKS + c;
    let q = w_q[at];
    let h = w_h[at];
    let p0 = k_pairs(q.x) | k_fifth_bits(h & 255u);
    let p1 = k_pairs(q.y) | k_fifth_bits((h >> 8u) & 255u);
    let p2 = k_pairs(q.z) | k_fifth_bits((h >> 16u) & 255u);
    let p3 = k_pairs(q.w) | k_fifth_bits(h >> 24u);
    let dot_q = dot4(vec4<u32>(p0, p1), xq.a) + dot4(vec4<u32>(p2, p3), xq.b);
    let dm = k4_dm(w_s[row * (CHUNKS / 8u) + c / 8u], c % 8u);
    return dm.x * xs.x * f32(dot_q) - dm.y * xs.y;
}
#endif

#if WEIGHTS == q6_k
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // low 4 bits, 32 per chunk
@group(0) @binding(4) var<storage, read> w_s: array<u32>;        // 5 per super-block
@group(0) @binding(5) var<storage, read> w_h: array<vec2<u32>>;  // high 2 bits, 16 per u32

// The high pairs of elements 8j .. 8j+7 (bits 2i of h16) as bits 4..5 of the bytes of (evens, odds).
fn k_high_pairs(h16: u32) -> vec2<u32> {
    let even = (h16 & 3u) | ((h16 & 0x30u) << 4u) | ((h16 & 0x300u) << 8u) | ((h16 & 0x3000u) << 12u);
    let h = h16 >> 2u;
    let odd = (h & 3u) | ((h & 0x30u) << 4u) | ((h & 0x300u) << 8u) | ((h & 0x3000u) << 12u);
    return vec2<u32>(even, odd) << vec2<u32>(4u);
}

fn chunk_dot(row: u32, c: u32, xq: XQ32, xs: vec4<f32>) -> f32 {
    let at = row * CHUNKS + c;
    let q = w_q[at];
    let h = w_h[at];
    let p0 = k_pairs(q.x) | k_high_pairs(h.x & 0xFFFFu);
    let p1 = k_pairs(q.y) | k_high_pairs(h.x >> 16u);
    let p2 = k_pairs(q.z) | k_high_pairs(h.y & 0xFFFFu);
    let p3 = k_pairs(q.w) | k_high_pairs(h.y >> 16u);
    // Quants are 0..63 with an offset of 32 per element: d q . x - 32 d sum x, per half (its own scale).
    let lo = xs.x * f32(dot4(vec4<u32>(p0, p1), xq.a)) - 32.0 * xs.w;
    let hi = xs.x * f32(dot4(vec4<u32>(p2, p3), xq.b)) - 32.0 * (xs.y - xs.w);
    let sb = (row * (CHUNKS / 8u) + c / 8u) * 5u;
    let scales = w_s[sb + 1u + (c % 8u) / 2u] >> (16u * (c % 2u));
    let s0 = f32(bitcast<i32>(scales << 24u) >> 24u);
    let s1 = f32(bitcast<i32>(scales << 16u) >> 24u);
    return unpack2x16float(w_s[sb]).x * (s0 * lo + s1 * hi);
}
#endif
