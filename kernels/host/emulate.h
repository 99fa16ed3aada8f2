// CUDA's built-ins for the host emulation of kernels/*.cu (compiled as C by build.rs).
//
// This is an emulation: it runs the kernels' integer logic and indexing on the CPU, block by
// block, so CI checks the same sources the GPU runs. It proves nothing about the CUDA
// compiler or the hardware (tests/cuda_compile.rs checks that NVRTC and ptxas accept the
// sources; only a GPU run checks the rest).
//
// Model: a launch's blocks are spread over the emulated device's threads (a rayon pool of
// its own, in Rust, apart from the caller's); within a block, threads run one at a time.
// Kernels that synchronize (the emulation table in emulate.c says which) run each thread as
// a fiber on its own stack: __syncthreads, __syncwarp and __ballot_sync switch to the next
// thread, and a full round over the block's threads is a barrier. The others run their threads one after another, without fibers, and
// stop the process if they reach a barrier. Warp intrinsics act on the whole block, so they
// are used only in 32-thread blocks (checked).

#ifndef LOCKSTEP_EMULATE_H
#define LOCKSTEP_EMULATE_H

#include <stdint.h>

#define LS_KERNEL static void
#define LS_FN static inline
#define LS_UNROLL4
#define LS_UNROLL16
#define __device__
#define __shared__ static __thread

typedef struct {
    unsigned x, y, z;
} ls_dim3;

static __thread ls_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The chunk geometry, set from the Rust constants before the first launch (ls_emu_init).
static unsigned ls_emu_chunk, ls_emu_groups;
#define CHUNK ls_emu_chunk
#define GROUPS ls_emu_groups

static void ls_emu_barrier(void);
static unsigned ls_emu_ballot(unsigned pred);
static void ls_emu_warp_only(void);

#define __syncthreads() ls_emu_barrier()
#define __syncwarp(mask) (ls_emu_warp_only(), ls_emu_barrier())
#define __ballot_sync(mask, pred) ((mask) & ls_emu_ballot(pred))

// Integer atomics: blocks of one launch run on several threads.
static inline unsigned atomicAdd(unsigned *a, unsigned v) {
    return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicOr(unsigned *a, unsigned v) {
    return __atomic_fetch_or(a, v, __ATOMIC_RELAXED);
}
static inline unsigned atomicMax(unsigned *a, unsigned v) {
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange_n(a, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
// Four signed int8 products summed into c, like the device's.
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 32; i += 8) { c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i); }
    return c;
}
// Like the device's: 64 for zero.
static inline int __clzll(long long v) {
    return v == 0 ? 64 : __builtin_clzll((unsigned long long)v);
}

#endif
