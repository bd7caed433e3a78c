// How a decode step's attended span is cut into splits: attn_decode.wgsl writes one partial per
// (head, split), gemv.wgsl (COMBINE) merges them; both derive the same splits from the state.
//
// The token at position pos attends to positions first..pos (first = pos + 1 - window with a sliding
// window, else 0; nothing past n_ctx). The span is cut into `count` splits of `chunk` positions (the
// last one shorter): chunk is ceil(span / n_splits) rounded up to whole tiles of SPLIT_KEYS positions,
// so a split is at least one full tile of attn_decode and no split is empty (count <= n_splits).
//
// Needs from the including kernel: const HEAD_DIM.

const SPLIT_KEYS = 4096u / HEAD_DIM;  // positions per attn_decode tile (its 256 invocations, 4 vec4s each)

struct Splits {
    first: u32,  // first attended position
    end: u32,    // one past the last attended position
    chunk: u32,  // positions per split (a multiple of SPLIT_KEYS)
    count: u32,  // non-empty splits
}

fn attn_splits(pos: u32, n_ctx: u32, window: u32, n_splits: u32) -> Splits {
    let end = min(pos + 1u, n_ctx);
    var first = 0u;
    if (window > 0u && end > window) {
        first = end - window;
    }
    let span = end - first;
    let per_split = (span + n_splits - 1u) / n_splits;
    let chunk = (per_split + SPLIT_KEYS - 1u) / SPLIT_KEYS * SPLIT_KEYS;
    return Splits(first, end, chunk, (span + chunk - 1u) / chunk);
}
