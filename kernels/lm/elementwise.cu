// The forward pass's element-wise steps (docs/INTEGER_GPT2.md §4): the saturating residual
// add, the GELU table lookup, and gathering the rows the head needs.

// b1 src (i32), b2 h (i32): h = clamp(h + src, +-clamp) over n words.
LS_KERNEL lm_add_residual(LM_ARGS) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) { return; }
    b2[i] = (u32)(int)clamp64((i64)(int)b2[i] + (int)b1[i], (i64)p.clamp);
}

// b1 src (i32), b2 the GELU table (65536 i32), b3 g (i64): g = GELU[clamp(src, i16) + 32768]
// over n values, as the i64 the quantizer reads.
LS_KERNEL lm_gelu(LM_ARGS) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) { return; }
    int x = (int)b1[i];
    x = x < -32768 ? -32768 : (x > 32767 ? 32767 : x);
    st64(b3, i, (i64)(int)b2[x + 32768]);
}

// b1 src (rows of d words), b2 row indices (n), b3 dst (n x d words): dst row r = src row
// b2[r].
LS_KERNEL lm_gather(LM_ARGS) {
    u64 at = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= (u64)p.n * p.d) { return; }
    u32 r = (u32)(at / p.d);
    b3[at] = b1[(u64)b2[r] * p.d + at % p.d];
}
