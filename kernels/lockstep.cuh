// Shared by every lockstep delta-codec CUDA kernel: a port of shaders/prelude.wgsl and
// shaders/scan.wgsl, with native 64-bit integers. The same files also compile as C on the
// host (kernels/host/emulate.h supplies threadIdx, __syncthreads, the warp intrinsics and
// atomics), so every construct here is in the common subset of CUDA C++ and C99: no
// templates, references, overloads or bool.
//
// CHUNK (elements per chunk, format::chunk::CHUNK_ELEMS) and GROUPS (mask groups per chunk:
// steps CHUNK / LANES x 4 stage slots) come from the Rust constants: prepended as #defines
// before NVRTC compiles the kernels, set at start-up in the host emulation.

#ifndef LOCKSTEP_CUH
#define LOCKSTEP_CUH

#ifndef LS_KERNEL
#define LS_KERNEL extern "C" __global__ void
#define LS_FN static __device__ __forceinline__
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

#define LANES 32u
#define TOTAL 4096u
#define SLOT_MASK 4095u
#define RANS_L 65536u
#define NONE 0xffffffffu
// Params.layout_id (format::symbols::Layout as u32).
#define LAYOUT_PAPER 0u
#define LAYOUT_SIGNED 1u
// One stage (J): b, q1, q2 and the sign as one symbol under er*2 + rs. Its elements have the
// Signed layout's codes and tails; only the stages differ.
#define LAYOUT_JOINT 2u

// The parameter block, word for word the WGSL uniform (src/backend/wgpu/params.rs writes
// it); passed by value to every kernel.
typedef struct {
    u32 n;
    u32 width;
    u32 mant;
    u32 ebits;
    u32 condition;
    u32 layout_id;
    // Distance to the neighbor element (one row up) whose bit length (B) and update sign (S)
    // are contexts; 0: no neighbor context.
    u32 neighbor;
    u32 n_stages;
    u32 n_chunks;
    u32 w1;
    u32 pass_;
    u32 pad;
    u32 map_off[4];
    u32 rows_off[4];
    u32 alpha[4];
    u32 hist_off[4];
    // Per stage: 1 when it uses its neighbor context form (B and S; J in the Joint layout).
    u32 nb_form[4];
    // J's neighbor form: the exponent classes win_lo .. win_lo + win_n its map covers
    // (format::tables::Window), or that a histogram pass counts.
    u32 win_lo;
    u32 win_n;
    u32 pad2[2];
} Params;

// Every kernel takes the parameter block and six buffers (unused ones get a dummy), so one
// launcher signature serves all of them.
#define LS_ARGS const Params p, u32 *b1, u32 *b2, u32 *b3, u32 *b4, u32 *b5, u32 *b6

LS_FN u32 ls_min(u32 a, u32 b) { return a < b ? a : b; }

LS_FN u64 mask64(u32 w) {
    return w >= 64u ? ~0ull : (1ull << w) - 1ull;
}

LS_FN u32 bit64(u64 v, u32 i) { return (u32)((v >> i) & 1ull); }

LS_FN u32 bitlen64(u64 v) { return v == 0ull ? 0u : 64u - (u32)__clzll((long long)v); }

// Ordered-integer key of a w-bit float pattern (src/float.rs).
LS_FN u64 key(u64 u, u32 w) {
    if (bit64(u, w - 1u)) { return u ^ mask64(w); }
    return u ^ (1ull << (w - 1u));
}

LS_FN u64 from_key(u64 k, u32 w) {
    if (bit64(k, w - 1u)) { return k ^ (1ull << (w - 1u)); }
    return k ^ mask64(w);
}

LS_FN u64 sext(u64 d, u32 w) {
    if (bit64(d, w - 1u)) { return d | ~mask64(w); }
    return d;
}

// Element j of a tensor of w-bit elements packed little-endian into u32 words.
LS_FN u64 load_elem(const u32 *buf, u32 j, u32 w) {
    if (w == 8u) { return (buf[j >> 2u] >> ((j & 3u) * 8u)) & 0xffu; }
    if (w == 16u) { return (buf[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu; }
    if (w == 32u) { return buf[j]; }
    return (u64)buf[2u * j] | ((u64)buf[2u * j + 1u] << 32u);
}

// Store element j; sub-word widths OR into a zeroed buffer (neighbors share a word).
LS_FN void store_elem(u32 *buf, u32 j, u32 w, u64 x) {
    if (w == 8u) {
        atomicOr(&buf[j >> 2u], (u32)x << ((j & 3u) * 8u));
    } else if (w == 16u) {
        atomicOr(&buf[j >> 1u], (u32)x << ((j & 1u) * 16u));
    } else if (w == 32u) {
        buf[j] = (u32)x;
    } else {
        buf[2u * j] = (u32)x;
        buf[2u * j + 1u] = (u32)(x >> 32u);
    }
}

// Symbol codes, 16 bits per element.
LS_FN u32 get_code(const u32 *codes, u32 j) {
    return (codes[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu;
}

// Reference facts: exponent class in bits 0..8, sign in bit 8, the two mantissa bits just
// below the exponent field in bits 9..11.
LS_FN u32 ref_info(u64 r, const Params *p) {
    u32 e = (u32)(r >> p->mant) & ((1u << p->ebits) - 1u);
    u32 er = 0u;
    if (p->condition != 0u) {
        if (p->ebits > 8u) {
            int c = (int)e - 1023 + 128;
            er = (u32)(c < 0 ? 0 : (c > 255 ? 255 : c));
        } else {
            er = e;
        }
    }
    u32 m2 = (u32)(r >> (p->mant - 2u)) & 3u;
    return er | (bit64(r, p->width - 1u) << 8u) | (m2 << 9u);
}

// Coded value of a displacement: |d| (Signed and Joint layouts, sign in *neg) or ZigZag(d)
// (Paper).
LS_FN u64 coded_value(u64 d, const Params *p, u32 *neg) {
    u64 sd = sext(d, p->width);
    u32 ng = (u32)(sd >> 63u);
    if (p->layout_id != LAYOUT_PAPER) {
        *neg = ng;
        return ng ? 0ull - sd : sd;
    }
    *neg = 0u;
    u64 z = sd << 1u;
    if (ng) { z = ~z; }
    return z & mask64(p->width);
}

// Packed symbols: b in bits 0..7, q1 bit 7, q2 bit 8, neg bit 9.
LS_FN u32 sym_code(u64 v, u32 neg) {
    u32 b = bitlen64(v);
    u32 q1 = b >= 2u ? bit64(v, b - 2u) : 0u;
    u32 q2 = b >= 3u ? bit64(v, b - 3u) : 0u;
    return b | (q1 << 7u) | (q2 << 8u) | (neg << 9u);
}

LS_FN u32 sign_state(u32 c) {
    if ((c & 127u) == 0u) { return 0u; }
    return 1u + ((c >> 9u) & 1u);
}

// Joint symbol of a code (format::symbols::joint_symbol): b = 0 -> 0; b = 1 -> 1 + neg;
// b = 2 -> 3 + 2 q1 + neg; b >= 3 -> 7 + 8 (b - 3) + 4 q1 + 2 q2 + neg.
LS_FN u32 joint_of(u32 c) {
    u32 b = c & 127u;
    u32 q1 = (c >> 7u) & 1u;
    u32 q2 = (c >> 8u) & 1u;
    u32 neg = (c >> 9u) & 1u;
    if (b == 0u) { return 0u; }
    if (b == 1u) { return 1u + neg; }
    if (b == 2u) { return 3u + 2u * q1 + neg; }
    return 7u + 8u * (b - 3u) + 4u * q1 + 2u * q2 + neg;
}

// Code of a joint symbol (format::symbols::joint_parts), the inverse of joint_of.
LS_FN u32 code_of_joint(u32 j) {
    if (j == 0u) { return 0u; }
    if (j < 3u) { return 1u | ((j - 1u) << 9u); }
    if (j < 7u) { return 2u | (((j - 3u) >> 1u) << 7u) | (((j - 3u) & 1u) << 9u); }
    u32 k = j - 7u;
    return (3u + (k >> 3u)) | (((k >> 2u) & 1u) << 7u) | (((k >> 1u) & 1u) << 8u)
        | ((k & 1u) << 9u);
}

// Does stage s (0 B, 1 Q1, 2 Q2, 3 S; in the Joint layout 0 is J) code a symbol for this
// element?
LS_FN u32 present(u32 s, u32 c) {
    u32 b = c & 127u;
    if (s == 0u) { return 1u; }
    if (s == 1u) { return b >= 2u; }
    if (s == 2u) { return b >= 3u; }
    return b >= 1u;
}

LS_FN u32 symbol_of(u32 s, u32 c, const Params *p) {
    if (p->layout_id == LAYOUT_JOINT) { return joint_of(c); }
    if (s == 0u) { return c & 127u; }
    if (s == 1u) { return (c >> 7u) & 1u; }
    if (s == 2u) { return (c >> 8u) & 1u; }
    return (c >> 9u) & 1u;
}

// Primary context id (format::tables::Space::context), except for J in its neighbor form:
// there the index into its map over the window of exponent classes (format::tables::Window),
// near*2n + (er - lo)*2 + rs with near = (m2*(W1+1) + nb)*3 + up, or NONE (no row) for a
// class outside the window. `nbc`: the neighbor's symbol code, or NONE when there is no
// neighbor in the chunk.
LS_FN u32 context(u32 s, u32 c, u32 info, u32 nbc, const Params *p) {
    u32 er = info & 255u;
    if (p->layout_id == LAYOUT_JOINT) {
        u32 e2 = er * 2u + ((info >> 8u) & 1u);
        if (p->nb_form[0] == 0u) { return e2; }
        // Unsigned wrap: a class below the window lands above it.
        u32 k = e2 - 2u * p->win_lo;
        if (k >= 2u * p->win_n) { return NONE; }
        u32 nb = nbc != NONE ? (nbc & 127u) : p->w1;
        u32 up = nbc != NONE ? sign_state(nbc) : 0u;
        return ((((info >> 9u) & 3u) * (p->w1 + 1u) + nb) * 3u + up) * 2u * p->win_n + k;
    }
    u32 eb = er * p->w1 + (c & 127u);
    if (s == 0u) {
        if (p->nb_form[0] == 0u) { return er; }
        u32 nb = nbc != NONE ? (nbc & 127u) : p->w1;
        return ((((info >> 9u) & 3u) * (p->w1 + 1u) + nb) << 8u) + er;
    }
    if (s == 1u) { return eb; }
    if (s == 2u) { return eb * 2u + ((c >> 7u) & 1u); }
    u32 up = 0u;
    if (p->nb_form[3] != 0u && nbc != NONE) { up = sign_state(nbc); }
    return (eb * 3u + up) * 2u + ((info >> 8u) & 1u);
}

LS_FN u32 chunk_len(u32 c, u32 n) { return ls_min(CHUNK, n - c * CHUNK); }

LS_FN u32 tail_len(u32 c) {
    u32 b = c & 127u;
    return b >= 4u ? b - 3u : 0u;
}

// Flat thread index of a 1-D launch.
LS_FN u32 flat_index(void) { return blockIdx.x * blockDim.x + threadIdx.x; }

// Block-wide exclusive prefix sum over SCAN_THREADS threads (Hillis-Steele): the exclusive
// prefix of v in *excl, the block's total returned. Call from uniform control flow.
#define SCAN_THREADS 256u
__shared__ u32 scan_sh[SCAN_THREADS];

LS_FN u32 block_scan(u32 t, u32 v, u32 *excl) {
    scan_sh[t] = v;
    __syncthreads();
    for (u32 off = 1u; off < SCAN_THREADS; off *= 2u) {
        u32 acc = scan_sh[t];
        if (t >= off) { acc += scan_sh[t - off]; }
        __syncthreads();
        scan_sh[t] = acc;
        __syncthreads();
    }
    u32 total = scan_sh[SCAN_THREADS - 1u];
    *excl = scan_sh[t] - v;
    __syncthreads();
    return total;
}

#endif
