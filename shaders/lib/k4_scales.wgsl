// The packed 6-bit sub-block scales and mins of Q4_K and Q5_K super-blocks (lib/weights.wgsl and
// lib/weights_i8.wgsl both decode them).

// Q4_K/Q5_K: (scale, min) of sub-block j (32 elements) from the super-block's 12 packed bytes
// b[0..11] = sb.yzw (ggml's get_scale_min_k4). j < 4: the low 6 bits of b[j] and of b[j+4]. j >= 4: the
// low and the high nibble of b[j+4], each with 2 more bits on top: the top 2 bits of b[j-4] and of b[j].
fn k4_scale_min(sb: vec4<u32>, j: u32) -> vec2<f32> {
    let shift = 8u * (j % 4u);
    let b0 = vec2<u32>(sb.y >> shift, sb.z >> shift) & vec2<u32>(255u);  // b[j % 4], b[j % 4 + 4]
    let b8 = (sb.w >> shift) & 255u;                                      // b[j % 4 + 8]
    let low = b0 & vec2<u32>(63u);
    let high = vec2<u32>(b8 & 15u, b8 >> 4u) | ((b0 >> vec2<u32>(6u)) << vec2<u32>(4u));
    return vec2<f32>(select(high, low, j < 4u));
}
