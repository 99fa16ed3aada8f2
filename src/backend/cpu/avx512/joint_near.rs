//! AVX-512 lanes of the Joint layout's neighbor form (`super::super::joint_near`), decoding:
//! two 16-lane state vectors per step, each lane's row from its facts (formed from the
//! reference) and the code of the element `d` back (an earlier step's, stored) by one
//! gather, then its symbol and its frequency and start by two more. The AVX2 lanes
//! (`super::super::avx2::joint_near`) gather only on Intel CPUs without the GDS
//! mitigation, and load each lookup separately elsewhere. Encoding: the
//! AVX2 pass's codes, tails and table entries, then the `--fast` AVX-512 lanes.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::super::avx2::encode::codes_and_tails;
use super::super::decode::{no_row, Stream};
use super::super::encode::Scratch;
use super::super::joint::{joint_of_code_wide, small_codes, JointDec};
use super::super::joint_near::{packed_index, NearSlots};
use super::super::tables::EncStage;
use super::super::word::Word;
use super::decode::{overrun, refill};
use super::encode::{gather, gather_flat};
use super::joint::{code_of, lanes_by};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::chunk::{EncodedChunk, LANES};
use crate::format::tables::Window;
use crate::Result;

/// The map indices of 16 elements over a window (`Window::index`), as the portable
/// `joint_near::index_of(near_of(..))` forms them: from their facts `i` and the codes `c`
/// of the elements `d` back. What the decode lanes, the encoder and the histogram share.
struct MapIndex {
    lo: __m512i,
    m2_mul: __m512i,
    span: __m512i,
}

impl MapIndex {
    #[inline(always)]
    unsafe fn new(window: Window, w1: usize) -> Self {
        MapIndex {
            lo: _mm512_set1_epi32(window.lo as i32),
            m2_mul: _mm512_set1_epi32(w1 as i32 + 1),
            span: _mm512_set1_epi32(2 * window.n as i32),
        }
    }

    /// `(k, index)`: each element's exponent class less the window's first (wrapped below
    /// it: above `n - 1` unsigned where outside, for the callers to refuse), and its map
    /// index, from its facts `i` packed as `InfoFn::info` packs them.
    #[inline(always)]
    unsafe fn of(&self, i: __m512i, c: __m512i) -> (__m512i, __m512i) {
        let er = _mm512_and_si512(i, _mm512_set1_epi32(255));
        let rs = _mm512_and_si512(_mm512_srli_epi32::<8>(i), _mm512_set1_epi32(1));
        let m2 = _mm512_and_si512(_mm512_srli_epi32::<9>(i), _mm512_set1_epi32(3));
        self.of_parts((er, rs, m2), c)
    }

    /// [`MapIndex::of`] from the facts' parts: exponent class, reference sign, the two
    /// mantissa bits below the class.
    #[inline(always)]
    unsafe fn of_parts(
        &self,
        (er, rs, m2): (__m512i, __m512i, __m512i),
        c: __m512i,
    ) -> (__m512i, __m512i) {
        let nb = _mm512_and_si512(c, _mm512_set1_epi32(127));
        // Sign state: 0 for b = 0, else 1 + neg (a code's neg bit is 0 where b = 0).
        let up = _mm512_add_epi32(
            _mm512_min_epu32(nb, _mm512_set1_epi32(1)),
            _mm512_and_si512(_mm512_srli_epi32::<9>(c), _mm512_set1_epi32(1)),
        );
        let near = _mm512_add_epi32(_mm512_mullo_epi32(m2, self.m2_mul), nb);
        let near = _mm512_add_epi32(_mm512_add_epi32(near, _mm512_add_epi32(near, near)), up);
        let k = _mm512_sub_epi32(er, self.lo);
        let index = _mm512_add_epi32(
            _mm512_mullo_epi32(near, self.span),
            _mm512_add_epi32(_mm512_add_epi32(k, k), rs),
        );
        (k, index)
    }
}

/// 16 elements' facts (`InfoFn::info`'s parts: exponent class, reference sign, the two
/// mantissa bits below the class) from the reference, for [`MapIndex::of_parts`].
struct Facts {
    mant: __m128i,
    mant2: __m128i,
    emask: __m512i,
}

impl Facts {
    #[inline(always)]
    unsafe fn new((mant, emask): (u32, u32)) -> Self {
        Facts {
            mant: _mm_cvtsi32_si128(mant as i32),
            mant2: _mm_cvtsi32_si128(mant as i32 - 2),
            emask: _mm512_set1_epi32(emask as i32),
        }
    }

    /// The facts of elements `j..j + 16` of the reference at `rp`.
    #[inline(always)]
    unsafe fn of<T: Word>(&self, rp: *const u8, j: usize) -> (__m512i, __m512i, __m512i) {
        let (r, rs) = if T::BITS == 16 {
            let r = _mm512_cvtepu16_epi32(_mm256_loadu_si256(rp.add(2 * j).cast()));
            (r, _mm512_srli_epi32::<15>(r))
        } else {
            let r = _mm512_loadu_si512(rp.add(4 * j).cast());
            (r, _mm512_srli_epi32::<31>(r))
        };
        let er = _mm512_and_si512(_mm512_srl_epi32(r, self.mant), self.emask);
        let m2 = _mm512_and_si512(_mm512_srl_epi32(r, self.mant2), _mm512_set1_epi32(3));
        (er, rs, m2)
    }
}

/// Decode whole steps from `from` (whose first element has its neighbor: `from·LANES >=
/// d`); returns the step it stopped at, for the portable lanes to finish (`from` itself
/// where the tables do not have the shapes the gathers assume). Each element's facts come
/// straight from the reference (`(mant, emask)`: `InfoFn::joint_params`), not from a facts
/// array written by a pass before. Where `guarded`, the words are read in place and it
/// stops while less than a step's worth is left; otherwise `st` must be padded with `LANES`
/// words past its length and it runs while whole steps remain.
///
/// # Safety
/// AVX-512 F, BW, VL (`Isa::Avx512` available); `T` of 16 or 32 bits.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn decode_steps<T: Word>(
    table: &JointDec,
    near: &NearSlots,
    reference: &[u8],
    params: (u32, u32),
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
    (d, w1): (usize, usize),
    from: usize,
) -> Result<usize> {
    debug_assert!(matches!(T::BITS, 16 | 32));
    let n = codes.len().min(reference.len() / T::SIZE);
    let window = near.window;
    // Indices as signed dwords inside their tables (`NearSlots::lane_shapes`).
    // (Symbol-per-slot tables: bucketed ones are AVX2's.)
    let Some((n_rows, span)) = near.lane_shapes(table, w1, d).filter(|_| !near.bucketed()) else {
        return Ok(from);
    };
    assert!(st.words.len() >= st.len + if guarded { 0 } else { LANES } && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [
        _mm512_loadu_si512(states.as_ptr().cast()),
        _mm512_loadu_si512(states.as_ptr().add(16).cast()),
    ];
    let small = _mm512_loadu_si512(small_codes().as_ptr().cast());
    let (map, syms, fs) = (table.map.as_ptr(), near.syms.as_ptr(), near.fs.as_ptr());
    let (rp, cp) = (reference.as_ptr(), codes.as_mut_ptr());
    let facts = Facts::new(params);
    debug_assert_eq!(span, 2 * window.n as usize);
    let index = MapIndex::new(window, w1);
    let last_class = _mm512_set1_epi32(window.n as i32 - 1);
    let (map_len, rows_v) = (
        _mm512_set1_epi32(table.map.len() as i32),
        _mm512_set1_epi32(n_rows as i32),
    );
    let zero = _mm512_setzero_si512();
    let mut step = from;
    while (step + 1) * LANES <= n {
        if guarded && st.len - pos < LANES {
            break;
        }
        let base = step * LANES;
        debug_assert!(base >= d);
        // Rows first: they depend on the facts and earlier steps' codes, not on the states.
        let mut rows = [zero; 2];
        let mut bad: __mmask16 = 0;
        for (h, row) in rows.iter_mut().enumerate() {
            let j = base + 16 * h;
            let c = _mm512_loadu_si512(cp.add(j - d).cast());
            let (k, idx) = index.of_parts(facts.of::<T>(rp, j), c);
            // Outside the window (k above the last class, unsigned): no row covers it. An
            // index past the map cannot come from codes this decoder wrote; refused, not
            // read, as is a row past the rows (`JointDec::NONE` among them).
            let outside = _mm512_cmpgt_epu32_mask(k, last_class);
            let past = _mm512_cmpge_epu32_mask(idx, map_len);
            let ok = !(outside | past);
            let r = _mm512_mask_i32gather_epi32::<4>(zero, ok, idx, map.cast());
            bad |= !ok | _mm512_cmpge_epu32_mask(r, rows_v);
            *row = r;
        }
        if bad != 0 {
            return Err(no_row());
        }
        for h in 0..2 {
            let slot = _mm512_and_si512(x[h], _mm512_set1_epi32(PROB_TOTAL as i32 - 1));
            // The slot's symbol (a 4-byte load of its byte: `syms` is padded), then its
            // frequency and start from the row's array.
            let at = _mm512_or_si512(_mm512_slli_epi32::<12>(rows[h]), slot);
            let j = _mm512_and_si512(
                _mm512_i32gather_epi32::<1>(at, syms.cast()),
                _mm512_set1_epi32(255),
            );
            let e = _mm512_i32gather_epi32::<4>(
                _mm512_or_si512(_mm512_slli_epi32::<8>(rows[h]), j),
                fs.cast(),
            );
            let hi = _mm512_srli_epi32::<{ PROB_BITS }>(x[h]);
            let xs = _mm512_add_epi32(
                _mm512_mullo_epi32(_mm512_and_si512(e, _mm512_set1_epi32(0xFFFF)), hi),
                _mm512_sub_epi32(slot, _mm512_srli_epi32::<16>(e)),
            );
            // Lanes 0..16 refill before lanes 16..32: the portable lane order. In bounds:
            // the stream is padded with `LANES` words.
            x[h] = refill(xs, words, &mut pos);
            _mm512_storeu_si512(cp.add(base + 16 * h).cast(), code_of(j, small));
        }
        if pos > st.len {
            return Err(overrun());
        }
        step += 1;
    }
    _mm512_storeu_si512(states.as_mut_ptr().cast(), x[0]);
    _mm512_storeu_si512(states.as_mut_ptr().add(16).cast(), x[1]);
    st.pos = pos;
    Ok(step)
}

/// Code one chunk of the neighbor form: codes and tails by the AVX2 pass, then the `--fast`
/// AVX-512 lanes, each group of 16 elements' packed symbols computed where the lanes read
/// them: the map index from the facts and the code `distance` back (as the decode lanes
/// form it), the row by a gather from the map, the symbol by one from the code, the packed
/// symbol by a third (a separate pass writing table indices, then read by the lanes, cost
/// 11% of a bf16 encode's samples). The elements before `distance` (no neighbor) take
/// their indices from the portable [`packed_index`].
///
/// # Safety
/// AVX-512 F, BW, VL, CD with AVX2, BMI1, BMI2, LZCNT, POPCNT (`Isa::Avx512` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512cd")]
pub unsafe fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    s: &mut Scratch,
) -> EncodedChunk {
    // SAFETY: the caller guarantees the features, AVX2's included (`Isa::available`).
    unsafe { codes_and_tails(d, true, s) };
    let n = s.codes.len().min(info.len());
    let codes = &s.codes[..n];
    // Groups of 16 starting below `head` hold an element without its neighbor.
    let head = distance.next_multiple_of(16).min(n);
    s.idx.clear();
    s.idx
        .extend((0..head).map(|j| packed_index(info, table, distance, w1, codes, j)));
    let first = &s.idx;
    let lut = joint_of_code_wide();
    let window = table.window;
    let (ip, cp) = (info.as_ptr(), codes.as_ptr());
    let index = MapIndex::new(window, w1);
    let last_class = _mm512_set1_epi32(window.n as i32 - 1);
    let map_len = _mm512_set1_epi32(table.map.len().min(i32::MAX as usize) as i32);
    let syms = super::joint::inlined_syms(
        #[inline(always)]
        |at: usize, valid: __mmask16| -> __m512i {
            if at < head {
                // SAFETY: the lanes in `valid` are elements below `n`, and `first` holds every
                // element below `head`'s; indices clamped inside the gather.
                let idx = unsafe { _mm512_maskz_loadu_epi32(valid, first.as_ptr().add(at).cast()) };
                return unsafe { gather_flat(&table.packed, valid, idx) };
            }
            // SAFETY: the lanes in `valid` are elements `at..` below `n <= info.len()`, and
            // `at >= head >= distance`: their neighbors are elements of the chunk. Gathers read
            // `lut` at `c & 1023`, and `gather` clamps what it reads to its tables.
            unsafe {
                let i = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, ip.add(at).cast()));
                let c = _mm512_maskz_loadu_epi32(valid, cp.add(at - distance).cast());
                let own = _mm512_maskz_loadu_epi32(valid, cp.add(at).cast());
                let (k, idx) = index.of(i, c);
                // Outside the window or past the map: no row, the identity (as
                // `packed_index`'s `u32::MAX`).
                let ok = valid
                    & !(_mm512_cmpgt_epu32_mask(k, last_class)
                        | _mm512_cmpge_epu32_mask(idx, map_len));
                let sym = _mm512_mask_i32gather_epi32::<4>(
                    _mm512_setzero_si512(),
                    valid,
                    _mm512_and_si512(own, _mm512_set1_epi32(1023)),
                    lut.as_ptr().cast(),
                );
                gather(table, ok, idx, sym)
            }
        },
    );
    // SAFETY: features as this function's; `syms` reads within its tables (above).
    let (states, at) = unsafe { lanes_by(n, &mut s.words, syms) };
    s.chunk(at..n, states)
}

/// The neighbor-form histogram's counters of one block whose elements all have their
/// neighbor (`nbs`: the codes `d` back, `own`: their codes): each element's row start from
/// `slot` (by its map index over `window`, formed as the decode lanes form it) plus its
/// joint symbol (`lut`, [`joint_of_code_wide`]), into `at`. False where some context has no
/// row yet (`u32::MAX` in `slot`): `at` is then not all counters, and the caller makes the
/// block's rows and counts it its portable way. Map indices are clamped to `slot` (those of
/// codes from `hist::code_of` are inside it: the window is the data's classes).
///
/// # Safety
/// AVX-512 F, BW, VL (`Isa::Avx512` available).
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
pub unsafe fn counters(
    info: &[u16],
    nbs: &[u32],
    own: &[u32],
    (w1, window): (usize, Window),
    slot: &[u32],
    lut: &[u32; 1024],
    at: &mut [u32],
) -> bool {
    let m = at.len().min(info.len()).min(nbs.len()).min(own.len());
    let Some(last) = slot.len().checked_sub(1) else {
        return false;
    };
    let last = _mm512_set1_epi32(last.min(i32::MAX as usize) as i32);
    let index = MapIndex::new(window, w1);
    let none = _mm512_set1_epi32(-1);
    let mut missing: __mmask16 = 0;
    for j in (0..m).step_by(16) {
        let valid: __mmask16 = if m - j >= 16 {
            !0
        } else {
            (1u16 << (m - j)) - 1
        };
        // SAFETY: the lanes in `valid` are below `m`, inside every slice; the gathers'
        // indices are clamped to `slot` and masked to `lut`.
        unsafe {
            let i =
                _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(valid, info.as_ptr().add(j).cast()));
            let c = _mm512_maskz_loadu_epi32(valid, nbs.as_ptr().add(j).cast());
            let x = _mm512_maskz_loadu_epi32(valid, own.as_ptr().add(j).cast());
            let (_, idx) = index.of(i, c);
            let start = _mm512_mask_i32gather_epi32::<4>(
                _mm512_setzero_si512(),
                valid,
                _mm512_min_epu32(idx, last),
                slot.as_ptr().cast(),
            );
            missing |= _mm512_mask_cmpeq_epi32_mask(valid, start, none);
            let sym = _mm512_mask_i32gather_epi32::<4>(
                _mm512_setzero_si512(),
                valid,
                _mm512_and_si512(x, _mm512_set1_epi32(1023)),
                lut.as_ptr().cast(),
            );
            _mm512_mask_storeu_epi32(
                at.as_mut_ptr().add(j).cast(),
                valid,
                _mm512_add_epi32(start, sym),
            );
        }
    }
    missing == 0
}
