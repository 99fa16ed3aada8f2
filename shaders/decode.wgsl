// Decoding: dec_lanes runs the 32 lanes of a chunk step by step, stage by stage, lane by
// lane (src/delta/chunk.rs). dec_tail then unpacks raw tails with a prefix sum of
// their lengths and applies the inverse transform. Malformed input sets an error code in
// ledger and never loops or reads out of bounds.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> refs: array<u32>;
@group(0) @binding(2) var<storage, read> tables: array<u32>;
// words of every chunk (two per u32) | tails from u32 index p.pad (+2 words of padding)
@group(0) @binding(3) var<storage, read> stream: array<u32>;
// per chunk: word base, word count, tail base (bits, multiple of 32), tail bits, 32 states;
// then the error code at nc * 36
@group(0) @binding(4) var<storage, read_write> ledger: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> codes: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> out: array<atomic<u32>>;

fn load_ref(j: u32) -> vec2<u32> {
    let i = word_index(j, p.width);
    var hi = 0u;
    if (p.width == 64u) { hi = refs[i + 1u]; }
    return load_elem(j, p.width, refs[i], hi);
}

fn get_code(j: u32) -> u32 {
    return (atomicLoad(&codes[j >> 1u]) >> ((j & 1u) * 16u)) & 0xffffu;
}

// 1 no row for a context, 2 word stream ended early, 3 lanes not back in their initial state,
// 4 raw tail too short, 5 raw tail too long.
fn fail(code: u32) {
    atomicOr(&ledger[p.n_chunks * 36u], 1u << code);
}

fn with_symbol(s: u32, sym: u32) -> u32 {
    if (p.layout_id == LAYOUT_JOINT) { return code_of_joint(sym); }
    if (s == 0u) { return sym; }
    if (s == 1u) { return sym << 7u; }
    if (s == 2u) { return sym << 8u; }
    return sym << 9u;
}

var<workgroup> ballot: array<atomic<u32>, 3>;

// Row lookup and state advance for one symbol; returns the symbol (NONE: no row). No loop:
// llvmpipe caps every loop at 65535 iterations per invocation, so slots map to symbols
// through a table (4 symbols per u32, at hist_off[s]) for the B and J stages.
fn dec_symbol(s: u32, ctx: u32, x: ptr<function, u32>) -> u32 {
    if (ctx == NONE) { return NONE; }
    let ri = tables[p.map_off[s] + ctx];
    if (ri == NONE) { return NONE; }
    let a = p.alpha[s];
    let rb = p.rows_off[s] + ri * a * 2u;
    let slot = *x & SLOT_MASK;
    var sym = 0u;
    if (a == 2u) {
        sym = select(0u, 1u, slot >= tables[rb + 3u]);
    } else {
        let at = p.hist_off[s] + ri * (TOTAL / 4u) + slot / 4u;
        sym = (tables[at] >> ((slot & 3u) * 8u)) & 0xffu;
    }
    let f = tables[rb + sym * 2u];
    let start = tables[rb + sym * 2u + 1u];
    *x = f * (*x >> 12u) + (*x & SLOT_MASK) - start;
    return sym;
}

// The 32 lanes of a chunk in lockstep (one workgroup per chunk). Lanes that need a word take
// consecutive words in lane order: a ballot through workgroup memory, triple-buffered so one
// barrier per (step, stage) suffices.
@compute @workgroup_size(32)
fn dec_lanes(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) l: u32) {
    let c = wg.x;
    let n = chunk_len(c, p.n);
    let base = c * CHUNK;
    let mb = c * 36u;
    let wbase = atomicLoad(&ledger[mb]);
    let nwords = atomicLoad(&ledger[mb + 1u]);
    var x = atomicLoad(&ledger[mb + 4u + l]);
    var pos = 0u;
    var buf = 0u;
    let steps = (n + 31u) / 32u;
    for (var st = 0u; st < steps; st++) {
        let jj = st * 32u + l;
        let live = jj < n;
        let j = base + jj;
        var info = 0u;
        if (live) { info = ref_info(load_ref(j), p); }
        // The neighbor (at least LANES elements back) was decoded in an earlier step.
        var nbc = NONE;
        if (live && p.neighbor != 0u && jj >= p.neighbor) { nbc = get_code(j - p.neighbor); }
        var code = 0u;
        for (var s = 0u; s < p.n_stages; s++) {
            var need = false;
            if (live && present(s, code)) {
                var sym = dec_symbol(s, context(s, code, info, nbc, p), &x);
                if (sym == NONE) {
                    fail(1u);
                    sym = 0u;
                }
                need = x < RANS_L;
                code = code | with_symbol(s, sym);
            }
            if (need) { atomicOr(&ballot[buf], 1u << l); }
            workgroupBarrier();
            let m = atomicLoad(&ballot[buf]);
            // The buffer of two groups ago: every lane has read it by now.
            if (l == 0u) { atomicStore(&ballot[(buf + 2u) % 3u], 0u); }
            if (need) {
                let q = pos + countOneBits(m & ((1u << l) - 1u));
                if (q < nwords) {
                    let wi = wbase + q;
                    x = (x << 16u) | ((stream[wi >> 1u] >> ((wi & 1u) * 16u)) & 0xffffu);
                } else {
                    fail(2u);
                }
            }
            pos += countOneBits(m);
            buf = (buf + 1u) % 3u;
        }
        if (live) { atomicOr(&codes[j >> 1u], code << ((j & 1u) * 16u)); }
        storageBarrier();
    }
    if (x != RANS_L || pos != nwords) { fail(3u); }
}

fn tail_len(c: u32) -> u32 {
    let b = c & 127u;
    if (b >= 4u) { return b - 3u; }
    return 0u;
}

fn get_bits(pos: u32, len: u32) -> vec2<u32> {
    let w = p.pad + (pos >> 5u);
    let sh = pos & 31u;
    let w0 = stream[w];
    let w1 = stream[w + 1u];
    let w2 = stream[w + 2u];
    var v = vec2<u32>(w0, w1);
    if (sh != 0u) {
        v = vec2<u32>((w0 >> sh) | (w1 << (32u - sh)), (w1 >> sh) | (w2 << (32u - sh)));
    }
    return v & mask64(len);
}

fn compose(c: u32, tail: vec2<u32>) -> vec2<u32> {
    let b = c & 127u;
    if (b == 0u) { return vec2<u32>(0u, 0u); }
    if (b == 1u) { return vec2<u32>(1u, 0u); }
    if (b == 2u) { return vec2<u32>(2u | ((c >> 7u) & 1u), 0u); }
    let top = 4u | (((c >> 7u) & 1u) << 1u) | ((c >> 8u) & 1u);
    return shl64(vec2<u32>(top, 0u), b - 3u) | tail;
}

fn displacement(v: vec2<u32>, neg: u32) -> vec2<u32> {
    var d = v;
    if (p.layout_id != LAYOUT_PAPER) {
        if (neg == 1u) { d = neg64(v); }
    } else {
        d = shr64(v, 1u);
        if ((v.x & 1u) == 1u) { d = d ^ vec2<u32>(0xffffffffu, 0xffffffffu); }
    }
    return d & mask64(p.width);
}

fn store_out(j: u32, x: vec2<u32>) {
    let w = p.width;
    let i = word_index(j, w);
    if (w == 8u) {
        atomicOr(&out[i], x.x << ((j & 3u) * 8u));
    } else if (w == 16u) {
        atomicOr(&out[i], x.x << ((j & 1u) * 16u));
    } else if (w == 32u) {
        atomicStore(&out[i], x.x);
    } else {
        atomicStore(&out[i], x.x);
        atomicStore(&out[i + 1u], x.y);
    }
}

@compute @workgroup_size(256)
fn dec_tail(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let c = wg.x;
    let n = chunk_len(c, p.n);
    let per = (n + 255u) / 256u;
    let j0 = min(t * per, n);
    let j1 = min(j0 + per, n);
    let base = c * CHUNK;
    let tbase = atomicLoad(&ledger[c * 36u + 2u]);
    let tbits = atomicLoad(&ledger[c * 36u + 3u]);
    var sum = 0u;
    for (var jj = j0; jj < j1; jj++) {
        sum += tail_len(get_code(base + jj));
    }
    let sc = wg_scan(t, sum);
    if (t == 0u && sc.y < tbits) { fail(5u); }
    var pos = sc.x;
    for (var jj = j0; jj < j1; jj++) {
        let j = base + jj;
        let code = get_code(j);
        let len = tail_len(code);
        var tail = vec2<u32>(0u, 0u);
        if (len > 0u) {
            if (pos + len <= tbits) {
                tail = get_bits(tbase + pos, len);
            } else {
                fail(4u);
            }
            pos += len;
        }
        let d = displacement(compose(code, tail), (code >> 9u) & 1u);
        let r = load_ref(j);
        store_out(j, from_key(add64(key(r, p.width), d) & mask64(p.width), p.width));
    }
}
