// stream_read: out[i] = XOR of the words invocation i reads from src (a grid-stride pass over src).
//
// A bandwidth probe, not part of a model's plan: the rate at which this kernel reads a buffer much
// larger than the GPU's caches is the "streaming read" bandwidth that docs/PERF.md measures the decode
// GEMVs against (tools/bench_bandwidth.py). Each invocation reads one vec4<u32> per iteration, so a
// workgroup's loads in one iteration are 16 * WG consecutive bytes; the XOR keeps every load live.
//
// Bindings (group 0):
//   0  params  uniform             Params
//   1  src     storage, read       array<vec4<u32>>  [n_vec4]        the buffer to read
//   2  out     storage, read_write array<u32>        [invocations]   one word per invocation
//
// Specialization:
//   WG  invocations per workgroup
// Grid: any number of workgroups (1-D); invocations = workgroups * WG.

struct Params {
    n_vec4: u32,       // vec4<u32> elements of src to read
    invocations: u32,  // workgroups * WG: the stride of the grid-stride loop
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let me = gid.x;
    var acc = vec4<u32>(0u);
    for (var i = me; i < params.n_vec4; i += params.invocations) {
        acc ^= src[i];
    }
    out[me] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}
