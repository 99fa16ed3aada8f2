// Integer LayerNorm (docs/INTEGER_GPT2.md §4), one workgroup per row: h (Q12 i32) -> y (Q26
// i64). Mirrors src/backend/cpu/lm/norm.rs::layer_norm_row integer for integer.

struct Params {
    d: u32,
    rows: u32,
    eps_lo: u32,
    eps_hi: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> h: array<i32>;
@group(0) @binding(2) var<storage, read> gamma: array<i32>;
@group(0) @binding(3) var<storage, read> beta: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> y: array<vec2<u32>>;

const WG: u32 = 256u;
var<workgroup> sum64: array<vec2<u32>, 256>;
var<workgroup> sum128: array<vec4<u32>, 256>;
var<workgroup> recip_sh: vec2<u32>;

// u128 / n for 0 < n < 2^16, by 16-bit digits (each partial dividend fits a u32).
fn div128_small(a: vec4<u32>, n: u32) -> vec4<u32> {
    var q = vec4<u32>(0u);
    var rem = 0u;
    for (var i = 0; i < 8; i = i + 1) {
        let word = 3 - i / 2;
        let shift = select(0u, 16u, i % 2 == 0);
        let digit = (a[word] >> shift) & 0xffffu;
        let cur = (rem << 16u) | digit;
        q[word] = q[word] | ((cur / n) << shift);
        rem = cur % n;
    }
    return q;
}

// Floor square root of a u128, digit by digit (exact; the root is below 2^64).
fn isqrt128(x: vec4<u32>) -> vec4<u32> {
    var num = x;
    var res = vec4<u32>(0u);
    var bit = vec4<u32>(0u, 0u, 0u, 0x40000000u);
    while (lt_u128(num, bit)) {
        bit = shr_s128(bit, 2u);
        if (all(bit == vec4<u32>(0u))) { return res; }
    }
    while (any(bit != vec4<u32>(0u))) {
        let t = add128(res, bit);
        if (!lt_u128(num, t)) {
            num = add128(num, neg128(t));
            res = add128(shr_s128(res, 1u), bit);
        } else {
            res = shr_s128(res, 1u);
        }
        bit = shr_s128(bit, 2u);
    }
    return res;
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let row = wid.x + wid.y * 32768u;
    if (row >= p.rows) { return; }
    let d = p.d;
    let base = row * d;
    // S = sum h (|S| <= 2^39)
    var s = vec2<u32>(0u);
    for (var i = t; i < d; i = i + WG) {
        s = add64(s, i64_of(h[base + i]));
    }
    sum64[t] = s;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off / 2u) {
        if (t < off) { sum64[t] = add64(sum64[t], sum64[t + off]); }
        workgroupBarrier();
    }
    let total = sum64[0];
    // sum of d_i^2 with d_i = n h_i - S (|d_i| <= 2^40, the sum <= 2^93)
    var sq = vec4<u32>(0u);
    for (var i = t; i < d; i = i + WG) {
        let dv = abs_s64(sub64(mul_s32(i32(d), h[base + i]), total));
        sq = add128(sq, mul128_u64(vec4<u32>(dv, 0u, 0u), dv));
    }
    sum128[t] = sq;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off / 2u) {
        if (t < off) { sum128[t] = add128(sum128[t], sum128[t + off]); }
        workgroupBarrier();
    }
    if (t == 0u) {
        // U = floor(sq * 2^16 / n) + eps_q * n^2; D = isqrt(U)
        let eps = i128_of(vec2<u32>(p.eps_lo, p.eps_hi));
        let u = add128(div128_small(shl128(sum128[0], 16u), d), mul128_u32(eps, d * d));
        let dd = isqrt128(u);
        if (all(dd == vec4<u32>(0u))) {
            recip_sh = vec2<u32>(0u, 0u);
        } else {
            recip_sh = recip64(dd.xy);
        }
    }
    workgroupBarrier();
    let rc = recip_sh;
    for (var i = t; i < d; i = i + WG) {
        let dv = sub64(mul_s32(i32(d), h[base + i]), total);
        var z = 0;
        if (rc.y != 0u) {
            // d_i * 2^22 <= 2^62, times r <= 2^30
            z = bitcast<i32>(div_recip64(shl64(dv, 22u), rc).x);
        }
        y[base + i] = add64(mul_s32(gamma[i], z), beta[i]);
    }
}
