// Forward residual transform, symbol codes and per-tensor histograms (integer atomics):
// shaders/residual.wgsl on CUDA. One thread per element (per code word for ls_symbols; a
// block per range of elements for ls_histogram).

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

// Histograms, privatized in shared memory: each block counts its range of elements into a
// __shared__ histogram, then merges it into the tensor's (b5) with one global atomic per
// non-zero bin, instead of one global atomic per element and stage.
//
// A stage's whole table does not fit: contexts x alphabet is up to 52k bins (bf16's S stage:
// 256 exponent classes x 204), shared memory holds HIST_SH_BINS. Every context form has the
// reference's exponent class er as one factor (context = er * rest_count + rest, or for B's
// neighbor form rest * 256 + er), and a block's elements share few classes, so the shared
// histogram holds a window of classes, for every stage at once, ending at the block's
// largest class (where most weights are). Elements outside the window, and stages whose
// bins per class leave no room for even one (B's neighbor form of 64-bit floats), count in
// global memory directly. The counts are the same either way.
#define HIST_SH_BINS 8192u

// Contexts per exponent class of stage s (the "rest" of its context form).
LS_FN u32 rest_count(u32 s, const Params *p) {
    if (p->layout_id == LAYOUT_JOINT) { return 2u; }
    if (s == 0u) { return p->nb_form[0] != 0u ? 4u * (p->w1 + 1u) : 1u; }
    if (s == 1u) { return p->w1; }
    if (s == 2u) { return 2u * p->w1; }
    return 6u * p->w1;
}

LS_FN u32 er_last(u32 s, const Params *p) {
    return p->layout_id != LAYOUT_JOINT && s == 0u && p->nb_form[0] != 0u;
}

// The context of class er and rest r, and the rest of a context of class er.
LS_FN u32 ctx_compose(u32 s, u32 er, u32 r, const Params *p) {
    return er_last(s, p) ? (r << 8u) + er : er * rest_count(s, p) + r;
}

LS_FN u32 ctx_rest(u32 s, u32 ctx, u32 er, const Params *p) {
    return er_last(s, p) ? ctx >> 8u : ctx - er * rest_count(s, p);
}

// b1 reference, b4 symbol codes, b5 counts (zeroed; per stage at hist_off, context-major).
// Any grid: block b counts elements [b * per, (b + 1) * per), per = ceil(n / blocks).
LS_KERNEL ls_histogram(LS_ARGS) {
    __shared__ u32 sh[HIST_SH_BINS];
    __shared__ u32 sh_er_max;
    // Per stage: alphabet, contexts per class, global offset (copied from the parameter
    // block with constant indices: indexing it by a loop variable costs a local-memory copy).
    __shared__ u32 sh_alpha[4], sh_rest[4], sh_off[4];
    u32 t = threadIdx.x;
    u32 per = (p.n + gridDim.x - 1u) / gridDim.x;
    u32 first = ls_min(blockIdx.x * per, p.n);
    u32 end = ls_min(first + per, p.n);
    if (t == 0u) {
        sh_er_max = 0u;
        for (u32 s = 0u; s < 4u; s++) {
            sh_alpha[s] = s < p.n_stages ? p.alpha[s] : 0u;
            sh_rest[s] = rest_count(s, &p);
            sh_off[s] = p.hist_off[s];
        }
    }
    __syncthreads();
    // Bins per exponent class, all stages; classes in the window. J's neighbor form counts
    // in global memory: its context is an index over the tensor's window of classes, with
    // the class not the outer factor, and a class has 2 x 4 (W1+1) x 3 rows of up to 247
    // bins, more than the shared histogram holds even for fp8.
    u32 slice = 0u;
    for (u32 s = 0u; s < p.n_stages; s++) { slice += sh_rest[s] * sh_alpha[s]; }
    u32 k = ls_min(HIST_SH_BINS / slice, 256u);
    if (p.layout_id == LAYOUT_JOINT && p.nb_form[0] != 0u) { k = 0u; }
    for (u32 i = t; i < k * slice; i += blockDim.x) { sh[i] = 0u; }
    for (u32 j = first + t; j < end; j += blockDim.x) {
        atomicMax(&sh_er_max, ref_info(load_elem(b1, j, p.width), &p) & 255u);
    }
    __syncthreads();
    u32 lo = sh_er_max + 1u >= k ? sh_er_max + 1u - k : 0u;
    for (u32 j = first + t; j < end; j += blockDim.x) {
        u32 c = get_code(b4, j);
        u32 info = ref_info(load_elem(b1, j, p.width), &p);
        u32 er = info & 255u;
        u32 nbc = NONE;
        if (p.neighbor != 0u && (j % CHUNK) >= p.neighbor) { nbc = get_code(b4, j - p.neighbor); }
        u32 base = 0u;
        for (u32 s = 0u; s < p.n_stages; s++) {
            u32 a = sh_alpha[s];
            u32 ctx = context(s, c, info, nbc, &p);
            // NONE: J's neighbor form, a class outside this pass's piece of the window
            // (another pass counts it).
            if (present(s, c) && ctx != NONE) {
                u32 sym = symbol_of(s, c, &p);
                if (er >= lo && er - lo < k) {
                    u32 r = ctx_rest(s, ctx, er, &p);
                    atomicAdd(&sh[base + ((er - lo) * sh_rest[s] + r) * a + sym], 1u);
                } else {
                    atomicAdd(&b5[sh_off[s] + ctx * a + sym], 1u);
                }
            }
            base += k * sh_rest[s] * a;
        }
    }
    __syncthreads();
    for (u32 i = t; i < k * slice; i += blockDim.x) {
        u32 v = sh[i];
        if (v == 0u) { continue; }
        u32 s = 0u;
        u32 at = i;
        while (s + 1u < p.n_stages && at >= k * sh_rest[s] * sh_alpha[s]) {
            at -= k * sh_rest[s] * sh_alpha[s];
            s++;
        }
        u32 a = sh_alpha[s];
        u32 per_class = sh_rest[s] * a;
        u32 er = lo + at / per_class;
        u32 r = (at % per_class) / a;
        atomicAdd(&b5[sh_off[s] + ctx_compose(s, er, r, &p) * a + at % a], v);
    }
}

// The reference's exponent classes, the window J's neighbor form is counted over: the largest
// 255 - er into b5[0] and the largest er into b5[1] (zeroed: zero is the identity of both),
// per block in shared memory first, so that one thread per block touches them. b1 reference;
// any grid, as ls_histogram.
LS_KERNEL ls_er_range(LS_ARGS) {
    __shared__ u32 sh_range[2];
    u32 t = threadIdx.x;
    u32 per = (p.n + gridDim.x - 1u) / gridDim.x;
    u32 first = ls_min(blockIdx.x * per, p.n);
    u32 end = ls_min(first + per, p.n);
    if (t == 0u) {
        sh_range[0] = 0u;
        sh_range[1] = 0u;
    }
    __syncthreads();
    u32 below = 0u;
    u32 top = 0u;
    for (u32 j = first + t; j < end; j += blockDim.x) {
        u32 er = ref_info(load_elem(b1, j, p.width), &p) & 255u;
        below = 255u - er > below ? 255u - er : below;
        top = er > top ? er : top;
    }
    atomicMax(&sh_range[0], below);
    atomicMax(&sh_range[1], top);
    __syncthreads();
    if (t == 0u) {
        atomicMax(&b5[0], sh_range[0]);
        atomicMax(&b5[1], sh_range[1]);
    }
}
