// Logits (Q8) -> frequency table of total 2^32 -> the query's answer (docs/INTEGER_GPT2.md
// §5, §10), one block of 1024 threads per queried item (a decode step has few items, so
// each item's passes over the vocabulary get many threads); the table stays on the device.
// Mirrors cpu/lm/freq.rs: w_j = EXP40[L - l_j] (0 past the table), f_j = 1 + floor(w_j R / W)
// with R = 2^32 - V, the remainder to the largest logit (lowest id on ties), then the match
// mix. Every frequency and every prefix sum below the total fits a u32 (the table sums to
// 2^32 and each entry is at least 1), so u32 sums that wrap at 2^32 are exact.

#define FREQ_THREADS 1024u
__shared__ int freq_best_v[FREQ_THREADS];
__shared__ u32 freq_best_i[FREQ_THREADS];
__shared__ u64 freq_red64[FREQ_THREADS];
__shared__ u32 freq_red32[FREQ_THREADS];

// Block-wide sum of u32s (wrapping). Call from uniform control flow.
LS_FN u32 freq_sum32(u32 l, u32 v) {
    freq_red32[l] = v;
    __syncthreads();
    for (u32 o = FREQ_THREADS / 2u; o > 0u; o /= 2u) {
        if (l < o) { freq_red32[l] += freq_red32[l + o]; }
        __syncthreads();
    }
    u32 s = freq_red32[0];
    __syncthreads();
    return s;
}

// Block-wide exclusive scan of u32s (wrapping): the sum of `v` over the threads before `l`.
// Call from uniform control flow.
LS_FN u32 freq_scan32(u32 l, u32 v) {
    freq_red32[l] = v;
    __syncthreads();
    for (u32 o = 1u; o < FREQ_THREADS; o *= 2u) {
        u32 acc = freq_red32[l];
        if (l >= o) { acc += freq_red32[l - o]; }
        __syncthreads();
        freq_red32[l] = acc;
        __syncthreads();
    }
    u32 before = freq_red32[l] - v;
    __syncthreads();
    return before;
}

// b1 logits (n x rows i32), b2 exp40 (u64), b3 queries (per row: kind 0 symbol / 1 target,
// its value, the mixed-in token (0xffffffff: none), lambda), b4 by_gap (n x exp_len u32),
// b5 freqs (n x rows u32), b6 answers (per row: symbol, cum, freq, 0). p: n, rows (the
// vocabulary), exp_len.
LS_KERNEL lm_frequencies(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 l = threadIdx.x;
    u32 v = p.rows;
    const int *logits = (const int *)b1 + (u64)row * v;
    u32 *by_gap = b4 + (u64)row * p.exp_len;
    u32 *f = b5 + (u64)row * v;
    // L = max logit, arg = its lowest id
    int bv = (int)0x80000000u;
    u32 bi = 0xffffffffu;
    for (u32 j = l; j < v; j += FREQ_THREADS) {
        if (logits[j] > bv) {
            bv = logits[j];
            bi = j;
        }
    }
    freq_best_v[l] = bv;
    freq_best_i[l] = bi;
    __syncthreads();
    for (u32 o = FREQ_THREADS / 2u; o > 0u; o /= 2u) {
        if (l < o) {
            int ov = freq_best_v[l + o];
            u32 oi = freq_best_i[l + o];
            if (ov > freq_best_v[l] || (ov == freq_best_v[l] && oi < freq_best_i[l])) {
                freq_best_v[l] = ov;
                freq_best_i[l] = oi;
            }
        }
        __syncthreads();
    }
    int top = freq_best_v[0];
    u32 arg = freq_best_i[0];
    // W = sum of the weights (< 2^56)
    u64 wsum = 0u;
    for (u32 j = l; j < v; j += FREQ_THREADS) {
        u32 gap = (u32)top - (u32)logits[j];
        if (gap < p.exp_len) { wsum += (u64)ld64(b2, gap); }
    }
    freq_red64[l] = wsum;
    __syncthreads();
    for (u32 o = FREQ_THREADS / 2u; o > 0u; o /= 2u) {
        if (l < o) { freq_red64[l] += freq_red64[l + o]; }
        __syncthreads();
    }
    u64 total_w = freq_red64[0];
    // f by gap, each distinct gap once: floor(w r / W) from one reciprocal of W, as
    // cpu/lm/freq.rs's floor_by_gap (inv = floor(r 2^64 / W) < 2^64 when W > r; then
    // q = floor(w inv / 2^64) is the floor or one less, and the remainder w r - q W, in
    // 0..2W and so exact in wrapping u64 (W < 2^56), says which). The specification's
    // table always has W >= 2^40 > r; the plain division stays for any other.
    u64 r = (1ull << 32) - v;
    u64 inv = total_w > r ? (u64)(((u128)r << 64) / total_w) : 0u;
    for (u32 g = l; g < p.exp_len; g += FREQ_THREADS) {
        u64 w = (u64)ld64(b2, g);
        u64 q;
        if (total_w > r) {
            q = (u64)(((u128)w * inv) >> 64);
            q += w * r - q * total_w >= total_w ? 1u : 0u;
        } else {
            q = (u64)((u128)w * r / total_w);
        }
        by_gap[g] = 1u + (u32)q;
    }
    __syncthreads();
    u32 s = 0u;
    for (u32 j = l; j < v; j += FREQ_THREADS) {
        u32 gap = (u32)top - (u32)logits[j];
        u32 fj = gap < p.exp_len ? by_gap[gap] : 1u;
        f[j] = fj;
        s += fj;
    }
    u32 rest = 0u - freq_sum32(l, s);
    // the match mix: every other token gives up lambda / 2^16 of its frequency (keeping 1)
    const u32 *qr = b3 + 4u * row;
    u32 x = qr[2];
    u32 lambda = qr[3];
    int mixing = x < v && lambda != 0u && lambda < 65536u;
    u32 others = 0u;
    for (u32 j = l; j < v; j += FREQ_THREADS) {
        u32 fj = f[j];
        if (j == arg) { fj += rest; }
        if (mixing && j != x) {
            u32 take = (u32)(((u64)fj * lambda) >> 16);
            fj = fj - take > 1u ? fj - take : 1u;
            others += fj;
        }
        f[j] = fj;
    }
    u32 others_total = freq_sum32(l, others);
    if (mixing && l == 0u) { f[x] = 0u - others_total; }
    __syncthreads();
    // the answer: prefix sums over 256 contiguous blocks, then a scan inside one block
    u32 per = (v + FREQ_THREADS - 1u) / FREQ_THREADS;
    u32 j0 = l * per < v ? l * per : v;
    u32 j1 = j0 + per < v ? j0 + per : v;
    u32 bsum = 0u;
    for (u32 j = j0; j < j1; j++) { bsum += f[j]; }
    u32 pre = freq_scan32(l, bsum);
    u32 *out = b6 + 4u * row;
    if (qr[0] == 0u) {
        u32 sym = qr[1];
        if (sym >= j0 && sym < j1) {
            u32 cum = pre;
            for (u32 j = j0; j < sym; j++) { cum += f[j]; }
            out[0] = sym;
            out[1] = cum;
            out[2] = f[sym];
        }
    } else {
        u32 goal = qr[1];
        if (goal >= pre && goal - pre < bsum) {
            u32 cum = pre;
            for (u32 j = j0; j < j1; j++) {
                if (goal - cum < f[j]) {
                    out[0] = j;
                    out[1] = cum;
                    out[2] = f[j];
                    break;
                }
                cum += f[j];
            }
        }
    }
}

// The prefix sums of a row's frequencies (lm_frequencies' output, unmixed) in the order
// `order`, at the indices the mixing encoder will read (docs/INTEGER_GPT2.md §13.3), one
// block of 1024 threads per row: each thread sums a contiguous piece of the order, a block
// scan gives every piece's start, and each wanted index adds the tokens of its piece up to
// it. Only those sums go back to the host, not the table. u32 sums wrap exactly as there.
// b1 freqs (n x rows u32), b2 order (k token ids), b3 per row the first of its indices in
// b4 (n + 1 words), b4 the indices (per row ascending, each at most k: cum[i] sums the first
// i tokens of the order), b5 the sums at them (laid out as b4). p: n, rows (the
// vocabulary), k (the order's length).
LS_KERNEL lm_prefix_at(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 l = threadIdx.x;
    const u32 *f = b1 + (u64)row * p.rows;
    const u32 *order = b2;
    u32 per = (p.k + FREQ_THREADS - 1u) / FREQ_THREADS;
    per = per > 0u ? per : 1u;
    u32 j0 = lm_min(l * per, p.k);
    u32 j1 = lm_min(j0 + per, p.k);
    u32 bsum = 0u;
    for (u32 j = j0; j < j1; j++) { bsum += f[order[j]]; }
    // Each piece's start (the sum of the pieces before it).
    freq_best_i[l] = freq_scan32(l, bsum);
    __syncthreads();
    for (u32 w = b3[row] + l; w < b3[row + 1u]; w += FREQ_THREADS) {
        u32 i = b4[w];
        u32 s = 0u;
        if (i > 0u) {
            // Token i - 1 is in piece c, which starts at or before it.
            u32 c = (i - 1u) / per;
            s = freq_best_i[c];
            for (u32 j = c * per; j < i; j++) { s += f[order[j]]; }
        }
        b5[w] = s;
    }
}
