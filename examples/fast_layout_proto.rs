//! PROTOTYPE, not a format: how fast could a one-symbol-per-weight layout decode, and what
//! would it cost in size? Measured against the shipped codec in the same process, so the
//! speed/ratio decision behind issue 4's targets rests on numbers, not on argument.
//!
//! The prototype codes, per bf16 weight, one joint symbol J = (b, q1, q2, sign) under the
//! reference's exponent class (`CTX=er`, default) or exponent class and sign (`CTX=ers`),
//! with 12-bit per-tensor tables, the shipped chunking (2^18 elements, 32 interleaved rANS
//! lanes, one shared word stream) and the same raw tails. Its decoder looks each lane's
//! symbol, frequency and bias up in one gather from a dense slot table (4096 entries per
//! context), then rebuilds the weights with the shipped tail pass's method. Every decode is
//! compared with the target. Table sizes are estimated with the shipped row format.
//!
//! `cargo run --release --example fast_layout_proto` (AVX-512 CPUs only; bf16 600 -> 800 pair
//! of ../shared/data/trajectory-gpt2).

#[cfg(target_arch = "x86_64")]
fn main() {
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
        eprintln!("SKIP: needs AVX-512 F and BW");
        return;
    }
    proto::main();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("SKIP: x86-64 only");
}

#[cfg(target_arch = "x86_64")]
mod proto {
    use core::arch::x86_64::*;
    use std::time::Instant;

    use lockstep::backend::cpu::CpuBackend;
    use lockstep::backend::{Backend, DecodeJob, EncodeJob};
    use lockstep::bytes::ByteWriter;
    use lockstep::checkpoint::Checkpoint;
    use lockstep::delta::blob::neighbor_distance;
    use lockstep::delta::model::{row_bytes, StageTable, Tables};
    use lockstep::delta::symbols::{encode_element, Layout};
    use lockstep::entropy::freq::normalize_to;
    use lockstep::entropy::rans::{enc_put, RANS_L};

    const LANES: usize = 32;
    const CHUNK: usize = 1 << 18;
    const SLOTS: usize = 4096;

    struct Coded {
        reference: Vec<u16>,
        target: Vec<u8>,
        ctx_lo: i32,
        with_sign: bool,
        /// Dense slot table: `J | (freq - 1) << 8 | (slot - start) << 20` per context, slot.
        dec: Vec<u32>,
        chunks: Vec<(Vec<u16>, [u32; LANES], Vec<u8>)>,
        bytes: usize,
    }

    fn ctx_of(r: u16, with_sign: bool) -> i32 {
        let er = ((r >> 7) & 0xFF) as i32;
        if with_sign {
            er * 2 + (r >> 15) as i32
        } else {
            er
        }
    }

    fn code_tensor(rd: &[u8], td: &[u8], with_sign: bool) -> Coded {
        let r: Vec<u16> = rd
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let x: Vec<u16> = td
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let syms: Vec<_> = r
            .iter()
            .zip(&x)
            .map(|(&a, &b)| encode_element(a as u64, b as u64, 16, Layout::Signed))
            .collect();
        let joint: Vec<usize> = syms
            .iter()
            .map(|s| ((s.b as usize * 2 + s.q1 as usize) * 2 + s.q2 as usize) * 2 + s.neg as usize)
            .collect();
        let ctx: Vec<i32> = r.iter().map(|&v| ctx_of(v, with_sign)).collect();
        let (lo, hi) = (*ctx.iter().min().unwrap(), *ctx.iter().max().unwrap());
        let n_ctx = (hi - lo + 1) as usize;
        const A: usize = 17 * 8;
        let mut counts = vec![0u64; n_ctx * A];
        for (&c, &j) in ctx.iter().zip(&joint) {
            counts[(c - lo) as usize * A + j] += 1;
        }
        let mut freq = vec![0u32; n_ctx * A];
        let mut start = vec![0u32; n_ctx * A];
        let mut dec = vec![0u32; n_ctx * SLOTS];
        let mut bytes = 0;
        for c in 0..n_ctx {
            let row = &counts[c * A..][..A];
            if row.iter().all(|&v| v == 0) {
                continue;
            }
            let f = normalize_to(row, 12);
            bytes += row_bytes(&f) + 1;
            let mut s = 0u32;
            for j in 0..A {
                freq[c * A + j] = f[j];
                start[c * A + j] = s;
                for slot in s..s + f[j] {
                    dec[c * SLOTS + slot as usize] = j as u32 | (f[j] - 1) << 8 | (slot - s) << 20;
                }
                s += f[j];
            }
        }
        let mut chunks = Vec::new();
        for c0 in (0..r.len()).step_by(CHUNK) {
            let n = CHUNK.min(r.len() - c0);
            let mut states = [RANS_L; LANES];
            let mut words = Vec::new();
            for step in (0..n.div_ceil(LANES)).rev() {
                for lane in (0..LANES.min(n - step * LANES)).rev() {
                    let j = c0 + step * LANES + lane;
                    let k = (ctx[j] - lo) as usize * A + joint[j];
                    enc_put(&mut states[lane], &mut words, start[k], freq[k]);
                }
            }
            words.reverse();
            // Raw tails, LSB first, in element order (as the shipped format).
            let (mut tail, mut acc, mut nb) = (Vec::new(), 0u64, 0u32);
            for s in &syms[c0..c0 + n] {
                if s.b >= 4 {
                    acc |= s.tail << nb;
                    nb += s.b as u32 - 3;
                    while nb >= 8 {
                        tail.push(acc as u8);
                        acc >>= 8;
                        nb -= 8;
                    }
                }
            }
            if nb > 0 {
                tail.push(acc as u8);
            }
            bytes += words.len() * 2 + tail.len() + LANES * 4;
            tail.resize(tail.len() + 16, 0);
            chunks.push((words, states, tail));
        }
        Coded {
            reference: r,
            target: td.to_vec(),
            ctx_lo: lo,
            with_sign,
            dec,
            chunks,
            bytes,
        }
    }

    /// Decode one tensor into `out`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt")]
    #[allow(clippy::needless_range_loop)] // `h` picks a state vector and a lane offset
    unsafe fn decode(c: &Coded, out: &mut [u8], codes: &mut Vec<u32>, padded: &mut Vec<u16>) {
        let n_all = c.reference.len();
        for (ci, (words, states, tail)) in c.chunks.iter().enumerate() {
            let c0 = ci * CHUNK;
            let n = CHUNK.min(n_all - c0);
            let r = &c.reference[c0..c0 + n];
            codes.clear();
            codes.resize(n, 0);
            padded.clear();
            padded.extend_from_slice(words);
            padded.resize(words.len() + LANES, 0);
            let mut pos = 0usize;
            let mut x = [
                _mm512_loadu_si512(states.as_ptr().cast()),
                _mm512_loadu_si512(states.as_ptr().add(16).cast()),
            ];
            let full = n / LANES * LANES;
            let dec = c.dec.as_ptr();
            for base in (0..full).step_by(LANES) {
                for h in 0..2 {
                    let rv = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                        r.as_ptr().add(base + 16 * h).cast(),
                    ));
                    let er = _mm512_and_si512(_mm512_srli_epi32::<7>(rv), _mm512_set1_epi32(255));
                    let ctx = if c.with_sign {
                        _mm512_add_epi32(_mm512_slli_epi32::<1>(er), _mm512_srli_epi32::<15>(rv))
                    } else {
                        er
                    };
                    let ctx = _mm512_sub_epi32(ctx, _mm512_set1_epi32(c.ctx_lo));
                    let slot = _mm512_and_si512(x[h], _mm512_set1_epi32(4095));
                    let idx = _mm512_add_epi32(_mm512_slli_epi32::<12>(ctx), slot);
                    let e = _mm512_i32gather_epi32::<4>(idx, dec.cast());
                    let f = _mm512_add_epi32(
                        _mm512_and_si512(_mm512_srli_epi32::<8>(e), _mm512_set1_epi32(0xFFF)),
                        _mm512_set1_epi32(1),
                    );
                    let bias = _mm512_srli_epi32::<20>(e);
                    let xs = _mm512_add_epi32(
                        _mm512_mullo_epi32(f, _mm512_srli_epi32::<12>(x[h])),
                        bias,
                    );
                    // Refill in lane order (as the shipped decoder).
                    let need = _mm512_cmplt_epu32_mask(xs, _mm512_set1_epi32(RANS_L as i32));
                    let w =
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256(padded.as_ptr().add(pos).cast()));
                    let w = _mm512_maskz_expand_epi32(need, w);
                    pos += need.count_ones() as usize;
                    x[h] = _mm512_mask_or_epi32(xs, need, _mm512_slli_epi32::<16>(xs), w);
                    // code = b | q1 << 7 | q2 << 8 | neg << 9 from J = b q1 q2 neg.
                    let j = _mm512_and_si512(e, _mm512_set1_epi32(0xFF));
                    let code = _mm512_or_si512(
                        _mm512_or_si512(
                            _mm512_srli_epi32::<3>(j),
                            _mm512_slli_epi32::<5>(_mm512_and_si512(j, _mm512_set1_epi32(4))),
                        ),
                        _mm512_or_si512(
                            _mm512_slli_epi32::<7>(_mm512_and_si512(j, _mm512_set1_epi32(2))),
                            _mm512_slli_epi32::<9>(_mm512_and_si512(j, _mm512_set1_epi32(1))),
                        ),
                    );
                    _mm512_storeu_si512(codes.as_mut_ptr().add(base + 16 * h).cast(), code);
                }
                assert!(pos <= words.len(), "stream overrun");
            }
            // The last partial step, lane by lane.
            let mut st = [0u32; LANES];
            _mm512_storeu_si512(st.as_mut_ptr().cast(), x[0]);
            _mm512_storeu_si512(st.as_mut_ptr().add(16).cast(), x[1]);
            for (lane, j) in (full..n).enumerate() {
                let ctx = ctx_of(r[j], c.with_sign) - c.ctx_lo;
                let e = c.dec[ctx as usize * SLOTS + (st[lane] & 4095) as usize];
                let jj = e & 0xFF;
                let mut s = ((e >> 8) & 0xFFF) + 1;
                s = s * (st[lane] >> 12) + (e >> 20);
                if s < RANS_L {
                    s = s << 16 | padded[pos] as u32;
                    pos += 1;
                }
                st[lane] = s;
                codes[j] = jj >> 3 | (jj & 4) << 5 | (jj & 2) << 7 | (jj & 1) << 9;
            }
            assert!(
                pos == words.len() && st.iter().all(|&s| s == RANS_L),
                "bad end state"
            );
            let (done, bits) = finish_u16(
                codes,
                &c.reference[c0..c0 + n],
                &mut out[2 * c0..2 * (c0 + n)],
                tail,
            );
            // The rest element by element.
            let mut bits = bits;
            for j in done..n {
                let code = codes[j];
                let b = code & 127;
                let len = b.saturating_sub(3);
                let mut t = 0u64;
                for i in 0..len as u64 {
                    let bit = (tail[((bits + i) / 8) as usize] >> ((bits + i) % 8)) & 1;
                    t |= (bit as u64) << i;
                }
                bits += len as u64;
                let top = match b {
                    0 => 0u64,
                    1 => 1,
                    2 => 2 | (code >> 7 & 1) as u64,
                    _ => (4 | ((code >> 7) & 1) << 1 | (code >> 8) & 1) as u64,
                };
                let v = if b >= 3 { top << (b - 3) | t } else { top };
                let d = if code >> 9 & 1 == 1 {
                    -(v as i64)
                } else {
                    v as i64
                };
                let rr = c.reference[c0 + j];
                let key = if rr & 0x8000 != 0 {
                    rr ^ 0xFFFF
                } else {
                    rr ^ 0x8000
                };
                let k = (key as i64 + d) as u16;
                let xv = if k & 0x8000 != 0 {
                    k ^ 0x8000
                } else {
                    k ^ 0xFFFF
                };
                out[2 * (c0 + j)..][..2].copy_from_slice(&xv.to_le_bytes());
            }
        }
    }

    /// The shipped AVX-512 tail pass (`cpu::avx512::decode::finish_u16`), Signed layout.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn finish_u16(
        codes: &[u32],
        reference: &[u16],
        out: &mut [u8],
        tail: &[u8],
    ) -> (usize, u64) {
        let n = codes.len().min(reference.len());
        let full = n / 16 * 16;
        let one = _mm512_set1_epi32(1);
        let three = _mm512_set1_epi32(3);
        let zero = _mm512_setzero_si512();
        let mut bits = 0u64;
        for j in (0..full).step_by(16) {
            let c = _mm512_loadu_si512(codes.as_ptr().add(j).cast());
            let b = _mm512_and_si512(c, _mm512_set1_epi32(127));
            let len = _mm512_subs_epu16(b, three);
            let mut p = len;
            p = _mm512_add_epi32(p, _mm512_alignr_epi32::<15>(p, zero));
            p = _mm512_add_epi32(p, _mm512_alignr_epi32::<14>(p, zero));
            p = _mm512_add_epi32(p, _mm512_alignr_epi32::<12>(p, zero));
            p = _mm512_add_epi32(p, _mm512_alignr_epi32::<8>(p, zero));
            let off = _mm512_sub_epi32(p, len);
            let total = _mm_extract_epi32::<3>(_mm512_extracti32x4_epi32::<3>(p)) as u32;
            let base = tail.as_ptr().add((bits / 8) as usize);
            let off = _mm512_add_epi32(off, _mm512_set1_epi32((bits % 8) as i32));
            let raw = _mm512_i32gather_epi32::<1>(_mm512_srli_epi32::<3>(off), base.cast());
            let raw = _mm512_srlv_epi32(raw, _mm512_and_si512(off, _mm512_set1_epi32(7)));
            let t = _mm512_and_si512(raw, _mm512_sub_epi32(_mm512_sllv_epi32(one, len), one));
            bits += total as u64;
            let top = _mm512_or_si512(
                _mm512_set1_epi32(4),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<6>(c), _mm512_set1_epi32(2)),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(c), one),
                ),
            );
            let ge3 = _mm512_cmpge_epu32_mask(b, three);
            let up = _mm512_sllv_epi32(top, _mm512_sub_epi32(b, three));
            let down = _mm512_srlv_epi32(top, _mm512_sub_epi32(three, b));
            let v = _mm512_or_si512(_mm512_mask_blend_epi32(ge3, down, up), t);
            let neg = _mm512_test_epi32_mask(c, _mm512_set1_epi32(1 << 9));
            let delta = _mm512_mask_sub_epi32(v, neg, zero, v);
            let r = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reference.as_ptr().add(j).cast()));
            let h = _mm512_set1_epi32(0x8000);
            let ffff = _mm512_set1_epi32(0xFFFF);
            let r_neg = _mm512_test_epi32_mask(r, h);
            let key = _mm512_xor_si512(r, _mm512_mask_blend_epi32(r_neg, h, ffff));
            let k = _mm512_and_si512(_mm512_add_epi32(key, delta), ffff);
            let k_pos = _mm512_test_epi32_mask(k, h);
            let x = _mm512_xor_si512(k, _mm512_mask_blend_epi32(k_pos, ffff, h));
            _mm256_storeu_si256(out.as_mut_ptr().add(2 * j).cast(), _mm512_cvtepi32_epi16(x));
        }
        (full, bits)
    }

    pub fn main() {
        lockstep::memory::reuse_freed_memory();
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .unwrap();
        let with_sign = std::env::var("CTX").as_deref() == Ok("ers");
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/data/trajectory-gpt2"
        );
        let r = Checkpoint::open(format!("{dir}/gpt2_step000600_bf16.safetensors")).unwrap();
        let t = Checkpoint::open(format!("{dir}/gpt2_step000800_bf16.safetensors")).unwrap();
        let mut proto = Vec::new();
        let mut shipped = Vec::new();
        let mut shipped_bytes = 0usize;
        let mut total = 0usize;
        for e in t.tensors.iter().filter(|e| e.dtype.is_float()) {
            let fl = e.dtype.float_layout().unwrap();
            assert_eq!(fl.width, 16, "bf16 only");
            let rd = r.data(r.get(&e.name).unwrap());
            let td = t.data(e);
            total += td.len();
            proto.push(code_tensor(rd, td, with_sign));
            // The shipped codec's lanes on the same tensor (tables as `delta encode` picks
            // for the Signed layout with neighbors; blob headers left out on both sides).
            let res = CpuBackend
                .residuals(&EncodeJob {
                    fl,
                    reference: rd,
                    target: td,
                    condition: true,
                })
                .unwrap();
            let d = neighbor_distance(&e.shape);
            let hs = res.histograms(Layout::Signed, Some(d)).unwrap();
            let tables = Tables {
                stages: hs.iter().map(|h| StageTable::select(h, true)).collect(),
            };
            let chunks = res.encode(Layout::Signed, &tables, Some(d)).unwrap();
            shipped_bytes += tables
                .stages
                .iter()
                .map(|st| {
                    let mut w = ByteWriter::new();
                    st.write(&mut w);
                    w.len()
                })
                .sum::<usize>();
            shipped_bytes += chunks
                .iter()
                .map(|c| c.words.len() * 2 + c.tail.len() + LANES * 4)
                .sum::<usize>();
            shipped.push((fl, rd, d, tables, chunks, td));
        }
        let proto_bytes: usize = proto.iter().map(|c| c.bytes).sum();
        let reps = 10;
        let mut out = Vec::new();
        let (mut codes, mut padded) = (Vec::new(), Vec::new());
        let mut best_p = f64::MAX;
        let mut best_s = f64::MAX;
        for _ in 0..3 {
            let clock = Instant::now();
            for _ in 0..reps {
                for c in &proto {
                    out.clear();
                    out.resize(c.target.len(), 0);
                    // SAFETY: AVX-512 F, BW checked in main (VL comes with them on every CPU
                    // that has both).
                    unsafe { decode(c, &mut out, &mut codes, &mut padded) };
                    assert!(out == c.target, "prototype decode differs");
                }
            }
            best_p = best_p.min(clock.elapsed().as_secs_f64());
            let clock = Instant::now();
            for _ in 0..reps {
                for (fl, rd, d, tables, chunks, want) in &shipped {
                    let job = DecodeJob {
                        fl: *fl,
                        layout: Layout::Signed,
                        condition: true,
                        distance: Some(*d),
                        tables,
                        chunks: &lockstep::delta::chunk::views(chunks),
                        reference: rd,
                    };
                    let got = CpuBackend.decode(&job).unwrap();
                    assert!(got == *want);
                }
            }
            best_s = best_s.min(clock.elapsed().as_secs_f64());
        }
        let mb = reps as f64 * total as f64 / 1e6;
        println!(
            "bf16 600 -> 800, {} weights, one thread, best of 3 × {reps} decodes, every one checked",
            total / 2
        );
        println!(
            "shipped (B, Q1, Q2, S chain) : payload ratio (tables included) {:.4}, decode {:>7.1} MB/s",
            shipped_bytes as f64 / total as f64,
            mb / best_s
        );
        println!(
            "prototype joint | {:<12}: payload ratio {:.4} (tables included), decode {:>7.1} MB/s",
            if with_sign { "er, rs" } else { "er" },
            proto_bytes as f64 / total as f64,
            mb / best_p
        );
    }
}
