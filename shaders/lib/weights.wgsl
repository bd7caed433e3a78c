// Reading weight matrices in their GPU layout, 8 weights at a time.
//
// A weight matrix is n_out rows of n_in weights (a GGUF tensor of shape (n_in, n_out)). Block formats
// are repacked on the GPU at load time (repack.wgsl) from GGUF's packed blocks (18-34 bytes, not
// 4-byte aligned) into separate arrays, row after row, so every read here is an aligned, coalesced
// u32 (or vector) load:
//   binding 3  w_q  quants: 16 bytes per 32-element block (Q4/Q5 low nibbles), 32 (Q8_0);
//                   the raw values for F16 (2 bytes each) and F32 (4 bytes each)
//   binding 4  w_s  scales (block formats): one u32 per block = f16 d | f16 m << 16 (Q4_1, Q5_1);
//                   one u32 per two blocks of a row = f16 d of block 2k | f16 d of block 2k+1 << 16
//                   (Q4_0, Q5_0, Q8_0; a row with an odd block count ends with a half-used word)
//   binding 5  w_h  high bits (Q5_0, Q5_1): one u32 qh per block, bit j = 5th bit of element j
//
// K-quants (Q2_K..Q6_K) have super-blocks of 256 elements (rows are whole super-blocks), which the
// layout splits into 8 chunks of 32 elements. Their quants are stored in element order, and each
// super-block's scales stay packed as in GGUF (decoded per step of 8 weights: a few shifts):
//   w_q  Q4_K, Q5_K, Q6_K low 4 bits: one u32 per 8 elements, element 8w+i in nibble i of word w;
//        Q2_K, Q3_K low 2 bits: one u32 per 16 elements, element 16w+i at bits 2i..2i+1 of word w
//   w_s  per super-block: Q4_K, Q5_K a vec4<u32> = (f16 d | f16 dmin << 16, GGUF's 12 bytes of packed
//        6-bit scales and mins); Q3_K a vec4<u32> = (f16 d, GGUF's 12 bytes of packed 6-bit scales);
//        Q2_K 5 u32 = (f16 d | f16 dmin << 16, GGUF's 16 scale bytes: scale | min << 4 per 16 elements);
//        Q6_K 5 u32 = (f16 d, GGUF's 16 int8 scales, one per 16 elements)
//   w_h  Q5_K 5th bits, Q3_K hmask bits: one u32 per 32 elements, bit i = element i;
//        Q6_K high 2 bits: one u32 per 16 elements, element 16w+i at bits 2i..2i+1 of word w
// IQ4_NL is laid out as Q4_0 (its nibbles index a 16-value code book). IQ4_XS (super-blocks of 256):
//   w_q  GGUF's qs as they are (16 bytes per 32 elements, Q4_0's nibble order);
//   w_s  a vec2<u32> per super-block = (f16 d | scales_h << 16, scales_l), GGUF's first 8 bytes.
// Byte counts per row: see `weight_row_bytes` in kernels.py.
//
// A row is read in steps of 8 weights (step s of a row, s < n_in / 8). load_w8 returns them as two
// vec4s plus the vec4 indices (in the row) of the 4 input elements each one multiplies: steps are
// contiguous in memory, so consecutive invocations reading consecutive steps read consecutive words.
// For Q4/Q5/IQ4 a quant word holds elements 4w..4w+3 (low nibbles) and 16+4w..16+4w+3 (high nibbles)
// of its block (w = s % 4), which is GGUF's own nibble order; for the other formats the 8 elements of
// step s are consecutive (8s..8s+7). Every step lies inside one 32-element block (the GEMM's tiles).
//
// Needs from the including kernel: a string define WEIGHTS (f32 f16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl
// q2_k q3_k q4_k q5_k q6_k iq4_xs).

struct W8 {
    lo: vec4<f32>,  // weights of row elements 4*lo_at .. 4*lo_at+3
    hi: vec4<f32>,  // weights of row elements 4*hi_at .. 4*hi_at+3
    lo_at: u32,     // vec4 index in the row
    hi_at: u32,     // vec4 index in the row
}

// Fields are taken out of a word with masks and exact power-of-two scales, not with a shift per
// field: a CPU adapter (SwiftShader) runs vector shifts slowly, and the masked value (a few significant
// bits, below bit 31) converts to f32 exactly, so the results are the same bits. The one shift per word
// below (q >> 4u etc.) brings the upper fields down.

// The nibbles at bits 0, 8, 16 and 24 of q (the low nibble of each byte), as floats.
fn byte_nibbles(q: u32) -> vec4<f32> {
    let masked = vec4<i32>(vec4<u32>(q) & vec4<u32>(0xFu, 0xF00u, 0xF0000u, 0xF000000u));
    return vec4<f32>(masked) * vec4<f32>(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
}

// The nibbles at bits 0, 4, 8 and 12 of q, as floats.
fn nibbles4(q: u32) -> vec4<f32> {
    let masked = vec4<i32>(vec4<u32>(q) & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u));
    return vec4<f32>(masked) * vec4<f32>(1.0, 1.0 / 16.0, 1.0 / 256.0, 1.0 / 4096.0);
}

// Bits 0..3 of v, each as 1.0 or 0.0.
fn bits4(v: u32) -> vec4<f32> {
    let masked = vec4<i32>(vec4<u32>(v) & vec4<u32>(1u, 2u, 4u, 8u));
    return vec4<f32>(masked) * vec4<f32>(1.0, 0.5, 0.25, 0.125);
}

// Bits `first`..`first+3` of qh, each as 16.0 or 0.0 (the 5th bit of a Q5 element).
fn fifth_bits(qh: u32, first: u32) -> vec4<f32> {
    return 16.0 * bits4(qh >> first);
}

// In GGUF's Q4/Q5 order a word holds the low nibbles (elements 4w..4w+3 of the block) at bits 0, 8,
// 16, 24 and the high nibbles (elements 16+4w..) at 4, 12, 20, 28 (iq4_values takes these shifts).
const LOW_NIBBLES = vec4<u32>(0u, 8u, 16u, 24u);
const HIGH_NIBBLES = vec4<u32>(4u, 12u, 20u, 28u);

#if WEIGHTS == f32
@group(0) @binding(3) var<storage, read> w_q: array<vec4<f32>>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let at = row * (n_in / 4u) + 2u * s;
    return W8(w_q[at], w_q[at + 1u], 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == f16
@group(0) @binding(3) var<storage, read> w_q: array<vec4<u32>>;  // 8 f16 per vec4

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let q = w_q[row * (n_in / 8u) + s];
    let lo = vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    let hi = vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q8_0
@group(0) @binding(3) var<storage, read> w_q: array<vec2<u32>>;  // 8 int8 per vec2
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

// The 4 int8 of q (byte 0 first), as floats. MASKED_BYTES (set by Kernels.get on CPU adapters): the
// bytes as masked (the top one is already signed as an i32), scaled down exactly, then 256 off the
// unsigned ones past 127 (SwiftShader: the Gemma head ~385 -> ~260 ms). Else sign-extending shifts,
// which a GPU runs faster (H100: the same head 0.117 -> 0.102 ms). The same values either way.
fn bytes_i8(q: u32) -> vec4<f32> {
#if MASKED_BYTES
    let masked = vec4<i32>(vec4<u32>(q) & vec4<u32>(0xFFu, 0xFF00u, 0xFF0000u, 0xFF000000u));
    let v = vec4<f32>(masked) * vec4<f32>(1.0, 1.0 / 256.0, 1.0 / 65536.0, 1.0 / 16777216.0);
    return v - select(vec4<f32>(0.0), vec4<f32>(256.0), v >= vec4<f32>(128.0));
#else
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
#endif
}

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let q = w_q[row * nb * 4u + s];
    let d = unpack2x16float(w_s[row * ((nb + 1u) / 2u) + b / 2u])[b % 2u];
    return W8(d * bytes_i8(q.x), d * bytes_i8(q.y), 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q4_0
@group(0) @binding(3) var<storage, read> w_q: array<u32>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let q = w_q[row * nb * 4u + s];
    let d = unpack2x16float(w_s[row * ((nb + 1u) / 2u) + b / 2u])[b % 2u];
    let at = 8u * b + s % 4u;
    return W8(d * (byte_nibbles(q) - 8.0), d * (byte_nibbles(q >> 4u) - 8.0), at, at + 4u);
}
#endif

#if WEIGHTS == q4_1
@group(0) @binding(3) var<storage, read> w_q: array<u32>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let q = w_q[row * nb * 4u + s];
    let dm = unpack2x16float(w_s[row * nb + b]);
    let at = 8u * b + s % 4u;
    return W8(dm.x * byte_nibbles(q) + dm.y, dm.x * byte_nibbles(q >> 4u) + dm.y, at, at + 4u);
}
#endif

#if WEIGHTS == q5_0
@group(0) @binding(3) var<storage, read> w_q: array<u32>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;
@group(0) @binding(5) var<storage, read> w_h: array<u32>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let w = s % 4u;
    let q = w_q[row * nb * 4u + s];
    let qh = w_h[row * nb + b];
    let d = unpack2x16float(w_s[row * ((nb + 1u) / 2u) + b / 2u])[b % 2u];
    let lo = byte_nibbles(q) + fifth_bits(qh, 4u * w);
    let hi = byte_nibbles(q >> 4u) + fifth_bits(qh, 16u + 4u * w);
    return W8(d * (lo - 16.0), d * (hi - 16.0), 8u * b + w, 8u * b + 4u + w);
}
#endif

#if WEIGHTS == q5_1
@group(0) @binding(3) var<storage, read> w_q: array<u32>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;
@group(0) @binding(5) var<storage, read> w_h: array<u32>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let w = s % 4u;
    let q = w_q[row * nb * 4u + s];
    let qh = w_h[row * nb + b];
    let dm = unpack2x16float(w_s[row * nb + b]);
    let lo = byte_nibbles(q) + fifth_bits(qh, 4u * w);
    let hi = byte_nibbles(q >> 4u) + fifth_bits(qh, 16u + 4u * w);
    return W8(dm.x * lo + dm.y, dm.x * hi + dm.y, 8u * b + w, 8u * b + 4u + w);
}
#endif

// ---- K-quants: step s of a row is 8 consecutive elements; g = the step's index in the weight part
// (row * n_in / 8 + s), so word g of 8 elements, g / 2 of 16, g / 4 of 32, and super-block g / 32.

// The 2-bit fields at bits 0, 2, 4 and 6 of v, as floats. Elements 0..3 of a word of 8 fields;
// elements 4..7 are pairs4(v >> 8u). Likewise nibbles4(q) and nibbles4(q >> 16u) for 8 nibbles.
fn pairs4(v: u32) -> vec4<f32> {
    let masked = vec4<i32>(vec4<u32>(v) & vec4<u32>(0x3u, 0xCu, 0x30u, 0xC0u));
    return vec4<f32>(masked) * vec4<f32>(1.0, 0.25, 1.0 / 16.0, 1.0 / 64.0);
}

#include "lib/k4_scales.wgsl"

// Q3_K: scale k (16 elements) from the super-block's 12 packed bytes b[0..11] = sb.yzw, minus 32:
// low 4 bits in nibble k / 8 of b[k % 8], high 2 bits at bit 2 (k / 4) of b[8 + k % 4].
fn k3_scale(sb: vec4<u32>, k: u32) -> f32 {
    let shift = 8u * (k % 4u);
    let low = (select(sb.z, sb.y, k % 8u < 4u) >> (shift + 4u * (k / 8u))) & 15u;
    let high = (sb.w >> (shift + 2u * (k / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

#if WEIGHTS == q2_k
@group(0) @binding(3) var<storage, read> w_q: array<u32>;  // 2-bit quants, 16 per u32
@group(0) @binding(4) var<storage, read> w_s: array<u32>;  // 5 per super-block

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g / 2u] >> (16u * (g % 2u));  // the step's 8 fields in the low 16 bits
    let at = (g / 32u) * 5u;
    let k = (g / 2u) % 16u;  // sub-block of 16 elements
    let scale_min = w_s[at + 1u + k / 4u] >> (8u * (k % 4u));
    let dm = unpack2x16float(w_s[at]) * vec2<f32>(f32(scale_min & 15u), f32((scale_min >> 4u) & 15u));
    let lo = dm.x * pairs4(q) - dm.y;
    let hi = dm.x * pairs4(q >> 8u) - dm.y;
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q3_k
@group(0) @binding(3) var<storage, read> w_q: array<u32>;        // low 2 bits, 16 per u32
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block
@group(0) @binding(5) var<storage, read> w_h: array<u32>;        // hmask bits, 32 per u32

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g / 2u] >> (16u * (g % 2u));
    let h = w_h[g / 4u] >> (8u * (g % 4u));  // the step's 8 hmask bits in the low 8 bits
    let sb = w_s[g / 32u];
    let d = unpack2x16float(sb.x).x * k3_scale(sb, (g / 2u) % 16u);
    // A clear hmask bit subtracts 4: quants -4..3.
    let lo = d * (pairs4(q) + 4.0 * bits4(h) - 4.0);
    let hi = d * (pairs4(q >> 8u) + 4.0 * bits4(h >> 4u) - 4.0);
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q4_k
@group(0) @binding(3) var<storage, read> w_q: array<u32>;        // nibbles, 8 per u32
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g];
    let sb = w_s[g / 32u];
    let dm = unpack2x16float(sb.x) * k4_scale_min(sb, (g / 4u) % 8u);  // (d * scale, dmin * min)
    let lo = dm.x * nibbles4(q) - dm.y;
    let hi = dm.x * nibbles4(q >> 16u) - dm.y;
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q5_k
@group(0) @binding(3) var<storage, read> w_q: array<u32>;        // low 4 bits, 8 per u32
@group(0) @binding(4) var<storage, read> w_s: array<vec4<u32>>;  // one per super-block
@group(0) @binding(5) var<storage, read> w_h: array<u32>;        // 5th bits, 32 per u32

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g];
    let h = w_h[g / 4u] >> (8u * (g % 4u));  // the step's 8 fifth bits in the low 8 bits
    let sb = w_s[g / 32u];
    let dm = unpack2x16float(sb.x) * k4_scale_min(sb, (g / 4u) % 8u);
    let lo = dm.x * (nibbles4(q) + fifth_bits(h, 0u)) - dm.y;
    let hi = dm.x * (nibbles4(q >> 16u) + fifth_bits(h, 4u)) - dm.y;
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

#if WEIGHTS == q6_k
@group(0) @binding(3) var<storage, read> w_q: array<u32>;  // low 4 bits, 8 per u32
@group(0) @binding(4) var<storage, read> w_s: array<u32>;  // 5 per super-block
@group(0) @binding(5) var<storage, read> w_h: array<u32>;  // high 2 bits, 16 per u32

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g];
    let h = w_h[g / 2u] >> (16u * (g % 2u));  // the step's 8 high pairs in the low 16 bits
    let at = (g / 32u) * 5u;
    let k = (g / 2u) % 16u;  // sub-block of 16 elements
    let scale = bitcast<i32>(w_s[at + 1u + k / 4u] << (24u - 8u * (k % 4u))) >> 24u;  // int8
    let d = unpack2x16float(w_s[at]).x * f32(scale);
    let lo = d * (nibbles4(q) + 16.0 * pairs4(h) - 32.0);
    let hi = d * (nibbles4(q >> 16u) + 16.0 * pairs4(h >> 8u) - 32.0);
    return W8(lo, hi, 2u * s, 2u * s + 1u);
}
#endif

// ---- IQ4_NL, IQ4_XS: 4-bit indices into a non-linear code book, nibbles in Q4_0's order.

// ggml's kvalues_iq4nl (-127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113), 4 int8 per word.
const IQ4_CODE_BOOK = vec4<u32>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);

// The code book values of the 4 nibbles at bit offsets `shifts` of q. The word of each value is picked
// with selects (a dynamically indexed table would sit in slow local memory on some GPUs).
fn iq4_values(q: u32, shifts: vec4<u32>) -> vec4<f32> {
    let n = (vec4<u32>(q) >> shifts) & vec4<u32>(15u);
    let upper = (n & vec4<u32>(4u)) != vec4<u32>(0u);  // word 1 or 3 of the book
    let low_words = select(vec4<u32>(IQ4_CODE_BOOK.x), vec4<u32>(IQ4_CODE_BOOK.y), upper);
    let high_words = select(vec4<u32>(IQ4_CODE_BOOK.z), vec4<u32>(IQ4_CODE_BOOK.w), upper);
    let words = select(low_words, high_words, n >= vec4<u32>(8u));
    return vec4<f32>(bitcast<vec4<i32>>(words << (vec4<u32>(24u) - 8u * (n % 4u))) >> vec4<u32>(24u));
}

#if WEIGHTS == iq4_nl
@group(0) @binding(3) var<storage, read> w_q: array<u32>;
@group(0) @binding(4) var<storage, read> w_s: array<u32>;

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let nb = n_in / 32u;
    let b = s / 4u;
    let q = w_q[row * nb * 4u + s];
    let d = unpack2x16float(w_s[row * ((nb + 1u) / 2u) + b / 2u])[b % 2u];
    let at = 8u * b + s % 4u;
    return W8(d * iq4_values(q, LOW_NIBBLES), d * iq4_values(q, HIGH_NIBBLES), at, at + 4u);
}
#endif

#if WEIGHTS == iq4_xs
@group(0) @binding(3) var<storage, read> w_q: array<u32>;        // 16 bytes per 32 elements
@group(0) @binding(4) var<storage, read> w_s: array<vec2<u32>>;  // one per super-block

fn load_w8(row: u32, s: u32, n_in: u32) -> W8 {
    let g = row * (n_in / 8u) + s;
    let q = w_q[g];
    let sb = w_s[g / 32u];  // (f16 d | scales_h << 16, scales_l)
    let j = (g / 4u) % 8u;  // sub-block of 32 elements
    let scale = ((sb.y >> (4u * j)) & 15u) | (((sb.x >> (16u + 2u * j)) & 3u) << 4u);
    let d = unpack2x16float(sb.x).x * f32(i32(scale) - 32);
    let at = 8u * (s / 4u) + s % 4u;
    return W8(d * iq4_values(q, LOW_NIBBLES), d * iq4_values(q, HIGH_NIBBLES), at, at + 4u);
}
#endif
