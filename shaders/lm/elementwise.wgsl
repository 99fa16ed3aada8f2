// The forward pass's element-wise steps (docs/INTEGER_GPT2.md §4): the saturating residual
// add and the GELU table lookup.

struct Params {
    len: u32,
    res_max: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<i32>;
@group(0) @binding(2) var<storage, read> gelu_table: array<i32>;
@group(0) @binding(3) var<storage, read_write> h: array<i32>;
@group(0) @binding(4) var<storage, read_write> g: array<vec2<u32>>;

fn index(gid: vec3<u32>, n: vec3<u32>) -> u32 {
    return gid.x + gid.y * n.x * 256u;
}

// h = clamp(h + src, +-res_max)
@compute @workgroup_size(256)
fn add_residual(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = index(gid, n);
    if (i >= p.len) { return; }
    h[i] = clamp_s64(add64(i64_of(h[i]), i64_of(src[i])), p.res_max);
}

// g = GELU[clamp(src, i16) + 32768], as the i64 the quantizer reads
@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = index(gid, n);
    if (i >= p.len) { return; }
    g[i] = i64_of(gelu_table[clamp(src[i], -32768, 32767) + 32768]);
}
