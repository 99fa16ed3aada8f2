// Wide integers for the integer GPT-2's shaders (concatenated in front of each LM module).
// WGSL has 32-bit integers only (SHADER_INT64 is optional, and absent on lavapipe), so every
// 64-bit value is a vec2<u32> (x = low word) and every 128-bit value a vec4<u32> (x = lowest
// word), both two's complement. The same code runs whether or not the adapter has 64-bit
// integers, so the results cannot depend on it. Names: u = unsigned, s = signed.

// 32 x 32 -> 64 bits, unsigned, through 16-bit halves (no partial sum overflows a u32).
fn mul_u32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p10 = a1 * b0;
    let mid = a0 * b1 + (p00 >> 16u) + (p10 & 0xffffu);
    let lo = (mid << 16u) | (p00 & 0xffffu);
    let hi = a1 * b1 + (mid >> 16u) + (p10 >> 16u);
    return vec2<u32>(lo, hi);
}

fn i64_of(v: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0));
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn neg64(a: vec2<u32>) -> vec2<u32> {
    return add64(~a, vec2<u32>(1u, 0u));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn neg_s64(a: vec2<u32>) -> bool {
    return (a.y >> 31u) == 1u;
}

fn lt_u64(a: vec2<u32>, b: vec2<u32>) -> bool {
    if (a.y != b.y) { return a.y < b.y; }
    return a.x < b.x;
}

fn lt_s64(a: vec2<u32>, b: vec2<u32>) -> bool {
    if (a.y != b.y) { return bitcast<i32>(a.y) < bitcast<i32>(b.y); }
    return a.x < b.x;
}

fn abs_s64(a: vec2<u32>) -> vec2<u32> {
    return select(a, neg64(a), neg_s64(a));
}

// |v| of an i32 as a u32 (i32::MIN included).
fn mag32(v: i32) -> u32 {
    return select(bitcast<u32>(v), 0u - bitcast<u32>(v), v < 0);
}

// Signed i32 x signed i32, exact.
fn mul_s32(a: i32, b: i32) -> vec2<u32> {
    let p = mul_u32(mag32(a), mag32(b));
    return select(p, neg64(p), (a < 0) != (b < 0));
}

// Signed i32 x unsigned u32, exact.
fn mul_s32_u32(a: i32, b: u32) -> vec2<u32> {
    let p = mul_u32(mag32(a), b);
    return select(p, neg64(p), a < 0);
}

// Arithmetic shift right of an i64 by s in 0..=63.
fn shr_s64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 32u) {
        return vec2<u32>(bitcast<u32>(bitcast<i32>(a.y) >> (s - 32u)), select(0u, 0xffffffffu, neg_s64(a)));
    }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), bitcast<u32>(bitcast<i32>(a.y) >> s));
}

fn shr_u64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 64u) { return vec2<u32>(0u, 0u); }
    if (s >= 32u) { return vec2<u32>(a.y >> (s - 32u), 0u); }
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

fn shl64(a: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return a; }
    if (s >= 64u) { return vec2<u32>(0u, 0u); }
    if (s >= 32u) { return vec2<u32>(0u, a.x << (s - 32u)); }
    return vec2<u32>(a.x << s, (a.y << s) | (a.x >> (32u - s)));
}

// Number of significant bits of a u64 (0 for 0): floor(log2 a) + 1.
fn bits_u64(a: vec2<u32>) -> u32 {
    if (a.y != 0u) { return 64u - countLeadingZeros(a.y); }
    return 32u - countLeadingZeros(a.x);
}

// Does the i64 lie in [-c, c] (c < 2^31)?
fn within_s64(a: vec2<u32>, c: u32) -> bool {
    let m = abs_s64(a);
    return m.y == 0u && m.x <= c;
}

// clamp(a, -c, c) as an i32, for c < 2^31.
fn clamp_s64(a: vec2<u32>, c: u32) -> i32 {
    if (within_s64(a, c)) { return bitcast<i32>(a.x); }
    return select(i32(c), -i32(c), neg_s64(a));
}

// ---- 128 bits ----

fn i128_of(a: vec2<u32>) -> vec4<u32> {
    let s = select(0u, 0xffffffffu, neg_s64(a));
    return vec4<u32>(a.x, a.y, s, s);
}

fn add128(a: vec4<u32>, b: vec4<u32>) -> vec4<u32> {
    let x = a.x + b.x;
    var c = select(0u, 1u, x < a.x);
    let y0 = a.y + b.y;
    let y = y0 + c;
    c = select(0u, 1u, y0 < a.y) + select(0u, 1u, y < y0);
    let z0 = a.z + b.z;
    let z = z0 + c;
    c = select(0u, 1u, z0 < a.z) + select(0u, 1u, z < z0);
    return vec4<u32>(x, y, z, a.w + b.w + c);
}

fn neg128(a: vec4<u32>) -> vec4<u32> {
    return add128(~a, vec4<u32>(1u, 0u, 0u, 0u));
}

fn neg_s128(a: vec4<u32>) -> bool {
    return (a.w >> 31u) == 1u;
}

fn lt_u128(a: vec4<u32>, b: vec4<u32>) -> bool {
    if (a.w != b.w) { return a.w < b.w; }
    if (a.z != b.z) { return a.z < b.z; }
    if (a.y != b.y) { return a.y < b.y; }
    return a.x < b.x;
}

// a * b modulo 2^128: exact for a signed a whose product fits.
fn mul128_u32(a: vec4<u32>, b: u32) -> vec4<u32> {
    let p0 = mul_u32(a.x, b);
    let p1 = mul_u32(a.y, b);
    let p2 = mul_u32(a.z, b);
    let y = p1.x + p0.y;
    var c = select(0u, 1u, y < p1.x);
    let z0 = p2.x + p1.y;
    let z = z0 + c;
    c = select(0u, 1u, z0 < p2.x) + select(0u, 1u, z < z0);
    return vec4<u32>(p0.x, y, z, a.w * b + p2.y + c);
}

// Shift left by s in 0..=127.
fn shl128(a: vec4<u32>, s: u32) -> vec4<u32> {
    var v = a;
    var k = s;
    while (k >= 32u) {
        v = vec4<u32>(0u, v.x, v.y, v.z);
        k = k - 32u;
    }
    if (k == 0u) { return v; }
    return vec4<u32>(v.x << k, (v.y << k) | (v.x >> (32u - k)), (v.z << k) | (v.y >> (32u - k)),
        (v.w << k) | (v.z >> (32u - k)));
}

// Arithmetic shift right by s in 0..=127.
fn shr_s128(a: vec4<u32>, s: u32) -> vec4<u32> {
    let fill = select(0u, 0xffffffffu, neg_s128(a));
    var v = a;
    var k = s;
    while (k >= 32u) {
        v = vec4<u32>(v.y, v.z, v.w, fill);
        k = k - 32u;
    }
    if (k == 0u) { return v; }
    return vec4<u32>((v.x >> k) | (v.y << (32u - k)), (v.y >> k) | (v.z << (32u - k)),
        (v.z >> k) | (v.w << (32u - k)), bitcast<u32>(bitcast<i32>(v.w) >> k));
}

// The spec's round_shift for s in 1..=126: (x + 2^(s-1)) >> s, ties toward +inf.
fn round_shift128(x: vec4<u32>, s: u32) -> vec4<u32> {
    return shr_s128(add128(x, shl128(vec4<u32>(1u, 0u, 0u, 0u), s - 1u)), s);
}

// a * b modulo 2^128 for a u64 b.
fn mul128_u64(a: vec4<u32>, b: vec2<u32>) -> vec4<u32> {
    return add128(mul128_u32(a, b.x), shl128(mul128_u32(a, b.y), 32u));
}

// Does the i128 fit an i64?
fn fits64(a: vec4<u32>) -> bool {
    let s = select(0u, 0xffffffffu, (a.y >> 31u) == 1u);
    return a.z == s && a.w == s;
}

// ---- the spec's reciprocal division (docs/INTEGER_GPT2.md §1) ----

// recip(d) for 0 < d < 2^62: (r, s) with s = floor(log2 d) + 30 and r = floor(2^s / d),
// by 31 steps of restoring division of 2^(bits - 1) * 2^30 (the remainder stays below 2d).
fn recip64(d: vec2<u32>) -> vec2<u32> {
    let top = bits_u64(d) - 1u;
    var rem = shl64(vec2<u32>(1u, 0u), top);
    var q = 0u;
    for (var i = 0u; i < 31u; i = i + 1u) {
        q = q << 1u;
        if (!lt_u64(rem, d)) {
            rem = sub64(rem, d);
            q = q | 1u;
        }
        rem = shl64(rem, 1u);
    }
    return vec2<u32>(q, top + 30u);
}

// div_recip(x, (r, s)) = round_shift(x * r, s) for an i64 x (the product stays below 2^127).
fn div_recip64(x: vec2<u32>, rc: vec2<u32>) -> vec4<u32> {
    return round_shift128(mul128_u32(i128_of(x), rc.x), rc.y);
}
