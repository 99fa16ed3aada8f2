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
/// the `128 * row_sum` correction).
///
/// Tiles: tmm0..tmm3 accumulate items `t..t+16` / `t+16..t+32` against groups `g` / `g+1`,
/// tmm4 / tmm5 hold the two item blocks' activations and tmm6 / tmm7 the two groups'
/// weights, so each tile load feeds two `tdpbusd`.
///
/// # Safety
/// [`available`] must be true; `w` must hold groups `g0..g1` whole and `xu` `n` items.
#[cfg(target_arch = "x86_64")]
pub unsafe fn dots(
    w: &[i8],
    quads: usize,
    (g0, g1): (usize, usize),
    xu: &[u8],
    n: usize,
    each: &mut impl FnMut(usize, usize, &[i32; 16]),
) {
    use std::arch::asm;
    debug_assert!(quads.is_multiple_of(16) && g1 * quads * 64 <= w.len());
    debug_assert!(xu.len() >= n * quads * 4);
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut loaded = (0, 0);
    let mut t = 0;
    while t < n {
        let m0 = (n - t).min(16);
        let m1 = (n - t - m0).min(16);
        if loaded != (m0, m1) {
            // Tiles of the second item block stay unconfigured (0 rows) when it is empty.
            for (i, m) in [m0, m0, m1, m1, m0, m1, 16, 16].into_iter().enumerate() {
                cfg.rows[i] = m as u8;
                cfg.colsb[i] = if m > 0 { 64 } else { 0 };
            }
            // SAFETY: AMX is available and permitted (the caller's contract); the operand is
            // a valid palette-1 configuration.
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly, preserves_flags));
            loaded = (m0, m1);
        }
        let mut g = g0;
        while g < g1 {
            let two_groups = g + 1 < g1;
            match (m1 > 0, two_groups) {
                (true, true) => pass::<true, true>(w, quads, g, xu, t, (m0, m1), each),
                (true, false) => pass::<true, false>(w, quads, g, xu, t, (m0, m1), each),
                (false, true) => pass::<false, true>(w, quads, g, xu, t, (m0, m1), each),
                (false, false) => pass::<false, false>(w, quads, g, xu, t, (m0, m1), each),
            }
            g += 2;
        }
        t += m0 + m1;
    }
    if loaded != (0, 0) {
        // Back to the init state: the thread's context switches save no tile data.
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }
}

/// One pass of [`dots`] over `k`: items `t..t + m0 (+ m1 where ITEMS2)` against group `g`
/// (and `g + 1` where GROUPS2), with the tiles configured for `(m0, m1)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn pass<const ITEMS2: bool, const GROUPS2: bool>(
    w: &[i8],
    quads: usize,
    g: usize,
    xu: &[u8],
    t: usize,
    (m0, m1): (usize, usize),
    each: &mut impl FnMut(usize, usize, &[i32; 16]),
) {
    use std::arch::asm;
    use std::mem::MaybeUninit;
    let kp = quads * 4;
    let (wg, xt) = (w.as_ptr().add(g * quads * 64), xu.as_ptr().add(t * kp));
    // SAFETY (every asm below): tiles configured by the caller; loads read 16 x 64 weight
    // bytes of group g or g + 1, and m0 / m1 rows of 64 activation bytes of items t.., all
    // inside the slices (the caller's contract); stores write the 1 KiB `Sums` buffers.
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
    // Not zeroed first (a 1 KiB memset per pass): each tile's store writes the m rows read.
    let mut s = MaybeUninit::<Sums>::uninit();
    let mut out = |tile: usize, g: usize, t: usize, m: usize, s: &mut MaybeUninit<Sums>| {
        let p = s.as_mut_ptr().cast::<[i32; 16]>();
        match tile {
            0 => asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags)),
            1 => asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags)),
            2 => asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags)),
            _ => asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) p, s = in(reg) 64usize,
                options(nostack, preserves_flags)),
        }
        for i in 0..m {
            // SAFETY: `tilestored` wrote rows 0..m (the tile's configured rows) of `s`.
            each(g, t + i, &*p.add(i));
        }
    };
    out(0, g, t, m0, &mut s);
    if GROUPS2 {
        out(1, g + 1, t, m0, &mut s);
    }
    if ITEMS2 {
        out(2, g, t + m0, m1, &mut s);
        if GROUPS2 {
            out(3, g + 1, t + m0, m1, &mut s);
        }
    }
}
