// The int8 matmul with the integer rescale (docs/INTEGER_GPT2.md §4) on tensor cores: IMMA
// (mma.sync m16n8k32: int8 products summed exactly into i32) where the device has it
// (sm_80 on), per word __dp4a otherwise and in the host emulation; then
// out = clamp(round_shift64(acc * m16 * t_m, e16 + t_e - frac) + bias, +-clamp).
// Mirrors cpu/lm/{matmul,rescale}.rs. Integer sums do not depend on their order, so every
// path gives the same acc (every partial sum is bounded like the whole, |acc| <= 2^27).
//
// A block is four warps and MM_ITEMS items. Each warp owns a tile of 16 weight rows x 64
// items as eight m16n8 accumulator fragments and walks k 32 int8 (8 words) at a time.
// p.split chooses how the warps share a block: 1, four row tiles over the whole k (many
// items: compression); 4, one row tile whose k the four warps split (a decode step's few
// items: four times the warps to hide memory latency with), their sums meeting in shared
// memory. The host picks it; the bytes never depend on it.
//
// The weights are stored word-column-major (word c of row j at c * rows + j), their words
// padded with zeros to a multiple of 8 and followed by 64 spare words, and the items' buffer
// has room for whole 64-item tiles plus 8 words: so a tile reads past its last row or item
// without a bound check (those results are never written), and past k only zeros of A.

#define MM_WARPS 4u
#define MM_ITEMS 64u
#define MM_TILES (MM_ITEMS / 8u)
__shared__ int mm_part[(MM_WARPS - 1u) * 32u * MM_TILES * 4u];

// A warp's product of a 16 x 32 int8 tile of A (element word (r, w) at a[r * row + w * word])
// with eight 32 x 8 tiles of B (item n of tile nt, word w at b[(8 nt + n) * item + w]),
// added to the lane's accumulator fragments: acc[4 nt + i] is row g + 8 (i / 2), item
// 8 nt + 2 q + i % 2, where g = lane / 4 and q = lane % 4 (PTX's m16n8k32 layout).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
LS_FN void mm_tiles(int *acc, const u32 *a, u64 row, u64 word, const u32 *b, u64 item,
                    u32 lane) {
    u32 g = lane / 4u, q = lane % 4u;
    u32 a0 = a[g * row + q * word], a1 = a[(g + 8u) * row + q * word];
    u32 a2 = a[g * row + (q + 4u) * word], a3 = a[(g + 8u) * row + (q + 4u) * word];
#pragma unroll
    for (u32 nt = 0u; nt < MM_TILES; nt++) {
        const u32 *bn = b + (8u * nt + g) * item;
        u32 b0 = bn[q], b1 = bn[q + 4u];
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+r"(acc[4u * nt]), "+r"(acc[4u * nt + 1u]), "+r"(acc[4u * nt + 2u]),
                       "+r"(acc[4u * nt + 3u])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
#else
// The same sums, each lane computing its own fragment's elements word by word.
LS_FN void mm_tiles(int *acc, const u32 *a, u64 row, u64 word, const u32 *b, u64 item,
                    u32 lane) {
    u32 g = lane / 4u, q = lane % 4u;
    for (u32 nt = 0u; nt < MM_TILES; nt++) {
        for (u32 i = 0u; i < 4u; i++) {
            const u32 *ar = a + (g + 8u * (i / 2u)) * row;
            const u32 *bn = b + (8u * nt + 2u * q + i % 2u) * item;
            int s = acc[4u * nt + i];
            for (u32 w = 0u; w < 8u; w++) { s = __dp4a((int)ar[w * word], (int)bn[w], s); }
            acc[4u * nt + i] = s;
        }
    }
}
#endif

// b1 weights (as above), b2 per row (m16, e16, bias, 0), b3 xq (n x k4 words), b4 scales
// (n x (t_m, t_e)), b5 out (n x rows i32). p: n, rows, k4, frac, clamp, split.
// Grid: ceil(rows / (16 * 4 / split)) x ceil(n / MM_ITEMS) blocks, row blocks first.
LS_KERNEL lm_matmul(LM_ARGS) {
    u32 warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
    u32 split = p.split;
    u32 block_rows = 16u * (MM_WARPS / split);
    u32 row_blocks = (p.rows + block_rows - 1u) / block_rows;
    u32 j0 = (blockIdx.x % row_blocks) * block_rows + (split == 1u ? 16u * warp : 0u);
    u32 t0 = (blockIdx.x / row_blocks) * MM_ITEMS;
    u32 steps = (p.k4 + 7u) / 8u;
    u32 per = (steps + split - 1u) / split;
    u32 s0 = split == 1u ? 0u : lm_min(warp * per, steps);
    u32 s1 = split == 1u ? steps : lm_min(s0 + per, steps);
    int acc[4u * MM_TILES];
    for (u32 i = 0u; i < 4u * MM_TILES; i++) { acc[i] = 0; }
    const u32 *b = b3 + (u64)t0 * p.k4;
    // (unrolled: the next steps' fragments load while this step's products run)
    LS_UNROLL4
    for (u32 s = s0; s < s1; s++) {
        mm_tiles(acc, b1 + (u64)8u * s * p.rows + j0, 1u, p.rows, b + 8u * s, p.k4, lane);
    }
    if (split > 1u) {
        // (split is uniform over the block, so every thread reaches the barrier)
        if (warp > 0u) {
            for (u32 i = 0u; i < 4u * MM_TILES; i++) {
                mm_part[((warp - 1u) * 4u * MM_TILES + i) * 32u + lane] = acc[i];
            }
        }
        __syncthreads();
        if (warp > 0u) { return; }
        for (u32 w = 1u; w < split; w++) {
            for (u32 i = 0u; i < 4u * MM_TILES; i++) {
                acc[i] += mm_part[((w - 1u) * 4u * MM_TILES + i) * 32u + lane];
            }
        }
    }
    u32 g = lane / 4u, q = lane % 4u;
    for (u32 h = 0u; h < 2u; h++) {
        u32 j = j0 + g + 8u * h;
        if (j >= p.rows) { continue; }
        i64 m16 = b2[4u * j];
        int e16 = (int)b2[4u * j + 1u];
        i64 bias = (int)b2[4u * j + 2u];
        for (u32 nt = 0u; nt < MM_TILES; nt++) {
            for (u32 e = 0u; e < 2u; e++) {
                u32 t = t0 + 8u * nt + 2u * q + e;
                if (t >= p.n) { continue; }
                // |sum| <= 2^27 and m16 * t_m < 2^32: the product is below 2^59
                i64 prod = (i64)acc[4u * nt + 2u * h + e] * m16 * (i64)b4[2u * t];
                i64 v = round_shift64(prod, e16 + (int)b4[2u * t + 1u] - p.frac) + bias;
                b5[(u64)t * p.rows + j] = (u32)(int)clamp64(v, (i64)p.clamp);
            }
        }
    }
}
