// The int8 matmul with the integer rescale (docs/INTEGER_GPT2.md §4): __dp4a (four int8
// products summed into an i32) per word, then
// out = clamp(round_shift64(acc * m16 * t_m, e16 + t_e - frac) + bias, +-clamp).
// One thread per weight row and MM_ITEMS items; the weights are stored word-column-major
// (word c of row j at c * rows + j), so a warp's 32 rows read 32 consecutive words.
// Mirrors cpu/lm/{matmul,rescale}.rs.

#define MM_ITEMS 4u

// b1 weights (k4 x rows words), b2 per row (m16, e16, bias, 0), b3 xq (n x k4 words),
// b4 scales (n x (t_m, t_e)), b5 out (n x rows i32). p: n, rows, k4, frac, clamp.
// Grid: ceil(rows / blockDim) x ceil(n / MM_ITEMS) blocks, row blocks first.
LS_KERNEL lm_matmul(LM_ARGS) {
    u32 row_blocks = (p.rows + blockDim.x - 1u) / blockDim.x;
    u32 j = (blockIdx.x % row_blocks) * blockDim.x + threadIdx.x;
    u32 t0 = (blockIdx.x / row_blocks) * MM_ITEMS;
    if (j >= p.rows || t0 >= p.n) { return; }
    const u32 *x[MM_ITEMS];
    int acc[MM_ITEMS];
    for (u32 i = 0u; i < MM_ITEMS; i++) {
        // items past n read item t0's words and are not written
        u32 t = t0 + i < p.n ? t0 + i : t0;
        x[i] = b3 + (u64)t * p.k4;
        acc[i] = 0;
    }
    for (u32 c = 0u; c < p.k4; c++) {
        int w = (int)b1[(u64)c * p.rows + j];
        for (u32 i = 0u; i < MM_ITEMS; i++) { acc[i] = __dp4a(w, (int)x[i][c], acc[i]); }
    }
    i64 m16 = b2[4u * j];
    int e16 = (int)b2[4u * j + 1u];
    i64 bias = (int)b2[4u * j + 2u];
    for (u32 i = 0u; i < MM_ITEMS; i++) {
        u32 t = t0 + i;
        if (t >= p.n) { break; }
        // |acc| <= 2^27 and m16 * t_m < 2^32: the product is below 2^59
        i64 prod = (i64)acc[i] * m16 * (i64)b4[2u * t];
        i64 v = round_shift64(prod, e16 + (int)b4[2u * t + 1u] - p.frac) + bias;
        b5[(u64)t * p.rows + j] = (u32)(int)clamp64(v, (i64)p.clamp);
    }
}
