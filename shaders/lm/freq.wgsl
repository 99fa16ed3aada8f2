// Logits (Q8) -> frequency table of total 2^32 -> the query's answer (docs/INTEGER_GPT2.md
// §5, §10), one workgroup per queried item; the table stays on the device. Mirrors
// cpu/lm/freq.rs: w_j = EXP40[L - l_j] (0 past the table), f_j = 1 + floor(w_j R / W) with
// R = 2^32 - V, the remainder to the largest logit (lowest id on ties), then the match mix.
// Every frequency and every prefix sum below the total fits a u32 (the table sums to 2^32
// and each entry is at least 1), so u32 sums that wrap at 2^32 are exact.

struct Params {
    v: u32,
    exp_len: u32,
    rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<i32>;
@group(0) @binding(2) var<storage, read> exp40: array<vec2<u32>>;
// per row: find kind (0 symbol, 1 target), symbol or target, mix token (NONE: no mix), lambda
@group(0) @binding(3) var<storage, read> queries: array<vec4<u32>>;
// per row: f for every gap below exp_len
@group(0) @binding(4) var<storage, read_write> by_gap: array<u32>;
@group(0) @binding(5) var<storage, read_write> freqs: array<u32>;
// per row: symbol, cum, freq, unused
@group(0) @binding(6) var<storage, read_write> coded: array<vec4<u32>>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<i32, 256>;
var<workgroup> best_i: array<u32, 256>;
var<workgroup> red64: array<vec2<u32>, 256>;
var<workgroup> red32: array<u32, 256>;

// floor(n / d) for a quotient below 2^32, by restoring division (d > 0).
fn div_small_quotient(num: vec4<u32>, d: vec2<u32>) -> u32 {
    var n = num;
    var q = 0u;
    let dd = vec4<u32>(d, 0u, 0u);
    for (var b = 31; b >= 0; b = b - 1) {
        let sh = shl128(dd, u32(b));
        if (!lt_u128(n, sh)) {
            n = add128(n, neg128(sh));
            q = q | (1u << u32(b));
        }
    }
    return q;
}

fn sum32(l: u32, v: u32) -> u32 {
    red32[l] = v;
    storageBarrier();
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o = o / 2u) {
        if (l < o) { red32[l] = red32[l] + red32[l + o]; }
        workgroupBarrier();
    }
    let s = red32[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(256)
fn frequencies(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let row = wid.x + wid.y * 32768u;
    if (row >= p.rows) { return; }
    let v = p.v;
    let lb = row * v;
    let gb = row * p.exp_len;
    // L = max logit, arg = its lowest id
    var bv = -2147483647 - 1;
    var bi = NONE;
    for (var j = l; j < v; j = j + WG) {
        if (logits[lb + j] > bv) { bv = logits[lb + j]; bi = j; }
    }
    best_v[l] = bv;
    best_i[l] = bi;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o = o / 2u) {
        if (l < o) {
            let ov = best_v[l + o];
            let oi = best_i[l + o];
            if (ov > best_v[l] || (ov == best_v[l] && oi < best_i[l])) {
                best_v[l] = ov;
                best_i[l] = oi;
            }
        }
        workgroupBarrier();
    }
    let top = best_v[0];
    let arg = best_i[0];
    // W = sum of the weights (< 2^56)
    var wsum = vec2<u32>(0u);
    for (var j = l; j < v; j = j + WG) {
        let gap = bitcast<u32>(top) - bitcast<u32>(logits[lb + j]);
        if (gap < p.exp_len) { wsum = add64(wsum, exp40[gap]); }
    }
    red64[l] = wsum;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o = o / 2u) {
        if (l < o) { red64[l] = add64(red64[l], red64[l + o]); }
        workgroupBarrier();
    }
    let total_w = red64[0];
    // f by gap: each distinct gap divided once
    let r = 0u - v;
    for (var g = l; g < p.exp_len; g = g + WG) {
        let e = exp40[g];
        by_gap[gb + g] = 1u + div_small_quotient(mul128_u32(vec4<u32>(e, 0u, 0u), r), total_w);
    }
    storageBarrier();
    workgroupBarrier();
    var s = 0u;
    for (var j = l; j < v; j = j + WG) {
        let gap = bitcast<u32>(top) - bitcast<u32>(logits[lb + j]);
        var f = 1u;
        if (gap < p.exp_len) { f = by_gap[gb + gap]; }
        freqs[lb + j] = f;
        s = s + f;
    }
    let rest = 0u - sum32(l, s);
    // the match mix: every other token gives up lambda / 2^16 of its frequency (keeping 1)
    let q = queries[row];
    let x = q.z;
    let lambda = q.w;
    let mixing = x < v && lambda != 0u && lambda < 65536u;
    var others = 0u;
    for (var j = l; j < v; j = j + WG) {
        var f = freqs[lb + j];
        if (j == arg) {
            f = f + rest;
        }
        if (mixing && j != x) {
            f = max(1u, f - shr_u64(mul_u32(f, lambda), 16u).x);
            others = others + f;
        }
        freqs[lb + j] = f;
    }
    let others_total = sum32(l, others);
    if (mixing && l == 0u) {
        freqs[lb + x] = 0u - others_total;
    }
    storageBarrier();
    workgroupBarrier();
    // the answer: prefix sums over 256 contiguous blocks, then a scan inside one block
    let per = (v + WG - 1u) / WG;
    let b0 = min(l * per, v);
    let b1 = min(b0 + per, v);
    var bsum = 0u;
    for (var j = b0; j < b1; j = j + 1u) { bsum = bsum + freqs[lb + j]; }
    red32[l] = bsum;
    workgroupBarrier();
    for (var o = 1u; o < WG; o = o * 2u) {
        var acc = red32[l];
        if (l >= o) { acc = acc + red32[l - o]; }
        workgroupBarrier();
        red32[l] = acc;
        workgroupBarrier();
    }
    let pre = red32[l] - bsum;
    if (q.x == 0u) {
        let sym = q.y;
        if (sym >= b0 && sym < b1) {
            var cum = pre;
            for (var j = b0; j < sym; j = j + 1u) { cum = cum + freqs[lb + j]; }
            coded[row] = vec4<u32>(sym, cum, freqs[lb + sym], 0u);
        }
    } else {
        let goal = q.y;
        if (goal >= pre && goal - pre < bsum) {
            var cum = pre;
            for (var j = b0; j < b1; j = j + 1u) {
                let f = freqs[lb + j];
                if (goal - cum < f) {
                    coded[row] = vec4<u32>(j, cum, f, 0u);
                    break;
                }
                cum = cum + f;
            }
        }
    }
}
