//! The fast CPU backend: the reference codec's exact operations, specialized per element
//! width, on compact per-element codes, with rayon across chunks (and, through the callers,
//! across tensors). Its output is checked byte for byte against the reference in
//! tests/backend_parity.rs.

mod avx2;
mod avx512;
mod decode;
mod encode;
mod hist;
mod joint;
mod joint_near;
pub mod lm;
mod neon;
mod residuals;
mod tables;
mod word;

use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use super::{Backend, Checked, DecodeJob, EncodeJob, HistRequest, Resident};
use crate::dtype::FloatLayout;
use crate::format::chunk::{chunk_ranges, EncodedChunk, CHUNK_ELEMS};
use crate::format::layout_stages;
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::format::{check_layout, layout_spaces};
use crate::{Error, Result};
use residuals::Residuals as _;
use tables::{DecStage, EncStage};
use word::{InfoFn, Word};

/// The fast CPU backend at the best instruction set this CPU has ([`Isa::detect`]).
pub struct CpuBackend;

/// The fast CPU backend pinned to one instruction set, so tests can run every path this
/// CPU supports (each must give the reference's bytes) and benches can compare them.
#[derive(Clone, Copy, Debug)]
pub struct CpuAt(Isa);

impl CpuAt {
    /// The backend at `isa`, if this CPU runs it.
    pub fn new(isa: Isa) -> Option<CpuAt> {
        isa.available().then_some(CpuAt(isa))
    }
    pub fn isa(&self) -> Isa {
        self.0
    }
}

/// How the AVX2 level's neighbor form looks its tables up: the decode lanes' three per
/// element, the encoder's row and symbol per element and its lanes' packed entries. Both
/// ways give the same bytes; which is faster depends on the CPU: a Zen 2's
/// `vpgatherdd` of 8 dwords takes about 16.5 cycles (scalar loads were 9-13% faster there,
/// `avx2::gather`), and the microcode mitigation of Downfall (GDS) slows gathers on the
/// Intel cores it covers, where an Intel Xeon of family 6 model 207 (Emerald Rapids class,
/// not affected) decodes bf16 9-13% and fp32 0-11% faster with them, and encodes the
/// default layout's bf16 6-13% faster. On a Zen 3 (AMD EPYC, family 25) the default
/// layout's fp32 decode runs 1.34-1.36x faster with gathers (medians of per-pair ratios,
/// passes alternated in one process: `measure lookups`), its bf16 decode 0.94-0.99x, both
/// encodes 0.99-1.01x (docs/BENCHMARKS.md, 2026-12-06).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Avx2Lookups {
    /// Gathers on an Intel CPU the Linux kernel reports not affected by GDS and on AMD
    /// from Zen 3 (family 25) on; scalar loads everywhere else (Zen 2 and older, older
    /// kernels, other systems): the measured cases.
    Auto,
    ScalarLoads,
    Gathers,
}

/// A yes-or-no choice of code path made per CPU (`detect`, asked once), which tests and
/// measurements may pin either way: every choice gives the same bytes.
struct CpuChoice {
    /// 0: `detect`'s answer; 1: no; 2: yes (the `Auto`, first, second variants of the
    /// public enums that set it).
    pinned: std::sync::atomic::AtomicU8,
    auto: std::sync::OnceLock<bool>,
    detect: fn() -> bool,
}

impl CpuChoice {
    const fn new(detect: fn() -> bool) -> Self {
        CpuChoice {
            pinned: std::sync::atomic::AtomicU8::new(0),
            auto: std::sync::OnceLock::new(),
            detect,
        }
    }

    fn pin(&self, v: u8) {
        self.pinned.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    fn yes(&self) -> bool {
        match self.pinned.load(std::sync::atomic::Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => *self.auto.get_or_init(self.detect),
        }
    }
}

static AVX2_LOOKUPS: CpuChoice = CpuChoice::new(fast_gathers);

/// Pin how the AVX2 neighbor form looks up (for tests and measurements: every choice gives
/// the same bytes).
pub fn set_avx2_lookups(l: Avx2Lookups) {
    AVX2_LOOKUPS.pin(l as u8);
}

/// Whether the AVX2 neighbor form looks up by gathers ([`Avx2Lookups`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn avx2_gathers() -> bool {
    AVX2_LOOKUPS.yes()
}

/// An Intel CPU that Linux reports not affected by Gather Data Sampling, or an AMD CPU of
/// family 25 (Zen 3, Zen 4) or later.
fn fast_gathers() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if amd() {
            return amd_family(std::arch::x86_64::__cpuid(1).eax) >= 25;
        }
        intel()
            && std::fs::read_to_string(
                "/sys/devices/system/cpu/vulnerabilities/gather_data_sampling",
            )
            .is_ok_and(|s| s.trim() == "Not affected")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// CPUID's vendor string, as its three registers.
#[cfg(target_arch = "x86_64")]
fn vendor() -> (u32, u32, u32) {
    let id = std::arch::x86_64::__cpuid(0);
    (id.ebx, id.edx, id.ecx)
}

/// "GenuineIntel".
fn intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    return vendor() == (0x756e_6547, 0x4965_6e69, 0x6c65_746e);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// "AuthenticAMD".
#[cfg(target_arch = "x86_64")]
fn amd() -> bool {
    vendor() == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
}

/// Which lanes decode the Joint layout (`--fast`, and the default layout's neighbor form)
/// at the AVX-512 level. Both give the same bytes. The AVX2 decode (four interleaved
/// 8-lane vectors, its neighbor form's 16-slot buckets, the tail pass fused into the
/// lanes' loop) was tuned on AVX2-only CPUs after the AVX-512 lanes were written, and on an
/// Intel Xeon with AVX-512 (family 6 model 167, Sapphire Rapids features) it now decodes
/// the Joint layout faster than those: `--fast` bf16 1.00-1.05x, fp32 1.13-1.19x, the
/// default layout's bf16 1.12-1.18x, fp32 1.20-1.30x (docs/BENCHMARKS.md, 2026-12-07). The
/// signed layout's AVX-512 decode stays faster there (its AVX2 decode 0.77-0.91x), and no
/// AMD CPU with AVX-512 (Zen 4, Zen 5) has compared the two since, so those keep theirs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Avx512JointDecode {
    /// The AVX2 lanes on an Intel CPU, the AVX-512 lanes elsewhere: the measured cases.
    Auto,
    Avx512Lanes,
    Avx2Lanes,
}

/// Whether the AVX-512 level decodes the Joint layout with the AVX2 lanes.
static AVX512_JOINT_BY_AVX2: CpuChoice = CpuChoice::new(intel);

/// Pin which lanes the AVX-512 level decodes the Joint layout with (for tests and
/// measurements: every choice gives the same bytes).
pub fn set_avx512_joint_decode(l: Avx512JointDecode) {
    AVX512_JOINT_BY_AVX2.pin(l as u8);
}

/// The level whose code decodes a tensor of `layout` at `isa`: `isa`, except the Joint
/// layout at AVX-512 where [`Avx512JointDecode`] says AVX2.
fn decode_level(isa: Isa, layout: Layout) -> Isa {
    if isa != Isa::Avx512 || layout != Layout::Joint {
        return isa;
    }
    if AVX512_JOINT_BY_AVX2.yes() {
        Isa::Avx2
    } else {
        isa
    }
}

/// The family of CPUID leaf 1's `eax`: the base family, plus the extended family where the
/// base is 15 (every AMD CPU since the K8).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn amd_family(eax: u32) -> u32 {
    let base = (eax >> 8) & 0xF;
    if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    }
}

/// Instruction-set level of the fast CPU paths, for both codecs (the language model's kernels
/// in `lm/` take the same level, so pinning one pins both). Every level gives the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, as built for the target.
    Portable,
    /// Explicit aarch64 NEON rANS lanes of every layout, decoding and encoding (4 per
    /// vector, no gathers: table lookups stay scalar or lane loads; the Joint layout's
    /// neighbor form too, over its packed-table entries), and every layout's
    /// codes-and-tails pass and tail pass for 16- and 32-bit floats. Ordered below the x86
    /// levels so that `isa >= Isa::Avx2` stays false for it; NEON is baseline on aarch64,
    /// so [`Isa::detect`] picks it there.
    Neon,
    /// Explicit AVX2 rANS lanes, encoding and decoding (8 per vector), and the decoder's
    /// tail pass; the other loops compiled with AVX2 (auto-vectorized, no intrinsics). The
    /// language model uses AVX-VNNI dot products here where the CPU has them.
    Avx2,
    /// Explicit AVX-512 (F, BW, VL, CD) rANS lanes: 16 lanes per vector. The language model
    /// uses VNNI dot products here where the CPU has them (AVX2 ones where it has not).
    Avx512,
}

impl Isa {
    /// The best level this CPU runs (cached).
    pub fn detect() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .iter()
                .rev()
                .copied()
                .find(|i| i.available())
                .unwrap_or(Isa::Portable)
        })
    }

    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Neon, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the level.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            // PCLMULQDQ: the AVX2 decode folds the output's CRC-32 by carry-less multiplies
            // (`avx2::crc`); every AVX2 CPU has it.
            let avx2 = has!("avx2")
                && has!("bmi1")
                && has!("bmi2")
                && has!("lzcnt")
                && has!("popcnt")
                && has!("pclmulqdq");
            match self {
                Isa::Portable => true,
                Isa::Neon => false,
                Isa::Avx2 => avx2,
                Isa::Avx512 => {
                    avx2 && has!("avx512f")
                        && has!("avx512bw")
                        && has!("avx512vl")
                        && has!("avx512cd")
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            match self {
                Isa::Portable => true,
                Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
                Isa::Avx2 | Isa::Avx512 => false,
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            self == Isa::Portable
        }
    }

    /// Lower-case name for device names and the command line ("portable", "avx2", ...).
    pub fn tag(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Neon => "NEON",
            Isa::Avx2 => "AVX2",
            Isa::Avx512 => "AVX-512",
        }
    }
}

/// One tensor pair on the CPU. Its residuals (`residuals::Residuals`) are computed per
/// chunk where each pass uses them, not kept whole; a first pass over the reference finds
/// its exponent classes, or the `--fast` histogram's own pass does
/// (`joint::residual_histogram`). At AVX2 the inputs' CRC-32s are folded from the vectors
/// the residuals are computed from (`avx2::crc`), the first time each chunk's are, which
/// saves the encoder a `crc32fast` pass over both inputs from memory.
struct CpuResident<'a, T: Word> {
    isa: Isa,
    fl: FloatLayout,
    info_fn: InfoFn,
    reference: &'a [u8],
    target: &'a [u8],
    /// CRC-32s of the reference and the target, where a pass hashed them whole.
    crcs: std::sync::OnceLock<[u32; 2]>,
    /// Per chunk, both inputs' running CRC-32s, where computing its residuals hashed them
    /// (empty where the level does not).
    hashes: Vec<std::sync::OnceLock<[crc32fast::Hasher; 2]>>,
    /// The lowest and highest exponent class of the facts (the Joint layout's histogram and
    /// flat table both need it: one pass, not two).
    er: std::sync::OnceLock<(usize, usize)>,
    _word: std::marker::PhantomData<T>,
}

/// Run `f` compiled for AVX2 (and BMI, LZCNT, POPCNT) when `isa` allows it, else as built.
/// No intrinsics: the same operations, so the same bytes; the compiler just vectorizes more
/// of the lane and counting loops (32-bit multiplies, gathers) than baseline x86-64 allows.
/// `f` and what it calls must be `#[inline(always)]` to be compiled inside the AVX2 copy.
#[inline(always)]
fn fast<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        debug_assert!(isa.available());
        // SAFETY: `isa` is only ever a level `Isa::available` confirmed on this CPU
        // (`CpuAt` checks it on construction).
        return unsafe { avx2(f) };
    }
    let _ = isa;
    f()
}

fn check_tables(layout: Layout, tables: &Tables) -> Result<()> {
    let want = layout_stages(layout).len();
    if tables.stages.len() != want {
        return Err(Error::Invalid(format!(
            "{} stage tables for a layout with {want} stages",
            tables.stages.len()
        )));
    }
    Ok(())
}

impl<'a, T: Word> CpuResident<'a, T> {
    fn new(isa: Isa, job: &EncodeJob<'a>) -> Self {
        let mut cpu = CpuResident {
            isa,
            fl: job.fl,
            info_fn: InfoFn::new(job.fl, job.condition),
            reference: job.reference,
            target: job.target,
            crcs: std::sync::OnceLock::new(),
            hashes: Vec::new(),
            er: std::sync::OnceLock::new(),
            _word: std::marker::PhantomData,
        };
        if cpu.avx2_residuals() {
            let chunks = cpu.n().div_ceil(CHUNK_ELEMS);
            cpu.hashes = (0..chunks).map(|_| std::sync::OnceLock::new()).collect();
        }
        cpu
    }

    /// The exponent classes the facts span.
    fn er_range(&self) -> (usize, usize) {
        *self.er.get_or_init(|| self.first_pass())
    }

    /// Both sides have `n` whole elements (the callers check the lengths are equal; the
    /// minimum keeps every chunk below fully written whatever a job holds).
    fn n(&self) -> usize {
        self.reference.len().min(self.target.len()) / T::SIZE
    }

    /// The bytes of elements `r` of the reference and of the target.
    fn bytes(&self, r: &Range<usize>) -> (&'a [u8], &'a [u8]) {
        let b = r.start * T::SIZE..r.end * T::SIZE;
        (&self.reference[b.clone()], &self.target[b])
    }

    /// Whether the AVX2 residual kernel applies (also at the AVX-512 level): 16- and
    /// 32-bit floats, inputs of whole elements (so its CRC-32s cover them).
    fn avx2_residuals(&self) -> bool {
        let n = self.n();
        cfg!(target_arch = "x86_64")
            && self.isa >= Isa::Avx2
            && matches!(T::BITS, 16 | 32)
            && !self.info_fn.wide()
            && self.reference.len() == n * T::SIZE
            && self.target.len() == n * T::SIZE
    }

    /// Chunk `r`'s displacements and facts, written to `d` and `info` (`r.len()` each).
    #[inline(always)]
    fn residuals_into(&self, r: &Range<usize>, d: &mut [T], info: &mut [u16]) {
        let (rb, xb) = self.bytes(r);
        let info_fn = self.info_fn;
        #[cfg(target_arch = "x86_64")]
        if let Some(hash) = self.hashes.get(r.start / CHUNK_ELEMS) {
            // Hashed the first time (not where the `--fast` histogram's pass hashed the
            // inputs whole).
            // SAFETY (both): `hashes` is only filled where `avx2_residuals` holds: `isa` is
            // AVX2 or AVX-512 (which implies AVX2's features), a level `Isa::available`
            // confirmed; `T` is u16 or u32 and `info_fn` not wide.
            if hash.get().is_none() && self.crcs.get().is_none() {
                let h = unsafe {
                    let mut h = [avx2::crc::Running::new(), avx2::crc::Running::new()];
                    avx2::hist::residuals::<T>(rb, xb, d, info, info_fn, &mut h);
                    h.map(|h| h.finish())
                };
                let _ = hash.set(h);
            } else {
                unsafe { avx2::hist::displacements::<T>(rb, xb, d, info, info_fn) };
            }
            return;
        }
        hist::simd(
            self.isa,
            #[inline(always)]
            || match (info_fn.condition(), info_fn.wide()) {
                (false, _) => residual_chunk::<T, false, false>(d, info, rb, xb, info_fn),
                (true, false) => residual_chunk::<T, true, false>(d, info, rb, xb, info_fn),
                (true, true) => residual_chunk::<T, true, true>(d, info, rb, xb, info_fn),
            },
        );
    }

    /// The first pass: the exponent classes the reference's facts span, chunk by chunk on
    /// the pool (at AVX2 from the reference alone; elsewhere from the facts, computed into
    /// scratch and dropped).
    fn first_pass(&self) -> (usize, usize) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2_residuals() {
            let params = self.info_fn.joint_params();
            let (lo, hi) = chunk_ranges(self.n())
                .into_par_iter()
                // SAFETY: `avx2_residuals`: AVX2 (or AVX-512, which implies it), a level
                // `Isa::available` confirmed on this CPU.
                .map(|r| unsafe { avx2::hist::er_range_of::<T>(self.bytes(&r).0, params) })
                .reduce(|| (usize::MAX, 0), |a, b| (a.0.min(b.0), a.1.max(b.1)));
            return if lo > hi { (0, 0) } else { (lo, hi) };
        }
        joint::merge_ranges(chunk_ranges(self.n()).into_par_iter().map(|r| {
            residuals::with_room::<T, _>(r.len(), |d, info| {
                self.residuals_into(&r, d, info);
                joint::byte_range(info)
            })
        }))
    }

    /// The Joint histogram, with the residuals in the same pass where the level has a kernel
    /// for it and they are not computed yet.
    fn joint_histogram(&self) -> Hist {
        if self.er.get().is_none() {
            let (r, x) = (self.reference, self.target);
            let fused = joint::residual_histogram::<T>(self.isa, r, x, self.info_fn, self.fl.width);
            if let Some((h, crcs, er)) = fused {
                let _ = self.crcs.set(crcs);
                let _ = self.er.set(er);
                return h;
            }
        }
        joint::histogram(self.isa, self, self.er_range(), self.fl.width)
    }

    fn w1(&self) -> usize {
        self.fl.width as usize + 1
    }

    /// The histograms of `layout`, and with `and_paper` (Signed only) the Paper layout's,
    /// counted in the same pass.
    fn counts(
        &self,
        layout: Layout,
        distance: Option<usize>,
        and_paper: bool,
    ) -> Result<(Vec<Hist>, Option<Vec<Hist>>)> {
        check_layout(layout, self.fl.width)?;
        if let (Layout::Joint, Some(d)) = (layout, distance) {
            let h = joint_near::histogram(self.isa, self, self.er_range(), self.fl.width, d);
            return Ok((vec![h], None));
        }
        if layout == Layout::Joint {
            return Ok((vec![self.joint_histogram()], None));
        }
        let signed = layout == Layout::Signed;
        let neighbor = if signed { distance } else { None };
        let spaces = layout_spaces(layout, self.fl.width, neighbor);
        let shape = hist::Shape::new(&spaces, signed, neighbor);
        let paper_spaces = layout_spaces(Layout::Paper, self.fl.width, None);
        let paper_shape = hist::Shape::new(&paper_spaces, false, None);
        let with_paper = signed && and_paper;
        let new = || {
            if with_paper {
                hist::Acc::with_paper(shape, paper_shape)
            } else {
                hist::Acc::new(shape)
            }
        };
        let acc = chunk_ranges(self.n())
            .into_par_iter()
            .fold(new, |mut acc, r| {
                self.chunk(r, |d, info| hist::count(self.isa, d, info, &mut acc));
                acc
            })
            .reduce_with(hist::Acc::merge)
            .unwrap_or_else(new);
        let paper = acc.paper().map(|p| p.hists(&paper_spaces));
        Ok((acc.hists(&spaces), paper))
    }
}

/// Displacements and reference facts of one chunk's elements (`r`, `x`: their bytes).
#[inline(always)]
fn residual_chunk<T: Word, const COND: bool, const WIDE: bool>(
    d: &mut [T],
    info: &mut [u16],
    r: &[u8],
    x: &[u8],
    info_fn: InfoFn,
) {
    let elems = r.chunks_exact(T::SIZE).zip(x.chunks_exact(T::SIZE));
    for ((d, i), (r, x)) in d.iter_mut().zip(info.iter_mut()).zip(elems) {
        let (r, x) = (T::read(r), T::read(x));
        let k = word::key::<T>(x).wrapping_sub(word::key::<T>(r)) & word::mask::<T>();
        *d = T::from_u64(k);
        *i = info_fn.info_as::<T, COND, WIDE>(r) as u16;
    }
}

impl<T: Word> residuals::Residuals<T> for CpuResident<'_, T> {
    fn elements(&self) -> usize {
        self.n()
    }
    fn chunk<R>(&self, r: Range<usize>, f: impl FnOnce(&[T], &[u16]) -> R) -> R {
        residuals::with_room::<T, _>(r.len(), |d, info| {
            self.residuals_into(&r, d, info);
            f(d, info)
        })
    }
}

impl<T: Word> Resident for CpuResident<'_, T> {
    fn input_crcs(&self) -> Option<[u32; 2]> {
        if let Some(&crcs) = self.crcs.get() {
            return Some(crcs);
        }
        // The chunks' hashes combined in order, where every chunk was hashed.
        if self.hashes.is_empty() && self.n() > 0 {
            return None;
        }
        let mut crcs = [crc32fast::Hasher::new(), crc32fast::Hasher::new()];
        for h in &self.hashes {
            let [r, x] = h.get()?;
            crcs[0].combine(r);
            crcs[1].combine(x);
        }
        Some(crcs.map(|h| h.finalize()))
    }

    fn residual_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.n() * T::SIZE];
        for r in chunk_ranges(self.n()) {
            let o = &mut out[r.start * T::SIZE..r.end * T::SIZE];
            self.chunk(r, |d, _| {
                for (o, &d) in o.chunks_exact_mut(T::SIZE).zip(d) {
                    T::write(d.get(), o);
                }
            });
        }
        Ok(out)
    }

    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>> {
        // A Signed pass also counts the Paper layout (same displacements, one more table):
        // a request for both, as the encoder's `auto` makes, is answered in one pass.
        let signed = requests.iter().position(|r| r.layout == Layout::Signed);
        let paper = requests.iter().position(|r| r.layout == Layout::Paper);
        let mut out: Vec<Option<Vec<Hist>>> = vec![None; requests.len()];
        if let (Some(s), Some(p)) = (signed, paper) {
            let (hs, hp) = self.counts(Layout::Signed, requests[s].distance, true)?;
            out[s] = Some(hs);
            out[p] = hp;
        }
        for (o, r) in out.iter_mut().zip(requests) {
            if o.is_none() {
                *o = Some(self.counts(r.layout, r.distance, false)?.0);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        check_layout(layout, self.fl.width)?;
        check_tables(layout, tables)?;
        let signed = layout == Layout::Signed;
        let stages: Vec<EncStage> = tables.stages.iter().map(EncStage::new).collect();
        let n = self.n();
        if layout == Layout::Joint && stages[0].neighbor {
            let d = distance.ok_or_else(|| {
                Error::Invalid("the joint stage's neighbor form without a distance".into())
            })?;
            let w1 = self.w1();
            return Ok(chunk_ranges(n)
                .into_par_iter()
                .map(|r| {
                    self.chunk(r, |dr, info| {
                        encode::with_scratch(|scratch| {
                            #[cfg(target_arch = "x86_64")]
                            if self.isa >= Isa::Avx2 {
                                let t = &stages[0];
                                // SAFETY: `isa` is only ever a level `Isa::available` confirmed
                                // on this CPU; AVX-512 implies AVX2.
                                return unsafe {
                                    if self.isa == Isa::Avx512 {
                                        avx512::joint_near::encode_chunk(
                                            dr, info, t, d, w1, scratch,
                                        )
                                    } else if avx2_gathers() {
                                        avx2::joint_near::encode_chunk::<_, true>(
                                            dr, info, t, d, w1, scratch,
                                        )
                                    } else {
                                        avx2::joint_near::encode_chunk::<_, false>(
                                            dr, info, t, d, w1, scratch,
                                        )
                                    }
                                };
                            }
                            #[cfg(target_arch = "aarch64")]
                            if self.isa == Isa::Neon {
                                // SAFETY: `isa` is only ever a level `Isa::available` confirmed
                                // on this CPU.
                                return unsafe {
                                    neon::joint::encode_near_chunk(
                                        dr, info, &stages[0], d, w1, scratch,
                                    )
                                };
                            }
                            fast(
                                self.isa,
                                #[inline(always)]
                                || joint_near::encode_chunk(dr, info, &stages[0], d, w1, scratch),
                            )
                        })
                    })
                })
                .collect());
        }
        if layout == Layout::Joint {
            // The flat table serves every vector encoder (small tensors: the portable lanes).
            #[cfg(target_arch = "x86_64")]
            let flat = (self.isa >= Isa::Avx2)
                .then(|| joint::JointFlat::new(&stages[0], n, self.er_range()))
                .flatten();
            #[cfg(target_arch = "aarch64")]
            let flat = (self.isa == Isa::Neon)
                .then(|| joint::JointFlat::new(&stages[0], n, self.er_range()))
                .flatten();
            return Ok(chunk_ranges(n)
                .into_par_iter()
                .map(|r| {
                    self.chunk(r, |d, info| {
                        encode::with_scratch(|scratch| {
                            #[cfg(target_arch = "x86_64")]
                            if let Some(flat) = &flat {
                                // SAFETY: `flat` exists only at `isa >= Avx2`, and `isa` is only ever
                                // a level `Isa::available` confirmed on this CPU; `Avx512` and `Avx2`
                                // require the features the two `encode_chunk`s are compiled for.
                                return unsafe {
                                    if self.isa == Isa::Avx512 {
                                        avx512::joint::encode_chunk(d, info, flat, scratch)
                                    } else {
                                        avx2::joint::encode_chunk(d, info, flat, scratch)
                                    }
                                };
                            }
                            #[cfg(target_arch = "aarch64")]
                            if let Some(flat) = &flat {
                                // SAFETY: `flat` exists only at `isa == Neon`, and `isa` is only ever
                                // a level `Isa::available` confirmed on this CPU.
                                return unsafe {
                                    neon::joint::encode_chunk(d, info, flat, scratch)
                                };
                            }
                            fast(
                                self.isa,
                                #[inline(always)]
                                || joint::encode_chunk(d, info, &stages[0], scratch),
                            )
                        })
                    })
                })
                .collect());
        }
        // The flat tables serve both vector encoders.
        #[cfg(target_arch = "x86_64")]
        let flat = (self.isa >= Isa::Avx2)
            .then(|| avx512::encode::Flat::new(&stages, self.w1(), n, self.er_range()));
        Ok(chunk_ranges(n)
            .into_par_iter()
            .map(|r| {
                self.chunk(r, |d, info| {
                    encode::with_scratch(|scratch| {
                        #[cfg(target_arch = "x86_64")]
                        if let Some(flat) = &flat {
                            let w1 = self.w1();
                            // SAFETY: `flat` exists only at `isa >= Avx2`, and `isa` is only ever a
                            // level `Isa::available` confirmed on this CPU (`CpuAt` checks it on
                            // construction); `Avx512` and `Avx2` require the features
                            // `avx512::encode::chunk` and `avx2::encode::chunk` are compiled for.
                            return unsafe {
                                if self.isa == Isa::Avx512 {
                                    avx512::encode::chunk(
                                        d, info, signed, w1, &stages, flat, distance, scratch,
                                    )
                                } else {
                                    avx2::encode::chunk(
                                        d, info, signed, w1, &stages, flat, distance, scratch,
                                    )
                                }
                            };
                        }
                        #[cfg(target_arch = "aarch64")]
                        if self.isa == Isa::Neon {
                            // SAFETY: `isa` is only ever a level `Isa::available` confirmed on this
                            // CPU.
                            return unsafe {
                                neon::encode::chunk(
                                    d,
                                    info,
                                    signed,
                                    self.w1(),
                                    &stages,
                                    distance,
                                    scratch,
                                )
                            };
                        }
                        fast(
                            self.isa,
                            #[inline(always)]
                            || {
                                encode::chunk(
                                    d,
                                    info,
                                    signed,
                                    self.w1(),
                                    &stages,
                                    distance,
                                    scratch,
                                )
                            },
                        )
                    })
                })
            })
            .collect())
    }
}

fn residuals_of<'a, T: Word>(isa: Isa, job: &EncodeJob<'a>) -> Box<dyn Resident + 'a> {
    Box::new(CpuResident::<T>::new(isa, job))
}

fn resident<'a>(isa: Isa, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
    Ok(match job.fl.width {
        8 => residuals_of::<u8>(isa, job),
        16 => residuals_of::<u16>(isa, job),
        32 => residuals_of::<u32>(isa, job),
        64 => residuals_of::<u64>(isa, job),
        w => return Err(Error::Unsupported(format!("{w}-bit floats"))),
    })
}

/// A job's decode, its tables built once, for any run of its chunks.
struct Decoder<'j, T> {
    isa: Isa,
    job: &'j DecodeJob<'j>,
    joint: Option<joint::JointDec<'j>>,
    stages: Vec<DecStage<'j>>,
    info_fn: InfoFn,
    _word: std::marker::PhantomData<T>,
}

impl<'j, T: Word> Decoder<'j, T> {
    /// The job's checks and tables.
    fn new(isa: Isa, job: &'j DecodeJob<'j>) -> Result<Self> {
        let isa = decode_level(isa, job.layout);
        check_layout(job.layout, job.fl.width)?;
        check_tables(job.layout, job.tables)?;
        let n = job.reference.len() / T::SIZE;
        if chunk_ranges(n).len() != job.chunks.len() {
            return Err(Error::format(
                "tensor blob",
                format!("{} chunks for {n} elements", job.chunks.len()),
            ));
        }
        let joint_near = job.layout == Layout::Joint && job.tables.stages[0].space.neighbor;
        if joint_near && job.distance.is_none() {
            return Err(Error::format(
                "tensor blob",
                "the joint stage's neighbor form without a distance",
            ));
        }
        let joint = (job.layout == Layout::Joint).then(|| {
            // The AVX2 neighbor-form lanes look up 16-slot buckets where they gather.
            let bucketed = isa == Isa::Avx2 && joint_near && avx2_gathers();
            let t = joint::JointDec::new(&job.tables.stages[0], bucketed);
            // The AVX2 lanes' context-ordered slots (see `JointDec::window_slots`): 1 MiB
            // written per tensor, so for tensors of a million elements or more.
            if isa == Isa::Avx2 && n >= 1 << 20 && !joint_near {
                t.with_window_slots(&job.tables.stages[0], T::BITS == 16)
            } else {
                t
            }
        });
        let stages: Vec<DecStage> = if joint.is_some() {
            Vec::new()
        } else {
            job.tables.stages.iter().map(DecStage::new).collect()
        };
        Ok(Decoder {
            isa,
            job,
            joint,
            stages,
            info_fn: InfoFn::new(job.fl, job.condition),
            _word: std::marker::PhantomData,
        })
    }

    /// The bytes of chunks `chunks` of the output.
    fn span(&self, chunks: &std::ops::Range<usize>) -> std::ops::Range<usize> {
        let (size, len) = (CHUNK_ELEMS * T::SIZE, self.job.reference.len());
        (chunks.start * size).min(len)..(chunks.end * size).min(len)
    }

    /// Decode chunks `chunks` into `out` (exactly their bytes), on the pool; with `hash`,
    /// the CRC-32 of what it wrote (0 without). On success every byte of `out` is written.
    fn chunks(
        &self,
        chunks: std::ops::Range<usize>,
        out: &mut [MaybeUninit<u8>],
        hash: bool,
    ) -> Result<crc32fast::Hasher> {
        let (isa, info_fn, job) = (self.isa, self.info_fn, self.job);
        let (signed, w1) = (job.layout.signed(), job.fl.width as usize + 1);
        let bytes = self.span(&chunks);
        assert_eq!(out.len(), bytes.len());
        // Each chunk's output is hashed by its decode (block by block while in L1, or after it).
        let crcs = out
            .par_chunks_mut(CHUNK_ELEMS * T::SIZE)
            .zip(job.reference[bytes].par_chunks(CHUNK_ELEMS * T::SIZE))
            .zip(job.chunks[chunks].par_iter())
            .map_init(
                || (Vec::new(), Vec::new(), Vec::new()),
                |scratch, ((o, r), c)| -> Result<crc32fast::Hasher> {
                    let mut crc = crc32fast::Hasher::new();
                    fast(
                        isa,
                        #[inline(always)]
                        || {
                            decode::chunk::<T>(
                                c,
                                r,
                                o,
                                isa,
                                info_fn,
                                signed,
                                w1,
                                &self.stages,
                                self.joint.as_ref(),
                                job.distance,
                                scratch,
                                hash.then_some(&mut crc),
                            )
                        },
                    )?;
                    Ok(crc)
                },
            )
            .collect::<Result<Vec<_>>>()?;
        let mut all = crc32fast::Hasher::new();
        for c in &crcs {
            all.combine(c);
        }
        Ok(all)
    }

    /// Every chunk into a new buffer.
    fn whole(&self, hash: bool) -> Result<Checked> {
        // Not zeroed first (that memset was 8% of a fast-layout decode): every chunk's
        // decode writes all of its bytes when it succeeds.
        let len = self.job.reference.len();
        let mut out: Vec<u8> = Vec::with_capacity(len);
        let crc = self.chunks(
            0..self.job.chunks.len(),
            &mut out.spare_capacity_mut()[..len],
            hash,
        )?;
        // SAFETY: the chunks cover `..len` and their successful decode wrote all its bytes
        // (`Decoder::chunks`); an error returned above, before this.
        unsafe { out.set_len(len) };
        Ok(Checked {
            out,
            crc: crc.finalize(),
        })
    }

    /// Chunks `chunks` into `buf` (emptied first), with their CRC-32.
    fn piece_into(
        &self,
        chunks: std::ops::Range<usize>,
        mut buf: Vec<u8>,
    ) -> Result<(Vec<u8>, crc32fast::Hasher)> {
        let len = self.span(&chunks).len();
        buf.clear();
        buf.reserve(len);
        let crc = self.chunks(chunks, &mut buf.spare_capacity_mut()[..len], true)?;
        // SAFETY: `chunks` wrote all `len` bytes (it returned without error).
        unsafe { buf.set_len(len) };
        Ok((buf, crc))
    }

    /// The chunks `per` at a time (`Backend::decode_pieces`) through two buffers: while
    /// `sink` takes one piece on this thread (in the CLI: hashing it and writing it to the
    /// file, a quarter to a half of a one-shot fp32 decode's time, timed in place, which
    /// left the pool idle when it came after the decode), the pool decodes the next into
    /// the other.
    fn pieces(&self, per: usize, sink: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<u32> {
        let n = self.job.chunks.len();
        let mut ranges = (0..n)
            .step_by(per.max(1))
            .map(|first| first..(first + per.max(1)).min(n));
        let Some(first) = ranges.next() else {
            sink(&[])?;
            return Ok(crc32fast::Hasher::new().finalize());
        };
        let (mut cur, mut crc) = self.piece_into(first, Vec::new())?;
        let mut spare = Vec::new();
        for chunks in ranges {
            let mut next = None;
            let slot = &mut next;
            let buf = std::mem::take(&mut spare);
            let sunk = rayon::in_place_scope(|s| {
                s.spawn(move |_| *slot = Some(self.piece_into(chunks, buf)));
                sink(&cur)
            });
            sunk?;
            let (buf, c) = next.expect("the scope ran its task")?;
            crc.combine(&c);
            spare = std::mem::replace(&mut cur, buf);
        }
        sink(&cur)?;
        Ok(crc.finalize())
    }
}

impl CpuAt {
    fn decode_hashing(&self, job: &DecodeJob, hash: bool) -> Result<Checked> {
        let isa = self.0;
        match job.fl.width {
            8 => Decoder::<u8>::new(isa, job)?.whole(hash),
            16 => Decoder::<u16>::new(isa, job)?.whole(hash),
            32 => Decoder::<u32>::new(isa, job)?.whole(hash),
            64 => Decoder::<u64>::new(isa, job)?.whole(hash),
            w => Err(Error::Unsupported(format!("{w}-bit floats"))),
        }
    }
}

impl Backend for CpuAt {
    fn name(&self) -> &'static str {
        match self.0 {
            Isa::Portable => "cpu-portable",
            Isa::Neon => "cpu-neon",
            Isa::Avx2 => "cpu-avx2",
            Isa::Avx512 => "cpu-avx512",
        }
    }

    fn device(&self) -> String {
        format!(
            "CPU, {}, {}",
            crate::backend::threads_phrase(rayon::current_num_threads()),
            self.0.name()
        )
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        resident(self.0, job)
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        Ok(self.decode_hashing(job, false)?.out)
    }

    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        self.decode_hashing(job, true)
    }

    fn decode_pieces(
        &self,
        job: &DecodeJob,
        per: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<u32> {
        let isa = self.0;
        match job.fl.width {
            8 => Decoder::<u8>::new(isa, job)?.pieces(per, sink),
            16 => Decoder::<u16>::new(isa, job)?.pieces(per, sink),
            32 => Decoder::<u32>::new(isa, job)?.pieces(per, sink),
            64 => Decoder::<u64>::new(isa, job)?.pieces(per, sink),
            w => Err(Error::Unsupported(format!("{w}-bit floats"))),
        }
    }
}

impl CpuBackend {
    fn at(&self) -> CpuAt {
        CpuAt(Isa::detect())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device(&self) -> String {
        self.at().device()
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        resident(Isa::detect(), job)
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        self.at().decode(job)
    }

    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        self.at().decode_checked(job)
    }

    fn decode_pieces(
        &self,
        job: &DecodeJob,
        per: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<u32> {
        self.at().decode_pieces(job, per, sink)
    }
}

#[cfg(test)]
use crate::test_lcg;

#[cfg(test)]
mod lookup_tests {
    /// Families from the `eax` of CPUID leaf 1 of CPUs on each side of the line
    /// `fast_gathers` draws.
    #[test]
    fn amd_families_come_from_the_extended_family() {
        assert_eq!(super::amd_family(0x0083_0F10), 23); // EPYC 7002 (Zen 2)
        assert_eq!(super::amd_family(0x00A0_0F11), 25); // EPYC 7003 (Zen 3)
        assert_eq!(super::amd_family(0x00B0_0F21), 26); // Zen 5
        assert_eq!(super::amd_family(0x0080_06F8), 6); // Intel: no extended family
    }
}
