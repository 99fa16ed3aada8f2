//! Text codec round trips and bad input, on small fixtures in the repo: a small random integer
//! model (context 16, so the sliding window is exercised) and the shipped tinygpt2 model.
//! `lm_parity!` runs the device checks once per device (`tests/devices`).

use std::sync::OnceLock;

use lockstep::format::lm::model_file::Model;
mod devices;
#[path = "lm_common/models.rs"]
mod models;
#[path = "lm_common/random_model.rs"]
mod random_model;
use models::{shipped, small};

use lockstep::backend::lm::{Find, Item, Query, Trace};
use lockstep::backend::Device;
use lockstep::lm::text_codec::{compress, compress_unverified, decompress, read_header, Options};
use lockstep::Error;
use random_model::random_model;

const TEXT: &[u8] = b"The integer model gives every machine the same table, so the range coder \
decodes the same tokens. Decoding on a laptop reads what a server wrote.\n\tdef f(x): return x + 1\n";

fn roundtrip(m: &Model, data: &[u8], seg: Option<u32>) -> Vec<u8> {
    let opts = Options {
        segment_tokens: seg,
        ..Default::default()
    };
    let c = compress(m, data, &opts, &lockstep::backend::Device::cpu()).unwrap();
    assert_eq!(
        decompress(m, &c, &lockstep::backend::Device::cpu()).unwrap(),
        data
    );
    c
}

#[test]
fn roundtrips_of_odd_inputs() {
    let m = small();
    let binary: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let invalid_utf8 = [b'a', 0xff, 0xc3, b'b', 0xe2, 0x82, 0x00, 0x80];
    for data in [
        &b""[..],
        b"x",
        b"\xff",
        &binary,
        &invalid_utf8,
        "na\u{ef}ve \u{2713} <|endoftext|>".as_bytes(),
        TEXT,
    ] {
        for seg in [None, Some(1), Some(5), Some(40)] {
            roundtrip(m, data, seg);
        }
    }
}

#[test]
fn sliding_window_segments_longer_than_the_context() {
    // Context 16: a 100-token segment slides its window several times, and the lockstep
    // decoder (one token per step, cache resets) must reproduce the batched encoder exactly.
    let m = small();
    let data = TEXT.repeat(3);
    roundtrip(m, &data, Some(100));
}

#[test]
fn output_is_independent_of_thread_count() {
    let m = small();
    let opts = Options {
        segment_tokens: Some(20),
        ..Default::default()
    };
    let a = compress_unverified(m, TEXT, &opts, &lockstep::backend::Device::cpu()).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let b = pool.install(|| {
        compress_unverified(m, TEXT, &opts, &lockstep::backend::Device::cpu()).unwrap()
    });
    assert_eq!(a, b);
}

#[test]
fn a_different_model_is_refused_by_hash() {
    let a = small();
    let b = random_model(2, 16, 2, 16, 50257, 2);
    let c = roundtrip(a, TEXT, None);
    match decompress(&b, &c, &lockstep::backend::Device::cpu()) {
        Err(Error::Mismatch(msg)) => assert!(msg.contains(&a.hash_hex()), "{msg}"),
        other => panic!("expected a model mismatch, got {other:?}"),
    }
}

#[test]
fn truncated_or_corrupt_streams_give_errors_not_panics() {
    let m = small();
    let c = roundtrip(m, TEXT, Some(12));
    for len in [0, 1, 7, 8, 20, 100, c.len() / 2, c.len() - 1] {
        assert!(
            decompress(m, &c[..len], &lockstep::backend::Device::cpu()).is_err(),
            "truncated to {len}"
        );
    }
    let mut padded = c.clone();
    padded.push(0);
    assert!(decompress(m, &padded, &lockstep::backend::Device::cpu()).is_err());
    // Flip bits everywhere: an error or (if the flip hit nothing that matters) the same bytes.
    for i in (0..c.len()).step_by(3) {
        let mut bad = c.clone();
        bad[i] ^= 0x41;
        if let Ok(out) = decompress(m, &bad, &lockstep::backend::Device::cpu()) {
            assert_eq!(out, TEXT);
        }
    }
}

#[test]
fn corrupt_model_files_are_refused() {
    let mut m = small().clone();
    let bytes = m.to_bytes();
    assert!(Model::from_bytes(&bytes).is_ok());
    assert!(Model::from_bytes(&[]).is_err());
    assert!(Model::from_bytes(b"LSTPGPT2").is_err());
    assert!(Model::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    for i in [0, 9, 20, bytes.len() / 2, bytes.len() - 40, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[i] ^= 1;
        assert!(Model::from_bytes(&bad).is_err(), "flip at {i}");
    }
    assert!(Model::from_bytes(&vec![0x5a; 4096]).is_err());
}

#[test]
fn shipped_model_compresses_english() {
    let m = shipped();
    let c = roundtrip(m, TEXT, None);
    let (_, start) = read_header(&c).unwrap();
    let payload = c.len() - start;
    let bpb = payload as f64 * 8.0 / TEXT.len() as f64;
    eprintln!(
        "shipped tinygpt2: {} bytes -> {payload} payload + {start} header ({bpb:.3} bits/byte)",
        TEXT.len()
    );
    assert!(payload * 2 < TEXT.len());
}

#[test]
fn match_model_helps_on_repetitive_text_and_can_be_off() {
    let m = small();
    let log: Vec<u8> = (0..30)
        .flat_map(|i| {
            format!("2026-11-30 12:00:{i:02} INFO request served path=/api/v1/items status=200\n")
                .into_bytes()
        })
        .collect();
    let size = |match_model: bool| {
        let opts = Options {
            segment_tokens: Some(200),
            match_model,
        };
        let c = compress(m, &log, &opts, &lockstep::backend::Device::cpu()).unwrap();
        assert_eq!(
            decompress(m, &c, &lockstep::backend::Device::cpu()).unwrap(),
            log
        );
        c.len()
    };
    let (on, off) = (size(true), size(false));
    eprintln!("repetitive log, random model: {off} bytes without the match model, {on} with");
    assert!(on * 2 < off);
}

#[test]
fn huge_header_counts_are_refused_or_bounded() {
    // A valid header (crc recomputed) that claims a gigantic original length must fail cleanly,
    // not allocate by the claim.
    let m = small();
    let c = roundtrip(m, TEXT, None);
    let (mut h, start) = read_header(&c).unwrap();
    h.original_len = u64::MAX / 2;
    let mut forged = write_header_for_test(&h);
    forged.extend_from_slice(&c[start..]);
    assert!(decompress(m, &forged, &lockstep::backend::Device::cpu()).is_err());
}

/// Re-serialize a header the way the codec does (layout in docs/INTEGER_GPT2.md §9).
fn write_header_for_test(h: &lockstep::lm::text_codec::Header) -> Vec<u8> {
    let mut o = Vec::new();
    o.extend_from_slice(b"LSTPTXT1");
    o.extend_from_slice(&1u32.to_le_bytes());
    o.extend_from_slice(&h.model_hash);
    o.extend_from_slice(&h.original_len.to_le_bytes());
    o.extend_from_slice(&h.original_hash);
    o.extend_from_slice(&h.segment_tokens.to_le_bytes());
    o.extend_from_slice(&h.flags.to_le_bytes());
    o.extend_from_slice(&h.n_tokens.to_le_bytes());
    o.extend_from_slice(&(h.segments.len() as u32).to_le_bytes());
    for &(t, b) in &h.segments {
        o.extend_from_slice(&t.to_le_bytes());
        o.extend_from_slice(&b.to_le_bytes());
    }
    let crc = crc32fast::hash(&o);
    o.extend_from_slice(&crc.to_le_bytes());
    o
}

/// A model whose rows reach every kernel's vector loops (n_embd 64: rows of 64 and 256
/// bytes), not only their tails.
fn wide() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| random_model(1, 64, 2, 16, 50257, 3))
}

/// Streams on `device` equal the reference device's, byte for byte, and decode across.
fn same_streams(device: &Device) {
    let reference = Device::reference();
    for (m, seg) in [(wide(), Some(30)), (small(), Some(12)), (shipped(), None)] {
        let opts = Options {
            segment_tokens: seg,
            ..Default::default()
        };
        let want = compress_unverified(m, TEXT, &opts, &reference).unwrap();
        let got = compress_unverified(m, TEXT, &opts, device).unwrap();
        assert_eq!(got, want, "{}", device.name());
        assert_eq!(decompress(m, &want, device).unwrap(), TEXT);
        assert_eq!(decompress(m, &got, &reference).unwrap(), TEXT);
    }
}

/// Every stage's integers on `device` equal the reference's: per-layer LayerNorm maxima and
/// residual streams, logits, frequency tables and the coder's answers, over two sequences
/// stepped together (batch order must not matter).
fn same_trace(device: &Device) {
    let m = wide();
    let tokens = lockstep::lm::tokenizer::encode(TEXT).unwrap();
    let run = |d: &Device| {
        let mut lm = d.lm().unwrap().load(m, 2, m.config.n_ctx as usize).unwrap();
        let mut trace = Trace::default();
        let mut answers = Vec::new();
        // Sequence 1 runs the text backwards, interleaved with sequence 0's items.
        for (i, pair) in tokens.windows(2).take(15).enumerate() {
            let items: Vec<Item> = [(0, pair[0], pair[1]), (1, pair[1], pair[0])]
                .iter()
                .map(|&(seq, token, next)| Item {
                    seq,
                    token,
                    query: Some(Query {
                        find: if i % 2 == 0 {
                            Find::Symbol(next)
                        } else {
                            Find::Target((next as u64) << 16)
                        },
                        mix: (i % 3 == 0).then_some((next, 40_000)),
                    }),
                })
                .collect();
            answers.extend(lm.step_traced(&items, &mut trace).unwrap());
        }
        (trace, answers)
    };
    let (want, want_answers) = run(&Device::reference());
    let (got, got_answers) = run(device);
    assert_eq!(got.ln1, want.ln1, "{}: LayerNorm 1 maxima", device.name());
    assert_eq!(got.ln2, want.ln2, "{}: LayerNorm 2 maxima", device.name());
    assert_eq!(got.resid, want.resid, "{}: residual streams", device.name());
    assert_eq!(got.logits, want.logits, "{}: logits", device.name());
    assert_eq!(got.freqs, want.freqs, "{}: frequency tables", device.name());
    assert_eq!(
        got_answers,
        want_answers,
        "{}: coded intervals",
        device.name()
    );
    // The answers are the tables' own intervals (the trace keeps the last call's tables).
    let last = &got_answers[got_answers.len() - got.freqs.len()..];
    assert_eq!(last.len(), 2);
    for (a, f) in last.iter().zip(&got.freqs) {
        let s = a.symbol as usize;
        assert_eq!((a.cum, a.freq), (f[..s].iter().sum(), f[s]));
    }
}

/// GPT-2-small's widths (n_embd 768, 12 heads of 64, 3072-wide MLP, the 50,257-token head)
/// with random weights, cut to two layers and a 64-position context so that lavapipe runs it
/// in seconds: every matmul, the LayerNorm and the head at their real sizes.
fn gpt2_small_shape() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| random_model(2, 768, 12, 64, 50257, 5))
}

/// Per-layer integers, logits and tables on the GPT-2-small shape equal the reference's
/// (two sequences, a batch of several positions then single steps), and `step_table` gives
/// the reference's whole table.
fn same_trace_gpt2_small_shape(device: &Device) {
    let m = gpt2_small_shape();
    let tokens = lockstep::lm::tokenizer::encode(TEXT).unwrap();
    let run = |d: &Device| {
        let mut lm = d.lm().unwrap().load(m, 2, m.config.n_ctx as usize).unwrap();
        let mut traces = Vec::new();
        let q = |next: u32| {
            Some(Query {
                find: Find::Symbol(next),
                mix: Some((next, 30_000)),
            })
        };
        // A batch: six positions of sequence 0 (two queried) and three of sequence 1.
        let mut items: Vec<Item> = (0..6)
            .map(|i| Item {
                seq: 0,
                token: tokens[i],
                query: (i >= 4).then(|| q(tokens[i + 1])).flatten(),
            })
            .collect();
        items.extend((0..3).map(|i| Item {
            seq: 1,
            token: tokens[20 + i],
            query: (i == 2).then(|| q(tokens[23])).flatten(),
        }));
        let mut trace = Trace::default();
        let a = lm.step_traced(&items, &mut trace).unwrap();
        traces.push((trace.clone(), a));
        for i in 0..2 {
            let item = Item {
                seq: i,
                token: tokens[30 + i],
                query: Some(Query {
                    find: Find::Target(3 << 30),
                    mix: None,
                }),
            };
            let a = lm.step_traced(&[item], &mut trace).unwrap();
            traces.push((trace.clone(), a));
        }
        let table = lm
            .step_table(&[Item {
                seq: 0,
                token: tokens[40],
                query: None,
            }])
            .unwrap();
        (traces, table)
    };
    let (want, want_table) = run(&Device::reference());
    let (got, got_table) = run(device);
    for (step, ((g, ga), (w, wa))) in got.iter().zip(&want).enumerate() {
        let name = device.name();
        assert_eq!(g.ln1, w.ln1, "{name} step {step}: LayerNorm 1 maxima");
        assert_eq!(g.ln2, w.ln2, "{name} step {step}: LayerNorm 2 maxima");
        assert_eq!(g.resid, w.resid, "{name} step {step}: residual streams");
        assert_eq!(g.logits, w.logits, "{name} step {step}: logits");
        assert_eq!(g.freqs, w.freqs, "{name} step {step}: frequency tables");
        assert_eq!(ga, wa, "{name} step {step}: coded intervals");
    }
    assert_eq!(want_table.len(), 50257);
    assert_eq!(want_table.iter().sum::<u64>(), 1 << 32);
    assert_eq!(got_table, want_table, "{}: step_table", device.name());
}

/// `step_tables` (the mixing coder's batched call) gives the reference's tables: two
/// sequences interleaved, items with and without queries, queries with a match mix (which
/// the tables ignore), then a second call that continues the sequences.
fn same_tables(device: &Device) {
    let m = wide();
    let tokens = lockstep::lm::tokenizer::encode(TEXT).unwrap();
    let run = |d: &Device| {
        let mut lm = d.lm().unwrap().load(m, 2, m.config.n_ctx as usize).unwrap();
        let mut out = Vec::new();
        for round in 0..2 {
            let items: Vec<Item> = tokens[round * 9..round * 9 + 9]
                .iter()
                .enumerate()
                .map(|(i, &token)| Item {
                    seq: i % 2,
                    token,
                    query: (i % 3 != 1).then_some(Query {
                        find: Find::Symbol(token),
                        mix: (i % 2 == 0).then_some((token, 30_000)),
                    }),
                })
                .collect();
            out.push(lm.step_tables(&items).unwrap());
        }
        out
    };
    let want = run(&Device::reference());
    assert_eq!(want[0].len(), 6);
    assert_eq!(run(device), want, "{}: step_tables", device.name());
}

/// `step_prefix_sums_at` (the mixing encoder's call) gives the reference's prefix sums at
/// the indices asked: in the coder's byte order, two sequences interleaved, lists empty, of
/// every end and random ones, a second call continuing the sequences; and bad lists refused.
fn same_sums_at(device: &Device) {
    let m = wide();
    let tokens = lockstep::lm::tokenizer::encode(TEXT).unwrap();
    let order = lockstep::lm::cm::lm_bits::Lm::order();
    let len = order.len() as u32;
    let mut state = 0x0123_4567_89AB_CDEFu64;
    let mut lists = Vec::new();
    for q in 0..12 {
        let mut at: Vec<u32> = (0..300)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((state >> 33) % (len as u64 + 1)) as u32
            })
            .collect();
        match q % 4 {
            0 => at.clear(),
            1 => at.extend([0, 1, len - 1, len]),
            _ => {}
        }
        at.sort_unstable();
        at.dedup();
        lists.push(at);
    }
    let items = |round: usize| -> Vec<Item> {
        tokens[round * 9..round * 9 + 9]
            .iter()
            .enumerate()
            .map(|(i, &token)| Item {
                seq: i % 2,
                token,
                query: (i % 3 != 1).then_some(Query {
                    find: Find::Symbol(token),
                    mix: (i % 2 == 0).then_some((token, 30_000)),
                }),
            })
            .collect()
    };
    let reference = Device::reference();
    let mut want = reference
        .lm()
        .unwrap()
        .load(m, 2, m.config.n_ctx as usize)
        .unwrap();
    let mut got = device
        .lm()
        .unwrap()
        .load(m, 2, m.config.n_ctx as usize)
        .unwrap();
    for round in 0..2 {
        let its = items(round);
        let wanted = &lists[round * 6..round * 6 + 6];
        let whole = want.step_prefix_sums(&its, order).unwrap();
        let sums = got.step_prefix_sums_at(&its, order, wanted).unwrap();
        assert_eq!(sums.len(), 6);
        for ((cum, at), s) in whole.iter().zip(wanted).zip(&sums) {
            let w: Vec<u32> = at.iter().map(|&i| cum[i as usize]).collect();
            assert_eq!(
                *s,
                w,
                "{}: step_prefix_sums_at, round {round}",
                device.name()
            );
        }
    }
    // Not ascending, beyond the sums, or one list short: refused before anything runs.
    let its = items(2);
    for bad in [vec![vec![3, 2]], vec![vec![len + 1]], vec![]] {
        let mut wanted = vec![vec![]; 5];
        wanted.extend(bad);
        assert!(got.step_prefix_sums_at(&its, order, &wanted).is_err());
    }
}

macro_rules! lm_parity {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn step_prefix_sums_at_equal_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_sums_at(&d);
                }
            }

            #[test]
            fn step_tables_equal_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_tables(&d);
                }
            }

            #[test]
            fn streams_equal_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_streams(&d);
                }
            }

            #[test]
            fn stage_trace_equals_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_trace(&d);
                }
            }

            #[test]
            fn gpt2_small_shape_trace_equals_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_trace_gpt2_small_shape(&d);
                }
            }
        }
    };
}

// Each CPU level runs its own matmul, rescale and attention kernels (no silent fallback: a
// level this CPU lacks is absent, and fails where LOCKSTEP_REQUIRE names it).
lm_parity!(portable);
lm_parity!(avx2);
lm_parity!(avx512);
// The WGSL kernels (lavapipe here and in CI).
lm_parity!(wgpu);
// The CUDA kernels: on a GPU where there is one, and through their host emulation everywhere
// (the same kernels/lm/*.cu compiled as C: their integer logic, not the GPU).
lm_parity!(cuda);
lm_parity!(cuda_emulated);

#[test]
fn rehashed_but_inconsistent_model_files_are_refused() {
    let mut m = small().clone();
    let bytes = m.to_bytes();
    let rehash = |mut b: Vec<u8>| {
        let n = b.len() - 32;
        let h = blake3::hash(&b[..n]);
        b[n..].copy_from_slice(h.as_bytes());
        b
    };
    // n_layer (offset 12) claims more blocks than the file holds.
    let mut b = bytes.clone();
    b[12..16].copy_from_slice(&200u32.to_le_bytes());
    assert!(Model::from_bytes(&rehash(b)).is_err());
    // A table entry changed: the GELU/exp tables must equal the specification's.
    let mut b = bytes.clone();
    let n = b.len();
    b[n - 32 - 8 - 3] ^= 1;
    assert!(Model::from_bytes(&rehash(b)).is_err());
    // n_head that does not divide n_embd.
    let mut b = bytes.clone();
    b[20..24].copy_from_slice(&3u32.to_le_bytes());
    assert!(Model::from_bytes(&rehash(b)).is_err());
    // A model without GPT-2's vocabulary cannot drive the text codec.
    let tiny_vocab = random_model(1, 8, 1, 8, 1000, 4);
    assert!(matches!(
        compress(
            &tiny_vocab,
            TEXT,
            &Options::default(),
            &lockstep::backend::Device::cpu()
        ),
        Err(Error::Unsupported(_))
    ));
}

/// The CUDA frequency kernel alone, on a row chosen so that its shortcut matters: it takes
/// `floor(w r / W)` for every gap from one reciprocal of `W` and corrects the estimate where
/// it is one short, which for a given gap happens about once in `2^65 / w` tables (the
/// parity tests above would pass without the correction). So the row is searched for: four
/// logits `0, -a, -b, -c` whose table needs it at one of their gaps, then the kernel's table
/// must equal the CPU's.
fn frequency_kernel_corrects_its_reciprocal<L: lockstep::backend::cuda::launch::Launcher>(dev: &L) {
    use lockstep::backend::cpu::lm::freq::frequencies;
    use lockstep::backend::cuda::lm::kernels::{LmKernel, LmParams};
    use lockstep::backend::Isa;
    let exp40 = lockstep::format::lm::fixed::exp_table(40);
    let v = 4u64;
    let r = (1u64 << 32) - v;
    let short = |gaps: [usize; 4]| {
        let total: u64 = gaps.iter().map(|&g| exp40[g]).sum();
        let inv = (((r as u128) << 64) / total as u128) as u64;
        gaps.iter().any(|&g| {
            let w = exp40[g];
            let q = ((w as u128 * inv as u128) >> 64) as u64;
            w.wrapping_mul(r).wrapping_sub(q.wrapping_mul(total)) >= total
        })
    };
    // Small gaps first: their weights are the largest, so the likeliest to need it.
    let len = exp40.len();
    let gaps = (1..len)
        .flat_map(|b| (1..=b).flat_map(move |a| (b..len).map(move |c| [0, a, b, c])))
        .find(|&g| short(g))
        .expect("some table needs the correction");
    let logits = gaps.map(|g| -(g as i32));
    let want: Vec<u32> = frequencies(Isa::Portable, &logits, &exp40)
        .unwrap()
        .iter()
        .map(|&f| f as u32)
        .collect();
    let words: Vec<u32> = exp40
        .iter()
        .flat_map(|&w| [w as u32, (w >> 32) as u32])
        .collect();
    let bufs = [
        dev.upload(&logits.map(|l| l as u32)).unwrap(),
        dev.upload(&words).unwrap(),
        // one query: symbol 0, nothing mixed in
        dev.upload(&[0, 0, u32::MAX, 0]).unwrap(),
        dev.zeroed(exp40.len()).unwrap(),
        dev.zeroed(v as usize).unwrap(),
        dev.zeroed(4).unwrap(),
        dev.zeroed(4).unwrap(),
        dev.zeroed(4).unwrap(),
    ];
    let p = LmParams {
        n: 1,
        rows: v as u32,
        exp_len: exp40.len() as u32,
        ..Default::default()
    };
    dev.launch_lm(LmKernel::Frequencies, 1, &p, bufs.each_ref())
        .unwrap();
    let got = dev.read(&bufs[4], v as usize).unwrap();
    assert_eq!(got, want, "frequencies of logits {logits:?}");
}

/// A CPU or CUDA session sizes its KV caches by the positions it was loaded for: a step past
/// them is an error (never a write past a cache), and the steps up to them run. (wgpu keeps
/// caches for the whole context.)
fn a_step_past_the_sessions_positions_is_an_error(device: &Device) {
    let m = small();
    let mut lm = device.lm().unwrap().load(m, 2, 4).unwrap();
    let item = |seq, token| Item {
        seq,
        token,
        query: None,
    };
    lm.step(&[item(0, 1), item(0, 2), item(1, 3)]).unwrap();
    lm.step(&[item(0, 4), item(1, 5)]).unwrap();
    // sequence 0 reaches its 4th position, then would take a 5th
    lm.step(&[item(1, 6), item(0, 7)]).unwrap();
    let err = lm.step(&[item(1, 8), item(0, 9)]).unwrap_err();
    assert!(err.to_string().contains("4 positions"), "{err}");
}

/// At every CPU level.
mod cpu_positions {
    macro_rules! at_levels {
        ($($level:ident),*) => {$(
            #[test]
            fn $level() {
                if let Some(d) = super::devices::device(stringify!($level)) {
                    super::a_step_past_the_sessions_positions_is_an_error(&d);
                }
            }
        )*};
    }
    at_levels!(portable, avx2, avx512);
}

mod kernels {
    mod cuda {
        #[test]
        fn frequency_kernel_corrects_its_reciprocal() {
            if super::super::devices::device("cuda").is_some() {
                let dev = lockstep::backend::cuda::driver::CudaDriver::open().unwrap();
                super::super::frequency_kernel_corrects_its_reciprocal(&dev);
            }
        }

        #[test]
        fn a_step_past_the_sessions_positions_is_an_error() {
            if let Some(d) = super::super::devices::device("cuda") {
                super::super::a_step_past_the_sessions_positions_is_an_error(&d);
            }
        }
    }

    mod cuda_emulated {
        #[test]
        fn frequency_kernel_corrects_its_reciprocal() {
            if super::super::devices::device("cuda_emulated").is_some() {
                let dev = lockstep::backend::cuda::emulated::HostEmulation::new();
                super::super::frequency_kernel_corrects_its_reciprocal(&dev);
            }
        }

        #[test]
        fn a_step_past_the_sessions_positions_is_an_error() {
            if let Some(d) = super::super::devices::device("cuda_emulated") {
                super::super::a_step_past_the_sessions_positions_is_an_error(&d);
            }
        }
    }
}
