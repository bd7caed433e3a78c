// rope_kv: RoPE on the q and k rows of a fused QKV projection; q to its own buffer, k and v into the
// layer's KV cache at their positions (read from the GPU state buffer).
//
// The tokens of this step are at positions pos..pos+n_tokens-1 (state words 0 and 1, see
// docs/ENGINE_STATE.md), so one plan serves every decode step and every prefill chunk length up to
// the grid's tokens. Per head row, in order: + bias (BIAS), RMSNorm of q and k rows (QK_NORM), RoPE of
// the first rope_dims elements of q and k rows, store.
//
// Bindings (group 0):
//   0  params        uniform             Params
//   1  state         storage, read       array<u32>   the engine state (pos, n_tokens)
//   2  qkv           storage, read       array<f32>   [T][n_head + 2 n_head_kv][HEAD_DIM] q, k, v rows
//   3  q             storage, read_write array<f32>   [T][n_head][HEAD_DIM]   roped queries
//   4  k_cache       storage, read_write array<kv_t>  [n_head_kv][n_ctx][HEAD_DIM]  roped keys
//   5  v_cache       storage, read_write array<kv_t>  [n_head_kv][n_ctx][HEAD_DIM]  values
//   6  q_norm        storage, read       array<f32>   [HEAD_DIM]   q RMSNorm weight (QK_NORM only)
//   7  k_norm        storage, read       array<f32>   [HEAD_DIM]   k RMSNorm weight (QK_NORM only)
//   8  bias          storage, read       array<f32>   [(n_head + 2 n_head_kv) HEAD_DIM]  q|k|v bias (BIAS only)
//   9  freq_factors  storage, read       array<f32>   [rope_dims / 2]  divide each pair's angle (FREQ_FACTORS only)
// At most 8 storage bindings (the WebGPU default) unless QK_NORM, BIAS and FREQ_FACTORS are all on,
// which no supported architecture needs.
//
// Specialization:
//   HEAD_DIM       elements per head
//   NEOX           rotate pairs (i, i + rope_dims / 2) (NeoX layout: qwen2/3, gemma3); else the
//                  adjacent pairs (2i, 2i + 1) (llama.cpp's "normal" rope: llama)
//   QK_NORM        RMSNorm each q and k head row (qwen3, gemma3) before RoPE
//   NORM_PLUS_ONE  the norm multiplies by (1 + w) (Gemma's convention for raw checkpoint weights;
//                  GGUF files of gemma3 already store 1 + w, so they leave this off)
//   BIAS           add the projection bias (qwen2) first
//   FREQ_FACTORS   rope_freqs.weight (Llama 3.1 long-context factors)
//   F16            the caches hold f16 (needs shader-f16), else f32
//
// The angle of pair i at position p is computed like llama.cpp's CPU rope (ggml_rope_cache_init), for
// token-level parity: theta = f32(p), multiplied in f32 by theta_scale = powf(base, -2 / rope_dims)
// once per pair index (not pow(theta_scale, i): the rounding differs), divided by the pair's freq
// factor, times freq_scale. That chain of products is inherently sequential, so one invocation runs it
// once per workgroup into a table. Each angle is then reduced to [-pi, pi], where WGSL promises sin /
// cos accuracy (outside it the spec promises nothing, and GPUs differ).
//
// Grid: T * (n_head + 2 n_head_kv) workgroups (2-D past 65535); workgroup g takes head row
// g % (n_head + 2 n_head_kv) of token g / (n_head + 2 n_head_kv). Tokens >= state n_tokens do nothing,
// and nothing is written to the caches at positions >= n_ctx.

struct Params {
    n_head: u32,       // query heads
    n_head_kv: u32,    // key / value heads
    rope_dims: u32,    // leading elements of each q / k head that rotate (even, <= HEAD_DIM)
    n_ctx: u32,        // positions per head in k_cache / v_cache
    theta_scale: f32,  // powf(rope_base, -2.0 / rope_dims) computed in f32 (radians per pair index step)
    freq_scale: f32,   // angle multiplier: 1 / linear rope-scaling factor (1.0 without scaling)
    eps: f32,          // RMSNorm epsilon of the q / k norm (QK_NORM only)
}

#if F16
alias kv_t = f16;
#else
alias kv_t = f32;
#endif

const WG = 64u;
// 2 pi in two parts for the angle reduction: TWO_PI_HI has 8 significant bits, so turns * TWO_PI_HI is
// exact for turns < 2^16 (angles < 4e5 radians), and only the small product turns * TWO_PI_LO rounds.
const TWO_PI_HI = 6.28125;
const TWO_PI_LO = 1.9353071795864769e-3;
const INV_TWO_PI = 0.15915494309189535;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> state: array<u32>;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<kv_t>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<kv_t>;
#if QK_NORM
@group(0) @binding(6) var<storage, read> q_norm: array<f32>;
@group(0) @binding(7) var<storage, read> k_norm: array<f32>;
#endif
#if BIAS
@group(0) @binding(8) var<storage, read> bias: array<f32>;
#endif
#if FREQ_FACTORS
@group(0) @binding(9) var<storage, read> freq_factors: array<f32>;
#endif

#include "lib/invocation.wgsl"
#include "lib/state.wgsl"

var<workgroup> row: array<f32, HEAD_DIM>;         // this head row after bias and norm
var<workgroup> thetas: array<f32, HEAD_DIM / 2u>;  // pos * theta_scale^i, llama.cpp's running product
#if QK_NORM
var<workgroup> sums: array<f32, WG>;               // the q / k norm's sum of squares
#endif

// The rotation angle of pair `pair`, reduced to [-pi, pi].
fn rope_angle(pair: u32) -> f32 {
    var theta = thetas[pair];
#if FREQ_FACTORS
    theta /= freq_factors[pair];
#endif
    theta *= params.freq_scale;
    let turns = round(theta * INV_TWO_PI);
    return (theta - turns * TWO_PI_HI) - turns * TWO_PI_LO;
}

// Element d of the roped row: x[d] rotated with its pair partner.
fn rope_element(d: u32) -> f32 {
#if NEOX
    let half = params.rope_dims / 2u;
    let pair = d % half;
    let first = pair;
    let second = pair + half;
#else
    let pair = d / 2u;
    let first = 2u * pair;
    let second = first + 1u;
#endif
    let angle = rope_angle(pair);
    let c = cos(angle);
    let s = sin(angle);
    if (d == first) {
        return row[first] * c - row[second] * s;
    }
    return row[first] * s + row[second] * c;
}

@compute @workgroup_size(WG)
fn main(inv: Invocation, grid: Grid) {
    let li = inv.index;
    let n_rows = params.n_head + 2u * params.n_head_kv;
    let g = group_index(grid);
    let t = g / n_rows;
    let r = g % n_rows;  // head row: q heads, then k heads, then v heads
    if (t >= state[N_TOKENS]) {
        return;  // uniform: the state buffer is read-only here
    }
    let pos = state[POS] + t;
    let is_q = r < params.n_head;
    let is_v = r >= params.n_head + params.n_head_kv;
    if (li == 0u && !is_v) {
        var theta = f32(pos);
        let scale = params.theta_scale;
        for (var i = 0u; i < params.rope_dims / 2u; i++) {
            thetas[i] = theta;
            theta *= scale;
        }
    }

#if QK_NORM
    var sum_sq = 0.0;
#endif
    for (var d = li; d < HEAD_DIM; d += WG) {
        var x = qkv[(t * n_rows + r) * HEAD_DIM + d];
#if BIAS
        x += bias[r * HEAD_DIM + d];
#endif
        row[d] = x;
#if QK_NORM
        sum_sq += x * x;
#endif
    }
#if QK_NORM
    sums[li] = sum_sq;
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (li < stride) {
            sums[li] += sums[li + stride];
        }
    }
    workgroupBarrier();
    let inv_rms = inverseSqrt(sums[0] / f32(HEAD_DIM) + params.eps);
    if (!is_v) {
        for (var d = li; d < HEAD_DIM; d += WG) {
            var w = select(k_norm[d], q_norm[d], is_q);
#if NORM_PLUS_ONE
            w += 1.0;
#endif
            row[d] *= inv_rms * w;
        }
    }
#endif
    workgroupBarrier();

    for (var d = li; d < HEAD_DIM; d += WG) {
        var x = row[d];
        if (!is_v && d < params.rope_dims) {
            x = rope_element(d);
        }
        if (is_q) {
            q[(t * params.n_head + r) * HEAD_DIM + d] = x;
        } else if (pos < params.n_ctx) {
            let kv_head = (r - params.n_head) % params.n_head_kv;
            let at = (kv_head * params.n_ctx + pos) * HEAD_DIM + d;
            if (is_v) {
                v_cache[at] = kv_t(x);
            } else {
                k_cache[at] = kv_t(x);
            }
        }
    }
}
