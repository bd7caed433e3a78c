// repack: weight rows in GGUF block layout (raw file bytes) → the GPU layout of lib/weights.wgsl.
//
// GGUF blocks are 18-34 bytes, so their fields are only 2-byte aligned: this kernel reads them with
// 16-bit extracts from u32 words once, at load time, so that every GEMV/GEMM read is an aligned
// u32/vector load. One invocation per block. Block formats only (F32/F16 are uploaded as they are).
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  src     storage, read       array<u32>  raw bytes of n_blocks blocks (whole rows), zero-padded to 4
//   3  w_q     storage, read_write array<u32>  quants of the weight part
//   4  w_s     storage, read_write array<u32>  scales of the weight part
//   5  w_h     storage, read_write array<u32>  high bits of the weight part (Q5_0, Q5_1)
//
// Specialization: WEIGHTS (q8_0 q4_0 q4_1 q5_0 q5_1).
// Grid: ceil(n_blocks / 64) workgroups (2-D past 65535).

struct Params {
    blocks_per_row: u32,  // n_in / 32
    n_blocks: u32,        // blocks in src (uploaded rows * blocks_per_row)
    row_begin: u32,       // row of the weight part that the first uploaded row becomes
}

#if WEIGHTS == q8_0
const BLOCK_BYTES = 34u;  // f16 d, 32 x int8
const QS_AT = 2u;         // byte offset of the quants in a block
const QS_WORDS = 8u;      // u32 words of quants per block
const PAIRED_SCALES = true;
#endif
#if WEIGHTS == q4_0
const BLOCK_BYTES = 18u;  // f16 d, 16 bytes of nibbles
const QS_AT = 2u;
const QS_WORDS = 4u;
const PAIRED_SCALES = true;
#endif
#if WEIGHTS == q4_1
const BLOCK_BYTES = 20u;  // f16 d, f16 m, 16 bytes of nibbles
const QS_AT = 4u;
const QS_WORDS = 4u;
const PAIRED_SCALES = false;
#endif
#if WEIGHTS == q5_0
const BLOCK_BYTES = 22u;  // f16 d, u32 qh, 16 bytes of nibbles
const QH_AT = 2u;
const QS_AT = 6u;
const QS_WORDS = 4u;
const PAIRED_SCALES = true;
#endif
#if WEIGHTS == q5_1
const BLOCK_BYTES = 24u;  // f16 d, f16 m, u32 qh, 16 bytes of nibbles
const QH_AT = 4u;
const QS_AT = 8u;
const QS_WORDS = 4u;
const PAIRED_SCALES = false;
#endif

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> w_q: array<u32>;
@group(0) @binding(4) var<storage, read_write> w_s: array<u32>;
#if WEIGHTS == q5_0
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;
#endif
#if WEIGHTS == q5_1
@group(0) @binding(5) var<storage, read_write> w_h: array<u32>;
#endif

#include "lib/invocation.wgsl"

// The 16 bits at an even byte offset of src.
fn src_u16(at: u32) -> u32 {
    return (src[at / 4u] >> ((at % 4u) * 8u)) & 0xFFFFu;
}

// The 32 bits at an even byte offset of src.
fn src_u32(at: u32) -> u32 {
    return src_u16(at) | (src_u16(at + 2u) << 16u);
}

@compute @workgroup_size(64)
fn main(inv: Invocation) {
    let block = group_index(inv) * 64u + inv.index;  // block in src
    if (block >= params.n_blocks) {
        return;
    }
    let nb = params.blocks_per_row;
    let row = params.row_begin + block / nb;
    let b = block % nb;  // block within its row
    let at = block * BLOCK_BYTES;
    for (var w = 0u; w < QS_WORDS; w++) {
        w_q[(row * nb + b) * QS_WORDS + w] = src_u32(at + QS_AT + 4u * w);
    }
    if (PAIRED_SCALES) {
        if (b % 2u == 0u) {  // the even block of a pair writes both scales
            var next_d = 0u;
            if (b + 1u < nb) {
                next_d = src_u16(at + BLOCK_BYTES);
            }
            w_s[row * ((nb + 1u) / 2u) + b / 2u] = src_u16(at) | (next_d << 16u);
        }
    } else {
        w_s[row * nb + b] = src_u32(at);  // f16 d | f16 m << 16, as in the block
    }
#if WEIGHTS == q5_0
    w_h[row * nb + b] = src_u32(at + QH_AT);
#endif
#if WEIGHTS == q5_1
    w_h[row * nb + b] = src_u32(at + QH_AT);
#endif
}
