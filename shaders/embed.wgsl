// embed: out[t] = table[ids[id_offset + t]] * scale, the table read in its GPU layout.
//
// The token ids come from a GPU buffer (for decoding: the id the sampler just wrote), so the next
// step needs no CPU round trip. A table split into parts takes one dispatch per part: each writes
// only the tokens whose row it holds.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  ids     storage, read       array<u32>        token ids
//   2  out     storage, read_write array<vec4<f32>>  [n_tokens * n_embd / 4]  embeddings
//   3..5       the table part's arrays (lib/weights.wgsl): rows row_begin..row_end-1, n_embd each
//
// Specialization: WEIGHTS, ROW_THREADS (invocations per workgroup).
// Grid: n_tokens workgroups (2-D past 65535).

struct Params {
    n_embd: u32,     // elements per row (multiple of 32 for block formats, of 8 for f32/f16)
    row_begin: u32,  // first table row (token id) held by this part
    row_end: u32,    // one past the last
    id_offset: u32,  // index in ids of token 0
    n_tokens: u32,   // tokens (workgroups) of this dispatch
    scale: f32,      // multiplies every element (e.g. sqrt(n_embd) for Gemma; 1.0 otherwise)
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

#include "lib/weights.wgsl"
#include "lib/invocation.wgsl"

@compute @workgroup_size(ROW_THREADS)
fn main(inv: Invocation, grid: Grid) {
    let t = group_index(grid);
    if (t >= params.n_tokens) {
        return;
    }
    let id = ids[params.id_offset + t];
    if (id < params.row_begin || id >= params.row_end) {
        return;
    }
    let base = t * (params.n_embd / 4u);
    for (var s = inv.index; s < params.n_embd / 8u; s += ROW_THREADS) {
        let w = load_w8(id - params.row_begin, s, params.n_embd);
        out[base + w.lo_at] = w.lo * params.scale;
        out[base + w.hi_at] = w.hi * params.scale;
    }
}
