// Decoding (shaders/decode.wgsl on CUDA): ls_dec_lanes runs the 32 lanes of a chunk step by
// step, stage by stage, as one warp (src/format/chunk.rs's order); ls_dec_tail then unpacks
// raw tails with a prefix sum of their lengths and applies the inverse transform. Malformed
// input sets an error bit in the ledger and never loops or reads out of bounds.
//
// Buffers: b1 reference, b2 tables (as encode.cu, plus the slot -> symbol bytes at hist_off
// for stages of more than two symbols), b3 stream (words of every chunk, two per u32, then
// tails from u32 index p.pad, plus two words of padding), b4 ledger (per chunk: word base,
// word count, tail base in bits (a multiple of 32), tail bits, 32 states; then the error
// bits at nc * 36), b5 symbol codes (zeroed), b6 output (zeroed).

// 1 no row for a context, 2 word stream ended early, 3 lanes not back in their initial state,
// 4 raw tail too short, 5 raw tail too long.
LS_FN void fail(u32 *ledger, const Params *p, u32 code) {
    atomicOr(&ledger[p->n_chunks * 36u], 1u << code);
}

LS_FN u32 with_symbol(const Params *p, u32 s, u32 sym) {
    if (p->layout_id == LAYOUT_JOINT) { return code_of_joint(sym); }
    if (s == 0u) { return sym; }
    if (s == 1u) { return sym << 7u; }
    if (s == 2u) { return sym << 8u; }
    return sym << 9u;
}

// Row lookup and state advance for one symbol; returns the symbol (NONE: no row). Slots map
// to symbols through a table (4 symbols per u32, at hist_off[s]) for the B and J stages, so
// no lane searches.
LS_FN u32 dec_symbol(const u32 *tables, const Params *p, u32 s, u32 ctx, u32 *x) {
    if (ctx == NONE) { return NONE; }
    u32 ri = tables[p->map_off[s] + ctx];
    if (ri == NONE) { return NONE; }
    u32 a = p->alpha[s];
    u32 rb = p->rows_off[s] + ri * a * 2u;
    u32 slot = *x & SLOT_MASK;
    u32 sym;
    if (a == 2u) {
        sym = slot >= tables[rb + 3u] ? 1u : 0u;
    } else {
        u32 at = p->hist_off[s] + ri * (TOTAL / 4u) + slot / 4u;
        sym = (tables[at] >> ((slot & 3u) * 8u)) & 0xffu;
    }
    u32 f = tables[rb + sym * 2u];
    u32 start = tables[rb + sym * 2u + 1u];
    *x = f * (*x >> 12u) + (*x & SLOT_MASK) - start;
    return sym;
}

// One warp (32 threads, one block) per chunk, lanes in lockstep. Lanes that need a word take
// consecutive words in lane order: a ballot, then each lane's rank among the refilling ones.
LS_KERNEL ls_dec_lanes(LS_ARGS) {
    u32 c = blockIdx.x;
    u32 l = threadIdx.x;
    u32 n = chunk_len(c, p.n);
    u32 base = c * CHUNK;
    u32 mb = c * 36u;
    u32 wbase = b4[mb];
    u32 nwords = b4[mb + 1u];
    u32 x = b4[mb + 4u + l];
    u32 pos = 0u;
    u32 below = (1u << l) - 1u;
    u32 steps = (n + 31u) / 32u;
    for (u32 st = 0u; st < steps; st++) {
        u32 jj = st * 32u + l;
        u32 live = jj < n;
        u32 j = base + jj;
        u32 info = live ? ref_info(load_elem(b1, j, p.width), &p) : 0u;
        // The neighbor (at least LANES elements back) was decoded in an earlier step, and
        // the __syncwarp below made its code visible.
        u32 nbc = NONE;
        if (live && p.neighbor != 0u && jj >= p.neighbor) { nbc = get_code(b5, j - p.neighbor); }
        u32 code = 0u;
        for (u32 s = 0u; s < p.n_stages; s++) {
            u32 need = 0u;
            if (live && present(s, code)) {
                u32 sym = dec_symbol(b2, &p, s, context(s, code, info, nbc, &p), &x);
                if (sym == NONE) {
                    fail(b4, &p, 1u);
                    sym = 0u;
                }
                need = x < RANS_L;
                code |= with_symbol(&p, s, sym);
            }
            u32 m = __ballot_sync(0xffffffffu, need);
            if (need) {
                u32 q = pos + (u32)__popc(m & below);
                if (q < nwords) {
                    u32 wi = wbase + q;
                    x = (x << 16u) | ((b3[wi >> 1u] >> ((wi & 1u) * 16u)) & 0xffffu);
                } else {
                    fail(b4, &p, 2u);
                }
            }
            pos += (u32)__popc(m);
        }
        if (live) { atomicOr(&b5[j >> 1u], code << ((j & 1u) * 16u)); }
        if (p.neighbor != 0u) { __syncwarp(0xffffffffu); }
    }
    if (x != RANS_L || pos != nwords) { fail(b4, &p, 3u); }
}

LS_FN u64 get_bits(const u32 *stream, const Params *p, u32 pos, u32 len) {
    u32 w = p->pad + (pos >> 5u);
    u32 sh = pos & 31u;
    u64 lo = stream[w] | ((u64)stream[w + 1u] << 32u);
    u64 v = sh != 0u ? (lo >> sh) | ((u64)stream[w + 2u] << (64u - sh)) : lo;
    return v & mask64(len);
}

LS_FN u64 compose(u32 c, u64 tail) {
    u32 b = c & 127u;
    if (b == 0u) { return 0ull; }
    if (b == 1u) { return 1ull; }
    if (b == 2u) { return 2u | ((c >> 7u) & 1u); }
    u64 top = 4u | (((c >> 7u) & 1u) << 1u) | ((c >> 8u) & 1u);
    return (top << (b - 3u)) | tail;
}

LS_FN u64 displacement(const Params *p, u64 v, u32 neg) {
    u64 d;
    if (p->layout_id != LAYOUT_PAPER) {
        d = neg ? 0ull - v : v;
    } else {
        d = v >> 1u;
        if (v & 1ull) { d = ~d; }
    }
    return d & mask64(p->width);
}

// SCAN_THREADS threads per block, one block per chunk; each thread unpacks a contiguous run.
LS_KERNEL ls_dec_tail(LS_ARGS) {
    u32 c = blockIdx.x;
    u32 t = threadIdx.x;
    u32 n = chunk_len(c, p.n);
    u32 per = (n + SCAN_THREADS - 1u) / SCAN_THREADS;
    u32 j0 = ls_min(t * per, n);
    u32 j1 = ls_min(j0 + per, n);
    u32 base = c * CHUNK;
    u32 tbase = b4[c * 36u + 2u];
    u32 tbits = b4[c * 36u + 3u];
    u32 sum = 0u;
    for (u32 jj = j0; jj < j1; jj++) { sum += tail_len(get_code(b5, base + jj)); }
    u32 pos;
    u32 total = block_scan(t, sum, &pos);
    if (t == 0u && total < tbits) { fail(b4, &p, 5u); }
    for (u32 jj = j0; jj < j1; jj++) {
        u32 j = base + jj;
        u32 code = get_code(b5, j);
        u32 len = tail_len(code);
        u64 tail = 0ull;
        if (len > 0u) {
            if (pos + len <= tbits) {
                tail = get_bits(b3, &p, tbase + pos, len);
            } else {
                fail(b4, &p, 4u);
            }
            pos += len;
        }
        u64 d = displacement(&p, compose(code, tail), (code >> 9u) & 1u);
        u64 r = load_elem(b1, j, p.width);
        store_elem(b6, j, p.width, from_key((key(r, p.width) + d) & mask64(p.width), p.width));
    }
}
