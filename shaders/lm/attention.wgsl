// Causal attention with the KV cache on the device (docs/INTEGER_GPT2.md §4). `kv_store`
// writes every item's key and value at its (sequence, position) first, so an item sees the
// earlier items of its own sequence in the same batch; `attention` runs one workgroup per
// (item, head). Mirrors cpu/lm/attention.rs.

struct Params {
    d: u32,
    hd: u32,
    ctx: u32,
    n: u32,
    heads: u32,
    exp_len: u32,
    attn_m_lo: u32,
    attn_m_hi: u32,
    // attention runs items first.. in one dispatch, scratch holds span values per head
    first: u32,
    span: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// per item: 3d values (q, k, v), Q10
@group(0) @binding(1) var<storage, read> qkv: array<i32>;
// per item: sequence, position, token, unused
@group(0) @binding(2) var<storage, read> items: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> exp24: array<u32>;
// this layer's cache: sequence x ctx x d
@group(0) @binding(4) var<storage, read_write> kc: array<i32>;
@group(0) @binding(5) var<storage, read_write> vc: array<i32>;
// per (item of this dispatch, head): span scores (i64), then the weights
@group(0) @binding(6) var<storage, read_write> scratch: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read_write> out: array<vec2<u32>>;

const WG: u32 = 64u;
var<workgroup> red64: array<vec2<u32>, 64>;

@compute @workgroup_size(256)
fn kv_store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.d || t >= p.n) { return; }
    let it = items[t];
    let at = (it.x * p.ctx + it.y) * p.d + i;
    kc[at] = qkv[t * 3u * p.d + p.d + i];
    vc[at] = qkv[t * 3u * p.d + 2u * p.d + i];
}

@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let t = p.first + wid.y;
    let hh = wid.x;
    let it = items[t];
    let len = it.y + 1u;
    let off = hh * p.hd;
    let cache = it.x * p.ctx * p.d;
    let sb = (wid.y * p.heads + hh) * p.span;
    let qb = t * 3u * p.d + off;
    let am = vec2<u32>(p.attn_m_lo, p.attn_m_hi);
    // scores: round_shift(q . k * a_m, 52), |q . k| <= 2^48
    var mx = vec2<u32>(0u, 0x80000000u);
    for (var s = l; s < len; s = s + WG) {
        var qk = vec2<u32>(0u);
        let kb = cache + s * p.d + off;
        for (var c = 0u; c < p.hd; c = c + 1u) {
            qk = add64(qk, mul_s32(qkv[qb + c], kc[kb + c]));
        }
        let sc = round_shift128(mul128_u64(i128_of(qk), am), 52u).xy;
        scratch[sb + s] = sc;
        if (lt_s64(mx, sc)) { mx = sc; }
    }
    red64[l] = mx;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o = o / 2u) {
        if (l < o && lt_s64(red64[l], red64[l + o])) { red64[l] = red64[l + o]; }
        workgroupBarrier();
    }
    mx = red64[0];
    workgroupBarrier();
    // weights: EXP24[gap], 0 past the table; their sum
    var total = vec2<u32>(0u);
    for (var s = l; s < len; s = s + WG) {
        let gap = sub64(mx, scratch[sb + s]);
        var w = 0u;
        if (gap.y == 0u && gap.x < p.exp_len) { w = exp24[gap.x]; }
        scratch[sb + s] = vec2<u32>(w, 0u);
        total = add64(total, vec2<u32>(w, 0u));
    }
    red64[l] = total;
    storageBarrier();
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o = o / 2u) {
        if (l < o) { red64[l] = add64(red64[l], red64[l + o]); }
        workgroupBarrier();
    }
    // the maximum weighs 2^24, so the total is positive
    let rc = recip64(red64[0]);
    for (var c = l; c < p.hd; c = c + WG) {
        var acc = vec2<u32>(0u);
        for (var s = 0u; s < len; s = s + 1u) {
            let w = scratch[sb + s].x;
            if (w != 0u) {
                acc = add64(acc, mul_s32_u32(vc[cache + s * p.d + off + c], w));
            }
        }
        out[t * p.d + off + c] = div_recip64(acc, rc).xy;
    }
}
