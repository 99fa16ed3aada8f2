// Integer LayerNorm (docs/INTEGER_GPT2.md §4), one block of 256 threads per row: h (Q12 i32)
// -> y (Q26 i64). Mirrors cpu/lm/norm.rs::layer_norm_row integer for integer.

#define NORM_THREADS 256u
__shared__ i64 norm_sum[NORM_THREADS];
__shared__ u128 norm_sq[NORM_THREADS];
__shared__ i128 norm_r;
__shared__ int norm_s;

// b1 h (n x d i32), b2 gamma (i32), b3 beta (i64), b4 y (n x d i64). p: n, d, eps.
LS_KERNEL lm_layer_norm(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 t = threadIdx.x;
    u32 d = p.d;
    const int *h = (const int *)b1 + (u64)row * d;
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
}
