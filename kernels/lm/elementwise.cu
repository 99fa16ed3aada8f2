// The forward pass's element-wise steps (docs/INTEGER_GPT2.md §4): the saturating residual
// add, the GELU table lookup (with the quantization that follows it), and gathering the rows
// the head needs.

// b1 src (i32), b2 h (i32): h = clamp(h + src, +-clamp) over n words.
LS_KERNEL lm_add_residual(LM_ARGS) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) { return; }
    b2[i] = (u32)(int)clamp64((i64)(int)b2[i] + (int)b1[i], (i64)p.clamp);
}

// One block of 256 threads per row: b1 src (n x k i32), b2 the GELU table (65536 i32), b3 g
// (n x k i64): g = GELU[clamp(src, i16) + 32768], then g quantized (lm_quantize_row) into
// b4 xq (n x k4 words) and b5 scales (n x (t_m, t_e)). p: n, k, k4, frac.
#define GELU_THREADS 256u
__shared__ u64 gelu_max[GELU_THREADS];

LS_KERNEL lm_gelu(LM_ARGS) {
    u32 row = blockIdx.x;
    u32 t = threadIdx.x;
    u64 base = (u64)row * p.k;
    for (u32 i = t; i < p.k; i += GELU_THREADS) {
        int x = (int)b1[base + i];
        x = x < -32768 ? -32768 : (x > 32767 ? 32767 : x);
        st64(b3, base + i, (i64)(int)b2[x + 32768]);
    }
    lm_quantize_row(b3 + 2u * base, p.k, p.k4, p.frac, b4 + (u64)row * p.k4, b5 + 2u * row, t,
                    GELU_THREADS, gelu_max);
}

// b1 src (rows of d words), b2 row indices (n), b3 dst (n x d words): dst row r = src row
// b2[r].
LS_KERNEL lm_gather(LM_ARGS) {
    u64 at = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= (u64)p.n * p.d) { return; }
    u32 r = (u32)(at / p.d);
    b3[at] = b1[(u64)b2[r] * p.d + at % p.d];
}
