// Interleaved rANS lanes and raw-tail packing of every chunk, in the exact order of
// src/format/chunk.rs (shaders/encode.wgsl on CUDA). Variable-length outputs are placed with
// prefix sums:
//
// 1. ls_enc_lanes (pass 0): one warp per chunk, one thread per lane; every lane encodes its
//    elements (reverse order, as the CPU does) and marks, per (step, stage) group, whether
//    it flushed a word: one bit per lane.
// 2. ls_enc_scan: per chunk, exclusive prefix of the groups' popcounts in decoding order.
//    The host turns per-chunk totals into chunk bases.
// 3. ls_enc_lanes (pass 1): the same encode again; a word flushed by lane l in group g lands
//    at base + prefix[g] + (lanes below l that flushed in g), which is where the reversed
//    CPU stream has it. Final states are stored.
// ls_enc_tail (pass 0 counts, pass 1 writes) packs tails LSB first in element order.
//
// Buffers: b1 reference, b2 displacements, b3 symbol codes, b4 tables (per stage: context ->
// row map at map_off, then (freq, start) per row and symbol at rows_off), b5 the ledger
// (masks [nc * GROUPS] | prefix [nc * GROUPS] | word totals [nc] | tail totals [nc] | word
// bases [nc] | tail bases [nc] | states [nc * 32]), b6 output (words, two per u32, then
// tails from u32 index p.pad).

LS_FN u32 off_prefix(const Params *p) { return p->n_chunks * GROUPS; }
LS_FN u32 off_wtot(const Params *p) { return 2u * p->n_chunks * GROUPS; }
LS_FN u32 off_ttot(const Params *p) { return off_wtot(p) + p->n_chunks; }
LS_FN u32 off_wbase(const Params *p) { return off_ttot(p) + p->n_chunks; }
LS_FN u32 off_tbase(const Params *p) { return off_wbase(p) + p->n_chunks; }
LS_FN u32 off_states(const Params *p) { return off_tbase(p) + p->n_chunks; }

// Launched with 32 threads per block, one block per chunk. Lanes are independent here: the
// ledger's masks and prefixes place every word, so no lane waits for another.
LS_KERNEL ls_enc_lanes(LS_ARGS) {
    u32 c = blockIdx.x;
    u32 l = threadIdx.x;
    u32 n = chunk_len(c, p.n);
    u32 base = c * CHUNK;
    u32 x = RANS_L;
    for (u32 step = (n + 31u) / 32u; step > 0u; step--) {
        u32 st = step - 1u;
        u32 jj = st * 32u + l;
        if (jj >= n) { continue; }
        u32 j = base + jj;
        u32 code = get_code(b3, j);
        u32 info = ref_info(load_elem(b1, j, p.width), &p);
        u32 nbc = NONE;
        if (p.neighbor != 0u && jj >= p.neighbor) { nbc = get_code(b3, j - p.neighbor); }
        for (u32 s1 = p.n_stages; s1 > 0u; s1--) {
            u32 s = s1 - 1u;
            if (!present(s, code)) { continue; }
            // A context without a row (J's neighbor form only, and never with tables made
            // from these counts) codes nothing: the lookups stay in bounds, and the
            // encoder's verify refuses the stream.
            u32 ctx = context(s, code, info, nbc, &p);
            if (ctx == NONE) { continue; }
            u32 ri = b4[p.map_off[s] + ctx];
            if (ri == NONE) { continue; }
            u32 e = p.rows_off[s] + (ri * p.alpha[s] + symbol_of(s, code, &p)) * 2u;
            u32 f = b4[e];
            u32 start = b4[e + 1u];
            u32 g = c * GROUPS + st * 4u + s;
            if (f < TOTAL && x >= (f << 20u)) {
                if (p.pass_ == 0u) {
                    atomicOr(&b5[g], 1u << l);
                } else {
                    u32 m = b5[g];
                    u32 pos = b5[off_wbase(&p) + c] + b5[off_prefix(&p) + g]
                        + (u32)__popc(m & ((1u << l) - 1u));
                    atomicOr(&b6[pos >> 1u], (x & 0xffffu) << ((pos & 1u) * 16u));
                }
                x >>= 16u;
            }
            x = (x / f) * TOTAL + (x % f) + start;
        }
    }
    if (p.pass_ == 1u) { b5[off_states(&p) + c * 32u + l] = x; }
}

// SCAN_THREADS threads per block, one block per chunk.
LS_KERNEL ls_enc_scan(LS_ARGS) {
    u32 c = blockIdx.x;
    u32 t = threadIdx.x;
    u32 per = GROUPS / SCAN_THREADS;
    u32 g0 = c * GROUPS + t * per;
    u32 sum = 0u;
    for (u32 i = 0u; i < per; i++) { sum += (u32)__popc(b5[g0 + i]); }
    u32 acc;
    u32 total = block_scan(t, sum, &acc);
    for (u32 i = 0u; i < per; i++) {
        b5[off_prefix(&p) + g0 + i] = acc;
        acc += (u32)__popc(b5[g0 + i]);
    }
    if (t == 0u) { b5[off_wtot(&p) + c] = total; }
}

// OR `v` (at most 64 bits) into the tail region at bit `pos`.
LS_FN void put_bits(u32 *out, const Params *p, u32 pos, u64 v) {
    u32 w = p->pad + (pos >> 5u);
    u32 sh = pos & 31u;
    u32 lo = (u32)v;
    u32 hi = (u32)(v >> 32u);
    atomicOr(&out[w], lo << sh);
    u32 mid = sh != 0u ? (lo >> (32u - sh)) | (hi << sh) : hi;
    if (mid != 0u) { atomicOr(&out[w + 1u], mid); }
    if (sh != 0u) {
        u32 top = hi >> (32u - sh);
        if (top != 0u) { atomicOr(&out[w + 2u], top); }
    }
}

// SCAN_THREADS threads per block, one block per chunk; each thread packs a contiguous run.
LS_KERNEL ls_enc_tail(LS_ARGS) {
    u32 c = blockIdx.x;
    u32 t = threadIdx.x;
    u32 n = chunk_len(c, p.n);
    u32 per = (n + SCAN_THREADS - 1u) / SCAN_THREADS;
    u32 j0 = ls_min(t * per, n);
    u32 j1 = ls_min(j0 + per, n);
    u32 base = c * CHUNK;
    u32 sum = 0u;
    for (u32 jj = j0; jj < j1; jj++) { sum += tail_len(get_code(b3, base + jj)); }
    u32 excl;
    u32 total = block_scan(t, sum, &excl);
    if (p.pass_ == 0u) {
        if (t == 0u) { b5[off_ttot(&p) + c] = total; }
        return;
    }
    u32 pos = b5[off_tbase(&p) + c] + excl;
    for (u32 jj = j0; jj < j1; jj++) {
        u32 len = tail_len(get_code(b3, base + jj));
        if (len == 0u) { continue; }
        u32 neg;
        u64 v = coded_value(load_elem(b2, base + jj, p.width), &p, &neg);
        put_bits(b6, &p, pos, v & mask64(len));
        pos += len;
    }
}
