// Per-row int8 quantization with an integer scale (docs/INTEGER_GPT2.md §4), one block of 256
// threads per row, for the attention's output (LayerNorm and GELU quantize their rows in the
// same launch: lm_quantize_row in lm.cuh).

#define QUANT_THREADS 256u
__shared__ u64 quant_max[QUANT_THREADS];

// b1 y (n x k i64), b2 xq (n x k4 words), b3 scales (n x (t_m, t_e)). p: n, k, k4, frac.
LS_KERNEL lm_quantize(LM_ARGS) {
    u32 row = blockIdx.x;
    lm_quantize_row(b1 + 2u * (u64)row * p.k, p.k, p.k4, p.frac, b2 + (u64)row * p.k4,
                    b3 + 2u * row, threadIdx.x, QUANT_THREADS, quant_max);
}
