// The int8 matmul with the integer rescale (docs/INTEGER_GPT2.md §4): __dp4a (four int8
// products summed into an i32) per word, then
// out = clamp(round_shift64(acc * m16 * t_m, e16 + t_e - frac) + bias, +-clamp).
// Mirrors cpu/lm/{matmul,rescale}.rs.
//
// A block of 256 threads takes MM_ROWS weight rows and MM_ITEMS items: thread t computes
// row t % MM_ROWS over slice t / MM_ROWS of the k words, so each warp reads 32 consecutive
// rows' words (the weights are stored word-column-major: word c of row j at c * rows + j)
// and four warps share one row's k. Splitting k gives a small launch (a decode step's few
// items) four times the warps to hide memory latency with; the slices' partial sums meet in
// shared memory, and integer sums do not depend on their order (every partial sum is
// bounded like the whole, |acc| <= 2^27).

#define MM_ROWS 64u
#define MM_SLICES 4u
#define MM_ITEMS 8u
__shared__ int mm_part[(MM_SLICES - 1u) * MM_ITEMS * MM_ROWS];

// b1 weights (k4 x rows words), b2 per row (m16, e16, bias, 0), b3 xq (n x k4 words),
// b4 scales (n x (t_m, t_e)), b5 out (n x rows i32). p: n, rows, k4, frac, clamp.
// Grid: ceil(rows / MM_ROWS) x ceil(n / MM_ITEMS) blocks, row blocks first.
LS_KERNEL lm_matmul(LM_ARGS) {
    u32 row_blocks = (p.rows + MM_ROWS - 1u) / MM_ROWS;
    u32 r = threadIdx.x % MM_ROWS;
    u32 slice = threadIdx.x / MM_ROWS;
    u32 j = (blockIdx.x % row_blocks) * MM_ROWS + r;
    u32 t0 = (blockIdx.x / row_blocks) * MM_ITEMS;
    // (uniform over the block, so no thread misses the barrier below)
    if (t0 >= p.n) { return; }
    u32 live = j < p.rows;
    u32 jr = live ? j : 0u;
    u32 per = (p.k4 + MM_SLICES - 1u) / MM_SLICES;
    u32 c0 = lm_min(slice * per, p.k4);
    u32 c1 = lm_min(c0 + per, p.k4);
    const u32 *x[MM_ITEMS];
    int acc[MM_ITEMS];
    for (u32 i = 0u; i < MM_ITEMS; i++) {
        // items past n read item t0's words and are not written
        u32 t = t0 + i < p.n ? t0 + i : t0;
        x[i] = b3 + (u64)t * p.k4;
        acc[i] = 0;
    }
    LS_UNROLL4
    for (u32 c = c0; c < c1; c++) {
        int w = (int)b1[(u64)c * p.rows + jr];
        for (u32 i = 0u; i < MM_ITEMS; i++) { acc[i] = __dp4a(w, (int)x[i][c], acc[i]); }
    }
    if (slice > 0u) {
        for (u32 i = 0u; i < MM_ITEMS; i++) {
            mm_part[((slice - 1u) * MM_ITEMS + i) * MM_ROWS + r] = acc[i];
        }
    }
    __syncthreads();
    if (slice != 0u || !live) { return; }
    i64 m16 = b2[4u * j];
    int e16 = (int)b2[4u * j + 1u];
    i64 bias = (int)b2[4u * j + 2u];
    for (u32 i = 0u; i < MM_ITEMS; i++) {
        u32 t = t0 + i;
        if (t >= p.n) { break; }
        int sum = acc[i];
        for (u32 s = 1u; s < MM_SLICES; s++) {
            sum += mm_part[((s - 1u) * MM_ITEMS + i) * MM_ROWS + r];
        }
        // |sum| <= 2^27 and m16 * t_m < 2^32: the product is below 2^59
        i64 prod = (i64)sum * m16 * (i64)b4[2u * t];
        i64 v = round_shift64(prod, e16 + (int)b4[2u * t + 1u] - p.frac) + bias;
        b5[(u64)t * p.rows + j] = (u32)(int)clamp64(v, (i64)p.clamp);
    }
}
