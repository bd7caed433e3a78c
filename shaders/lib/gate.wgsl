// The gate activation of a gated feed-forward block (GATE_UP epilogues of gemv.wgsl and gemm.wgsl):
// SiLU (llama, qwen: SwiGLU), or with GELU the tanh approximation of GELU (gemma3: GeGLU).
//
// GELU(x) = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), is computed as the identical
// x / (1 + exp(-2 u)): no tanh, whose WGSL implementations may overflow to NaN for large |u|; here
// exp overflows to +inf and the result is the correct limit 0.

const SQRT_2_OVER_PI = 0.7978845608028654;
const GELU_COEF_A = 0.044715;

fn gate_activation(v: f32) -> f32 {
#if GELU
    let u = SQRT_2_OVER_PI * (v + GELU_COEF_A * v * v * v);
    return v / (1.0 + exp(-2.0 * u));
#else
    return v / (1.0 + exp(-v));
#endif
}
