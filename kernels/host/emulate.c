// Host emulation of the CUDA kernels (see emulate.h): the kernels' sources, compiled as C,
// and a small fiber scheduler that gives each block's threads CUDA's barrier semantics.
//
// Fibers: each OS thread keeps LS_EMU_MAX_THREADS fibers, started once with makecontext
// and then switched with _setjmp/_longjmp (no signal-mask system call per switch, which
// swapcontext would make: the lane decoder synchronizes once per step and stage).

#undef _FORTIFY_SOURCE /* __longjmp_chk rejects jumps between stacks */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include "emulate.h"

#include "../lockstep.cuh"
#include "../residual.cu"
#include "../encode.cu"
#include "../decode.cu"
#include "../crc32.cu"
#include "../lm/lm.cuh"
#include "../lm/embed.cu"
#include "../lm/norm.cu"
#include "../lm/quantize.cu"
#include "../lm/matmul.cu"
#include "../lm/attention.cu"
#include "../lm/elementwise.cu"
#include "../lm/freq.cu"

#define LS_EMU_MAX_THREADS 1024u
#define LS_EMU_STACK (128u * 1024u)

typedef void (*ls_kernel_fn)(const Params, u32 *, u32 *, u32 *, u32 *, u32 *, u32 *);

// In the order of the Rust enum `Kernel` (src/backend/cuda/launch.rs).
static const struct {
    ls_kernel_fn fn;
    int syncs;
} LS_KERNELS[] = {
    {ls_residuals, 0}, {ls_symbols, 0}, {ls_histogram, 1}, {ls_er_range, 1},
    {ls_enc_lanes, 0}, {ls_enc_scan, 1}, {ls_enc_tail, 1}, {ls_dec_lanes, 1},
    {ls_dec_tail, 1},  {ls_crc32, 1},
};

typedef void (*ls_lm_kernel_fn)(const LmParams, u32 *, u32 *, u32 *, u32 *, u32 *, u32 *, u32 *,
                                u32 *);

typedef struct {
    ucontext_t uc;
    jmp_buf jb;
    int started;
    int done;
} ls_fiber;

static __thread struct {
    ls_fiber *fibers;
    jmp_buf sched;
    ls_fiber *cur;
    int fiber_mode;
    ls_kernel_fn fn;
    const Params *p;
    u32 **bufs;
    // Ballot bits of the round in progress, and of the round that last ended.
    u32 mask_now, mask_done;
    // The LM kernel of the launch in progress (ls_emu_launch_lm; 0 for a delta kernel, whose
    // signature differs).
    ls_lm_kernel_fn lm_fn;
    const LmParams *lm_p;
} ls_emu;

static void ls_emu_die(const char *why) {
    fprintf(stderr, "lockstep CUDA emulation: %s\n", why);
    abort();
}

static void ls_emu_yield(void) {
    if (!_setjmp(ls_emu.cur->jb)) { _longjmp(ls_emu.sched, 1); }
    // Thread-local state (threadIdx, ls_emu.cur) changed while this fiber was away.
    __asm__ volatile("" ::: "memory");
}

// One thread of the launch in progress: its delta or LM kernel (their signatures differ).
static void ls_emu_thread(void) {
    u32 **b = ls_emu.bufs;
    if (ls_emu.lm_fn) {
        ls_emu.lm_fn(*ls_emu.lm_p, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
    } else {
        ls_emu.fn(*ls_emu.p, b[0], b[1], b[2], b[3], b[4], b[5]);
    }
}

static void ls_fiber_main(void) {
    for (;;) {
        ls_emu_thread();
        ls_emu.cur->done = 1;
        ls_emu_yield();
    }
}

static void ls_emu_resume(ls_fiber *f) {
    ls_emu.cur = f;
    if (!_setjmp(ls_emu.sched)) {
        if (!f->started) {
            ucontext_t from;
            f->started = 1;
            swapcontext(&from, &f->uc);
        } else {
            _longjmp(f->jb, 1);
        }
    }
    __asm__ volatile("" ::: "memory");
}

static void ls_emu_fibers(void) {
    if (ls_emu.fibers) { return; }
    ls_emu.fibers = calloc(LS_EMU_MAX_THREADS, sizeof(ls_fiber));
    if (!ls_emu.fibers) { ls_emu_die("out of memory"); }
    for (unsigned t = 0; t < LS_EMU_MAX_THREADS; t++) {
        ls_fiber *f = &ls_emu.fibers[t];
        void *stack = malloc(LS_EMU_STACK);
        if (!stack || getcontext(&f->uc) != 0) { ls_emu_die("cannot create a fiber"); }
        f->uc.uc_stack.ss_sp = stack;
        f->uc.uc_stack.ss_size = LS_EMU_STACK;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, ls_fiber_main, 0);
    }
}

static void ls_emu_barrier(void) {
    if (!ls_emu.fiber_mode) {
        ls_emu_die("a kernel marked as not synchronizing reached a barrier");
    }
    ls_emu_yield();
}

static void ls_emu_warp_only(void) {
    if (blockDim.x > 32u) { ls_emu_die("warp intrinsics in a block of more than 32 threads"); }
}

// A ballot is a barrier: in the round that ends at it, each thread ORs its bit into the
// round's mask; the scheduler keeps the finished round's mask, which every thread reads once
// released (all threads run the same sequence of barriers, so a round is one ballot).
static unsigned ls_emu_ballot(unsigned pred) {
    ls_emu_warp_only();
    ls_emu.mask_now |= (pred != 0u) << threadIdx.x;
    ls_emu_barrier();
    return ls_emu.mask_done;
}

void ls_emu_init(unsigned chunk, unsigned groups) {
    ls_emu_chunk = chunk;
    ls_emu_groups = groups;
}

// Run blocks [first, end) of the launch set up in `ls_emu` (grid x block threads): a kernel
// without barriers runs each thread straight through, one with barriers runs its threads as
// fibers in rounds.
static void ls_emu_run(unsigned grid, unsigned block, unsigned first, unsigned end, int syncs) {
    ls_emu.fiber_mode = syncs;
    if (ls_emu.fiber_mode) { ls_emu_fibers(); }
    gridDim.x = grid;
    gridDim.y = gridDim.z = 1u;
    blockDim.x = block;
    blockDim.y = blockDim.z = 1u;
    threadIdx.y = threadIdx.z = 0u;
    blockIdx.y = blockIdx.z = 0u;
    for (unsigned b = first; b < end; b++) {
        blockIdx.x = b;
        if (!ls_emu.fiber_mode) {
            for (unsigned t = 0u; t < block; t++) {
                threadIdx.x = t;
                ls_emu_thread();
            }
            continue;
        }
        for (unsigned t = 0u; t < block; t++) { ls_emu.fibers[t].done = 0; }
        ls_emu.mask_now = 0u;
        // One round: every thread runs to its next barrier or its end. A round ends with
        // all live threads at the same barrier, which the next round releases.
        unsigned live = block;
        while (live > 0u) {
            for (unsigned t = 0u; t < block; t++) {
                if (ls_emu.fibers[t].done) { continue; }
                threadIdx.x = t;
                ls_emu_resume(&ls_emu.fibers[t]);
                if (ls_emu.fibers[t].done) { live--; }
            }
            ls_emu.mask_done = ls_emu.mask_now;
            ls_emu.mask_now = 0u;
        }
    }
}

// Run blocks [first, end) of a launch of `kernel` (grid x block threads). 0: done; 1: no such
// kernel; 2: a block size the emulation does not take.
int ls_emu_launch(unsigned kernel, unsigned grid, unsigned block, unsigned first, unsigned end,
                  const Params *p, u32 **bufs) {
    if (kernel >= sizeof(LS_KERNELS) / sizeof(LS_KERNELS[0])) { return 1; }
    if (block == 0u || block > LS_EMU_MAX_THREADS) { return 2; }
    ls_emu.fn = LS_KERNELS[kernel].fn;
    ls_emu.lm_fn = 0;
    ls_emu.p = p;
    ls_emu.bufs = bufs;
    ls_emu_run(grid, block, first, end, LS_KERNELS[kernel].syncs);
    return 0;
}

// ---- the integer GPT-2's kernels (kernels/lm/) ----

// In the order of the Rust enum `LmKernel` (src/backend/cuda/lm/kernels.rs).
static const struct {
    ls_lm_kernel_fn fn;
    int syncs;
} LS_LM_KERNELS[] = {
    {lm_embed, 0},     {lm_layer_norm, 1},   {lm_quantize, 1}, {lm_matmul, 1},
    {lm_kv_store, 0},  {lm_attention, 1},    {lm_add_residual, 0}, {lm_gelu, 1},
    {lm_gather, 0},    {lm_frequencies, 1},  {lm_prefix_at, 1},
};

// Run blocks [first, end) of a launch of LM kernel `kernel` (grid x block threads, eight
// buffers). 0: done; 1: no such kernel; 2: a block size the emulation does not take.
int ls_emu_launch_lm(unsigned kernel, unsigned grid, unsigned block, unsigned first,
                     unsigned end, const LmParams *p, u32 **bufs) {
    if (kernel >= sizeof(LS_LM_KERNELS) / sizeof(LS_LM_KERNELS[0])) { return 1; }
    if (block == 0u || block > LS_EMU_MAX_THREADS) { return 2; }
    ls_emu.lm_fn = LS_LM_KERNELS[kernel].fn;
    ls_emu.lm_p = p;
    ls_emu.bufs = bufs;
    ls_emu_run(grid, block, first, end, LS_LM_KERNELS[kernel].syncs);
    return 0;
}
