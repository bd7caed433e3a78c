// One activation block of 32 as 8-bit quants, computed (not stored): d = max|v| / 127, q_i = v_i / d
// rounded half away from zero (C's roundf, as llama.cpp's q8_1; q = 0 when d = 0, |q| <= 127). What the
// block stores (lib/quant8.wgsl writes it for quantize_q8 and attn_merge_q8, gemv_q8.wgsl QUANT_OUT for
// the next linear): its scales (d, d * sum q, sum_sq, d * sum of q_0 .. q_15: Q6_K's sub-blocks of 16
// need the halves), its quants in element order, and in K-quant order (per 8 elements e0..e7 the words
// (e0 e2 e4 e6), (e1 e3 e5 e7); lib/weights_q8.wgsl says why).

struct Q8Block {
    scales: vec4<f32>,  // (d, d * sum q, sum_sq, d * sum of q_0 .. q_15)
    q_lo: vec4<u32>,    // words 0..3 of the quants in element order (4 int8 each, byte 0 first)
    q_hi: vec4<u32>,    // words 4..7
    k_lo: vec4<u32>,    // words 0..3 in K-quant order
    k_hi: vec4<u32>,    // words 4..7
}

// Quantizes 4 values by 1 / d, rounding half away from zero.
fn quant4(v: vec4<f32>, inv_d: f32) -> vec4<i32> {
    let scaled = v * inv_d;
    return clamp(vec4<i32>(sign(scaled) * floor(abs(scaled) + 0.5)), vec4<i32>(-127), vec4<i32>(127));
}

// The block of v0 .. v7 (its 32 values in order); sum_sq goes to its scales as it is.
fn q8_block(v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>, v4: vec4<f32>, v5: vec4<f32>,
        v6: vec4<f32>, v7: vec4<f32>, sum_sq: f32) -> Q8Block {
    let m = max(max(max(abs(v0), abs(v1)), max(abs(v2), abs(v3))), max(max(abs(v4), abs(v5)), max(abs(v6), abs(v7))));
    let d = max(max(m.x, m.y), max(m.z, m.w)) / 127.0;
    let inv_d = select(0.0, 1.0 / d, d > 0.0);
    let q0 = quant4(v0, inv_d);
    let q1 = quant4(v1, inv_d);
    let q2 = quant4(v2, inv_d);
    let q3 = quant4(v3, inv_d);
    let q4 = quant4(v4, inv_d);
    let q5 = quant4(v5, inv_d);
    let q6 = quant4(v6, inv_d);
    let q7 = quant4(v7, inv_d);
    let first = q0 + q1 + q2 + q3;
    let sums = first + q4 + q5 + q6 + q7;
    let sum_first = first.x + first.y + first.z + first.w;
    return Q8Block(
        vec4<f32>(d, d * f32(sums.x + sums.y + sums.z + sums.w), sum_sq, d * f32(sum_first)),
        vec4<u32>(pack4xI8(q0), pack4xI8(q1), pack4xI8(q2), pack4xI8(q3)),
        vec4<u32>(pack4xI8(q4), pack4xI8(q5), pack4xI8(q6), pack4xI8(q7)),
        vec4<u32>(
            pack4xI8(vec4<i32>(q0.xz, q1.xz)),
            pack4xI8(vec4<i32>(q0.yw, q1.yw)),
            pack4xI8(vec4<i32>(q2.xz, q3.xz)),
            pack4xI8(vec4<i32>(q2.yw, q3.yw))
        ),
        vec4<u32>(
            pack4xI8(vec4<i32>(q4.xz, q5.xz)),
            pack4xI8(vec4<i32>(q4.yw, q5.yw)),
            pack4xI8(vec4<i32>(q6.xz, q7.xz)),
            pack4xI8(vec4<i32>(q6.yw, q7.yw))
        )
    );
}
