// The builtins a kernel takes (as its entry point parameter) and passes down to library functions.

struct Invocation {
    @builtin(local_invocation_index) index: u32,
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
#if SUBGROUPS
    @builtin(subgroup_size) subgroup_size: u32,
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
#endif
}

// Linear workgroup index of a 1-D or 2-D grid: grids past max_compute_workgroups_per_dimension
// (65535) wrap into y, and kernels return early for the overhang (index >= the workgroups needed).
fn group_index(inv: Invocation) -> u32 {
    return inv.group.x + inv.group.y * inv.groups.x;
}
