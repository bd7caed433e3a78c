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
// Byte counts per row: see `weight_array_sizes` in kernels.py.
//
// A row is read in steps of 8 weights (step s of a row, s < n_in / 8). load_w8 returns them as two
// vec4s plus the vec4 indices (in the row) of the 4 input elements each one multiplies: steps are
// contiguous in memory, so consecutive invocations reading consecutive steps read consecutive words.
// For Q4/Q5 a quant word holds elements 4w..4w+3 (low nibbles) and 16+4w..16+4w+3 (high nibbles) of
// its block (w = s % 4), which is GGUF's own nibble order.
//
// Needs from the including kernel: a string define WEIGHTS (f32 f16 q8_0 q4_0 q4_1 q5_0 q5_1).

struct W8 {
    lo: vec4<f32>,  // weights of row elements 4*lo_at .. 4*lo_at+3
    hi: vec4<f32>,  // weights of row elements 4*hi_at .. 4*hi_at+3
    lo_at: u32,     // vec4 index in the row
    hi_at: u32,     // vec4 index in the row
}

// The 4 nibbles at bit offsets `shifts` of q, as floats.
fn nibbles(q: u32, shifts: vec4<u32>) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> shifts) & vec4<u32>(15u));
}

// Bits `first`..`first+3` of qh, each as 16.0 or 0.0 (the 5th bit of a Q5 element).
fn fifth_bits(qh: u32, first: u32) -> vec4<f32> {
    return vec4<f32>(((vec4<u32>(qh) >> (vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u));
}

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

fn bytes_i8(q: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
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
    return W8(d * (nibbles(q, LOW_NIBBLES) - 8.0), d * (nibbles(q, HIGH_NIBBLES) - 8.0), at, at + 4u);
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
    return W8(dm.x * nibbles(q, LOW_NIBBLES) + dm.y, dm.x * nibbles(q, HIGH_NIBBLES) + dm.y, at, at + 4u);
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
    let lo = nibbles(q, LOW_NIBBLES) + fifth_bits(qh, 4u * w);
    let hi = nibbles(q, HIGH_NIBBLES) + fifth_bits(qh, 16u + 4u * w);
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
    let lo = nibbles(q, LOW_NIBBLES) + fifth_bits(qh, 4u * w);
    let hi = nibbles(q, HIGH_NIBBLES) + fifth_bits(qh, 16u + 4u * w);
    return W8(dm.x * lo + dm.y, dm.x * hi + dm.y, 8u * b + w, 8u * b + 4u + w);
}
#endif
