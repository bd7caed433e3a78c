// Sum of a vec4 over each group of ROW_THREADS consecutive invocations ("a row"), or over the whole
// workgroup (workgroup_sum).
//
// Needs from the including kernel: const ROW_THREADS (power of two) and const WG (invocations per
// workgroup, a multiple of ROW_THREADS). Call row_sum from workgroup-uniform control flow: it
// contains barriers (and, with SUBGROUPS, subgroupAdd).
//
// With SUBGROUPS the subgroup size must divide ROW_THREADS (the host picks ROW_THREADS >= the largest
// subgroup size), so no subgroup spans two rows: one subgroupAdd, one barrier, and a sum of
// ROW_THREADS / subgroup_size partials. Without it, a shared-memory tree: log2(ROW_THREADS) barriers.

#include "lib/invocation.wgsl"

var<workgroup> row_partials: array<vec4<f32>, WG>;

// Returns the row's total to every invocation of the row.
fn row_sum(value: vec4<f32>, inv: Invocation) -> vec4<f32> {
    let first = inv.index - inv.index % ROW_THREADS;  // first invocation of this row
#if SUBGROUPS
    let subgroup_total = subgroupAdd(value);
    if (inv.subgroup_lane == 0u) {
        row_partials[inv.index / inv.subgroup_size] = subgroup_total;
    }
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    for (var i = first / inv.subgroup_size; i < (first + ROW_THREADS) / inv.subgroup_size; i++) {
        total += row_partials[i];
    }
    return total;
#else
    var total = value;
    row_partials[inv.index] = total;
    for (var stride = ROW_THREADS / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (inv.index - first < stride) {
            total += row_partials[inv.index + stride];
            row_partials[inv.index] = total;
        }
    }
    workgroupBarrier();
    return row_partials[first];
#endif
}

// Returns the workgroup's total to every invocation. Same rules as row_sum (with SUBGROUPS, the subgroup
// size divides WG); row_partials may be reused once it returns.
fn workgroup_sum(value: vec4<f32>, inv: Invocation) -> vec4<f32> {
#if SUBGROUPS
    let subgroup_total = subgroupAdd(value);
    if (inv.subgroup_lane == 0u) {
        row_partials[inv.index / inv.subgroup_size] = subgroup_total;
    }
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    for (var i = 0u; i < WG / inv.subgroup_size; i++) {
        total += row_partials[i];
    }
#else
    row_partials[inv.index] = value;
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (inv.index < stride) {
            row_partials[inv.index] += row_partials[inv.index + stride];
        }
    }
    workgroupBarrier();
    let total = row_partials[0];
#endif
    workgroupBarrier();  // every invocation has its total before row_partials is written again
    return total;
}
