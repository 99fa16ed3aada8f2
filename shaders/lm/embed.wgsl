// Token plus position embedding (docs/INTEGER_GPT2.md §4), one invocation per (channel,
// item): h = clamp(round_shift(q_wte * m, e - 12) + wpe[pos]).

struct Params {
    d: u32,
    k4: u32,
    n: u32,
    res_max: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> wte: array<u32>;
// per token: m (< 2^31), e (bitcast i32)
@group(0) @binding(3) var<storage, read> scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> wpe: array<i32>;
@group(0) @binding(5) var<storage, read_write> h: array<i32>;

@compute @workgroup_size(256)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    let t = gid.y;
    if (k >= p.d || t >= p.n) { return; }
    let it = items[t];
    let word = wte[it.z * p.k4 + k / 4u];
    let q = bitcast<i32>(word << (24u - 8u * (k % 4u))) >> 24u;
    let sc = scale[it.z];
    let x = mul_s32(q, bitcast<i32>(sc.x)); // |x| <= 2^38
    let s = bitcast<i32>(sc.y) - 12;
    let pe = i64_of(wpe[it.y * p.d + k]);
    var v: vec2<u32>;
    if (s >= 64) {
        v = pe;
    } else if (s >= 1) {
        v = add64(shr_s64(add64(x, shl64(vec2<u32>(1u, 0u), u32(s - 1))), u32(s)), pe);
    } else if (all(x == vec2<u32>(0u))) {
        v = pe;
    } else if (bits_u64(abs_s64(x)) + u32(-s) > 40u) {
        // |x * 2^-s| >= 2^40 outweighs any i32 position value: the clamp takes x's sign
        v = select(vec2<u32>(0u, 1u), vec2<u32>(0u, 0xffffffffu), neg_s64(x));
    } else {
        v = add64(shl64(x, u32(-s)), pe);
    }
    h[t * p.d + k] = clamp_s64(v, p.res_max);
}
