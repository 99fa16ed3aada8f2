// Shared by every lockstep delta-codec shader (concatenated in front of each module).
// 64-bit values are vec2<u32> (x = low word, y = high word) whatever SHADER_INT64 says, so
// results never depend on that feature. Every float width is handled by the same code.

// CHUNK (elements per chunk, delta::chunk::CHUNK_ELEMS) and GROUPS (mask groups per chunk:
// steps CHUNK / LANES x 4 stage slots) are prepended by the host from the Rust constants.
const LANES: u32 = 32u;
const TOTAL: u32 = 4096u;
const SLOT_MASK: u32 = 4095u;
const RANS_L: u32 = 65536u;
const NONE: u32 = 0xffffffffu;
// Params.layout_id (delta::symbols::Layout as u32).
const LAYOUT_PAPER: u32 = 0u;
const LAYOUT_SIGNED: u32 = 1u;
// One stage (J): b, q1, q2 and the sign as one symbol under er·2 + rs. Its elements have the
// Signed layout's codes and tails; only the stages differ.
const LAYOUT_JOINT: u32 = 2u;

struct Params {
    n: u32,
    width: u32,
    mant: u32,
    ebits: u32,
    condition: u32,
    layout_id: u32,
    // Distance to the neighbor element (one row up) whose bit length (B) and update sign (S)
    // are contexts; 0: no neighbor context.
    neighbor: u32,
    n_stages: u32,
    n_chunks: u32,
    w1: u32,
    pass_: u32,
    pad: u32,
    map_off: vec4<u32>,
    rows_off: vec4<u32>,
    alpha: vec4<u32>,
    hist_off: vec4<u32>,
    // Per stage: 1 when it uses its neighbor context form (B and S; J in the Joint layout).
    nb_form: vec4<u32>,
    // J's neighbor form: the exponent classes win_lo .. win_lo + win_n its map covers
    // (format::tables::Window), or that a histogram pass counts.
    win_lo: u32,
    win_n: u32,
    pad2: u32,
    pad3: u32,
}

fn mask64(w: u32) -> vec2<u32> {
    if (w >= 64u) { return vec2<u32>(0xffffffffu, 0xffffffffu); }
    if (w >= 32u) { return vec2<u32>(0xffffffffu, (1u << (w - 32u)) - 1u); }
    return vec2<u32>((1u << w) - 1u, 0u);
}

fn bit64(v: vec2<u32>, i: u32) -> u32 {
    if (i < 32u) { return (v.x >> i) & 1u; }
    return (v.y >> (i - 32u)) & 1u;
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn neg64(a: vec2<u32>) -> vec2<u32> {
    return sub64(vec2<u32>(0u, 0u), a);
}

fn shl64(v: vec2<u32>, k: u32) -> vec2<u32> {
    if (k == 0u) { return v; }
    if (k < 32u) { return vec2<u32>(v.x << k, (v.y << k) | (v.x >> (32u - k))); }
    return vec2<u32>(0u, v.x << (k - 32u));
}

fn shr64(v: vec2<u32>, k: u32) -> vec2<u32> {
    if (k == 0u) { return v; }
    if (k < 32u) { return vec2<u32>((v.x >> k) | (v.y << (32u - k)), v.y >> k); }
    return vec2<u32>(v.y >> (k - 32u), 0u);
}

fn bitlen64(v: vec2<u32>) -> u32 {
    if (v.y != 0u) { return 64u - countLeadingZeros(v.y); }
    return 32u - countLeadingZeros(v.x);
}

// Ordered-integer key of a w-bit float pattern (src/float.rs).
fn key(u: vec2<u32>, w: u32) -> vec2<u32> {
    if (bit64(u, w - 1u) == 1u) { return u ^ mask64(w); }
    return u ^ shl64(vec2<u32>(1u, 0u), w - 1u);
}

fn from_key(k: vec2<u32>, w: u32) -> vec2<u32> {
    if (bit64(k, w - 1u) == 1u) { return k ^ shl64(vec2<u32>(1u, 0u), w - 1u); }
    return k ^ mask64(w);
}

fn sext(d: vec2<u32>, w: u32) -> vec2<u32> {
    if (bit64(d, w - 1u) == 1u) { return d | ~mask64(w); }
    return d;
}

// Element j of a tensor of w-bit elements packed little-endian into u32 words.
fn load_elem(j: u32, w: u32, word0: u32, word1: u32) -> vec2<u32> {
    if (w == 8u) { return vec2<u32>((word0 >> ((j & 3u) * 8u)) & 0xffu, 0u); }
    if (w == 16u) { return vec2<u32>((word0 >> ((j & 1u) * 16u)) & 0xffffu, 0u); }
    if (w == 32u) { return vec2<u32>(word0, 0u); }
    return vec2<u32>(word0, word1);
}

// Index of the u32 word holding element j (its low word for 64-bit elements).
fn word_index(j: u32, w: u32) -> u32 {
    if (w == 8u) { return j >> 2u; }
    if (w == 16u) { return j >> 1u; }
    if (w == 32u) { return j; }
    return 2u * j;
}

// Reference facts: exponent class in bits 0..8, sign in bit 8, the two mantissa bits just
// below the exponent field in bits 9..11.
fn ref_info(r: vec2<u32>, p: Params) -> u32 {
    let e = shr64(r, p.mant).x & ((1u << p.ebits) - 1u);
    var er = 0u;
    if (p.condition != 0u) {
        if (p.ebits > 8u) {
            er = u32(clamp(i32(e) - 1023 + 128, 0, 255));
        } else {
            er = e;
        }
    }
    let m2 = shr64(r, p.mant - 2u).x & 3u;
    return er | (bit64(r, p.width - 1u) << 8u) | (m2 << 9u);
}

// Coded value of a displacement: |d| (Signed and Joint layouts, sign returned in .z) or
// ZigZag(d) (Paper).
fn coded_value(d: vec2<u32>, p: Params) -> vec3<u32> {
    let sd = sext(d, p.width);
    let neg = sd.y >> 31u;
    if (p.layout_id != LAYOUT_PAPER) {
        var v = sd;
        if (neg == 1u) { v = neg64(sd); }
        return vec3<u32>(v, neg);
    }
    var z = shl64(sd, 1u);
    if (neg == 1u) { z = z ^ vec2<u32>(0xffffffffu, 0xffffffffu); }
    return vec3<u32>(z & mask64(p.width), 0u);
}

// Packed symbols: b in bits 0..7, q1 bit 7, q2 bit 8, neg bit 9.
fn sym_code(v: vec2<u32>, neg: u32) -> u32 {
    let b = bitlen64(v);
    var q1 = 0u;
    var q2 = 0u;
    if (b >= 2u) { q1 = bit64(v, b - 2u); }
    if (b >= 3u) { q2 = bit64(v, b - 3u); }
    return b | (q1 << 7u) | (q2 << 8u) | (neg << 9u);
}

fn sign_state(c: u32) -> u32 {
    if ((c & 127u) == 0u) { return 0u; }
    return 1u + ((c >> 9u) & 1u);
}

// Joint symbol of a code (delta::symbols::joint_symbol): b = 0 -> 0; b = 1 -> 1 + neg;
// b = 2 -> 3 + 2 q1 + neg; b >= 3 -> 7 + 8 (b - 3) + 4 q1 + 2 q2 + neg.
fn joint_of(c: u32) -> u32 {
    let b = c & 127u;
    let q1 = (c >> 7u) & 1u;
    let q2 = (c >> 8u) & 1u;
    let neg = (c >> 9u) & 1u;
    if (b == 0u) { return 0u; }
    if (b == 1u) { return 1u + neg; }
    if (b == 2u) { return 3u + 2u * q1 + neg; }
    return 7u + 8u * (b - 3u) + 4u * q1 + 2u * q2 + neg;
}

// Code of a joint symbol (delta::symbols::joint_parts), the inverse of joint_of.
fn code_of_joint(j: u32) -> u32 {
    if (j == 0u) { return 0u; }
    if (j < 3u) { return 1u | ((j - 1u) << 9u); }
    if (j < 7u) { return 2u | (((j - 3u) >> 1u) << 7u) | (((j - 3u) & 1u) << 9u); }
    let k = j - 7u;
    return (3u + (k >> 3u)) | (((k >> 2u) & 1u) << 7u) | (((k >> 1u) & 1u) << 8u)
        | ((k & 1u) << 9u);
}

// Does stage s (0 B, 1 Q1, 2 Q2, 3 S; in the Joint layout 0 is J) code a symbol for this
// element, and which?
fn present(s: u32, c: u32) -> bool {
    let b = c & 127u;
    if (s == 0u) { return true; }
    if (s == 1u) { return b >= 2u; }
    if (s == 2u) { return b >= 3u; }
    return b >= 1u;
}

fn symbol_of(s: u32, c: u32, p: Params) -> u32 {
    if (p.layout_id == LAYOUT_JOINT) { return joint_of(c); }
    if (s == 0u) { return c & 127u; }
    if (s == 1u) { return (c >> 7u) & 1u; }
    if (s == 2u) { return (c >> 8u) & 1u; }
    return (c >> 9u) & 1u;
}

// Primary context id (format::tables::Space::context), except for J in its neighbor form:
// there the index into its map over the window of exponent classes (format::tables::Window),
// near·2n + (er - lo)·2 + rs with near = (m2·(W1+1) + nb)·3 + up, or NONE (no row) for a
// class outside the window. `nbc`: the neighbor's symbol code, or NONE when there is no
// neighbor in the chunk.
fn context(s: u32, c: u32, info: u32, nbc: u32, p: Params) -> u32 {
    let er = info & 255u;
    if (p.layout_id == LAYOUT_JOINT) {
        let e2 = er * 2u + ((info >> 8u) & 1u);
        if (p.nb_form[0] == 0u) { return e2; }
        // Wrapping: a class below the window lands above it.
        let k = e2 - 2u * p.win_lo;
        if (k >= 2u * p.win_n) { return NONE; }
        var nb = p.w1;
        var up = 0u;
        if (nbc != NONE) {
            nb = nbc & 127u;
            up = sign_state(nbc);
        }
        return ((((info >> 9u) & 3u) * (p.w1 + 1u) + nb) * 3u + up) * 2u * p.win_n + k;
    }
    let eb = er * p.w1 + (c & 127u);
    if (s == 0u) {
        if (p.nb_form[0] == 0u) { return er; }
        var nb = p.w1;
        if (nbc != NONE) { nb = nbc & 127u; }
        return ((((info >> 9u) & 3u) * (p.w1 + 1u) + nb) << 8u) + er;
    }
    if (s == 1u) { return eb; }
    if (s == 2u) { return eb * 2u + ((c >> 7u) & 1u); }
    var up = 0u;
    if (p.nb_form[3] != 0u && nbc != NONE) { up = sign_state(nbc); }
    return (eb * 3u + up) * 2u + ((info >> 8u) & 1u);
}

fn chunk_len(c: u32, n: u32) -> u32 {
    return min(CHUNK, n - c * CHUNK);
}

// Flat invocation index of a 2-D dispatch of 256-wide workgroups.
fn flat_index(wg: vec3<u32>, nwg: vec3<u32>, local: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + local;
}
