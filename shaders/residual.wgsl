// Forward residual transform, symbol codes and per-tensor histograms (integer atomics).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> refs: array<u32>;
@group(0) @binding(2) var<storage, read> tgts: array<u32>;
// Displacements, packed like the input (w bits per element).
@group(0) @binding(3) var<storage, read_write> resid: array<atomic<u32>>;
// Symbol codes, 16 bits per element.
@group(0) @binding(4) var<storage, read_write> codes: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> counts: array<atomic<u32>>;

fn load_ref(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = refs[i + 1u]; }
    return load_elem(j, p.width, refs[i], hi);
}

fn load_tgt(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = tgts[i + 1u]; }
    return load_elem(j, p.width, tgts[i], hi);
}

fn load_resid(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = atomicLoad(&resid[i + 1u]); }
    return load_elem(j, p.width, atomicLoad(&resid[i]), hi);
}

fn get_code(j: u32) -> u32 {
    return (atomicLoad(&codes[j >> 1u]) >> ((j & 1u) * 16u)) & 0xffffu;
}

@compute @workgroup_size(256)
fn residuals(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let j = flat_index(wg, nwg, t);
    if (j >= p.n) { return; }
    let w = p.width;
    let d = sub64(key(load_tgt(j), w), key(load_ref(j), w)) & mask64(w);
    let i = word_index(j, w);
    if (w == 8u) {
        atomicOr(&resid[i], d.x << ((j & 3u) * 8u));
    } else if (w == 16u) {
        atomicOr(&resid[i], d.x << ((j & 1u) * 16u));
    } else if (w == 32u) {
        atomicStore(&resid[i], d.x);
    } else {
        atomicStore(&resid[i], d.x);
        atomicStore(&resid[i + 1u], d.y);
    }
}

@compute @workgroup_size(256)
fn symbols(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let j = flat_index(wg, nwg, t);
    if (j >= p.n) { return; }
    let v = coded_value(load_resid(j), p);
    atomicOr(&codes[j >> 1u], sym_code(v.xy, v.z) << ((j & 1u) * 16u));
}

@compute @workgroup_size(256)
fn histogram(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let j = flat_index(wg, nwg, t);
    if (j >= p.n) { return; }
    let c = get_code(j);
    let info = ref_info(load_ref(j), p);
    var nbc = NONE;
    if (p.neighbor != 0u && (j % CHUNK) >= p.neighbor) {
        nbc = get_code(j - p.neighbor);
    }
    for (var s = 0u; s < p.n_stages; s++) {
        let ctx = context(s, c, info, nbc, p);
        // NONE: J's neighbor form, a class outside this pass's piece of the window (another
        // pass counts it).
        if (present(s, c) && ctx != NONE) {
            atomicAdd(&counts[p.hist_off[s] + ctx * p.alpha[s] + symbol_of(s, c, p)], 1u);
        }
    }
}

var<workgroup> wg_range: array<atomic<u32>, 2>;

// The reference's exponent classes, the window J's neighbor form is counted over: the largest
// 255 - er into counts[0] and the largest er into counts[1] (zero, the buffer's start, is the
// identity of both), per workgroup first so that only one invocation in 256 touches them.
@compute @workgroup_size(256)
fn er_range(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    // wg_range starts zeroed (WGSL zero-initializes workgroup memory).
    let j = flat_index(wg, nwg, t);
    if (j < p.n) {
        let er = ref_info(load_ref(j), p) & 255u;
        atomicMax(&wg_range[0], 255u - er);
        atomicMax(&wg_range[1], er);
    }
    workgroupBarrier();
    if (t == 0u) {
        atomicMax(&counts[0], atomicLoad(&wg_range[0]));
        atomicMax(&counts[1], atomicLoad(&wg_range[1]));
    }
}
