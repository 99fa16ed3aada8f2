// Workgroup-wide exclusive prefix sum over 256 invocations (Hillis-Steele).

var<workgroup> scan_sh: array<u32, 256>;

// Returns (exclusive prefix of v, total over the workgroup). Call from uniform control flow.
fn wg_scan(t: u32, v: u32) -> vec2<u32> {
    scan_sh[t] = v;
    workgroupBarrier();
    for (var off = 1u; off < 256u; off = off * 2u) {
        var acc = scan_sh[t];
        if (t >= off) { acc = acc + scan_sh[t - off]; }
        workgroupBarrier();
        scan_sh[t] = acc;
        workgroupBarrier();
    }
    let total = scan_sh[255];
    let incl = scan_sh[t];
    workgroupBarrier();
    return vec2<u32>(incl - v, total);
}
