// Per-row int8 quantization with an integer scale (docs/INTEGER_GPT2.md §4), one block of 256
// threads per row: y (i64, Q`frac`) -> four int8 per u32 word (zero padded to k4 words) and
// the row's scale (t_m, t_e). Mirrors format::lm::fixed::quantize_row.

#define QUANT_THREADS 256u
__shared__ u64 quant_max[QUANT_THREADS];

// b1 y (n x k i64), b2 xq (n x k4 words), b3 scales (n x (t_m, t_e)). p: n, k, k4, frac.
LS_KERNEL lm_quantize(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 t = threadIdx.x;
    u64 base = (u64)row * p.k;
    u64 m = 0u;
    for (u32 i = t; i < p.k; i += QUANT_THREADS) {
        i64 v = ld64(b1, base + i);
        u64 a = v < 0 ? 0ull - (u64)v : (u64)v;
        if (a > m) { m = a; }
    }
    quant_max[t] = m;
    __syncthreads();
    for (u32 off = QUANT_THREADS / 2u; off > 0u; off /= 2u) {
        if (t < off && quant_max[t + off] > quant_max[t]) { quant_max[t] = quant_max[t + off]; }
        __syncthreads();
    }
    i128 a = (i128)quant_max[0];
    if (t == 0u) {
        if (a == 0) {
            b3[2u * row] = 0u;
            b3[2u * row + 1u] = 0u;
        } else {
            // t_m = rdiv(A * 2^k, 127) in [2^15, 2^16), from k = 22 - floor(log2 A)
            int k = 22 - ((int)bits128((u128)a) - 1);
            for (;;) {
                i128 tm = k >= 0 ? rdiv_pos(a << k, 127) : rdiv_pos(a, (i128)127 << (-k));
                if (tm >= 65536) {
                    k -= 1;
                } else if (tm < 32768) {
                    k += 1;
                } else {
                    b3[2u * row] = (u32)tm;
                    b3[2u * row + 1u] = (u32)(p.frac + k);
                    break;
                }
            }
        }
    }
    Recip rc;
    rc.r = 0;
    rc.s = 0;
    if (a != 0) { rc = recip(a); }
    for (u32 w = t; w < p.k4; w += QUANT_THREADS) {
        u32 word = 0u;
        for (u32 b = 0u; b < 4u; b++) {
            u32 i = 4u * w + b;
            int q = 0;
            if (i < p.k && a != 0) {
                i128 v = div_recip(127 * (i128)ld64(b1, base + i), rc);
                q = (int)(v < -127 ? -127 : (v > 127 ? 127 : v));
            }
            word |= ((u32)q & 0xffu) << (8u * b);
        }
        b2[(u64)row * p.k4 + w] = word;
    }
}
