//! CRC-32s folded inside the AVX2 passes, 32 bytes at a time while they are in registers,
//! instead of a `crc32fast` pass over each block after the pass: the decode's output in its
//! tail passes, and the encode's two inputs (reference and target) where their residuals
//! are first computed (`hist::residual_count`, fused with the Joint histogram, or
//! `hist::residuals`, chunk by chunk in the first histogram pass).
//!
//! Same CRC-32 (IEEE, reflected) as `crc32fast`, by the same carry-less folding
//! (`crc32fast`'s `pclmulqdq` path; Intel, "Fast CRC Computation for Generic Polynomials
//! Using PCLMULQDQ"): a 128-bit accumulator `a` and the next 16 bytes `d` fold to
//! `clmul(a.lo, K3) ^ clmul(a.hi, K4) ^ d`, which has the CRC of `a` followed by `d`. The
//! accumulator is handed back to `crc32fast` as 16 bytes of message (their CRC from a zero
//! register is the whole region's), so `crc32fast` does the final reduction and keeps the
//! running length for `combine`.
//!
//! Why: each such pass ran at the carry-less multiplier's limit (on a Zen 2, 4 bytes a
//! cycle: the output's some 7% of a bf16 `--fast` decode, 10% of an fp32 one; the inputs'
//! 8% of a bf16 encode). Inside the passes it is about a dozen instructions per 32 bytes
//! on data already in registers: on the Zen 2, in each of three code placements, `--fast`
//! decode +1–2.5% (the default layout's unchanged) and `--fast` encode +5–6% (bf16) and
//! +2–3% (fp32) (docs/BENCHMARKS.md).
//!
//! Where the CPU has VPCLMULQDQ (AMD from Zen 3, Intel from Ice Lake), the accumulator is
//! 32 bytes and a piece folds by two 256-bit `vpclmulqdq` and two xors instead of an
//! extract, four 128-bit multiplies and four xors: on a Zen 3, decode +2.4–4.5% and
//! encode +1–5% at the AVX2 level. Zen 2 keeps the 128-bit form.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

/// `crc32fast`'s fold-by-one constants: reflect(x^(128+32) mod P), reflect(x^(128-32) mod P).
const K3: i64 = 0x1751997d0;
const K4: i64 = 0x0ccaa009e;

/// The same for a 256-bit fold (each 128-bit half of the accumulator moved on by 256 bits):
/// reflect(x^(256+32) mod P), reflect(x^(256-32) mod P), by the computation that gives
/// `K3` and `K4` for 128 + 32 and 128 - 32.
const K256_LO: i64 = 0x0f1da05aa;
const K256_HI: i64 = 0x15a546366;

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xEDB8_8320;

/// A CRC-32 in progress over whole 32-byte pieces, continuing a `crc32fast::Hasher`.
pub(in crate::backend::cpu) struct Fold {
    /// The folded message so far, from a zero register: 16 bytes (the low half), or 32
    /// where `wide`, whose CRC-32 is that of everything folded (starting as zero bytes and
    /// 4 that bring the register from zero to the hasher's: what came before, with no
    /// per-piece work to fold it in).
    acc: __m256i,
    /// `K256_LO, K256_HI` in both halves where `wide`, else `K3, K4` in the low half.
    keys: __m256i,
    /// Fold 32 bytes by two 256-bit `vpclmulqdq` (the CPU has VPCLMULQDQ: Zen 3 on, Intel
    /// from Ice Lake) instead of four 128-bit ones: four vector operations a piece instead
    /// of nine ([`clmul256`]).
    wide: bool,
    bytes: u64,
}

impl Fold {
    /// Continue from `h` (nothing folded yet).
    ///
    /// # Safety
    /// SSE2 (every x86-64 CPU).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new(h: &crc32fast::Hasher) -> Self {
        Self::new_as(h, wide_clmul())
    }

    /// [`Fold::new`] in the form `wide` says (true only where the CPU has VPCLMULQDQ).
    ///
    /// # Safety
    /// SSE2; VPCLMULQDQ and AVX2 where `wide`.
    #[inline(always)]
    unsafe fn new_as(h: &crc32fast::Hasher, wide: bool) -> Self {
        // `crc32fast`'s state is the register's complement. Four message bytes `x` take a
        // zero register to the 32 bit steps of `x` (each step `r >> 1`, xor `POLY` where the
        // bit shifted out was set); undone step by step (a set top bit says that bit was
        // set, as `POLY`'s top bit is), they give the bytes that take it to `register`.
        let mut x = !h.clone().finalize();
        for _ in 0..32 {
            x = if x >> 31 == 1 {
                (x ^ POLY) << 1 | 1
            } else {
                x << 1
            };
        }
        // Built in memory, not by AVX intrinsics: callers without AVX make a fold too (then
        // not `wide`), and only the AVX2 passes fold into it.
        let (acc, keys): ([u32; 8], [i64; 4]) = if wide {
            // 28 zero bytes, then the 4 (leading zeros leave a zero register at zero).
            (
                [0, 0, 0, 0, 0, 0, 0, x],
                [K256_LO, K256_HI, K256_LO, K256_HI],
            )
        } else {
            ([0, 0, 0, x, 0, 0, 0, 0], [K3, K4, 0, 0])
        };
        Fold {
            acc: core::mem::transmute::<[u32; 8], __m256i>(acc),
            keys: core::mem::transmute::<[i64; 4], __m256i>(keys),
            wide,
            bytes: 0,
        }
    }

    /// Fold the 32 bytes of `v` (in memory order), which follow what came before.
    ///
    /// # Safety
    /// AVX2 and PCLMULQDQ (inlined into code built for them).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn add32(&mut self, v: __m256i) {
        if self.wide {
            // Each half of the accumulator moved on by the 32 bytes, the piece added.
            let (a, k) = (self.acc, self.keys);
            let folded = _mm256_xor_si256(clmul256::<0x00>(a, k), clmul256::<0x11>(a, k));
            self.acc = _mm256_xor_si256(folded, v);
        } else {
            let keys = _mm256_castsi256_si128(self.keys);
            let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let a = _mm_xor_si128(fold128(_mm256_castsi256_si128(self.acc), keys), lo);
            self.acc = _mm256_castsi128_si256(_mm_xor_si128(fold128(a, keys), hi));
        }
        self.bytes += 32;
    }

    /// The 16 bytes whose CRC-32 from a zero register is that of everything folded.
    #[inline(always)]
    unsafe fn acc128(&self) -> __m128i {
        // Halves taken in memory, as in `new_as`.
        let [first, second] = core::mem::transmute::<__m256i, [__m128i; 2]>(self.acc);
        if self.wide {
            // The first half moved on by the second's 16 bytes, then the second added.
            _mm_xor_si128(fold128(first, _mm_set_epi64x(K4, K3)), second)
        } else {
            first
        }
    }

    /// `h` as if it had hashed every byte folded here, and a fresh fold from there.
    ///
    /// # Safety
    /// SSE2; `h` is the hasher this fold continued.
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn flush(&mut self, h: &mut crc32fast::Hasher) {
        if self.bytes == 0 {
            return;
        }
        let mut a = [0u8; 16];
        _mm_storeu_si128(a.as_mut_ptr().cast(), self.acc128());
        // From a zero register (`crc32fast`'s state is the register's complement).
        let mut z = crc32fast::Hasher::new_with_initial(!0);
        z.update(&a);
        *h = crc32fast::Hasher::new_with_initial_len(z.finalize(), h.total_len() + self.bytes);
        *self = Fold::new_as(h, self.wide);
    }
}

/// `a` moved on by 16 bytes, `keys` = `K3, K4`.
///
/// # Safety
/// PCLMULQDQ (inlined into code built for it).
#[inline(always)]
unsafe fn fold128(a: __m128i, keys: __m128i) -> __m128i {
    _mm_xor_si128(
        _mm_clmulepi64_si128::<0x00>(a, keys),
        _mm_clmulepi64_si128::<0x11>(a, keys),
    )
}

/// Whether this CPU runs 256-bit `vpclmulqdq` (and AVX, which its VEX form needs).
fn wide_clmul() -> bool {
    is_x86_feature_detected!("vpclmulqdq") && is_x86_feature_detected!("avx2")
}

/// `vpclmulqdq` of `a` and `b` with immediate `IMM` (0x00: the low quadwords of each 128-bit
/// half, 0x11: the high ones), by inline assembly: as an intrinsic it would need VPCLMULQDQ
/// enabled in every pass that folds, which the AVX2 level does not assume (Zen 2 has no
/// VPCLMULQDQ); the passes pick the form at run time ([`Fold::wide`]). One instruction per
/// block, the xors left to the compiler: the whole fold as one block read 0.960 and 0.967
/// against this (`--fast` fp32 decode on a Zen 3, a noisy window; docs/BENCHMARKS.md).
///
/// # Safety
/// The CPU has VPCLMULQDQ and AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn clmul256<const IMM: u8>(a: __m256i, b: __m256i) -> __m256i {
    let r: __m256i;
    core::arch::asm!(
        "vpclmulqdq {r}, {a}, {b}, {imm}",
        r = lateout(ymm_reg) r, a = in(ymm_reg) a, b = in(ymm_reg) b, imm = const IMM,
        options(pure, nomem, nostack, preserves_flags)
    );
    r
}

/// A `crc32fast::Hasher` with a [`Fold`] in front of it: 32-byte pieces folded, anything
/// else hashed in order.
pub(in crate::backend::cpu) struct Running {
    h: crc32fast::Hasher,
    fold: Fold,
}

impl Running {
    /// # Safety
    /// SSE2 (every x86-64 CPU).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new() -> Self {
        let h = crc32fast::Hasher::new();
        let fold = Fold::new(&h);
        Running { h, fold }
    }

    /// # Safety
    /// As [`Fold::add32`].
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn add32(&mut self, v: __m256i) {
        self.fold.add32(v);
    }

    /// Hash `bytes`, which follow what came before.
    ///
    /// # Safety
    /// SSE2.
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn update(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.fold.flush(&mut self.h);
            self.h.update(bytes);
            self.fold = Fold::new(&self.h);
        }
    }

    /// The hasher, as if it had hashed everything itself.
    ///
    /// # Safety
    /// SSE2.
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn finish(mut self) -> crc32fast::Hasher {
        self.fold.flush(&mut self.h);
        self.h
    }
}

#[cfg(test)]
mod tests {
    use super::{wide_clmul, Fold};
    use core::arch::x86_64::*;

    /// Any split of a message into a hashed prefix, folded 32-byte pieces and a hashed rest
    /// gives `crc32fast`'s CRC-32 and length.
    #[test]
    fn folding_matches_crc32fast() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("pclmulqdq")) {
            eprintln!("SKIP: this CPU has no AVX2 or PCLMULQDQ");
            return;
        }
        let data: Vec<u8> = (0..4096u32)
            .map(|k| (k.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        #[target_feature(enable = "avx2,pclmulqdq")]
        unsafe fn run(
            data: &[u8],
            wide: bool,
            pre: usize,
            pieces: usize,
            rounds: usize,
        ) -> (u32, u64) {
            let mut h = crc32fast::Hasher::new();
            let mut at = 0;
            for _ in 0..rounds {
                h.update(&data[at..at + pre]);
                at += pre;
                let mut f = Fold::new_as(&h, wide);
                for _ in 0..pieces {
                    f.add32(_mm256_loadu_si256(data[at..].as_ptr().cast()));
                    at += 32;
                }
                f.flush(&mut h);
            }
            h.update(&data[at..]);
            (h.clone().finalize(), h.total_len())
        }
        let want = crc32fast::hash(&data);
        let mut forms = vec![false];
        if wide_clmul() {
            forms.push(true);
        } else {
            eprintln!("SKIP (256-bit form): this CPU has no VPCLMULQDQ");
        }
        for wide in forms {
            for pre in [0, 1, 3, 16, 33] {
                for pieces in [0, 1, 2, 5, 31] {
                    for rounds in [1, 2, 3] {
                        // SAFETY: the features were checked above.
                        let got = unsafe { run(&data, wide, pre, pieces, rounds) };
                        assert_eq!(
                            got,
                            (want, 4096),
                            "wide {wide} pre {pre} pieces {pieces} rounds {rounds}"
                        );
                    }
                }
            }
        }
    }
}
