// Per-row int8 quantization with an integer scale (docs/INTEGER_GPT2.md §4), one workgroup
// per row: y (i64, Q`frac`) -> four int8 per u32 word (zero padded to k4 words) and the row's
// scale (t_m, t_e). Mirrors format::lm::fixed::quantize_row.

struct Params {
    k: u32,
    k4: u32,
    rows: u32,
    frac: i32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> scales: array<vec2<u32>>;

const WG: u32 = 256u;
var<workgroup> max_sh: array<vec2<u32>, 256>;
var<workgroup> recip_sh: vec2<u32>;

// rdiv(A * 2^k, 127) for the k of the scale search (the quotient stays near 2^16).
fn scale_at(a: vec2<u32>, k: i32) -> u32 {
    if (k >= 0) {
        // A * 2^k < 2^24 at every k the search visits.
        let x = shl64(a, u32(k)).x;
        return (2u * x + 127u) / 254u;
    }
    // rdiv(A, 127 * 2^j) = floor(floor((2A + 127 * 2^j) / 2^(j+1)) / 127)
    let j = u32(-k);
    let num = add64(shl64(a, 1u), shl64(vec2<u32>(127u, 0u), j));
    return shr_u64(num, j + 1u).x / 127u;
}

@compute @workgroup_size(256)
fn quantize(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wid.x + wid.y * 32768u;
    if (row >= p.rows) { return; }
    let base = row * p.k;
    var m = vec2<u32>(0u);
    for (var i = t; i < p.k; i = i + WG) {
        let v = abs_s64(y[base + i]);
        if (lt_u64(m, v)) { m = v; }
    }
    max_sh[t] = m;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off / 2u) {
        if (t < off && lt_u64(max_sh[t], max_sh[t + off])) { max_sh[t] = max_sh[t + off]; }
        workgroupBarrier();
    }
    let a = max_sh[0];
    let zero = all(a == vec2<u32>(0u));
    if (t == 0u) {
        if (zero) {
            scales[row] = vec2<u32>(0u, 0u);
            recip_sh = vec2<u32>(0u, 0u);
        } else {
            recip_sh = recip64(a);
            var k = 22 - (i32(bits_u64(a)) - 1);
            loop {
                let tm = scale_at(a, k);
                if (tm >= 65536u) {
                    k = k - 1;
                } else if (tm < 32768u) {
                    k = k + 1;
                } else {
                    scales[row] = vec2<u32>(tm, bitcast<u32>(p.frac + k));
                    break;
                }
            }
        }
    }
    workgroupBarrier();
    let rc = recip_sh;
    for (var w = t; w < p.k4; w = w + WG) {
        var word = 0u;
        for (var b = 0u; b < 4u; b = b + 1u) {
            let i = w * 4u + b;
            var q = 0;
            if (i < p.k && !zero) {
                // 127 * y < 2^59, times r <= 2^30
                let v = div_recip64(mul128_u32(i128_of(y[base + i]), 127u).xy, rc);
                if (fits64(v)) {
                    q = clamp_s64(v.xy, 127u);
                } else {
                    q = select(127, -127, neg_s128(v));
                }
            }
            word = word | ((bitcast<u32>(q) & 0xffu) << (8u * b));
        }
        xq[row * p.k4 + w] = word;
    }
}
