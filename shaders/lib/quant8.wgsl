// Writing an activation block of 32 as 8-bit quants (quantize_q8.wgsl's format, read by gemv_q8.wgsl and
// gemm_q8.wgsl): lib/q8_block.wgsl computes it; this stores its scales, its quants in element order and,
// with K_ORDER, in K-quant order.
//
// Needs from the including kernel: xq (array<vec4<u32>>: a block's 8 words in two), xs (array<vec4<f32>>)
// and, with K_ORDER, xk (array<vec4<u32>>), read_write storage; the bool define K_ORDER.

#include "lib/q8_block.wgsl"

// Block b = (v0 .. v7: its 32 values in order); sum_sq goes to its scales as it is.
fn store_block_q8(b: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>,
        v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>, sum_sq: f32) {
    let block = q8_block(v0, v1, v2, v3, v4, v5, v6, v7, sum_sq);
    xs[b] = block.scales;
    xq[2u * b] = block.q_lo;
    xq[2u * b + 1u] = block.q_hi;
#if K_ORDER
    xk[2u * b] = block.k_lo;
    xk[2u * b + 1u] = block.k_hi;
#endif
}
