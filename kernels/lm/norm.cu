// Integer LayerNorm (docs/INTEGER_GPT2.md §4), one block of 256 threads per row: h (Q12 i32)
// -> y (Q26 i64), then y quantized (lm_quantize_row) in the same launch, which the forward
// pass always does next; first, where asked, the residual add that precedes it. Mirrors
// cpu/lm/norm.rs::layer_norm_row integer for integer.

#define NORM_THREADS 256u
__shared__ i64 norm_sum[NORM_THREADS];
__shared__ u128 norm_sq[NORM_THREADS];
__shared__ i128 norm_r;
__shared__ int norm_s;

// b1 h (n x d i32), b2 gamma (i32), b3 beta (i64), b4 y (n x d i64), b5 xq (n x k4 words),
// b6 scales (n x (t_m, t_e)), b7 with p.add: a residual (n x d i32) to add to h first,
// h = clamp(h + b7, +-clamp). p: n, d, k4 (d / 4 rounded up), frac, eps, add, clamp.
LS_KERNEL lm_layer_norm(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 t = threadIdx.x;
    u32 d = p.d;
    const int *h = (const int *)b1 + (u64)row * d;
    if (p.add != 0u) {
        // (each thread adds the elements its loops below read)
        for (u32 i = t; i < d; i += NORM_THREADS) {
            u64 at = (u64)row * d + i;
            b1[at] = (u32)(int)clamp64((i64)(int)b1[at] + (int)b7[at], (i64)p.clamp);
        }
    }
    // S = sum h (|S| <= 2^39)
    i64 s = 0;
    for (u32 i = t; i < d; i += NORM_THREADS) { s += h[i]; }
    norm_sum[t] = s;
    __syncthreads();
    for (u32 off = NORM_THREADS / 2u; off > 0u; off /= 2u) {
        if (t < off) { norm_sum[t] += norm_sum[t + off]; }
        __syncthreads();
    }
    i64 total = norm_sum[0];
    // sum of dv^2, dv = n h_i - S (|dv| <= 2^40, the sum <= 2^93)
    u128 sq = 0u;
    for (u32 i = t; i < d; i += NORM_THREADS) {
        i128 dv = (i128)((i64)d * h[i] - total);
        sq += (u128)(dv * dv);
    }
    norm_sq[t] = sq;
    __syncthreads();
    for (u32 off = NORM_THREADS / 2u; off > 0u; off /= 2u) {
        if (t < off) { norm_sq[t] += norm_sq[t + off]; }
        __syncthreads();
    }
    if (t == 0u) {
        // U = floor(sq * 2^16 / n) + eps_q * n^2; D = isqrt(U)
        i64 eps = (i64)((u64)p.eps_lo | ((u64)p.eps_hi << 32));
        i128 u = (i128)((norm_sq[0] << 16) / (u128)d) + (i128)eps * ((i128)d * (i128)d);
        u128 dd = isqrt128((u128)u);
        if (dd == 0u) {
            norm_r = 0;
            norm_s = 0;
        } else {
            Recip rc = recip((i128)dd);
            norm_r = rc.r;
            norm_s = rc.s;
        }
    }
    __syncthreads();
    Recip rc;
    rc.r = norm_r;
    rc.s = norm_s;
    for (u32 i = t; i < d; i += NORM_THREADS) {
        i128 dv = (i128)((i64)d * h[i] - total);
        // |dv| <= 2^40: dv * 2^22 * r <= 2^92
        i128 z = rc.r == 0 ? 0 : div_recip(dv * ((i128)1 << 22), rc);
        i128 beta = ld64(b3, i);
        st64(b4, (u64)row * d + i, (i64)((i128)(int)b2[i] * z + beta));
    }
    lm_quantize_row(b4 + 2u * (u64)row * d, d, p.k4, p.frac, b5 + (u64)row * p.k4, b6 + 2u * row,
                    t, NORM_THREADS, (u64 *)norm_sum);
}
