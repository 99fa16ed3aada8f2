// Shared by the integer GPT-2's CUDA kernels (kernels/lm/*.cu): the spec's integer helpers
// (docs/INTEGER_GPT2.md §1) with CUDA's native 64-bit integers and 128-bit ones where the
// spec needs them (NVRTC's --device-int128; gcc's __int128 in the host emulation), the
// parameter block and the 64-bit loads and stores. Like kernels/lockstep.cuh, every construct
// is in the common subset of CUDA C++ and C99, so kernels/host/emulate.c compiles the same
// files as C. Integer only: nothing here may depend on a floating-point mode.

#ifndef LOCKSTEP_LM_CUH
#define LOCKSTEP_LM_CUH

#ifndef LS_KERNEL
#define LS_KERNEL extern "C" __global__ void
#define LS_FN static __device__ __forceinline__
#endif
// Unroll the next loop four (sixteen) times on the device, so that the loads of several
// iterations are in flight at once (the host emulation's C compiler decides).
#ifndef LS_UNROLL4
#define LS_PRAGMA(x) _Pragma(#x)
#define LS_UNROLL4 LS_PRAGMA(unroll 4)
#define LS_UNROLL16 LS_PRAGMA(unroll 16)
#endif

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
typedef __int128 i128;
typedef unsigned __int128 u128;

// The parameter block, word for word `LmParams::words` (src/backend/cuda/lm/kernels.rs);
// each kernel reads the fields its comment names. 64-bit values are split in words, so the
// block is 32 plain u32 on both sides.
typedef struct {
    u32 n;     // items (rows) of this launch
    u32 d;     // n_embd
    u32 k;     // width of a row to quantize, or of the matmul's input
    u32 k4;    // k in words of four int8
    u32 rows;  // the matmul's output rows; the vocabulary for the frequencies
    int frac;  // the quantizer's input fraction bits, the matmul's output ones
    u32 clamp; // the matmul's output clamp (symmetric); the residual clamp elsewhere
    u32 hd;    // head width
    u32 ctx;   // context (positions per sequence in the KV cache)
    u32 heads;
    u32 exp_len; // entries of the exp table the kernel reads
    u32 eps_lo, eps_hi;       // LayerNorm's eps_q (i64)
    u32 attn_m_lo, attn_m_hi; // attention's score multiplier (i64)
    u32 split;   // matmul: warps sharing one row tile's k (1 or 4)
    u32 add;     // LayerNorm: add a residual first (0: no)
    u32 pad[15];
} LmParams;

// Every LM kernel takes the parameter block and eight buffers of u32 words (unused ones get a
// dummy), so one launcher signature serves all of them.
#define LM_ARGS                                                                              \
    const LmParams p, u32 *b1, u32 *b2, u32 *b3, u32 *b4, u32 *b5, u32 *b6, u32 *b7, u32 *b8

// Buffers hold u32 words; a 64-bit value is two words, low first (the host emulation's
// buffers are only 4-byte aligned, so no 64-bit loads).
LS_FN i64 ld64(const u32 *b, u64 i) {
    return (i64)((u64)b[2u * i] | ((u64)b[2u * i + 1u] << 32));
}

LS_FN void st64(u32 *b, u64 i, i64 v) {
    b[2u * i] = (u32)(u64)v;
    b[2u * i + 1u] = (u32)((u64)v >> 32);
}

LS_FN u32 lm_min(u32 a, u32 b) { return a < b ? a : b; }

LS_FN i64 clamp64(i64 v, i64 c) { return v < -c ? -c : (v > c ? c : v); }

LS_FN u32 bits128(u128 v) {
    u32 b = 0u;
    while (v != 0u) {
        v >>= 1;
        b++;
    }
    return b;
}

// round_shift of the spec (format::lm::fixed::round_shift): round(x / 2^s), ties toward +inf;
// s <= 0 shifts left, saturating at the i128 range.
LS_FN i128 round_shift(i128 x, int s) {
    if (s >= 1) {
        if (s >= 127) { return 0; }
        return (x + ((i128)1 << (s - 1))) >> s;
    }
    int l = -s < 126 ? -s : 126;
    u128 mag = x < 0 ? (u128)0 - (u128)x : (u128)x;
    if ((mag >> (127 - l)) != 0u) {
        // |x| * 2^l does not fit: the saturated value (i128::MIN or i128::MAX)
        u128 top = (u128)1 << 127;
        return x < 0 ? (i128)top : (i128)(top - 1u);
    }
    return x * ((i128)1 << l);
}

// round_shift64 (fixed::round_shift64): the matmul rescale's i64 rounding.
LS_FN i64 round_shift64(i64 x, int s) {
    if (s >= 1 && s <= 63) { return (x + ((i64)1 << (s - 1))) >> s; }
    if (s >= 64) { return 0; }
    int l = -s < 62 ? -s : 62;
    u64 mag = x < 0 ? 0ull - (u64)x : (u64)x;
    if ((mag >> (63 - l)) != 0u) { return x < 0 ? (i64)(1ull << 63) : (i64)((1ull << 63) - 1u); }
    return x * ((i64)1 << l);
}

// rdiv (fixed::rdiv) for n >= 0, d > 0: round(n / d), ties up. (A GPU divides in software:
// a 64-bit division where both fit is several times shorter than a 128-bit one, and equal.)
LS_FN i128 rdiv_pos(i128 n, i128 d) {
    u128 num = (u128)(2 * n + d), den = (u128)(2 * d);
    if ((num >> 64) == 0u && (den >> 64) == 0u) { return (i128)((u64)num / (u64)den); }
    return (i128)(num / den);
}

// The spec's reciprocal (fixed::recip): s = floor(log2 d) + 30, r = floor(2^s / d), d > 0.
typedef struct {
    i128 r;
    int s;
} Recip;

LS_FN Recip recip(i128 d) {
    Recip rc;
    rc.s = (int)bits128((u128)d) - 1 + 30;
    // (d < 2^s: below 2^64 where 2^s is; then the 64-bit division gives the same quotient)
    if (rc.s < 64) {
        rc.r = (i128)((1ull << rc.s) / (u64)d);
    } else {
        rc.r = (i128)(((u128)1 << rc.s) / (u128)d);
    }
    return rc;
}

// div_recip (fixed::div_recip): round_shift(x * r, s).
LS_FN i128 div_recip(i128 x, Recip rc) { return round_shift(x * rc.r, rc.s); }

// Floor square root (fixed::isqrt_u128 gives the same integer), digit by digit.
LS_FN u128 isqrt128(u128 x) {
    u128 res = 0u;
    u128 bit = (u128)1 << 126;
    while (bit > x) { bit >>= 2; }
    while (bit != 0u) {
        if (x >= res + bit) {
            x -= res + bit;
            res = (res >> 1) + bit;
        } else {
            res >>= 1;
        }
        bit >>= 2;
    }
    return res;
}

// Element i of a row of int8 packed four to a word.
LS_FN int int8_at(const u32 *row, u32 i) {
    return (int)(signed char)(unsigned char)((row[i >> 2] >> ((i & 3u) * 8u)) & 0xffu);
}

// Per-row int8 quantization with an integer scale (docs/INTEGER_GPT2.md §4; mirrors
// format::lm::fixed::quantize_row), by a block's `threads` threads (t: this one's index):
// the row y (k i64 words, Q`frac`) -> four int8 per u32 word in xq (zero padded to k4
// words) and the row's scale (t_m, t_e) in scale[0..2]. `red` is the caller's shared array
// of `threads` u64. Call from uniform control flow (it synchronizes the block); y may have
// been written by this block just before (it synchronizes first).
LS_FN void lm_quantize_row(const u32 *y, u32 k, u32 k4, int frac, u32 *xq, u32 *scale, u32 t,
                           u32 threads, u64 *red) {
    __syncthreads();
    u64 m = 0u;
    for (u32 i = t; i < k; i += threads) {
        i64 v = ld64(y, i);
        u64 a = v < 0 ? 0ull - (u64)v : (u64)v;
        if (a > m) { m = a; }
    }
    red[t] = m;
    __syncthreads();
    for (u32 off = threads / 2u; off > 0u; off /= 2u) {
        if (t < off && red[t + off] > red[t]) { red[t] = red[t + off]; }
        __syncthreads();
    }
    i128 a = (i128)red[0];
    if (t == 0u) {
        if (a == 0) {
            scale[0] = 0u;
            scale[1] = 0u;
        } else {
            // t_m = rdiv(A * 2^k, 127) in [2^15, 2^16), from e = 22 - floor(log2 A)
            int e = 22 - ((int)bits128((u128)a) - 1);
            for (;;) {
                i128 tm = e >= 0 ? rdiv_pos(a << e, 127) : rdiv_pos(a, (i128)127 << (-e));
                if (tm >= 65536) {
                    e -= 1;
                } else if (tm < 32768) {
                    e += 1;
                } else {
                    scale[0] = (u32)tm;
                    scale[1] = (u32)(frac + e);
                    break;
                }
            }
        }
    }
    Recip rc;
    rc.r = 0;
    rc.s = 0;
    if (a != 0) { rc = recip(a); }
    for (u32 w = t; w < k4; w += threads) {
        u32 word = 0u;
        for (u32 b = 0u; b < 4u; b++) {
            u32 i = 4u * w + b;
            int q = 0;
            if (i < k && a != 0) {
                i128 v = div_recip(127 * (i128)ld64(y, i), rc);
                q = (int)(v < -127 ? -127 : (v > 127 ? 127 : v));
            }
            word |= ((u32)q & 0xffu) << (8u * b);
        }
        xq[w] = word;
    }
}

#endif
