// repack: weight rows in GGUF block layout (raw file bytes) → the GPU layout of lib/weights.wgsl.
//
// GGUF blocks are 18-34 bytes (super-blocks 84-210), so their fields are only 2-byte aligned: this
// kernel reads them with 16-bit extracts from u32 words once, at load time, so that every GEMV/GEMM
// read is an aligned u32/vector load. K-quants also keep their quants in bit planes (one element per
// byte), which it gathers into element order. One invocation per block (per super-block for K-quants
// and IQ4_XS). Block formats only (F32/F16 are uploaded as they are).
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  src     storage, read       array<u32>  raw bytes of n_blocks blocks (whole rows), zero-padded to 4
//   3  w_q     storage, read_write array<u32>  quants of the weight part
//   4  w_s     storage, read_write array<u32>  scales of the weight part
//   5  w_h     storage, read_write array<u32>  high bits of the weight part (Q5_0 Q5_1 Q3_K Q5_K Q6_K)
//
// Specialization: WEIGHTS (q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl iq4_xs q2_k q3_k q4_k q5_k q6_k).
// Grid: ceil(n_blocks / 64) workgroups (2-D past 65535).

struct Params {
    blocks_per_row: u32,  // n_in / elements per block (32; 256 for K-quants and IQ4_XS)
    n_blocks: u32,        // blocks in src (uploaded rows * blocks_per_row)
    row_begin: u32,       // row of the weight part that the first uploaded row becomes
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> w_q: array<u32>;
@group(0) @binding(4) var<storage, read_write> w_s: array<u32>;

#include "lib/invocation.wgsl"

// Each format defines BLOCK_BYTES and repack_block(row, b, at): block b of `row` (of the weight part)
// from the GGUF block at byte `at` of src.

#if WEIGHTS == q8_0
const BLOCK_BYTES = 34u;  // f16 d, 32 x int8

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 2u, 8u);
    write_paired_scale(row, b, at);
}
#endif

#if WEIGHTS == q4_0
const BLOCK_BYTES = 18u;  // f16 d, 16 bytes of nibbles

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 2u, 4u);
    write_paired_scale(row, b, at);
}
#endif

#if WEIGHTS == q4_1
const BLOCK_BYTES = 20u;  // f16 d, f16 m, 16 bytes of nibbles

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 4u, 4u);
    w_s[row * params.blocks_per_row + b] = src_u32(at);  // f16 d | f16 m << 16, as in the block
}
#endif

#if WEIGHTS == q5_0
const BLOCK_BYTES = 22u;  // f16 d, u32 qh, 16 bytes of nibbles
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 6u, 4u);
    write_paired_scale(row, b, at);
    w_h[row * params.blocks_per_row + b] = src_u32(at + 2u);
}
#endif

#if WEIGHTS == q5_1
const BLOCK_BYTES = 24u;  // f16 d, f16 m, u32 qh, 16 bytes of nibbles
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 8u, 4u);
    w_s[row * params.blocks_per_row + b] = src_u32(at);
    w_h[row * params.blocks_per_row + b] = src_u32(at + 4u);
}
#endif

#if WEIGHTS == iq4_nl
const BLOCK_BYTES = 18u;  // f16 d, 16 bytes of code book indices (as Q4_0)

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 2u, 4u);
    write_paired_scale(row, b, at);
}
#endif

#if WEIGHTS == iq4_xs
const BLOCK_BYTES = 136u;  // f16 d, u16 scales_h, scales_l[4], qs[128] (16 bytes per 32 elements)

fn repack_block(row: u32, b: u32, at: u32) {
    copy_quants(row, b, at + 8u, 32u);
    w_s[(row * params.blocks_per_row + b) * 2u] = src_u32(at);
    w_s[(row * params.blocks_per_row + b) * 2u + 1u] = src_u32(at + 4u);
}
#endif

// K-quant super-blocks (see lib/weights.wgsl): sb = row * blocks_per_row + b is the super-block's
// index in the part; chunk j (0..7) is its elements 32j..32j+31.

#if WEIGHTS == q2_k
const BLOCK_BYTES = 84u;  // scales[16] (scale | min << 4), qs[64] (2-bit planes), f16 d, f16 dmin

fn repack_block(row: u32, b: u32, at: u32) {
    let sb = row * params.blocks_per_row + b;
    // Element 128h + 32s + l (chunk j = 4h + s) is bits 2s of qs[32h + l].
    for (var j = 0u; j < 8u; j++) {
        for (var half = 0u; half < 2u; half++) {
            let qs_at = at + 16u + 32u * (j / 4u) + 16u * half;
            w_q[sb * 16u + 2u * j + half] = plane_pairs(qs_at, 2u * (j % 4u));
        }
    }
    w_s[sb * 5u] = src_u32(at + 80u);
    for (var i = 0u; i < 4u; i++) {
        w_s[sb * 5u + 1u + i] = src_u32(at + 4u * i);
    }
}
#endif

#if WEIGHTS == q3_k
const BLOCK_BYTES = 110u;  // hmask[32], qs[64] (low 2 bits, as Q2_K), scales[12], f16 d
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;

fn repack_block(row: u32, b: u32, at: u32) {
    let sb = row * params.blocks_per_row + b;
    for (var j = 0u; j < 8u; j++) {
        for (var half = 0u; half < 2u; half++) {
            let qs_at = at + 32u + 32u * (j / 4u) + 16u * half;
            w_q[sb * 16u + 2u * j + half] = plane_pairs(qs_at, 2u * (j % 4u));
        }
        w_h[sb * 8u + j] = bit_plane(at, j);  // the 3rd bit of element 32j + l: bit j of hmask[l]
    }
    w_s[sb * 4u] = src_u16(at + 108u);
    for (var i = 0u; i < 3u; i++) {
        w_s[sb * 4u + 1u + i] = src_u32(at + 96u + 4u * i);
    }
}
#endif

#if WEIGHTS == q4_k
const BLOCK_BYTES = 144u;  // f16 d, f16 dmin, scales[12], qs[128]

fn repack_block(row: u32, b: u32, at: u32) {
    let sb = row * params.blocks_per_row + b;
    write_k4_nibbles(sb, at + 16u);
    for (var i = 0u; i < 4u; i++) {
        w_s[sb * 4u + i] = src_u32(at + 4u * i);  // d | dmin << 16, then the scales as they are
    }
}
#endif

#if WEIGHTS == q5_k
const BLOCK_BYTES = 176u;  // f16 d, f16 dmin, scales[12], qh[32], qs[128]
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;

fn repack_block(row: u32, b: u32, at: u32) {
    let sb = row * params.blocks_per_row + b;
    write_k4_nibbles(sb, at + 48u);
    for (var j = 0u; j < 8u; j++) {
        w_h[sb * 8u + j] = bit_plane(at + 16u, j);
    }
    for (var i = 0u; i < 4u; i++) {
        w_s[sb * 4u + i] = src_u32(at + 4u * i);
    }
}
#endif

#if WEIGHTS == q6_k
const BLOCK_BYTES = 210u;  // ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;

fn repack_block(row: u32, b: u32, at: u32) {
    let sb = row * params.blocks_per_row + b;
    // Chunk j = 4h + k is half h, quarter k: low nibbles (k / 2) of ql[64h + 32(k % 2) + l],
    // high pairs at bit 2k of qh[32h + l] (l = 0..31).
    for (var j = 0u; j < 8u; j++) {
        let h = j / 4u;
        let k = j % 4u;
        for (var w = 0u; w < 4u; w++) {
            let ql_at = at + 64u * h + 32u * (k % 2u) + 8u * w;
            w_q[sb * 32u + 4u * j + w] = gather8(ql_at, 4u * (k / 2u), 4u);
        }
        for (var half = 0u; half < 2u; half++) {
            w_h[sb * 16u + 2u * j + half] = plane_pairs(at + 128u + 32u * h + 16u * half, 2u * k);
        }
    }
    w_s[sb * 5u] = src_u16(at + 208u);
    for (var i = 0u; i < 4u; i++) {
        w_s[sb * 5u + 1u + i] = src_u32(at + 192u + 4u * i);
    }
}
#endif

// The 16 bits at an even byte offset of src.
fn src_u16(at: u32) -> u32 {
    return (src[at / 4u] >> ((at % 4u) * 8u)) & 0xFFFFu;
}

// The 32 bits at an even byte offset of src.
fn src_u32(at: u32) -> u32 {
    return src_u16(at) | (src_u16(at + 2u) << 16u);
}

// Q4/Q5/Q8_0/IQ4: the quant words of a block, as they are.
fn copy_quants(row: u32, b: u32, qs_at: u32, words: u32) {
    for (var w = 0u; w < words; w++) {
        w_q[(row * params.blocks_per_row + b) * words + w] = src_u32(qs_at + 4u * w);
    }
}

// Q4_0/Q5_0/Q8_0/IQ4_NL: f16 d in pairs per row; the even block of a pair writes both.
fn write_paired_scale(row: u32, b: u32, at: u32) {
    let nb = params.blocks_per_row;
    if (b % 2u == 0u) {
        var next_d = 0u;
        if (b + 1u < nb) {
            next_d = src_u16(at + BLOCK_BYTES);
        }
        w_s[row * ((nb + 1u) / 2u) + b / 2u] = src_u16(at) | (next_d << 16u);
    }
}

// The byte at byte offset `at` of src.
fn src_u8(at: u32) -> u32 {
    return (src[at / 4u] >> ((at % 4u) * 8u)) & 0xFFu;
}

// The `width`-bit fields at bit `shift` of each of the 8 bytes at `at`, next to each other (the field of
// byte i at bits width * i): K-quants keep one element per byte in bit planes; this puts them in
// element order.
fn gather8(at: u32, shift: u32, width: u32) -> u32 {
    var out = 0u;
    for (var i = 0u; i < 8u; i++) {
        out |= ((src_u8(at + i) >> shift) & ((1u << width) - 1u)) << (width * i);
    }
    return out;
}

// Q4_K/Q5_K: sub-block 2c (2c+1) is the low (high) nibbles of qs[32c..32c+31]; 8 nibbles per word.
fn write_k4_nibbles(sb: u32, qs_at: u32) {
    for (var j = 0u; j < 8u; j++) {
        for (var w = 0u; w < 4u; w++) {
            w_q[sb * 32u + 4u * j + w] = gather8(qs_at + 32u * (j / 2u) + 8u * w, 4u * (j % 2u), 4u);
        }
    }
}

// Q2_K/Q3_K quants, Q6_K high bits: the 2-bit fields at bit `shift` of the 16 bytes at `at`, one word.
fn plane_pairs(at: u32, shift: u32) -> u32 {
    return gather8(at, shift, 2u) | (gather8(at + 8u, shift, 2u) << 16u);
}

// Q3_K hmask, Q5_K qh: bit j of each of the 32 bytes at `at` (element l of chunk j is in byte l).
fn bit_plane(at: u32, j: u32) -> u32 {
    var out = 0u;
    for (var m = 0u; m < 4u; m++) {
        out |= gather8(at + 8u * m, j, 1u) << (8u * m);
    }
    return out;
}

@compute @workgroup_size(64)
fn main(inv: Invocation, grid: Grid) {
    let block = group_index(grid) * 64u + inv.index;  // block in src
    if (block >= params.n_blocks) {
        return;
    }
    let nb = params.blocks_per_row;
    repack_block(params.row_begin + block / nb, block % nb, block * BLOCK_BYTES);
}
