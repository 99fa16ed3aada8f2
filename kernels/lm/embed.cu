// Token plus position embedding (docs/INTEGER_GPT2.md §4), one thread per (item, channel):
// h = clamp(round_shift(q_wte * m, e - 12) + wpe[pos], +-RES_MAX). Mirrors cpu/lm/forward.rs.

// b1 items (sequence, position, token, unused), b2 wte (rows of k4 words of int8), b3 the
// token's row scale (m, e), b4 wpe (i32, ctx x d), b5 h (i32, n x d). p: n, d, k4, clamp.
LS_KERNEL lm_embed(LM_ARGS) {
    u64 at = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= (u64)p.n * p.d) { return; }
    u32 t = (u32)(at / p.d);
    u32 k = (u32)(at % p.d);
    u32 pos = b1[4u * t + 1u];
    u32 token = b1[4u * t + 2u];
    int q = int8_at(b2 + (u64)token * p.k4, k);
    i128 x = (i128)q * (i128)(int)b3[2u * token];
    int e = (int)b3[2u * token + 1u];
    i128 v = round_shift(x, e - 12) + (int)b4[(u64)pos * p.d + k];
    i128 c = (i128)p.clamp;
    b5[at] = (u32)(int)(v < -c ? -c : (v > c ? c : v));
}
