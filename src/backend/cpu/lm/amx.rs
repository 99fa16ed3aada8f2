//! AMX-INT8 tiles for the matmul's dot products (Sapphire Rapids and later Xeons), on the
//! weights' VNNI layout ([`super::matmul::VnniRows`]) as it is.
//!
//! `tdpbusd` multiplies a tile of u8 activations (up to 16 items x 64 bytes of `k`) by a tile
//! of s8 weights (16 quads of `k` x 16 rows x 4 bytes) and adds the sums of four products into
//! 16 x 16 i32 accumulators, wrapping like `vpdpbusd` (no saturation). A VNNI group of 16 rows
//! stores its quads one after the other, 64 bytes each, so 16 consecutive quads are exactly
//! such a weight tile (stride 64 bytes): the layout packed once per session serves both
//! kernels, and so do the activations (`x + 128`) and the bias subtraction. i32 addition
//! modulo 2^32 is associative, so the sums equal the VNNI kernel's bit for bit whatever the
//! order, and the portable kernel's wherever the exact sums fit i32 (`k <= 2^17`).
//!
//! Rust has no AMX intrinsics on stable: the few instructions are `asm!`, on tile registers
//! the compiler never allocates. Linux hands out the 8 KiB tile state only to processes that
//! ask ([`available`] asks once); without it, or without the CPU feature, the callers keep
//! the VNNI kernel.

/// Whether this CPU and OS run AMX-INT8 with the 16 x 64-byte tiles used here (cached; the
/// first call asks Linux for the tile data permission).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn detect() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaves above the maximum are not read.
    let (max, l7) = (__cpuid_count(0, 0).eax, __cpuid_count(7, 0));
    // AMX-TILE (bit 24) and AMX-INT8 (bit 25) of leaf 7's EDX.
    if max < 0x1d || l7.edx & (3 << 24) != 3 << 24 {
        return false;
    }
    // Palette 1 (leaf 0x1d, subleaf 1): bytes per row, tile registers, rows per tile.
    let p = __cpuid_count(0x1d, 1);
    if p.ebx & 0xffff < 64 || p.ebx >> 16 < 8 || p.ecx & 0xffff < 16 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments; it only changes this process's
    // permission (Linux 5.16 and later; older kernels answer an error, and we keep VNNI).
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn detect() -> bool {
    false
}

/// `ldtilecfg`'s operand (palette 1): bytes per row and rows of each tile register.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// 16 x 16 i32, one tile's accumulators as `tilestored` writes them.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Sums([[i32; 16]; 16]);

/// The dot products of groups `g0..g1` of the weights `w` (VNNI layout, `quads` quads per
/// group, a multiple of 16) with the `n` items of `xu` (`4 * quads` bytes each), handed to
/// `each(group, item, sums)` (lane `r` is row `16 * group + r`; the raw `dpbusd` sums, before
/// the `128 * row_sum` correction), in no particular order.
///
/// Tiles, at k = 128 (the shipped model's head, two 64-byte chunks): an item block's four
/// activation tiles (tmm2..tmm5) stay loaded through all its passes, each pass one group:
/// its two weight tiles (tmm6 / tmm7) into the two item blocks' sums (tmm0 / tmm1), so a
/// pass loads only weights, prefetched two passes ahead ([`pass_resident`]). At other `k`
/// ([`pass`]): tmm0..tmm3 accumulate items `t..t+16` / `t+16..t+32` against groups `g` /
/// `g+1`, tmm4 / tmm5 hold the item blocks' activations and tmm6 / tmm7 the two groups'
/// weights, so each tile load feeds two `tdpbusd`.
///
/// Software-pipelined over passes: pass `i`'s sums are stored right before pass `i + 1`
/// reuses the tiles, and handed to `each` after pass `i + 2`'s tile work is issued, so the
/// vector loads read stores retired a pass earlier and the tile unit works through `each`.
/// Back to back (store, then read the rows just stored) each pass waited on its own
/// `tdpbusd` chain and tile stores, then the tile unit idled through the longer epilogue.
///
/// # Safety
/// [`available`] must be true; `w` must hold groups `g0..g1` whole and `xu` `n` items.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn dots(
    w: &[i8],
    quads: usize,
    (g0, g1): (usize, usize),
    xu: &[u8],
    n: usize,
    each: &mut impl FnMut(usize, usize, &[i32; 16]),
) {
    use std::arch::asm;
    use std::mem::MaybeUninit;
    debug_assert!(quads.is_multiple_of(16) && g1 * quads * 64 <= w.len());
    debug_assert!(xu.len() >= n * quads * 4);
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    // Two passes' sums (4 tiles each), alternately: the one being stored and the one `each`
    // reads. Not zeroed (a memset per call): a tile store writes every row later read.
    let mut bufs = MaybeUninit::<[[Sums; 4]; 2]>::uninit();
    let bufs = bufs.as_mut_ptr().cast::<[Sums; 4]>();
    // Every pass in order (item blocks outer, groups inner), then two empty steps that drain
    // the pipeline: one call site each for the store, the tile work and `each`.
    let resident = quads == 32;
    let passes = (0..n).step_by(32).flat_map(|t| {
        let m0 = (n - t).min(16);
        let m = (m0, (n - t - m0).min(16));
        (g0..g1).step_by(2 - resident as usize).map(move |g| Pass {
            g,
            t,
            m,
            groups2: !resident && g + 1 < g1,
            resident,
        })
    });
    // The item block whose activations the tiles hold (resident).
    let mut block_loaded = None;
    // The pass whose sums are still in the tiles, and the one stored (with its slot) but not
    // yet handed out: a store goes to the slot that one does not hold.
    let (mut in_tiles, mut stored): (Option<Pass>, Option<(Pass, usize)>) = (None, None);
    let mut loaded = (0, 0);
    for p in passes.map(Some).chain([None, None]) {
        // Stored right before the tiles are reused (or reconfigured, which zeroes them).
        let just = in_tiles.take().map(|q| {
            let slot = stored.map_or(0, |(_, s)| s ^ 1);
            store(&q, bufs.add(slot));
            (q, slot)
        });
        if let Some(p) = p {
            let (m0, m1) = p.m;
            if loaded != p.m {
                // Tiles of the second item block stay unconfigured (0 rows) when it is empty.
                let rows = if resident {
                    [m0, m1, m0, m0, m1, m1, 16, 16]
                } else {
                    [m0, m0, m1, m1, m0, m1, 16, 16]
                };
                for (i, m) in rows.into_iter().enumerate() {
                    cfg.rows[i] = m as u8;
                    cfg.colsb[i] = if m > 0 { 64 } else { 0 };
                }
                // SAFETY: AMX is available and permitted (the caller's contract); the
                // operand is a valid palette-1 configuration.
                asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly, preserves_flags));
                loaded = p.m;
                block_loaded = None;
            }
            let (g, t) = (p.g, p.t);
            if resident {
                if block_loaded != Some(t) {
                    load_items(xu, t, m1 > 0);
                    block_loaded = Some(t);
                }
                if m1 > 0 {
                    pass_resident::<true>(w, g);
                } else {
                    pass_resident::<false>(w, g);
                }
            } else {
                match (m1 > 0, p.groups2) {
                    (true, true) => pass::<true, true>(w, quads, g, xu, t),
                    (true, false) => pass::<true, false>(w, quads, g, xu, t),
                    (false, true) => pass::<false, true>(w, quads, g, xu, t),
                    (false, false) => pass::<false, false>(w, quads, g, xu, t),
                }
            }
        }
        in_tiles = p;
        // Stored one pass ago: its tile stores have long reached memory.
        hand_out(stored.take(), bufs, each);
        stored = just;
    }
    if loaded != (0, 0) {
        // Back to the init state: the thread's context switches save no tile data.
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }
}

/// One pass of [`dots`]: items `t..t + m0 (+ m1)` against group `g` (and `g + 1`).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Pass {
    g: usize,
    t: usize,
    m: (usize, usize),
    groups2: bool,
    /// Sums in tmm0 / tmm1 (the two item blocks, one group), activations resident.
    resident: bool,
}

/// Stores the tiles of pass `p` into `buf` (tile `i` into `buf[i]`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn store(p: &Pass, buf: *mut [Sums; 4]) {
    use std::arch::asm;
    let at = |i: usize| buf.cast::<Sums>().add(i);
    // SAFETY (every asm): the tiles hold pass p's sums (configured rows only); each store
    // writes at most 16 rows of 64 bytes of one 1 KiB `Sums` of `buf`.
    asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) at(0), s = in(reg) 64usize,
        options(nostack, preserves_flags));
    if p.groups2 {
        asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) at(1), s = in(reg) 64usize,
            options(nostack, preserves_flags));
    }
    if p.m.1 > 0 && p.resident {
        asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) at(2), s = in(reg) 64usize,
            options(nostack, preserves_flags));
    } else if p.m.1 > 0 {
        asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) at(2), s = in(reg) 64usize,
            options(nostack, preserves_flags));
        if p.groups2 {
            asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) at(3), s = in(reg) 64usize,
                options(nostack, preserves_flags));
        }
    }
}

/// Hands the sums of pass `p`, stored in slot `slot` of `bufs` by [`store`], to `each`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hand_out(
    p: Option<(Pass, usize)>,
    bufs: *const [Sums; 4],
    each: &mut impl FnMut(usize, usize, &[i32; 16]),
) {
    let Some((p, slot)) = p else { return };
    let buf = bufs.add(slot);
    let (m0, m1) = p.m;
    let tiles = [
        (0, p.g, p.t, m0),
        (1, p.g + 1, p.t, m0),
        (2, p.g, p.t + m0, m1),
    ];
    let tiles = tiles.into_iter().chain([(3, p.g + 1, p.t + m0, m1)]);
    for (i, g, t, m) in tiles {
        if i & 1 == 1 && !p.groups2 {
            continue;
        }
        let rows = &(*buf)[i].0;
        for (r, sums) in rows.iter().take(m).enumerate() {
            // `store` wrote rows 0..m of this tile (its configured rows).
            each(g, t + r, sums);
        }
    }
}

/// The tile work of one pass of [`dots`] over `k`: items `t..t + m0 (+ m1 where ITEMS2)`
/// against group `g` (and `g + 1` where GROUPS2), with the tiles configured for `(m0, m1)`;
/// the sums stay in the tiles.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<const ITEMS2: bool, const GROUPS2: bool>(
    w: &[i8],
    quads: usize,
    g: usize,
    xu: &[u8],
    t: usize,
) {
    use std::arch::asm;
    let kp = quads * 4;
    let (wg, xt) = (w.as_ptr().add(g * quads * 64), xu.as_ptr().add(t * kp));
    // SAFETY (every asm below): tiles configured by the caller; loads read 16 x 64 weight
    // bytes of group g or g + 1, and m0 / m1 rows of 64 activation bytes of items t.., all
    // inside the slices (the caller's contract).
    asm!("tilezero tmm0", options(nostack, nomem, preserves_flags));
    if GROUPS2 {
        asm!("tilezero tmm1", options(nostack, nomem, preserves_flags));
    }
    if ITEMS2 {
        asm!("tilezero tmm2", options(nostack, nomem, preserves_flags));
        if GROUPS2 {
            asm!("tilezero tmm3", options(nostack, nomem, preserves_flags));
        }
    }
    for c in 0..quads / 16 {
        let (x, wc) = (xt.add(64 * c), wg.add(1024 * c));
        asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) x, s = in(reg) kp,
            options(nostack, readonly, preserves_flags));
        asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) wc, s = in(reg) 64usize,
            options(nostack, readonly, preserves_flags));
        asm!(
            "tdpbusd tmm0, tmm4, tmm6",
            options(nostack, nomem, preserves_flags)
        );
        if GROUPS2 {
            asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) wc.add(quads * 64),
                s = in(reg) 64usize, options(nostack, readonly, preserves_flags));
            asm!(
                "tdpbusd tmm1, tmm4, tmm7",
                options(nostack, nomem, preserves_flags)
            );
        }
        if ITEMS2 {
            asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) x.add(16 * kp), s = in(reg) kp,
                options(nostack, readonly, preserves_flags));
            asm!(
                "tdpbusd tmm2, tmm5, tmm6",
                options(nostack, nomem, preserves_flags)
            );
            if GROUPS2 {
                asm!(
                    "tdpbusd tmm3, tmm5, tmm7",
                    options(nostack, nomem, preserves_flags)
                );
            }
        }
    }
}

/// Loads the activations of the item block at `t` at k = 128 for [`pass_resident`]: tmm2 /
/// tmm3 the first 16 items' two 64-byte chunks, tmm4 / tmm5 the next items' (`items2`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_items(xu: &[u8], t: usize, items2: bool) {
    use std::arch::asm;
    let x = xu.as_ptr().add(t * 128);
    // SAFETY (every asm): tiles configured by the caller for this block; the loads read the
    // configured rows (items) of 128 bytes, inside `xu` (the caller's contract).
    asm!("tileloadd tmm2, [{p} + {s}*1]", p = in(reg) x, s = in(reg) 128usize,
        options(nostack, readonly, preserves_flags));
    asm!("tileloadd tmm3, [{p} + {s}*1]", p = in(reg) x.add(64), s = in(reg) 128usize,
        options(nostack, readonly, preserves_flags));
    if items2 {
        asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) x.add(16 * 128), s = in(reg) 128usize,
            options(nostack, readonly, preserves_flags));
        asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) x.add(16 * 128 + 64),
            s = in(reg) 128usize, options(nostack, readonly, preserves_flags));
    }
}

/// The tile work of one pass at k = 128 with the activations resident ([`load_items`]):
/// group `g` against the block's first 16 items into tmm0 and the rest into tmm1 (ITEMS2).
/// Only the weight tiles are loaded, and they do not wait on the activations' reloads.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass_resident<const ITEMS2: bool>(w: &[i8], g: usize) {
    use std::arch::asm;
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let wg = w.as_ptr().add(g * 2048);
    // The weights two passes ahead into L1 (a prefetch does not fault, the address need not
    // lie inside `w`): the tile loads otherwise wait on them at the head of the window.
    let ahead = wg.wrapping_add(2 * 2048);
    for line in 0..32 {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
    }
    // SAFETY (every asm): tiles configured and loaded by the caller; the loads read group g's
    // two 1 KiB weight tiles, inside `w` (the caller's contract).
    asm!("tilezero tmm0", options(nostack, nomem, preserves_flags));
    if ITEMS2 {
        asm!("tilezero tmm1", options(nostack, nomem, preserves_flags));
    }
    asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) wg, s = in(reg) 64usize,
        options(nostack, readonly, preserves_flags));
    asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) wg.add(1024), s = in(reg) 64usize,
        options(nostack, readonly, preserves_flags));
    asm!(
        "tdpbusd tmm0, tmm2, tmm6",
        options(nostack, nomem, preserves_flags)
    );
    if ITEMS2 {
        asm!(
            "tdpbusd tmm1, tmm4, tmm6",
            options(nostack, nomem, preserves_flags)
        );
    }
    asm!(
        "tdpbusd tmm0, tmm3, tmm7",
        options(nostack, nomem, preserves_flags)
    );
    if ITEMS2 {
        asm!(
            "tdpbusd tmm1, tmm5, tmm7",
            options(nostack, nomem, preserves_flags)
        );
    }
}
