//! The histogram pass: every stage's counts of one tensor, in one pass per chunk.
//!
//! Per chunk the elements are counted, branch-free, into two per-thread `u32` tables laid
//! out exponent class first (a chunk has at most 2^18 elements, so `u32` cannot overflow):
//!
//! - `B`: per `er`, the B symbol in its context form, `(m2·(W1+1) + nb)·W1 + b` (neighbor
//!   form) or `b`;
//! - `T`: per `er`, the joint count of `(b, q1, q2)` and, with an S stage, `(up, rs, neg)`:
//!   Q1, Q2 and S are its marginals (restricted to the elements that code them).
//!
//! Only the blocks of exponent classes the chunk saw are folded into the running `u64`
//! counts (kept per seen class only) and zeroed again, so a small tensor costs a few blocks,
//! not the whole context space. The dense [`Hist`]s are built once per tensor at the end.

use std::cell::RefCell;

use super::word::{self, Word};
use super::Isa;
use crate::format::symbols::EXP_CLASSES;
use crate::format::tables::{Hist, Space};

/// What one tensor's pass counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// b alphabet, w + 1.
    pub w1: usize,
    /// Signed values (else the Paper layout's ZigZag fold).
    pub signed: bool,
    /// B (and S, if present) in their neighbor forms, with the neighbor this far back.
    pub distance: Option<usize>,
    /// Whether there is an S stage.
    pub s: bool,
}

impl Shape {
    pub fn new(spaces: &[Space], signed: bool, distance: Option<usize>) -> Shape {
        let b_nb = spaces[0].neighbor;
        Shape {
            w1: spaces[0].w1,
            signed,
            distance: distance.filter(|_| b_nb),
            s: spaces.len() == 4,
        }
    }
    fn nb(&self) -> bool {
        self.distance.is_some()
    }
    /// `B` entries per exponent class.
    fn bb(&self) -> usize {
        if self.nb() {
            4 * (self.w1 + 1) * self.w1
        } else {
            0
        }
    }
    /// `T` entries per b.
    fn k(&self) -> usize {
        if self.s {
            48
        } else {
            4
        }
    }
    /// `T` entries per exponent class.
    fn tt(&self) -> usize {
        self.w1 * self.k()
    }
}

/// Running `u64` counts of one tensor (or part of it), per exponent class seen.
pub struct Acc {
    shape: Shape,
    /// Exponent class -> block index, `u32::MAX` if unseen.
    slot: Vec<u32>,
    ers: Vec<u8>,
    b: Vec<u64>,
    t: Vec<u64>,
    /// With a Signed shape: the Paper layout's counts of the same elements, taken in the
    /// same pass (its codes come from the same displacements).
    paper: Option<Box<Acc>>,
}

impl Acc {
    pub fn new(shape: Shape) -> Acc {
        Acc {
            shape,
            slot: vec![u32::MAX; EXP_CLASSES],
            ers: Vec::new(),
            b: Vec::new(),
            t: Vec::new(),
            paper: None,
        }
    }

    /// A Signed pass that also counts the Paper layout (`paper`: its shape).
    pub fn with_paper(shape: Shape, paper: Shape) -> Acc {
        debug_assert!(shape.signed && !paper.signed && !paper.nb() && !paper.s);
        debug_assert_eq!(shape.w1, paper.w1);
        Acc {
            paper: Some(Box::new(Acc::new(paper))),
            ..Acc::new(shape)
        }
    }

    /// The Paper counts taken along, if any.
    pub fn paper(&self) -> Option<&Acc> {
        self.paper.as_deref()
    }

    /// Room for `classes` more blocks (here and in the Paper counts taken along).
    fn reserve(&mut self, classes: usize) {
        let (bb, tt) = (self.shape.bb(), self.shape.tt());
        self.b.reserve(classes * bb);
        self.t.reserve(classes * tt);
        if let Some(p) = self.paper.as_deref_mut() {
            p.reserve(classes);
        }
    }

    /// The block index of class `er`, allocated on first use.
    fn block(&mut self, er: usize) -> usize {
        if self.slot[er] == u32::MAX {
            self.slot[er] = self.ers.len() as u32;
            self.ers.push(er as u8);
            let (bb, tt) = (self.shape.bb(), self.shape.tt());
            self.b.resize(self.b.len() + bb, 0);
            self.t.resize(self.t.len() + tt, 0);
        }
        self.slot[er] as usize
    }

    pub fn merge(mut self, other: Acc) -> Acc {
        let (bb, tt) = (self.shape.bb(), self.shape.tt());
        for (k, &er) in other.ers.iter().enumerate() {
            let s = self.block(er as usize);
            add(&mut self.b[s * bb..][..bb], &other.b[k * bb..][..bb]);
            add(&mut self.t[s * tt..][..tt], &other.t[k * tt..][..tt]);
        }
        self.paper = match (self.paper, other.paper) {
            (Some(a), Some(b)) => Some(Box::new(a.merge(*b))),
            (a, b) => a.or(b),
        };
        self
    }

    /// The histograms of `spaces` (the ones this pass was set up for).
    pub fn hists(&self, spaces: &[Space]) -> Vec<Hist> {
        let sh = self.shape;
        let (w1, bb, tt, k) = (sh.w1, sh.bb(), sh.tt(), sh.k());
        debug_assert_eq!(spaces[0].neighbor, sh.nb());
        debug_assert_eq!(spaces.len() == 4, sh.s);
        // Per stage: the occupied contexts in ascending order and their rows, made in that
        // order (classes ascending) so that no sort and no second copy is needed (sorting
        // and copying rows given in any order was some 3% of an fp32 default encode).
        let mut lists: Vec<(Vec<u32>, Vec<u64>)> = vec![Default::default(); spaces.len()];
        // Room for every class's rows up front (growing by doubling copied them several
        // times: about 1.5% of an fp32 default-layout encode on a Zen 2). Stage B's
        // neighbor form reserves its bound (pages never written cost nothing).
        let n = self.ers.len();
        let b_rows = if sh.nb() { bb / w1 } else { 1 };
        let per_class = [
            (b_rows, w1),
            (w1 - 2, 2),
            (2 * (w1 - 3), 2),
            (6 * (w1 - 1), 2),
        ];
        for ((ctxs, rows), (c, a)) in lists.iter_mut().zip(per_class) {
            ctxs.reserve(n * c);
            rows.reserve(n * c * a);
        }
        let push = |(ctxs, rows): &mut (Vec<u32>, Vec<u64>), ctx: usize, row: &[u64]| {
            if row.iter().any(|&c| c != 0) {
                ctxs.push(ctx as u32);
                rows.extend_from_slice(row);
            }
        };
        // (class, block), classes ascending.
        let mut order: Vec<(usize, usize)> = self
            .ers
            .iter()
            .enumerate()
            .map(|(blk, &er)| (er as usize, blk))
            .collect();
        order.sort_unstable();
        if sh.nb() {
            // Context (m2·(w+2) + nb)·256 + er: the class is the fastest-moving part.
            for row in 0..b_rows {
                for &(er, blk) in &order {
                    let src = &self.b[blk * bb + row * w1..][..w1];
                    push(&mut lists[0], row * EXP_CLASSES + er, src);
                }
            }
        }
        let mut sums = vec![0u64; w1];
        for &(er, blk) in &order {
            let t = &self.t[blk * tt..][..tt];
            if !sh.nb() {
                for (s, r) in sums.iter_mut().zip(t.chunks_exact(k)) {
                    *s = r.iter().sum();
                }
                push(&mut lists[0], er, &sums);
            }
            // q = q1 + 2·q2.
            for bit in 2..w1 {
                let eb = er * w1 + bit;
                let mut q = [0u64; 4];
                for (n, part) in q.iter_mut().zip(t[bit * k..][..k].chunks_exact(k / 4)) {
                    *n = part.iter().sum();
                }
                push(&mut lists[1], eb, &[q[0] + q[2], q[1] + q[3]]);
                if bit >= 3 {
                    push(&mut lists[2], eb * 2, &[q[0], q[2]]);
                    push(&mut lists[2], eb * 2 + 1, &[q[1], q[3]]);
                }
            }
            if sh.s {
                for bit in 1..w1 {
                    let eb = er * w1 + bit;
                    let mut srow = [0u64; 12];
                    for part in t[bit * k..][..k].chunks_exact(12) {
                        add(&mut srow, part);
                    }
                    for (c, row) in srow.chunks_exact(2).enumerate() {
                        push(&mut lists[3], eb * 6 + c, row);
                    }
                }
            }
        }
        spaces
            .iter()
            .zip(lists)
            .map(|(&sp, (ctxs, rows))| Hist::from_sorted(sp, ctxs, rows))
            .collect()
    }
}

#[inline(always)]
fn add<A: Copy + Into<u64>>(acc: &mut [u64], x: &[A]) {
    for (a, &x) in acc.iter_mut().zip(x) {
        *a += x.into();
    }
}

/// Per-thread scratch: codes of the chunk, and the `u32` tables (all zero between chunks).
#[derive(Default)]
struct Scratch {
    codes: Vec<u16>,
    /// Table indices of a block of elements.
    ib: Vec<u32>,
    it: Vec<u32>,
    b: Vec<u32>,
    t: Vec<u32>,
    /// Paper-layout indices and table, when counted along.
    ip: Vec<u32>,
    p: Vec<u32>,
    seen: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Count one chunk into `acc`.
pub fn count<T: Word>(isa: Isa, d: &[T], info: &[u16], acc: &mut Acc) {
    let sh = acc.shape;
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        let (bb, tt) = (sh.bb(), sh.tt());
        // Tables only grow (all zero between chunks, whatever layout used them last).
        if s.b.len() < bb * EXP_CLASSES {
            s.b = vec![0; bb * EXP_CLASSES];
        }
        if s.t.len() < tt * EXP_CLASSES {
            s.t = vec![0; tt * EXP_CLASSES];
        }
        let pp = acc.paper.is_some();
        let ptt = sh.w1 * 4;
        if pp && s.p.len() < PC * ptt * EXP_CLASSES {
            s.p = vec![0; PC * ptt * EXP_CLASSES];
        }
        s.seen.resize(EXP_CLASSES, 0);
        simd(
            isa,
            #[inline(always)]
            || match (sh.signed, sh.distance, sh.s, pp) {
                (true, Some(dist), _, true) => {
                    tally::<T, true, true, true, true>(d, info, sh, dist, s)
                }
                (true, None, true, true) => tally::<T, true, false, true, true>(d, info, sh, 0, s),
                (true, None, false, true) => {
                    tally::<T, true, false, false, true>(d, info, sh, 0, s)
                }
                (true, Some(dist), _, false) => {
                    tally::<T, true, true, true, false>(d, info, sh, dist, s)
                }
                (true, None, true, false) => {
                    tally::<T, true, false, true, false>(d, info, sh, 0, s)
                }
                (true, None, false, false) => {
                    tally::<T, true, false, false, false>(d, info, sh, 0, s)
                }
                (false, Some(dist), _, _) => {
                    tally::<T, false, true, true, false>(d, info, sh, dist, s)
                }
                (false, None, true, _) => tally::<T, false, false, true, false>(d, info, sh, 0, s),
                (false, None, false, _) => {
                    tally::<T, false, false, false, false>(d, info, sh, 0, s)
                }
            },
        );
        // Room for the blocks of the classes new to `acc`, at once (one by one, the
        // doubling copied the blocks before them: about 1% of an fp32 default encode).
        let fresh = (0..EXP_CLASSES)
            .filter(|&er| s.seen[er] != 0 && acc.slot[er] == u32::MAX)
            .count();
        acc.reserve(fresh);
        // Fold the seen classes' blocks and zero them for the next chunk.
        for er in 0..EXP_CLASSES {
            if s.seen[er] == 0 {
                continue;
            }
            s.seen[er] = 0;
            // Every element counted adds one to its class's `T` block: an all-zero block
            // is a class in the seen range that no element had (nothing to fold or zero).
            if s.t[er * tt..][..tt].iter().all(|&c| c == 0) {
                continue;
            }
            let blk = acc.block(er);
            let src_b = &mut s.b[er * bb..][..bb];
            add(&mut acc.b[blk * bb..][..bb], src_b);
            src_b.fill(0);
            let src_t = &mut s.t[er * tt..][..tt];
            add(&mut acc.t[blk * tt..][..tt], src_t);
            src_t.fill(0);
            if let Some(pa) = acc.paper.as_deref_mut() {
                let blk = pa.block(er);
                for c in 0..PC {
                    let src_p = &mut s.p[(c * EXP_CLASSES + er) * ptt..][..ptt];
                    add(&mut pa.t[blk * ptt..][..ptt], src_p);
                    src_p.fill(0);
                }
            }
        }
    });
}

/// Run `f` compiled for AVX-512 (with conflict detection, for vector leading-zero counts)
/// where `isa` allows it, else as [`super::fast`] does.
#[inline(always)]
pub(super) fn simd<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512cd")]
        fn v512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        debug_assert!(isa.available());
        // SAFETY: `isa` is only ever a level `Isa::available` confirmed on this CPU.
        return unsafe { v512(f) };
    }
    super::fast(isa, f)
}

/// `word::code(word::value::<T>(d, signed))`, in 32-bit arithmetic for words of at most 32
/// bits (twice the vector lanes of the 64-bit form; the same code).
#[inline(always)]
pub(super) fn code_of<T: Word>(d: T, signed: bool) -> u32 {
    if T::BITS > 32 {
        let (v, neg) = word::value::<T>(d.get(), signed);
        return word::code(v, neg);
    }
    let sh = 32 - T::BITS;
    let sd = ((d.get() as u32) << sh) as i32 >> sh;
    let (v, neg) = if signed {
        (sd.unsigned_abs(), (sd < 0) as u32)
    } else {
        (
            (((sd as u32) << 1) ^ ((sd >> 31) as u32)) & (u32::MAX >> sh),
            0,
        )
    };
    let b = 32 - v.leading_zeros();
    let q1 = (v >> b.saturating_sub(2)) & 1 & (b >= 2) as u32;
    let q2 = (v >> b.saturating_sub(3)) & 1 & (b >= 3) as u32;
    b | q1 << 7 | q2 << 8 | neg << 9
}

#[inline(always)]
fn codes_as<T: Word, const SIGNED: bool>(d: &[T], out: &mut [u16]) {
    for (o, &d) in out.iter_mut().zip(d) {
        *o = code_of::<T>(d, SIGNED) as u16;
    }
}

/// Elements per block of the counting loop: codes, then table indices (vectorized), then
/// the increments, with the index buffers in L1.
const BLOCK: usize = 2048;

/// Copies of the Paper table, element `j` counted into copy `j % PC`: its few hot bins
/// would otherwise chain increments through store forwarding.
const PC: usize = 2;

/// Paper-layout table indices (`(j % PC · 256 + er)·4·W1 + b·4 + q`) of a block of elements.
#[inline(always)]
fn paper_index<T: Word>(d: &[T], info: &[u16], w1: u32, out: &mut [u32]) {
    let copy = EXP_CLASSES as u32 * w1 * 4;
    for (j, ((o, &d), &i)) in out.iter_mut().zip(d).zip(info).enumerate() {
        let c = code_of::<T>(d, false);
        let base = (j % PC) as u32 * copy;
        *o = base + (i as u32 & 255) * (w1 * 4) + (c & 127) * 4 + ((c >> 7) & 3);
    }
}

/// Count a chunk into the scratch tables. `SIGNED`: signed values (else ZigZag); `NB`: B and
/// S in neighbor form at distance `dist`; `S`: count the S fields too; `P`: count the Paper
/// layout's fields into `p` too.
#[inline(always)]
fn tally<T: Word, const SIGNED: bool, const NB: bool, const S: bool, const P: bool>(
    d: &[T],
    info: &[u16],
    sh: Shape,
    dist: usize,
    s: &mut Scratch,
) {
    let g = Geo {
        w1: sh.w1 as u32,
        bb: sh.bb() as u32,
        tt: sh.tt() as u32,
        k: sh.k() as u32,
    };
    let n = d.len().min(info.len());
    let Scratch {
        codes,
        ib,
        it,
        b: bt,
        t: tt,
        ip,
        p: pt,
        seen,
    } = s;
    // Only grown: every code is written (block by block) before it is read, the neighbor
    // codes included (they lie before the current block's end), so no zeroing is needed.
    if codes.len() < n {
        codes.resize(n, 0);
    }
    ib.resize(BLOCK, 0);
    it.resize(BLOCK, 0);
    if P {
        ip.resize(BLOCK, 0);
    }
    let (bt, tt, pt, seen) = (&mut bt[..], &mut tt[..], &mut pt[..], &mut seen[..]);
    for start in (0..n).step_by(BLOCK) {
        let end = (start + BLOCK).min(n);
        let m = end - start;
        codes_as::<T, SIGNED>(&d[start..end], &mut codes[start..end]);
        let (ib, it) = (&mut ib[..m], &mut it[..m]);
        let (cb, inf) = (&codes[start..end], &info[start..end]);
        // Elements with no neighbor (the chunk's first `dist`), then the rest.
        let h = if NB {
            dist.saturating_sub(start).min(m)
        } else {
            m
        };
        for (((ib, it), &c), &i) in ib.iter_mut().zip(it.iter_mut()).zip(cb).zip(inf).take(h) {
            (*ib, *it) = index::<NB, S>(c, i, g.w1, 0, g);
        }
        if NB && h < m {
            let nbs = &codes[start + h - dist..end - dist];
            let rest = ib[h..]
                .iter_mut()
                .zip(&mut it[h..])
                .zip(&cb[h..])
                .zip(&inf[h..]);
            for ((((ib, it), &c), &i), &cn) in rest.zip(nbs) {
                let cn = cn as u32;
                (*ib, *it) = index::<NB, S>(c, i, cn & 127, word::sign_state(cn), g);
            }
        }
        // The once-per-block bounds proof of the increments below: every index of the
        // block is checked against its table here (a vectorized max), so the hot loop
        // needs no per-increment check.
        check(it, tt.len());
        if NB {
            check(ib, bt.len());
        }
        // The classes of the block, as the range between its least and greatest (a
        // vectorized min/max, not a store per element): the fold skips the classes of the
        // range that counted nothing.
        let (lo, hi) = inf.iter().fold((255u16, 0u16), |(lo, hi), &i| {
            (lo.min(i & 255), hi.max(i & 255))
        });
        if lo <= hi {
            seen[lo as usize..=hi as usize].fill(1);
        }
        if P {
            let ip = &mut ip[..m];
            paper_index::<T>(&d[start..end], inf, g.w1, ip);
            check(ip, pt.len());
            if NB {
                for ((&ib, &it), &ip) in ib.iter().zip(it.iter()).zip(ip.iter()) {
                    // SAFETY: `check` above proved every `ib`, `it`, `ip` of this block
                    // below its table's length.
                    unsafe {
                        *bt.get_unchecked_mut(ib as usize) += 1;
                        *tt.get_unchecked_mut(it as usize) += 1;
                        *pt.get_unchecked_mut(ip as usize) += 1;
                    }
                }
            } else {
                for (&it, &ip) in it.iter().zip(ip.iter()) {
                    // SAFETY: as above (`it`, `ip` checked for this block).
                    unsafe {
                        *tt.get_unchecked_mut(it as usize) += 1;
                        *pt.get_unchecked_mut(ip as usize) += 1;
                    }
                }
            }
        } else if NB {
            for (&ib, &it) in ib.iter().zip(it.iter()) {
                // SAFETY: as above (`ib`, `it` checked for this block).
                unsafe {
                    *bt.get_unchecked_mut(ib as usize) += 1;
                    *tt.get_unchecked_mut(it as usize) += 1;
                }
            }
        } else {
            for &it in it.iter() {
                // SAFETY: as above (`it` checked for this block).
                unsafe {
                    *tt.get_unchecked_mut(it as usize) += 1;
                }
            }
        }
    }
}

/// Panic unless every index in `ix` is below `len` (branch-free max, vectorized).
#[inline(always)]
fn check(ix: &[u32], len: usize) {
    let mx = ix.iter().fold(0u32, |a, &x| a.max(x));
    assert!(
        ix.is_empty() || (mx as usize) < len,
        "histogram index out of range"
    );
}

#[derive(Clone, Copy)]
struct Geo {
    w1: u32,
    bb: u32,
    tt: u32,
    k: u32,
}

/// Table indices (B, T) of an element with code `c` and facts `i`, its neighbor's class
/// `nbc` and sign state `up`.
#[inline(always)]
fn index<const NB: bool, const S: bool>(c: u16, i: u16, nbc: u32, up: u32, g: Geo) -> (u32, u32) {
    let (c, i) = (c as u32, i as u32);
    let er = i & 255;
    let b = c & 127;
    let bi = if NB {
        er * g.bb + (((i >> 9) & 3) * (g.w1 + 1) + nbc) * g.w1 + b
    } else {
        er * g.bb + b
    };
    let q = (c >> 7) & 3;
    let ti = if S {
        er * g.tt + b * g.k + ((q * 3 + up) * 2 + ((i >> 8) & 1)) * 2 + ((c >> 9) & 1)
    } else {
        er * g.tt + b * g.k + q
    };
    (bi, ti)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same<T: Word>(d: u64) {
        for signed in [false, true] {
            let (v, neg) = word::value::<T>(d, signed);
            let want = word::code(v, neg);
            assert_eq!(
                code_of::<T>(T::from_u64(d), signed),
                want,
                "{} {d:#x}",
                T::BITS
            );
        }
    }

    #[test]
    fn code_of_matches_word_code() {
        for d in 0..=u8::MAX as u64 {
            same::<u8>(d);
        }
        for d in 0..=u16::MAX as u64 {
            same::<u16>(d);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            same::<u32>(x & 0xffff_ffff);
            same::<u32>((x >> 7) & 0xffff);
            same::<u64>(x);
            same::<u64>(x >> (x & 63));
        }
        for d in [0, 1, 0x7fff_ffff, 0x8000_0000, 0x8000_0001, 0xffff_ffff] {
            same::<u32>(d);
        }
    }
}
