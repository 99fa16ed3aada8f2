// Forward residual transform, symbol codes and per-tensor histograms (integer atomics):
// shaders/residual.wgsl on CUDA. One thread per element (per code word for ls_symbols).

// b1 reference, b2 target, b3 displacements (packed like the input, zeroed), b4 unused.
LS_KERNEL ls_residuals(LS_ARGS) {
    u32 j = flat_index();
    if (j >= p.n) { return; }
    u32 w = p.width;
    u64 d = (key(load_elem(b2, j, w), w) - key(load_elem(b1, j, w), w)) & mask64(w);
    store_elem(b3, j, w, d);
}

// b3 displacements, b4 symbol codes (16 bits per element; one thread writes a whole word,
// so the buffer needs no clearing between layouts).
LS_KERNEL ls_symbols(LS_ARGS) {
    u32 i = flat_index();
    u32 j = 2u * i;
    if (j >= p.n) { return; }
    u32 word = 0u;
    for (u32 k = 0u; k < 2u && j + k < p.n; k++) {
        u32 neg;
        u64 v = coded_value(load_elem(b3, j + k, p.width), &p, &neg);
        word |= sym_code(v, neg) << (16u * k);
    }
    b4[i] = word;
}

// b1 reference, b4 symbol codes, b5 counts (zeroed; per stage at hist_off, context-major).
LS_KERNEL ls_histogram(LS_ARGS) {
    u32 j = flat_index();
    if (j >= p.n) { return; }
    u32 c = get_code(b4, j);
    u32 info = ref_info(load_elem(b1, j, p.width), &p);
    u32 nbc = NONE;
    if (p.neighbor != 0u && (j % CHUNK) >= p.neighbor) { nbc = get_code(b4, j - p.neighbor); }
    for (u32 s = 0u; s < p.n_stages; s++) {
        if (present(s, c)) {
            u32 at = p.hist_off[s] + context(s, c, info, nbc, &p) * p.alpha[s] + symbol_of(s, c, &p);
            atomicAdd(&b5[at], 1u);
        }
    }
}
