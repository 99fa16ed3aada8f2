// Causal attention with the KV cache on the device (docs/INTEGER_GPT2.md §4). `lm_kv_store`
// writes every item's key and value at its (sequence, position) first, so an item sees the
// earlier items of its own sequence in the same batch; `lm_attention` runs one block per
// (item, head). Mirrors cpu/lm/attention.rs.

// b1 qkv (n x 3d i32, Q10), b2 items (sequence, position, token, unused), b3 this layer's
// key cache (sequence x d x ctx i32: channel-major, so that the threads scoring consecutive
// positions read consecutive words), b4 its value cache (sequence x ctx x d i32: the
// threads summing consecutive channels read consecutive words). p: n, d, ctx. One thread
// per (item, channel).
LS_KERNEL lm_kv_store(LM_ARGS) {
    u64 at = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= (u64)p.n * p.d) { return; }
    u32 t = (u32)(at / p.d);
    u32 i = (u32)(at % p.d);
    u64 seq = b2[4u * t];
    u64 pos = b2[4u * t + 1u];
    b3[(seq * p.d + i) * p.ctx + pos] = b1[(u64)t * 3u * p.d + p.d + i];
    b4[(seq * p.ctx + pos) * p.d + i] = b1[(u64)t * 3u * p.d + 2u * p.d + i];
}

// A block of ATT_THREADS threads per (item, head), its scores and weights in shared memory
// (the host refuses a context longer than ATT_SPAN; GPT-2's is 1024). The weighted sum
// splits the positions over groups of hd threads (each thread one channel, consecutive
// threads consecutive words of a value row), whose partial sums meet in shared memory: a
// decode step's few blocks get four times the threads to hide memory latency with.
#define ATT_THREADS 256u
#define ATT_SPAN 1024u
__shared__ i64 att_red[ATT_THREADS];
__shared__ u32 att_w[2u * ATT_SPAN];

// b1 qkv, b2 items, b3 exp24 (u32), b4 key cache, b5 value cache (as lm_kv_store's), b6 out
// (n x d i64). p: d, hd, ctx, heads, exp_len, attn_m. Block b: item b / heads, head b % heads.
LS_KERNEL lm_attention(LM_ARGS) {
    u32 l = threadIdx.x;
    u32 t = blockIdx.x / p.heads;
    u32 head = blockIdx.x % p.heads;
    u32 len = b2[4u * t + 1u] + 1u;
    u32 off = head * p.hd;
    const int *q = (const int *)b1 + (u64)t * 3u * p.d + off;
    const int *kc = (const int *)b4 + ((u64)b2[4u * t] * p.d + off) * p.ctx;
    const int *vc = (const int *)b5 + (u64)b2[4u * t] * p.ctx * p.d + off;
    u32 *sw = att_w;
    i64 attn_m = (i64)((u64)p.attn_m_lo | ((u64)p.attn_m_hi << 32));
    // scores: round_shift(q . k * attn_m, 52); |q|, |k| <= 2^20, so q . k fits an i64
    i64 mx = (i64)(1ull << 63);
    for (u32 s = l; s < len; s += ATT_THREADS) {
        i64 dot = 0;
        LS_UNROLL16
        for (u32 c = 0u; c < p.hd; c++) { dot += (i64)q[c] * kc[(u64)c * p.ctx + s]; }
        i64 sc = (i64)round_shift((i128)dot * attn_m, 52);
        st64(sw, s, sc);
        if (sc > mx) { mx = sc; }
    }
    att_red[l] = mx;
    __syncthreads();
    for (u32 o = ATT_THREADS / 2u; o > 0u; o /= 2u) {
        if (l < o && att_red[l + o] > att_red[l]) { att_red[l] = att_red[l + o]; }
        __syncthreads();
    }
    mx = att_red[0];
    __syncthreads();
    // weights: EXP24[gap], 0 past the table; their sum
    i64 total = 0;
    for (u32 s = l; s < len; s += ATT_THREADS) {
        u64 gap = (u64)(mx - ld64(sw, s));
        i64 w = gap < p.exp_len ? (i64)b3[gap] : 0;
        st64(sw, s, w);
        total += w;
    }
    att_red[l] = total;
    __syncthreads();
    for (u32 o = ATT_THREADS / 2u; o > 0u; o /= 2u) {
        if (l < o) { att_red[l] += att_red[l + o]; }
        __syncthreads();
    }
    // the maximum weighs 2^24, so the total is positive
    Recip rc = recip((i128)att_red[0]);
    __syncthreads();
    // positions s = group, group + groups, ...; integer sums in any order
    u32 groups = p.hd < ATT_THREADS ? ATT_THREADS / p.hd : 1u;
    u32 group = l / p.hd;
    for (u32 c0 = 0u; c0 < p.hd; c0 += ATT_THREADS) {
        u32 c = c0 + l % p.hd;
        i64 acc = 0;
        if (group < groups && c < p.hd) {
            // (no branch on w == 0, which adds nothing: a loop without one unrolls, and its
            // independent loads overlap instead of waiting one after another)
            LS_UNROLL16
            for (u32 s = group; s < len; s += groups) {
                acc += ld64(sw, s) * vc[(u64)s * p.d + c];
            }
        }
        att_red[l] = acc;
        __syncthreads();
        if (group == 0u && c < p.hd) {
            for (u32 g = 1u; g < groups; g++) { acc += att_red[g * p.hd + l]; }
            // |acc| <= 2^57, r <= 2^30
            st64(b6, (u64)t * p.d + off + c, (i64)div_recip((i128)acc, rc));
        }
        __syncthreads();
    }
}
