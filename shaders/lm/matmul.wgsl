// The int8 matmul with the integer rescale (docs/INTEGER_GPT2.md §4): one invocation per
// weight row and four items. `dot4` (four int8 pairs packed in u32 words, summed in i32) is
// prepended by the host: `dot4I8Packed` where the adapter has the packed-dot language
// feature, the exact scalar product where it has not. Mirrors cpu/lm/{matmul,rescale}.rs.

struct Params {
    rows: u32,
    k4: u32,
    n: u32,
    out_frac: i32,
    clamp: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// rows x k4 words of int8 weights (zero padded)
@group(0) @binding(1) var<storage, read> w: array<u32>;
// per row: m16, e16 (bitcast i32), bias (bitcast i32), unused
@group(0) @binding(2) var<storage, read> rowinfo: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> xq: array<u32>;
// per item: t_m, t_e (bitcast i32)
@group(0) @binding(4) var<storage, read> scales: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read_write> out: array<i32>;

// round_shift64 of the spec: s in 1..=63 rounds, s >= 64 gives 0, s <= 0 shifts left
// saturating at the i64 range.
fn round_shift64(x: vec2<u32>, s: i32) -> vec2<u32> {
    if (s >= 64) { return vec2<u32>(0u); }
    if (s >= 1) {
        return shr_s64(add64(x, shl64(vec2<u32>(1u, 0u), u32(s - 1))), u32(s));
    }
    let l = u32(min(-s, 62));
    if (all(x == vec2<u32>(0u))) { return x; }
    if (bits_u64(abs_s64(x)) + l <= 63u) { return shl64(x, l); }
    return select(vec2<u32>(0xffffffffu, 0x7fffffffu), vec2<u32>(0u, 0x80000000u), neg_s64(x));
}

fn rescale(acc: i32, ri: vec4<u32>, sc: vec2<u32>) -> i32 {
    // |acc| <= 2^27 and m16 * t_m < 2^32: the product is below 2^59
    let prod = mul_s32_u32(acc, ri.x * sc.x);
    let s = bitcast<i32>(ri.y) + bitcast<i32>(sc.y) - p.out_frac;
    let v = add64(round_shift64(prod, s), i64_of(bitcast<i32>(ri.z)));
    return clamp_s64(v, p.clamp);
}

// Each invocation: one weight row against four items, so each weight word is read once per
// four items (items past n read item 0's words and are not written).
@compute @workgroup_size(64)
fn matmul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let t0 = gid.y * 4u;
    if (j >= p.rows || t0 >= p.n) { return; }
    let k4 = p.k4;
    let wb = j * k4;
    var xb = vec4<u32>(t0, t0 + 1u, t0 + 2u, t0 + 3u);
    xb = select(vec4<u32>(0u), xb, xb < vec4<u32>(p.n)) * k4;
    var acc = vec4<i32>(0);
    for (var c = 0u; c < k4; c = c + 1u) {
        let wv = w[wb + c];
        acc = acc + vec4<i32>(dot4(wv, xq[xb.x + c]), dot4(wv, xq[xb.y + c]),
            dot4(wv, xq[xb.z + c]), dot4(wv, xq[xb.w + c]));
    }
    let ri = rowinfo[j];
    for (var i = 0u; i < 4u; i = i + 1u) {
        let t = t0 + i;
        if (t < p.n) {
            out[t * p.rows + j] = rescale(acc[i], ri, scales[t]);
        }
    }
}
