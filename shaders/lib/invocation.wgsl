// The builtins a kernel takes (as its entry point parameters) and passes down to library functions.
//
// Two structs, because Tint (Chrome's WGSL compiler) judges the uniformity of a struct parameter as a
// whole: a struct holding local_invocation_index is non-uniform, so an early return that depends on
// it (even only on its workgroup id) would make every later barrier an error. `Grid` holds only
// workgroup-uniform builtins, so returns that depend on it keep the barriers after them valid.

struct Invocation {
    @builtin(local_invocation_index) index: u32,
#if SUBGROUPS
    @builtin(subgroup_size) subgroup_size: u32,
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
#endif
}

struct Grid {
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
}

// Linear workgroup index of a 1-D or 2-D grid: grids past max_compute_workgroups_per_dimension
// (65535) wrap into y, and kernels return early for the overhang (index >= the workgroups needed).
fn group_index(grid: Grid) -> u32 {
    return grid.group.x + grid.group.y * grid.groups.x;
}
