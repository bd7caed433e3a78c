// Reading weight matrices in their GPU layout as int8, one 32-element block at a time (gemm_q8.wgsl).
//
// The arrays are those of lib/weights.wgsl (bindings 3 w_q, 4 w_s, 5 w_h; layouts in its header and in
// docs/GPU.md "Weights on the GPU"), declared here with the widest types a block can be read with: a
// block's quants are 16 aligned bytes (32 for Q8_0), so one vec4<u32> load (two for Q8_0).
//
// A block is read in two steps, so that a kernel can issue the loads of its next tile before it computes
// on the current one and unpack after: fetch_block(row, b, nb) loads the words (BlockRaw), unpack_block
// turns them into 32 int8 quants in element order and the block's scales (BlockI8), such that
//   weight element i = d[i / 16] * q[i] + m   (q: the signed int8 in byte i % 4 of word i / 4)
// Every format's q fits int8: Q4_0 -8..7, Q4_1 and Q4_K 0..15, Q5_0 -16..15, Q5_K 0..31, Q6_K -32..31,
// Q8_0 -127..127. The offsets that ggml subtracts (8, 16, 32) are taken off the bytes here, so only the
// formats with a min (Q4_1, Q4_K, Q5_K) have m != 0. d and m are exact in f32 (an f16 times an integer
// of at most 8 bits).
//
// Needs from the including kernel: a string define WEIGHTS (q8_0 q4_0 q4_1 q5_0 q4_k q5_k q6_k).
// Gives: W_SUBS (integer sums per block: 2 for Q6_K, whose scales cover 16 elements, else 1) and
// W_HAS_MIN (1 for formats with m, else 0).

struct BlockRaw {
    q: vec4<u32>,   // the block's 16 bytes of quants (Q8_0: elements 0..15)
    q8: vec4<u32>,  // Q8_0: elements 16..31
    s: vec2<u32>,   // scale words: small blocks .x; Q4_K/Q5_K see sb; Q6_K (d, the word of the 2 scales)
    sb: vec4<u32>,  // Q4_K/Q5_K: the super-block's scale words (f16 d | f16 dmin << 16, 12 scale bytes)
    h: vec2<u32>,   // high bits: Q5_0/Q5_K .x (bit i = element i), Q6_K .xy (element 16w+i at bits 2i of h[w])
}

struct BlockI8 {
    lo: vec4<u32>,  // elements 0..15 as int8, element 4k+i in byte i of word k
    hi: vec4<u32>,  // elements 16..31
    d: vec2<f32>,   // scale of elements 0..15 and of 16..31 (equal except for Q6_K)
    m: f32,         // added to every element (formats with a min), else 0
}

// ---- byte arithmetic on packed words (4 bytes each)

// Bytes v - bias as int8, for bytes v < 128 and bias <= 128: no borrow crosses a byte because every
// byte is first lifted by 128.
fn sub_bias(v: vec4<u32>, bias: u32) -> vec4<u32> {
    return ((v | vec4<u32>(0x80808080u)) - vec4<u32>(bias * 0x01010101u)) ^ vec4<u32>(0x80808080u);
}

// The 4 nibbles at bits 0..15 of v (higher bits ignored), moved to the low nibbles of bytes 0..3.
fn spread_nibbles(v: vec4<u32>) -> vec4<u32> {
    let low = v & vec4<u32>(0xFFFFu);
    let t = (low | (low << vec4<u32>(8u))) & vec4<u32>(0x00FF00FFu);  // nibbles 0,1 in byte 0; 2,3 in byte 2
    return (t | (t << vec4<u32>(4u))) & vec4<u32>(0x0F0F0F0Fu);
}

// Bits 0..3 of v, moved to bit 0 of bytes 0..3 (the product's terms land on distinct bits: no carries).
fn spread_bits(v: vec4<u32>) -> vec4<u32> {
    return ((v & vec4<u32>(15u)) * 0x00204081u) & vec4<u32>(0x01010101u);
}

// The 2-bit fields at bits 0..7 of v (higher bits ignored), moved to bits 0..1 of bytes 0..3.
fn spread_pairs(v: vec4<u32>) -> vec4<u32> {
    let low = v & vec4<u32>(0xFFu);
    let t = (low | (low << vec4<u32>(12u))) & vec4<u32>(0x000F000Fu);  // fields 0,1 at bit 0; 2,3 at bit 16
    return (t | (t << vec4<u32>(6u))) & vec4<u32>(0x03030303u);
}

// f16 scale of block b from the word of its pair of blocks (Q4_0, Q5_0, Q8_0).
fn pair_scale(word: u32, b: u32) -> f32 {
    return unpack2x16float(word)[b % 2u];
}

// Q4/Q5 small blocks hold elements 4k..4k+3 in the low nibbles and 16+4k.. in the high nibbles of word k.
fn low_nibbles(q: vec4<u32>) -> vec4<u32> {
    return q & vec4<u32>(0x0F0F0F0Fu);
}

fn high_nibbles(q: vec4<u32>) -> vec4<u32> {
    return (q >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
}

// K-quants hold element 8w+i in nibble i of word w: words 2w, 2w+1 of the int8 block come from word w.
fn k_nibbles(q: vec4<u32>) -> array<vec4<u32>, 2> {
    let low = spread_nibbles(q);                    // elements 8w..8w+3
    let high = spread_nibbles(q >> vec4<u32>(16u));  // elements 8w+4..8w+7
    return array<vec4<u32>, 2>(
        vec4<u32>(low.x, high.x, low.y, high.y),
        vec4<u32>(low.z, high.z, low.w, high.w),
    );
}

// Fifth bits (bit i = element i of the block), moved to bit 4 of the bytes of words 0..3 and 4..7.
fn fifth_bits_i8(h: u32) -> array<vec4<u32>, 2> {
    let shifts = vec4<u32>(0u, 4u, 8u, 12u);
    return array<vec4<u32>, 2>(
        spread_bits(vec4<u32>(h) >> shifts) << vec4<u32>(4u),
        spread_bits(vec4<u32>(h) >> (shifts + vec4<u32>(16u))) << vec4<u32>(4u),
    );
}

#if WEIGHTS == q8_0
const W_SUBS = 1u;
const W_HAS_MIN = 0u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // 2 per block
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let at = 2u * (row * nb + b);
    let s = w_s[row * ((nb + 1u) / 2u) + b / 2u];
    return BlockRaw(w_q[at], w_q[at + 1u], vec2<u32>(s, 0u), vec4<u32>(), vec2<u32>());
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    return BlockI8(raw.q, raw.q8, vec2<f32>(pair_scale(raw.s.x, b)), 0.0);
}
#endif

#if WEIGHTS == q4_0
const W_SUBS = 1u;
const W_HAS_MIN = 0u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let s = w_s[row * ((nb + 1u) / 2u) + b / 2u];
    return BlockRaw(w_q[row * nb + b], vec4<u32>(), vec2<u32>(s, 0u), vec4<u32>(), vec2<u32>());
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let d = pair_scale(raw.s.x, b);
    return BlockI8(sub_bias(low_nibbles(raw.q), 8u), sub_bias(high_nibbles(raw.q), 8u), vec2<f32>(d), 0.0);
}
#endif

#if WEIGHTS == q4_1
const W_SUBS = 1u;
const W_HAS_MIN = 1u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let s = w_s[row * nb + b];
    return BlockRaw(w_q[row * nb + b], vec4<u32>(), vec2<u32>(s, 0u), vec4<u32>(), vec2<u32>());
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let dm = unpack2x16float(raw.s.x);
    return BlockI8(low_nibbles(raw.q), high_nibbles(raw.q), vec2<f32>(dm.x), dm.y);
}
#endif

#if WEIGHTS == q5_0
const W_SUBS = 1u;
const W_HAS_MIN = 0u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;
@group(0) @binding(5) var<storage, read> w_h: array<u32>;

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let s = w_s[row * ((nb + 1u) / 2u) + b / 2u];
    let h = w_h[row * nb + b];
    return BlockRaw(w_q[row * nb + b], vec4<u32>(), vec2<u32>(s, 0u), vec4<u32>(), vec2<u32>(h, 0u));
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let fifth = fifth_bits_i8(raw.h.x);
    let lo = sub_bias(low_nibbles(raw.q) | fifth[0], 16u);
    let hi = sub_bias(high_nibbles(raw.q) | fifth[1], 16u);
    return BlockI8(lo, hi, vec2<f32>(pair_scale(raw.s.x, b)), 0.0);
}
#endif

#if WEIGHTS == q4_k
const W_SUBS = 1u;
const W_HAS_MIN = 1u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // one per block of 32
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block

#include "lib/k4_scales.wgsl"

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    return BlockRaw(w_q[row * nb + b], vec4<u32>(), vec2<u32>(), w_s[(row * nb + b) / 8u], vec2<u32>());
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let q = k_nibbles(raw.q);
    let dm = unpack2x16float(raw.sb.x) * k4_scale_min(raw.sb, b % 8u);  // (d * scale, dmin * min)
    return BlockI8(q[0], q[1], vec2<f32>(dm.x), -dm.y);
}
#endif

#if WEIGHTS == q5_k
const W_SUBS = 1u;
const W_HAS_MIN = 1u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // one per block of 32
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block
@group(0) @binding(5) var<storage, read> w_h: array<u32>;        // one per block of 32

#include "lib/k4_scales.wgsl"

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let at = row * nb + b;
    return BlockRaw(w_q[at], vec4<u32>(), vec2<u32>(), w_s[at / 8u], vec2<u32>(w_h[at], 0u));
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let q = k_nibbles(raw.q);
    let fifth = fifth_bits_i8(raw.h.x);
    let dm = unpack2x16float(raw.sb.x) * k4_scale_min(raw.sb, b % 8u);
    return BlockI8(q[0] | fifth[0], q[1] | fifth[1], vec2<f32>(dm.x), -dm.y);
}
#endif

#if WEIGHTS == q6_k
const W_SUBS = 2u;
const W_HAS_MIN = 0u;
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // low 4 bits, one per block of 32
@group(0) @binding(4) var<storage, read> w_s: array<u32>;        // 5 per super-block
@group(0) @binding(5) var<storage, read> w_h: array<vec2<u32>>;  // high 2 bits, one per block of 32

fn fetch_block(row: u32, b: u32, nb: u32) -> BlockRaw {
    let at = row * nb + b;
    let sb = (at / 8u) * 5u;
    let s = vec2<u32>(w_s[sb], w_s[sb + 1u + (b % 8u) / 2u]);  // d, and the word of this block's 2 scales
    return BlockRaw(w_q[at], vec4<u32>(), s, vec4<u32>(), w_h[at]);
}

fn unpack_block(raw: BlockRaw, b: u32) -> BlockI8 {
    let q = k_nibbles(raw.q);
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    let high_lo = spread_pairs(vec4<u32>(raw.h.x) >> shifts) << vec4<u32>(4u);  // elements 0..15
    let high_hi = spread_pairs(vec4<u32>(raw.h.y) >> shifts) << vec4<u32>(4u);  // elements 16..31
    // The two int8 scales (16 elements each) are bytes 2 (b % 2) and 2 (b % 2) + 1 of the scale word.
    let pair = raw.s.y >> (16u * (b % 2u));
    let scales = bitcast<vec2<i32>>(vec2<u32>(pair << 24u, pair << 16u)) >> vec2<u32>(24u);
    let d = unpack2x16float(raw.s.x).x * vec2<f32>(scales);
    return BlockI8(sub_bias(q[0] | high_lo, 32u), sub_bias(q[1] | high_hi, 32u), d, 0.0);
}
#endif
