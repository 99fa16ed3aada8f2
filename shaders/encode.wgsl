// Interleaved rANS lanes and raw-tail packing of every chunk, in the exact order of
// src/delta/chunk.rs. Variable-length outputs are placed with prefix sums:
//
// 1. enc_lanes (pass 0): every lane encodes its elements (reverse order, as the CPU does) and
//    marks, per (step, stage) group, whether it flushed a word: one bit per lane.
// 2. enc_scan: per chunk, exclusive prefix of the groups' popcounts in decoding order.
//    The host turns per-chunk totals into chunk bases.
// 3. enc_lanes (pass 1): the same encode again; a word flushed by lane l in group g lands at
//    base + prefix[g] + (lanes below l that flushed in g), which is where the reversed CPU
//    stream has it. Final states are stored.
// enc_tail (pass 0 counts, pass 1 writes) packs tails LSB first in element order.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> refs: array<u32>;
@group(0) @binding(2) var<storage, read> resid: array<u32>;
@group(0) @binding(3) var<storage, read> codes: array<u32>;
// Per stage: context -> row map at map_off, then (freq, start) per row and symbol at rows_off.
@group(0) @binding(4) var<storage, read> tables: array<u32>;
// masks [nc * GROUPS] | prefix [nc * GROUPS] | word totals [nc] | tail totals [nc]
// | word bases [nc] | tail bases [nc] | states [nc * 32]
@group(0) @binding(5) var<storage, read_write> ledger: array<atomic<u32>>;
// words (two per u32) | tails from u32 index p.pad
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>;

fn load_ref(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = refs[i + 1u]; }
    return load_elem(j, p.width, refs[i], hi);
}

fn load_resid(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = resid[i + 1u]; }
    return load_elem(j, p.width, resid[i], hi);
}

fn get_code(j: u32) -> u32 {
    return (codes[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu;
}

fn off_prefix() -> u32 { return p.n_chunks * GROUPS; }
fn off_wtot() -> u32 { return 2u * p.n_chunks * GROUPS; }
fn off_ttot() -> u32 { return off_wtot() + p.n_chunks; }
fn off_wbase() -> u32 { return off_ttot() + p.n_chunks; }
fn off_tbase() -> u32 { return off_wbase() + p.n_chunks; }
fn off_states() -> u32 { return off_tbase() + p.n_chunks; }

@compute @workgroup_size(32)
fn enc_lanes(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let c = wg.x;
    let n = chunk_len(c, p.n);
    let base = c * CHUNK;
    var x = RANS_L;
    for (var step = (n + 31u) / 32u; step > 0u; step--) {
        let st = step - 1u;
        let jj = st * 32u + l;
        if (jj >= n) { continue; }
        let j = base + jj;
        let code = get_code(j);
        let info = ref_info(load_ref(j), p);
        var nbc = NONE;
        if (p.neighbor != 0u && jj >= p.neighbor) { nbc = get_code(j - p.neighbor); }
        for (var s1 = p.n_stages; s1 > 0u; s1--) {
            let s = s1 - 1u;
            if (!present(s, code)) { continue; }
            // A context without a row (J's neighbor form only, and never with tables made
            // from these counts) codes nothing: the lookups stay in bounds, and the
            // encoder's verify refuses the stream.
            let ctx = context(s, code, info, nbc, p);
            if (ctx == NONE) { continue; }
            let ri = tables[p.map_off[s] + ctx];
            if (ri == NONE) { continue; }
            let e = p.rows_off[s] + (ri * p.alpha[s] + symbol_of(s, code, p)) * 2u;
            let f = tables[e];
            let start = tables[e + 1u];
            let g = c * GROUPS + st * 4u + s;
            if (f < TOTAL && x >= (f << 20u)) {
                if (p.pass_ == 0u) {
                    atomicOr(&ledger[g], 1u << l);
                } else {
                    let m = atomicLoad(&ledger[g]);
                    let pos = atomicLoad(&ledger[off_wbase() + c]) + atomicLoad(&ledger[off_prefix() + g])
                        + countOneBits(m & ((1u << l) - 1u));
                    atomicOr(&out[pos >> 1u], (x & 0xffffu) << ((pos & 1u) * 16u));
                }
                x = x >> 16u;
            }
            x = (x / f) * TOTAL + (x % f) + start;
        }
    }
    if (p.pass_ == 1u) {
        atomicStore(&ledger[off_states() + c * 32u + l], x);
    }
}

@compute @workgroup_size(256)
fn enc_scan(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let c = wg.x;
    let per = GROUPS / 256u;
    let g0 = c * GROUPS + t * per;
    var sum = 0u;
    for (var i = 0u; i < per; i++) {
        sum += countOneBits(atomicLoad(&ledger[g0 + i]));
    }
    let sc = wg_scan(t, sum);
    var acc = sc.x;
    for (var i = 0u; i < per; i++) {
        atomicStore(&ledger[off_prefix() + g0 + i], acc);
        acc += countOneBits(atomicLoad(&ledger[g0 + i]));
    }
    if (t == 0u) {
        atomicStore(&ledger[off_wtot() + c], sc.y);
    }
}

fn tail_len(c: u32) -> u32 {
    let b = c & 127u;
    if (b >= 4u) { return b - 3u; }
    return 0u;
}

fn put_bits(pos: u32, v: vec2<u32>) {
    let w = p.pad + (pos >> 5u);
    let sh = pos & 31u;
    atomicOr(&out[w], v.x << sh);
    var hi = v.y;
    if (sh != 0u) { hi = (v.x >> (32u - sh)) | (v.y << sh); }
    if (hi != 0u) { atomicOr(&out[w + 1u], hi); }
    if (sh != 0u) {
        let top = v.y >> (32u - sh);
        if (top != 0u) { atomicOr(&out[w + 2u], top); }
    }
}

@compute @workgroup_size(256)
fn enc_tail(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let c = wg.x;
    let n = chunk_len(c, p.n);
    let per = (n + 255u) / 256u;
    let j0 = min(t * per, n);
    let j1 = min(j0 + per, n);
    let base = c * CHUNK;
    var sum = 0u;
    for (var jj = j0; jj < j1; jj++) {
        sum += tail_len(get_code(base + jj));
    }
    let sc = wg_scan(t, sum);
    if (p.pass_ == 0u) {
        if (t == 0u) { atomicStore(&ledger[off_ttot() + c], sc.y); }
        return;
    }
    var pos = atomicLoad(&ledger[off_tbase() + c]) + sc.x;
    for (var jj = j0; jj < j1; jj++) {
        let len = tail_len(get_code(base + jj));
        if (len == 0u) { continue; }
        let v = coded_value(load_resid(base + jj), p);
        put_bits(pos, v.xy & mask64(len));
        pos += len;
    }
}
