//! Logits (Q8) to a frequency table with total 2^32 (docs/INTEGER_GPT2.md §5).
//!
//! `w_j = EXP40[L - l_j]` (0 past the table), `f_j = 1 + floor(w_j * (2^32 - V) / W)`, the
//! remainder to the largest weight (lowest id on ties). Since `f_j` depends only on the gap
//! `L - l_j`, each gap's floor is computed once, into a table the per-token passes look up
//! (freq_scan.rs: the top, `W`, and the running sums, per instruction-set level).

use rayon::prelude::*;

use super::freq_scan;
use super::split::Split;
use crate::backend::cpu::Isa;
use crate::backend::lm::{Coded, Find};
use crate::{Error, Result};

pub const TOTAL: u64 = 1 << 32;

/// A frequency table before it is laid out: every token's frequency depends only on its gap
/// below the top logit, plus the remainder that goes to one token.
///
/// Two passes over the vocabulary (the top, then `W` by table lookups) and one division per
/// item; the floor of every gap then comes from a reciprocal of `W` with an exact correction
/// ([`floor_by_gap`]). The remainder is `2^32` minus the sum of the floors, which the caller's
/// pass over the tokens (the table, or its running sums) adds up as it goes.
struct ByGap {
    isa: Isa,
    top: i32,
    /// The positions of the logits equal to `top`, in order (at least one when `top` is the
    /// largest logit).
    at_top: Vec<usize>,
    /// `1 + floor(w * (2^32 - V) / W)` per gap up to the last whose floor is not 0, then 1
    /// for every gap after (those past the table too). Each is below 2^32: `w <= W` makes
    /// the floor at most `2^32 - V` and `V >= 2`.
    by_gap: Vec<u32>,
}

impl ByGap {
    /// The table of `logits`, whose largest is `top` when the caller knows it.
    fn new(isa: Isa, logits: &[i32], top: Option<i32>, exp40: &[u64]) -> Result<ByGap> {
        let v = logits.len();
        if !(2..=1 << 16).contains(&v) {
            return Err(Error::Invalid(format!("frequencies: vocabulary of {v}")));
        }
        let top = top.unwrap_or_else(|| freq_scan::top(isa, logits));
        let mut at_top = Vec::new();
        // v <= 2^16 and w <= 2^40: W < 2^56.
        let total_w = freq_scan::weight_sum(isa, logits, top, exp40, &mut at_top);
        let r = TOTAL - v as u64;
        // Past the last weight with `w * r >= W` every floor is 0, as past the table: those
        // gaps share the last entry (1), which leaves a third of the table's divisions out and
        // the table smaller for the passes' gathers. For an integer `w`, `w * r >= W` is
        // `w >= ceil(W / r)`: one division, then compares (`r >= 2^32 - 2^16 > 0`).
        let least = total_w.div_ceil(r);
        let live = exp40.iter().rposition(|&w| w >= least).map_or(0, |i| i + 1);
        let by_gap = floors_plus_one(isa, &exp40[..live], r, total_w);
        Ok(ByGap {
            isa,
            top,
            at_top,
            by_gap,
        })
    }

    /// The lowest id of the largest weight: the remainder's token.
    fn arg(&self) -> usize {
        self.at_top.first().copied().unwrap_or(0)
    }

    /// The position of the remainder's token among logits laid out so that position `p` is
    /// token `ids[p]`: the lowest id of the largest weight.
    fn arg_in(&self, ids: &[u32]) -> usize {
        let at_top = self.at_top.iter().copied();
        at_top.min_by_key(|&p| ids[p]).unwrap_or(0)
    }

    /// The remainder of a table laid out in an order ([`prefix_sums_in_order`]), from the
    /// floors of its first `len` positions summed mod 2^32 (`in_order`) and those of the rest
    /// (`logits[len..]`, the tokens the order leaves out), with the check that the order's
    /// sums stay below 2^32; `arg` is [`ByGap::arg_in`].
    fn rem_in_order(&self, logits: &[i32], len: usize, in_order: u32, arg: usize) -> Result<u64> {
        let left_out: u64 = logits[len..].iter().map(|&l| self.floor(l)).sum();
        let rem = ByGap::rem(whole_sum(in_order.wrapping_add(left_out as u32)))?;
        // The order's tokens sum to 2^32 less the tokens it leaves out.
        let sum = TOTAL - left_out - if arg >= len { rem } else { 0 };
        if sum >> 32 != 0 {
            return Err(Error::Invalid("LM table sums past 2^32".into()));
        }
        Ok(rem)
    }

    /// The frequency of a token with logit `l`, without the remainder.
    #[inline(always)]
    fn floor(&self, l: i32) -> u64 {
        let n = self.by_gap.len() - 1;
        let gap = ((self.top as i64 - l as i64) as u64).min(n as u64) as usize;
        self.by_gap[gap] as u64
    }

    /// The remainder, given the sum of every token's floor (at most 2^32: each floor of
    /// `w * r / W` is at most the quotient, so they sum to at most `V + r`).
    fn rem(floors: u64) -> Result<u64> {
        TOTAL
            .checked_sub(floors)
            .ok_or_else(|| Error::Invalid("LM table floors past 2^32".into()))
    }
}

/// `floor(w * r / W)` for every weight `w` of `exp40`, `r < 2^32`, `W` the sum of the weights
/// of a table (so every `w` counted in it is at most `W`). One 128-bit division per table:
/// with `inv = floor(r * 2^64 / W)` (below 2^64 when `W > r`), `q = floor(w * inv / 2^64)`
/// is the quotient or one less (`w * inv / 2^64` falls short of `w * r / W` by less than
/// `w / 2^64 < 1`), and the remainder `w * r - q * W`, in `0..2W` so exact in wrapping u64
/// arithmetic (`W < 2^56`), says which.
fn floor_by_gap(exp40: &[u64], r: u64, total_w: u64) -> impl Iterator<Item = u64> + '_ {
    let inv = (total_w > r).then(|| (((r as u128) << 64) / total_w as u128) as u64);
    exp40.iter().map(move |&w| match inv {
        Some(inv) => {
            let q = ((w as u128 * inv as u128) >> 64) as u64;
            let left = w.wrapping_mul(r).wrapping_sub(q.wrapping_mul(total_w));
            q + (left >= total_w) as u64
        }
        // Not with the specification's table (W >= EXP40[0] = 2^40): the plain division.
        None => (w as u128 * r as u128)
            .checked_div(total_w as u128)
            .unwrap_or(0) as u64,
    })
}

/// `1 + floor(w * r / W)` for every weight of `exp40` ([`floor_by_gap`]), then a last entry
/// of 1: the table [`ByGap`] looks floors up in. On AVX-512 with IFMA, eight at a time.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn floors_plus_one(isa: Isa, exp40: &[u64], r: u64, total_w: u64) -> Vec<u32> {
    let mut by_gap = Vec::with_capacity(exp40.len() + 1);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && x86::ifma() && total_w > r {
        // SAFETY: AVX-512 F/DQ/IFMA are present (checked by `ifma`) and `W > r` (checked).
        unsafe { x86::floors_plus_one_ifma(exp40, r, total_w, &mut by_gap) };
    }
    let done = by_gap.len();
    by_gap.extend(floor_by_gap(&exp40[done..], r, total_w).map(|q| 1 + q as u32));
    by_gap.push(1);
    by_gap
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::LazyLock;

    /// Whether this CPU has AVX-512 IFMA (52-bit multiplies) and DQ (64-bit low multiplies).
    pub fn ifma() -> bool {
        static HAS: LazyLock<bool> = LazyLock::new(|| {
            std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512dq")
                && std::is_x86_feature_detected!("avx512ifma")
        });
        *HAS
    }

    /// [`super::floor_by_gap`] plus one, as u32 (truncated as there), of the weights of
    /// `exp40` in whole groups of eight, up to the first group with a weight of 2^52 or more
    /// (none in the specification's table), appended to `out`; the caller does the rest.
    ///
    /// With `inv = floor(r 2^52 / W)` (below 2^52 as `W > r`), `q = floor(w inv / 2^52)`
    /// (`vpmadd52huq`: exact for `w, inv < 2^52`). `w inv / 2^52` falls short of `w r / W` by
    /// `w (r 2^52 / W - inv) / 2^52 < w / 2^52 < 1`, so `q` is the floor of `w r / W` or one
    /// less, and the remainder `w r - q W`, in `0..2W` and so exact in wrapping u64 arithmetic
    /// (`W < 2^56`), says which, as in the scalar version.
    ///
    /// # Safety
    /// AVX-512 F, DQ and IFMA must be present and `total_w > r`.
    #[target_feature(enable = "avx512f,avx512dq,avx512ifma")]
    pub unsafe fn floors_plus_one_ifma(exp40: &[u64], r: u64, total_w: u64, out: &mut Vec<u32>) {
        let inv = (((r as u128) << 52) / total_w as u128) as u64;
        let (inv_v, r_v, w_v) = (
            _mm512_set1_epi64(inv as i64),
            _mm512_set1_epi64(r as i64),
            _mm512_set1_epi64(total_w as i64),
        );
        let one = _mm512_set1_epi64(1);
        let whole = exp40.len() / 8 * 8;
        out.reserve(whole);
        let dst = out.spare_capacity_mut();
        let (mut done, wide) = (0, _mm512_set1_epi64(1 << 52));
        for (c, o) in exp40[..whole].chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
            let w = _mm512_loadu_si512(c.as_ptr().cast());
            if _mm512_cmpge_epu64_mask(w, wide) != 0 {
                break;
            }
            let q = _mm512_madd52hi_epu64(_mm512_setzero_si512(), w, inv_v);
            let left = _mm512_sub_epi64(_mm512_mullo_epi64(w, r_v), _mm512_mullo_epi64(q, w_v));
            let short = _mm512_cmpge_epu64_mask(left, w_v);
            let f = _mm512_add_epi64(_mm512_mask_add_epi64(q, short, q, one), one);
            // The low halves: `as u32`.
            _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm512_cvtepi64_epi32(f));
            done += 8;
        }
        // SAFETY: the loop wrote the `done` elements after the old length.
        unsafe { out.set_len(out.len() + done) };
    }
}

/// Frequencies of every token; `u64` because a one-sided table can hold up to 2^32 - V + 1.
pub fn frequencies(isa: Isa, logits: &[i32], exp40: &[u64]) -> Result<Vec<u64>> {
    let g = ByGap::new(isa, logits, None, exp40)?;
    let mut f: Vec<u64> = logits.iter().map(|&l| g.floor(l)).collect();
    f[g.arg()] += ByGap::rem(f.iter().sum())?;
    Ok(f)
}

/// Prefix sums of the frequency table of `logits` in the order `order`, as
/// [`crate::backend::lm::prefix_sums`] of [`frequencies`] gives them, without the table in
/// between: each token's frequency is looked up from its logit where the sum reaches it.
/// (The path for an order that is not a permutation of the vocabulary: a token may come
/// twice, so the sums are checked in u64.)
pub fn prefix_sums(isa: Isa, logits: &[i32], exp40: &[u64], order: &[u32]) -> Result<Vec<u32>> {
    let g = ByGap::new(isa, logits, None, exp40)?;
    if order.iter().fold(0, |a, &id| a.max(id)) as usize >= logits.len() {
        return Err(Error::Invalid(format!(
            "prefix sums: a token beyond the table of {}",
            logits.len()
        )));
    }
    let rem = ByGap::rem(logits.iter().map(|&l| g.floor(l)).sum())?;
    let arg = g.arg();
    // A random read of the logits per token (the head's rows are in token order).
    let at = |i: usize| {
        let id = order[i] as usize;
        g.floor(logits[id]) + if id == arg { rem } else { 0 }
    };
    let mut cum = vec![0u32; order.len() + 1];
    let mut s = 0u64;
    for (i, c) in cum[1..].iter_mut().enumerate() {
        s += at(i);
        *c = s as u32;
    }
    if s >> 32 != 0 {
        return Err(Error::Invalid("LM table sums past 2^32".into()));
    }
    Ok(cum)
}

/// [`prefix_sums`] of logits that come out of the head already in the order: `logits[p]` is
/// token `ids[p]`'s (`ids` a permutation of the vocabulary) and the sums run over the first
/// `len` of them, the order's tokens (the rest are the tokens it leaves out). A sequential
/// read instead of a random one per token, by the level's [`freq_scan::floor_sums`]. `top`
/// is the largest logit when the caller knows it (the head's kernel: one pass less).
///
/// The remainder is known only once every floor is summed, so the sums are made without it
/// and it is added after, with the pieces' offsets, to the sums from its token on. The u32
/// sums wrap; the floors of all V tokens sum to some `F` in `V..=2^32`, which is therefore
/// exact from its value mod 2^32 (0 only for 2^32).
#[allow(clippy::too_many_arguments)]
pub fn prefix_sums_in_order(
    isa: Isa,
    logits: &[i32],
    top: Option<i32>,
    ids: &[u32],
    len: usize,
    exp40: &[u64],
    split: Split,
) -> Result<Vec<u32>> {
    if ids.len() != logits.len() || len > ids.len() {
        return Err(Error::Invalid(
            "prefix sums: order and logits differ".into(),
        ));
    }
    let g = ByGap::new(isa, logits, top, exp40)?;
    // The remainder goes to the lowest id of the largest weight: here a position.
    let arg = g.arg_in(ids);
    // Every sum is written below: no zeroing of the 4 (V + 1) bytes first.
    let mut cum: Vec<u32> = Vec::with_capacity(len + 1);
    let spare = &mut cum.spare_capacity_mut()[..len + 1];
    spare[0].write(0);
    let share = len.div_ceil(split.threads()).max(4096);
    // Each piece's running sums from 0, and its total mod 2^32.
    let totals: Vec<u32> = spare[1..]
        .par_chunks_mut(share)
        .zip(logits[..len].par_chunks(share))
        .map(|(dst, l)| freq_scan::floor_sums(g.isa, l, g.top, &g.by_gap, dst))
        .collect();
    // SAFETY: the first len + 1 elements are written: cum[0] above, and cum[1..] by the
    // pieces, which cover it (floor_sums writes every element of its output).
    unsafe { cum.set_len(len + 1) };
    let in_order = totals.iter().fold(0u32, |a, &t| a.wrapping_add(t));
    let rem = g.rem_in_order(logits, len, in_order, arg)?;
    // Offsets: the totals of the pieces before, and the remainder from its token on.
    let mut offsets = Vec::with_capacity(totals.len());
    let mut before = 0u32;
    for t in totals {
        offsets.push(before);
        before = before.wrapping_add(t);
    }
    cum[1..]
        .par_chunks_mut(share)
        .zip(offsets)
        .enumerate()
        .for_each(|(c, (dst, before))| {
            // cum[1 + p] holds token p's frequency: from p = arg on, the remainder.
            let start = c * share;
            let cut = arg.saturating_sub(start).min(dst.len());
            let (head, tail) = dst.split_at_mut(cut);
            if before != 0 {
                head.iter_mut().for_each(|x| *x = x.wrapping_add(before));
            }
            let after = before.wrapping_add(rem as u32);
            if after != 0 {
                tail.iter_mut().for_each(|x| *x = x.wrapping_add(after));
            }
        });
    Ok(cum)
}

/// [`prefix_sums_in_order`] at the indices `at` only (ascending, each at most `len`):
/// `out[k] = cum[at[k]]`. What the mixing encoder asks for (the few hundred sums its bit
/// predictor reads), without the 4 (V + 1) bytes of sums written and read again: the running
/// sums are made a piece at a time in a buffer that stays in the L1 cache, the wanted ones
/// picked out as they pass, and the remainder added after to those from its token on. One
/// thread per table (the encoder's steps have many). The sums wrap in u32 as there.
#[allow(clippy::too_many_arguments)]
pub fn prefix_sums_in_order_at(
    isa: Isa,
    logits: &[i32],
    top: Option<i32>,
    ids: &[u32],
    len: usize,
    exp40: &[u64],
    at: &[u32],
) -> Result<Vec<u32>> {
    if ids.len() != logits.len() || len > ids.len() {
        return Err(Error::Invalid(
            "prefix sums: order and logits differ".into(),
        ));
    }
    if !at.windows(2).all(|w| w[0] < w[1]) || at.last().is_some_and(|&i| i as usize > len) {
        return Err(Error::Invalid(
            "prefix sums at: indices not ascending or beyond the sums".into(),
        ));
    }
    // Every floor is at least 1 and they sum to 2^32: the sums stay below it exactly when
    // the order leaves a token out (checked below too where every floor is summed).
    if len == logits.len() {
        return Err(Error::Invalid("LM table sums past 2^32".into()));
    }
    let g = ByGap::new(isa, logits, top, exp40)?;
    let arg = g.arg_in(ids);
    // The remainder is known only from every floor; only a sum past its token holds it.
    // Without one, the tokens past the last wanted index are not summed at all (the encoder
    // reads sums of one token range: on prose, often well before the end of the order).
    let last = at.last().map_or(0, |&i| i as usize);
    let whole = last > arg;
    let upto = if whole { len } else { last };
    // 8 KiB of sums: small enough to stay in L1 between the pass and the picks.
    const PIECE: usize = 2048;
    let mut buf = [std::mem::MaybeUninit::<u32>::uninit(); PIECE];
    let mut out = Vec::with_capacity(at.len());
    let mut rest = at;
    // cum[0] = 0; cum[i] sums tokens 0..i.
    if let [0, tail @ ..] = rest {
        out.push(0);
        rest = tail;
    }
    // The floors' running sum (mod 2^32) before the current piece.
    let mut before = 0u32;
    for (c, l) in logits[..upto].chunks(PIECE).enumerate() {
        let (start, end) = (c * PIECE, c * PIECE + l.len());
        let dst = &mut buf[..l.len()];
        let total = freq_scan::floor_sums(g.isa, l, g.top, &g.by_gap, dst);
        while let [i, tail @ ..] = rest {
            let i = *i as usize;
            if i > end {
                break;
            }
            // SAFETY: floor_sums wrote every element of `dst`, and start < i <= end.
            let s = unsafe { dst[i - start - 1].assume_init() };
            out.push(before.wrapping_add(s));
            rest = tail;
        }
        before = before.wrapping_add(total);
    }
    if !whole {
        return Ok(out);
    }
    let rem = g.rem_in_order(logits, len, before, arg)?;
    // cum[i] holds the remainder from i = arg + 1 on.
    let from = at.partition_point(|&i| i as usize <= arg);
    out[from..]
        .iter_mut()
        .for_each(|x| *x = x.wrapping_add(rem as u32));
    Ok(out)
}

/// Move `lambda / 2^16` of every other token's frequency to `x` (each keeps at least 1), so the
/// total is unchanged.
pub fn mix(f: &mut [u64], x: usize, lambda: u64) {
    if x >= f.len() || lambda == 0 || lambda >= 1 << 16 {
        return;
    }
    let total: u64 = f.iter().sum();
    let mut rest = 0u64;
    for (j, v) in f.iter_mut().enumerate() {
        if j != x {
            // v <= 2^32 and lambda < 2^16: the product fits u64.
            *v = (*v - ((*v * lambda) >> 16)).max(1);
            rest += *v;
        }
    }
    f[x] = total - rest;
}

/// The coder's table for one position: the model's frequencies with the match prediction
/// mixed in.
pub fn table(
    isa: Isa,
    logits: &[i32],
    exp40: &[u64],
    mix_in: Option<(u32, u64)>,
) -> Result<Vec<u64>> {
    let mut f = frequencies(isa, logits, exp40)?;
    if let Some((x, lambda)) = mix_in {
        mix(&mut f, x as usize, lambda);
    }
    Ok(f)
}

/// A wrapping u32 sum of frequencies as the integer it stands for, where that lies in
/// `1..=2^32` (a non-empty run of a table's frequencies, each at least 1, all summing to
/// 2^32; or of its floors): 0 stands for 2^32.
fn whole_sum(s: u32) -> u64 {
    if s == 0 {
        TOTAL
    } else {
        s as u64
    }
}

/// Block sums of one table's lookups, made as far as a question needs them: an encoder's
/// symbol, or a decoder's target, usually lies among the first tokens (the frequent ones,
/// by the vocabulary's construction), so the pass stops there.
struct Blocks<'a> {
    isa: Isa,
    logits: &'a [i32],
    top: i32,
    lut: &'a [u32],
    sums: Vec<u32>,
}

impl Blocks<'_> {
    /// Blocks made per call of the pass beyond the one asked for.
    const AHEAD: usize = 16;

    /// The sum of block `b` (which must exist).
    fn get(&mut self, b: usize) -> u64 {
        if self.sums.len() <= b {
            let from = self.sums.len() * freq_scan::BLOCK;
            let to = ((b + 1).max(self.sums.len() + Self::AHEAD) * freq_scan::BLOCK)
                .min(self.logits.len());
            let part = &self.logits[from..to];
            freq_scan::block_sums(self.isa, part, self.top, self.lut, &mut self.sums);
        }
        whole_sum(self.sums[b])
    }

    /// The sum of every block.
    fn total(&mut self) -> u64 {
        let blocks = self.logits.len().div_ceil(freq_scan::BLOCK);
        if blocks > 0 {
            self.get(blocks - 1);
        }
        self.sums.iter().map(|&s| whole_sum(s)).sum()
    }
}

/// [`answer`] of [`table`] without the table: the query's interval from block sums over the
/// logits as far as the query needs them and a walk through one block.
///
/// Every token's frequency is a lookup by its gap (`by_gap`, or with a mix the same table
/// mixed entry by entry, as [`mix`] changes every token's frequency alone) except at most two:
/// the remainder's token and the mix's token. Their true values need the table's total (every
/// block; with a mix, also every block of the unmixed lookups), so they are worked out only
/// when a sum reaches one of them, kept as `(token, lookup value, true value)`, and corrected
/// wherever a sum passes them. `top` is the largest logit when the caller knows it.
pub fn coded(
    isa: Isa,
    logits: &[i32],
    top: Option<i32>,
    exp40: &[u64],
    mix_in: Option<(u32, u64)>,
    find: Find,
) -> Result<Coded> {
    let g = ByGap::new(isa, logits, top, exp40)?;
    let v = logits.len();
    let (arg, top_floor) = (g.arg(), g.by_gap[0] as u64);
    let n = g.by_gap.len() - 1;
    let lookup = |lut: &[u32], j: usize| {
        let gap = ((g.top as i64 - logits[j] as i64) as u64).min(n as u64);
        lut[gap as usize] as u64
    };
    // [`mix`] is the identity for these; its token must be in the table.
    let mix_in = mix_in.filter(|&(x, l)| (x as usize) < v && l != 0 && l < 1 << 16);
    let mixed = |f: u64, lambda: u64| (f - ((f * lambda) >> 16)).max(1);
    let mixed_lut: Option<Vec<u32>> = mix_in.map(|(_, lambda)| {
        let each = g.by_gap.iter();
        each.map(|&f| mixed(f as u64, lambda) as u32).collect()
    });
    let lut: &[u32] = mixed_lut.as_deref().unwrap_or(&g.by_gap);
    let mut blocks = Blocks {
        isa,
        logits,
        top: g.top,
        lut,
        sums: Vec::new(),
    };
    let odd = [Some(arg), mix_in.map(|(x, _)| x as usize)];
    let resolve = |blocks: &mut Blocks| -> Result<Vec<(usize, u64, u64)>> {
        let Some((x, lambda)) = mix_in else {
            let rem = ByGap::rem(blocks.total())?;
            return Ok(vec![(arg, top_floor, top_floor + rem)]);
        };
        let x = x as usize;
        let mut plain = Vec::new();
        freq_scan::block_sums(isa, logits, g.top, &g.by_gap, &mut plain);
        let rem = ByGap::rem(plain.iter().map(|&s| whole_sum(s)).sum())?;
        let at_x = lookup(lut, x);
        // Every token but x, mixed: the lookups, with the remainder's token's own value.
        let mut rest = blocks.total() - at_x;
        let mut specials = Vec::with_capacity(2);
        if arg != x {
            let true_arg = mixed(top_floor + rem, lambda);
            rest = rest - lut[0] as u64 + true_arg;
            specials.push((arg, lut[0] as u64, true_arg));
        }
        let true_x = TOTAL
            .checked_sub(rest)
            .ok_or_else(|| Error::Invalid("LM mix: the rest past 2^32".into()))?;
        specials.push((x, at_x, true_x));
        Ok(specials)
    };
    let range = |b: usize| b * freq_scan::BLOCK..((b + 1) * freq_scan::BLOCK).min(v);
    let value = |sp: &[(usize, u64, u64)], j: usize| match sp.iter().find(|s| s.0 == j) {
        Some(s) => s.2,
        None => lookup(lut, j),
    };
    // Block b's sum with its special tokens' true values.
    let block = |blocks: &mut Blocks, sp: &[(usize, u64, u64)], b: usize| {
        let inside = sp.iter().filter(|s| range(b).contains(&s.0));
        let fix = inside.fold(0i64, |a, s| a + s.2 as i64 - s.1 as i64);
        (blocks.get(b) as i64 + fix) as u64
    };
    match find {
        Find::Symbol(s) => {
            let s = s as usize;
            if s >= v {
                return Err(Error::Invalid(format!("symbol {s} beyond the vocabulary")));
            }
            let sp = match odd.iter().flatten().any(|&p| p <= s) {
                true => resolve(&mut blocks)?,
                false => Vec::new(),
            };
            let first = s / freq_scan::BLOCK;
            let mut cum: u64 = (first * freq_scan::BLOCK..s).map(|j| value(&sp, j)).sum();
            for b in 0..first {
                cum += block(&mut blocks, &sp, b);
            }
            Ok(Coded {
                symbol: s as u32,
                cum,
                freq: value(&sp, s),
            })
        }
        Find::Target(t) => {
            let (mut cum, mut sp) = (0u64, None);
            for b in 0..v.div_ceil(freq_scan::BLOCK) {
                if sp.is_none() && odd.iter().flatten().any(|p| range(b).contains(p)) {
                    sp = Some(resolve(&mut blocks)?);
                }
                let sp = sp.as_deref().unwrap_or(&[]);
                let size = block(&mut blocks, sp, b);
                if t >= cum + size {
                    cum += size;
                    continue;
                }
                for j in range(b) {
                    let freq = value(sp, j);
                    if t < cum + freq {
                        return Ok(Coded {
                            symbol: j as u32,
                            cum,
                            freq,
                        });
                    }
                    cum += freq;
                }
                break;
            }
            Err(Error::Invalid(format!(
                "target {t} beyond the table's total"
            )))
        }
    }
}

/// Answer a query from its table: the symbol's interval, or the symbol whose interval holds
/// the target (every frequency is at least 1, so there is exactly one).
pub fn answer(f: &[u64], find: Find) -> Result<Coded> {
    let mut cum = 0u64;
    match find {
        Find::Symbol(s) => {
            let s = s as usize;
            let freq = *f
                .get(s)
                .ok_or_else(|| Error::Invalid(format!("symbol {s} beyond the vocabulary")))?;
            cum = f[..s].iter().sum();
            Ok(Coded {
                symbol: s as u32,
                cum,
                freq,
            })
        }
        Find::Target(t) => {
            for (s, &freq) in f.iter().enumerate() {
                if t < cum + freq {
                    return Ok(Coded {
                        symbol: s as u32,
                        cum,
                        freq,
                    });
                }
                cum += freq;
            }
            Err(Error::Invalid(format!(
                "target {t} beyond the table's total"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::lm::fixed::exp_table;
    const LOGIT_MAX: i32 = crate::format::lm::model_file::LOGIT_MAX as i32;

    /// The definition, one token at a time (the kernel before the counting version).
    fn frequencies_definition(logits: &[i32], exp40: &[u64]) -> Vec<u64> {
        let top = *logits.iter().max().unwrap();
        let arg = logits.iter().position(|&l| l == top).unwrap();
        let w = |l: i32| {
            exp40
                .get((top as i64 - l as i64) as usize)
                .copied()
                .unwrap_or(0)
        };
        let total_w: u64 = logits.iter().map(|&l| w(l)).sum();
        let r = (TOTAL - logits.len() as u64) as u128;
        let mut f: Vec<u64> = logits
            .iter()
            .map(|&l| 1 + (w(l) as u128 * r / total_w as u128) as u64)
            .collect();
        let sum: u64 = f.iter().sum();
        f[arg] += TOTAL - sum;
        f
    }

    /// A small deterministic generator (Knuth's MMIX LCG): the state after each step.
    fn lcg(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x
        }
    }

    /// The levels this CPU runs: every test below runs at each.
    fn levels() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|i| i.available())
    }

    #[test]
    fn tables_by_gap_equal_the_definition() {
        let t = exp_table(40);
        let mut next = lcg(11);
        let mut cases: Vec<Vec<i32>> = [
            (2usize, 10i64),
            (50257, 3000),
            (50257, 40000),
            (1000, 1 << 24),
        ]
        .into_iter()
        .map(|(v, spread)| {
            (0..v)
                .map(|_| ((next() >> 33) as i64 % spread - spread / 2) as i32)
                .collect()
        })
        .collect();
        // Ties on the top, and extremes of the logit range.
        cases.push(vec![LOGIT_MAX, -LOGIT_MAX, LOGIT_MAX, 0, LOGIT_MAX - 1]);
        // Two equal weights: the floors sum to exactly 2^32, no remainder.
        cases.push(vec![5, 5]);
        cases.push(vec![i32::MAX, i32::MIN, 0]);
        for isa in levels() {
            for logits in &cases {
                assert_eq!(
                    frequencies(isa, logits, &t).unwrap(),
                    frequencies_definition(logits, &t),
                    "{isa:?} v={}",
                    logits.len()
                );
            }
        }
    }

    /// The reciprocal with its correction gives the quotient of the plain division, at the
    /// extremes of `W` (one weight of 2^40; 2^16 of them) and of `r`, and for random sums.
    #[test]
    fn floors_by_reciprocal_equal_the_division() {
        let t = exp_table(40);
        let mut next = lcg(7);
        let mut rnd = || next() >> 11;
        let mut sums = vec![
            1 << 40,
            (1 << 40) + 1,
            t[0] << 16,
            (t[0] << 16) - 1,
            3 << 40,
        ];
        sums.extend((0..200).map(|_| (1 << 40) + rnd() % (t[0] << 16)));
        for total_w in sums {
            for r in [TOTAL - 2, TOTAL - 50257, TOTAL - (1 << 16), 1 << 31] {
                let want = t
                    .iter()
                    .map(|&w| (w as u128 * r as u128 / total_w as u128) as u64);
                assert!(floor_by_gap(&t, r, total_w).eq(want), "W={total_w} r={r}");
            }
        }
        // Every weight against itself and its neighbours as W.
        for &w in t.iter().step_by(37) {
            for total_w in [w, w + 1, w.saturating_sub(1).max(1)] {
                let r = TOTAL - 2;
                let want = (w as u128 * r as u128 / total_w as u128) as u64;
                if total_w > r {
                    assert_eq!(floor_by_gap(&[w], r, total_w).next(), Some(want), "{w}");
                }
            }
        }
    }

    /// The lookup table of floors plus one at every level equals the scalar floors, for the
    /// sums and rates of `floors_by_reciprocal_equal_the_division`, tables off the vector
    /// width, weights of 2^52 and more (the scalar path from there), and `W <= r`.
    #[test]
    fn floor_tables_equal_the_scalar_floors() {
        let t = exp_table(40);
        let mut next = lcg(17);
        let mut rnd = || next() >> 11;
        let mut wide = t[..77].to_vec();
        wide[21] = (1 << 52) + 3;
        wide[60] = u64::MAX >> 9;
        let tables = [&t[..], &t[..1], &t[..13], &t[3000..], &wide[..]];
        let mut sums = vec![1 << 40, t[0] << 16, (t[0] << 16) - 1, 3 << 40, 5, 1 << 31];
        sums.extend((0..50).map(|_| (1 << 40) + rnd() % (t[0] << 16)));
        for isa in levels() {
            for table in tables {
                for &total_w in &sums {
                    for r in [TOTAL - 2, TOTAL - 50257, 1 << 31] {
                        let mut want: Vec<u32> = floor_by_gap(table, r, total_w)
                            .map(|q| 1 + q as u32)
                            .collect();
                        want.push(1);
                        let got = floors_plus_one(isa, table, r, total_w);
                        assert_eq!(got, want, "{isa:?} W={total_w} r={r} {}", table.len());
                    }
                }
            }
        }
    }

    #[test]
    fn prefix_sums_equal_those_of_the_table() {
        let t = exp_table(40);
        let mut next = lcg(5);
        let mut rnd = || next() >> 33;
        for (v, spread) in [(2usize, 10i64), (50257, 3000), (50257, 40000), (9000, 600)] {
            let logits: Vec<i32> = (0..v)
                .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                .collect();
            // A shuffled order that leaves a token out (as lm_bits leaves out the EOT).
            let mut order: Vec<u32> = (0..v as u32).collect();
            for i in (1..v).rev() {
                order.swap(i, rnd() as usize % (i + 1));
            }
            order.pop();
            let f = frequencies_definition(&logits, &t);
            let want = crate::backend::lm::prefix_sums(&f, &order).unwrap();
            for isa in levels() {
                assert_eq!(prefix_sums(isa, &logits, &t, &order).unwrap(), want);
            }
        }
        assert!(prefix_sums(Isa::Portable, &[1, 2, 3], &t, &[0, 3]).is_err());
        // Every token in the order: the sums reach 2^32, as the table's do.
        assert!(prefix_sums(Isa::Portable, &[1, 2, 3], &t, &[0, 1, 2]).is_err());
    }

    /// Logits that come out of the head in the order give the sums of the table's, ties on
    /// the top included (the remainder goes to the lowest id, wherever it sits), at every
    /// level, serial and parallel.
    #[test]
    fn sums_of_ordered_logits_equal_those_of_the_table() {
        let t = exp_table(40);
        let mut next = lcg(9);
        let mut rnd = || next() >> 33;
        for (v, spread, ties, top_left_out) in [
            (50257usize, 3000i64, 5usize, false),
            (50257, 3000, 0, true),
            (9000, 600, 0, false),
            (3, 4, 3, false),
            (2, 1, 2, false),
            (2, 1, 2, true),
        ] {
            let mut logits: Vec<i32> = (0..v)
                .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                .collect();
            for _ in 0..ties {
                let at = rnd() as usize % v;
                logits[at] = spread as i32;
            }
            let mut order: Vec<u32> = (0..v as u32).collect();
            for i in (1..v).rev() {
                order.swap(i, rnd() as usize % (i + 1));
            }
            if top_left_out {
                // The remainder's token is the one the order leaves out.
                let arg = logits
                    .iter()
                    .position(|&l| l == *logits.iter().max().unwrap())
                    .unwrap() as u32;
                let at = order.iter().position(|&id| id == arg).unwrap();
                order.swap(at, v - 1);
            }
            let f = frequencies_definition(&logits, &t);
            let left_out = order.pop().unwrap();
            let want = crate::backend::lm::prefix_sums(&f, &order).unwrap();
            let mut ids = order.clone();
            ids.push(left_out);
            let by_row: Vec<i32> = ids.iter().map(|&id| logits[id as usize]).collect();
            for isa in levels() {
                for split in [Split::SERIAL, Split::PARALLEL] {
                    let len = order.len();
                    let got = prefix_sums_in_order(isa, &by_row, None, &ids, len, &t, split);
                    assert_eq!(got.unwrap(), want, "{isa:?} v={v} ties={ties} {split:?}");
                    // With the top given, as the head's kernel gives it.
                    let top = by_row.iter().max().copied();
                    let got = prefix_sums_in_order(isa, &by_row, top, &ids, len, &t, split);
                    assert_eq!(got.unwrap(), want, "{isa:?} v={v} ties={ties} {split:?}");
                }
                // Nothing left out: the sums reach 2^32.
                let all = prefix_sums_in_order(isa, &by_row, None, &ids, v, &t, Split::SERIAL);
                assert!(all.is_err(), "{isa:?} v={v}");
            }
        }
        let short = prefix_sums_in_order(Isa::Portable, &[1, 2], None, &[0], 1, &t, Split::SERIAL);
        assert!(short.is_err());
    }

    /// Answers without the table equal the table's answers: every level, with and without
    /// a mix (its token the remainder's or another, a lambda of 1 and 2^16 - 1), symbols at
    /// and around block edges and the special tokens, targets at every interval's ends.
    #[test]
    fn answers_without_the_table_equal_the_tables() {
        let t = exp_table(40);
        let mut next = lcg(21);
        let mut rnd = || next() >> 33;
        let mut cases: Vec<Vec<i32>> = [(50257usize, 3000i64), (9000, 600), (513, 40000), (2, 1)]
            .into_iter()
            .map(|(v, spread)| {
                (0..v)
                    .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                    .collect()
            })
            .collect();
        cases.push(vec![LOGIT_MAX, -LOGIT_MAX, LOGIT_MAX, 0, LOGIT_MAX - 1]);
        cases.push(vec![5, 5]);
        // One token all but certain: its floor near 2^32, the rest 1.
        let mut sharp = vec![-LOGIT_MAX; 700];
        sharp[300] = LOGIT_MAX;
        cases.push(sharp);
        for logits in &cases {
            let v = logits.len();
            let arg = logits
                .iter()
                .position(|&l| l == *logits.iter().max().unwrap())
                .unwrap();
            let mut mixes = vec![None, Some((arg as u32, 30000)), Some((v as u32, 5))];
            for lambda in [1, 30000, (1 << 16) - 1, 1 << 16, 0] {
                mixes.push(Some(((v - 1 - arg.min(v - 1)) as u32, lambda)));
                mixes.push(Some(((rnd() as usize % v) as u32, lambda)));
            }
            for mix_in in mixes {
                let f = table(Isa::Portable, logits, &t, mix_in).unwrap();
                let mut symbols: Vec<usize> = vec![0, v - 1, arg, v / 2];
                symbols.extend([255, 256, 257, 511, 512].into_iter().filter(|&s| s < v));
                if let Some((x, _)) = mix_in {
                    symbols.push((x as usize).min(v - 1));
                }
                symbols.extend((0..20).map(|_| rnd() as usize % v));
                let mut cum = vec![0u64];
                for &x in &f {
                    cum.push(cum.last().unwrap() + x);
                }
                for isa in levels() {
                    let at = format!("{isa:?} v={v} mix={mix_in:?}");
                    for top in [None, logits.iter().max().copied()] {
                        for &s in &symbols {
                            let got = coded(isa, logits, top, &t, mix_in, Find::Symbol(s as u32));
                            let want = answer(&f, Find::Symbol(s as u32)).unwrap();
                            assert_eq!(got.unwrap(), want, "{at} symbol {s}");
                            for target in [cum[s], cum[s + 1] - 1, cum[s] + f[s] / 2] {
                                let got = coded(isa, logits, top, &t, mix_in, Find::Target(target));
                                let want = answer(&f, Find::Target(target)).unwrap();
                                assert_eq!(got.unwrap(), want, "{at} target {target}");
                            }
                        }
                    }
                    let beyond = |find| coded(isa, logits, None, &t, mix_in, find).is_err();
                    assert!(beyond(Find::Symbol(v as u32)), "{at}");
                    assert!(beyond(Find::Target(TOTAL)), "{at}");
                }
            }
        }
    }

    /// The sums at chosen indices equal those of the whole prefix sums, at every level: no
    /// index, the first and last, every index, and random ones across the pieces, with the
    /// remainder's token inside the order and left out of it.
    #[test]
    fn sums_at_indices_equal_the_whole_sums() {
        let t = exp_table(40);
        let mut next = lcg(7);
        let mut rnd = || next() >> 33;
        for (v, len) in [
            (5000usize, 4999usize),
            (50_257, 50_256),
            (9000, 8990),
            (3, 2),
        ] {
            for case in 0..6 {
                let mut logits: Vec<i32> = (0..v)
                    .map(|_| (rnd() % 3000) as i32 - 1500 + if case == 0 { 0 } else { 100 })
                    .collect();
                // The top among the left-out tokens, or twice inside the order.
                match case {
                    1 => logits[v - 1] = 5000,
                    2 => {
                        logits[v / 3] = 5000;
                        logits[v / 2] = 5000
                    }
                    _ => {}
                }
                let ids: Vec<u32> = (0..v as u32).rev().collect();
                let whole = prefix_sums_in_order(
                    Isa::Portable,
                    &logits,
                    None,
                    &ids,
                    len,
                    &t,
                    Split::SERIAL,
                )
                .unwrap();
                let every: Vec<u32> = (0..=len as u32).collect();
                let some: Vec<u32> = every.iter().copied().filter(|_| rnd() % 50 == 0).collect();
                // Lists that end before the remainder's token and after it.
                let cut = |k: usize| every[..(k * len / 4).max(1)].to_vec();
                let (a, b, c) = (cut(1), cut(2), cut(3));
                let mut spread: Vec<u32> = some.iter().map(|&i| i / 3).collect();
                spread.dedup();
                for at in [vec![], vec![0, len as u32], every, some, a, b, c, spread] {
                    let want: Vec<u32> = at.iter().map(|&i| whole[i as usize]).collect();
                    for isa in levels() {
                        let got = prefix_sums_in_order_at(isa, &logits, None, &ids, len, &t, &at);
                        assert_eq!(got.unwrap(), want, "{isa:?}, v {v}, case {case}");
                    }
                }
            }
        }
        let ids = [1, 0];
        let bad = |len, at: &[u32]| {
            prefix_sums_in_order_at(Isa::Portable, &[1, 2], None, &ids, len, &t, at)
        };
        assert!(bad(1, &[2]).is_err());
        assert!(bad(1, &[1, 1]).is_err());
        assert!(bad(1, &[1, 0]).is_err());
        // Nothing left out: the sums reach 2^32, whichever are asked for.
        assert!(bad(2, &[0]).is_err());
        assert!(bad(1, &[0, 1]).is_ok());
    }

    #[test]
    fn total_floor_and_remainder() {
        let t = exp_table(40);
        let logits = vec![0, 256, 256, -100000, 10, 256];
        let f = frequencies(Isa::Portable, &logits, &t).unwrap();
        assert_eq!(f.iter().sum::<u64>(), TOTAL);
        assert!(f.iter().all(|&x| x >= 1));
        assert_eq!(f[3], 1);
        // ids 1, 2, 5 tie on the largest weight; the remainder goes to id 1
        assert!(f[1] > f[2] && f[2] == f[5]);
    }
}
