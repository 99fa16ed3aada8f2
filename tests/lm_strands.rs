//! Strands of the context-mixing stream (docs/INTEGER_GPT2.md §13.5): round trips for any
//! strand count (one-byte and empty strands included), the schedule, hostile strand headers,
//! a golden stream, and the same bytes on every LM device (`strands_parity!`).

mod devices;

use lockstep::backend::Device;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::coder::Setup;
use lockstep::lm::cm::strands::{
    decode_strands, encode_strands, encode_strands_in_order, encode_strands_verified, max_strands,
    MAX_STRANDS,
};
use lockstep::lm::cm::stream::{
    compress, compress_unverified, read_header, strand_count, write_header, Header, Options,
    FLAG_BLOCKS, FLAG_LM, FLAG_MATCH, FLAG_STRANDS, MODE_MIXED,
};
use lockstep::lm::text_codec::{self, Pass};

#[path = "lm_common/models.rs"]
mod models;
#[path = "lm_common/random_model.rs"]
mod random_model;
use models::{shipped, small};
use random_model::random_model;

fn genesis() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/text/prose-genesis.txt"
    ))
    .unwrap()
}

fn log(lines: usize) -> Vec<u8> {
    (0..lines)
        .map(|i| {
            format!(
                "2026-05-09 07:29:{:02} status installed libfoo{}:amd64 1.{}.{}-1\n",
                i % 60,
                i % 7,
                i % 3,
                i
            )
        })
        .collect::<String>()
        .into_bytes()
}

fn quiet(_: Pass, _: u64, _: u64) {}

fn setup<'a>(m: &'a Model, device: &'a Device) -> Setup<'a> {
    Setup {
        lm: Some((m, device.lm().unwrap())),
        match_model: true,
    }
}

/// A mixed stream with strands, written by hand around a payload.
fn strand_stream(m: &Model, data: &[u8], count: u32, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        mode: MODE_MIXED,
        flags: FLAG_LM | FLAG_MATCH | FLAG_STRANDS,
        original_len: data.len() as u64,
        original_hash: *blake3::hash(data).as_bytes(),
        model_hash: Some(m.hash),
        blocks: None,
        strands: Some(count),
    };
    [write_header(&h), payload.to_vec()].concat()
}

fn decompress(m: &Model, d: &[u8]) -> lockstep::Result<Vec<u8>> {
    text_codec::decompress(m, d, &Device::cpu())
}

#[test]
fn any_strand_count_roundtrips() {
    // Prose, a log and odd bytes; 64 strands over 3 bytes leave 61 empty, over 100 bytes
    // most strands are one or two bytes.
    let m = small();
    let cpu = Device::cpu();
    let s = setup(m, &cpu);
    let mixed = [&genesis()[..1500], &log(12), b"\xff\x00 x\r\n".as_slice()].concat();
    let inputs: [&[u8]; 5] = [b"", b"x", b"abc", &mixed[..100], &mixed];
    for data in inputs {
        for count in [1, 2, 3, 7, MAX_STRANDS] {
            let (c, _) = encode_strands(data, count, s, &|_, _| {}).unwrap();
            let back = decode_strands(&c, data.len() as u64, count, s, &|_, _| {}).unwrap();
            assert_eq!(back, data, "{count} strands over {} bytes", data.len());
            if count > 1 && !data.is_empty() {
                let stream = strand_stream(m, data, count as u32, &c);
                assert_eq!(decompress(m, &stream).unwrap(), data);
            }
        }
    }
}

#[test]
fn the_verified_encoder_writes_the_plain_encoders_bytes() {
    // The verify runs beside the encoder on the bytes it has settled (two threads or more;
    // after it on one): it must neither change them nor refuse them, for any strand count
    // (one-byte and empty strands included).
    let m = small();
    let cpu = Device::cpu();
    let s = setup(m, &cpu);
    let mixed = [&genesis()[..3000], &log(20)].concat();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for data in [&b"xy"[..], &mixed[..100], &mixed] {
            for count in [1, 2, 7, MAX_STRANDS] {
                let (want, _) = encode_strands(data, count, s, &|_, _| {}).unwrap();
                let (got, _) = pool
                    .install(|| encode_strands_verified(data, count, s, &|_, _| {}))
                    .unwrap();
                assert_eq!(
                    got,
                    want,
                    "{threads} threads, {count} strands, {} B",
                    data.len()
                );
            }
        }
    }
}

#[test]
fn the_compressor_writes_strands_and_one_thread_decodes_them_alike() {
    // The shipped model pays on prose, so the compressor keeps the LM (and the strands).
    let m = shipped();
    let data = genesis()[..3000].to_vec();
    let opts = Options {
        strands: Some(5),
        ..Options::default()
    };
    let c = compress(m, &data, &opts, &Device::cpu(), &quiet).unwrap();
    let (h, _) = read_header(&c).unwrap();
    assert_eq!(h.flags, FLAG_LM | FLAG_MATCH | FLAG_STRANDS);
    assert_eq!(h.strands, Some(5));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let c1 = one
        .install(|| compress_unverified(m, &data, &opts, &Device::cpu(), &quiet))
        .unwrap();
    assert_eq!(c, c1);
    assert_eq!(one.install(|| decompress(m, &c)).unwrap(), data);
    // Without the match model too.
    let no_match = Options {
        match_model: false,
        ..opts
    };
    let c = compress(m, &data, &no_match, &Device::cpu(), &quiet).unwrap();
    assert_eq!(read_header(&c).unwrap().0.flags, FLAG_LM | FLAG_STRANDS);
}

#[test]
fn the_default_strand_count_follows_the_length() {
    let tiny = shipped();
    assert_eq!(strand_count(0, None, tiny), 1);
    assert_eq!(strand_count(2047, None, tiny), 1);
    assert_eq!(strand_count(2048, None, tiny), 2);
    assert_eq!(strand_count(21872, None, tiny), 21);
    assert_eq!(strand_count(1 << 30, None, tiny), 32);
    assert_eq!(strand_count(100, Some(9), tiny), 9);
    // A GPT-2-small shape: its KV caches allow 7 strands within 512 MiB.
    let big = random_model(12, 768, 12, 1024, 50257, 1);
    assert_eq!(max_strands(&big), 7);
    assert_eq!(strand_count(1 << 30, None, &big), 7);
    assert_eq!(strand_count(1 << 30, Some(64), &big), 7);
}

#[test]
fn strands_share_what_they_learn() {
    // The same log twice, one copy per strand: the second strand codes what the first has
    // just taught the shared tables (and its match may follow the first strand's text), so
    // the pair costs far less than twice one copy coded alone.
    let m = small();
    let cpu = Device::cpu();
    let s = setup(m, &cpu);
    let one = log(60);
    let two = [one.clone(), one.clone()].concat();
    let (alone, _) = encode_strands(&one, 1, s, &|_, _| {}).unwrap();
    let (pair, _) = encode_strands(&two, 2, s, &|_, _| {}).unwrap();
    assert!(
        pair.len() * 10 < alone.len() * 16,
        "two strands {} B, one copy alone {} B",
        pair.len(),
        alone.len()
    );
}

#[test]
fn another_schedule_does_not_decode() {
    // Strands taking their turns in another order code the same bits with other
    // probabilities: the decoder (which follows 0, 1, 2) must fail or be caught by the hash.
    let m = small();
    let cpu = Device::cpu();
    let s = setup(m, &cpu);
    let data = [&genesis()[..1200], &log(10)].concat();
    let (good, _) = encode_strands(&data, 3, s, &|_, _| {}).unwrap();
    let (bad, _) = encode_strands_in_order(&data, 3, &[2, 1, 0], s, &|_, _| {}).unwrap();
    assert_ne!(good, bad);
    assert_eq!(
        decompress(m, &strand_stream(m, &data, 3, &good)).unwrap(),
        data
    );
    assert!(decompress(m, &strand_stream(m, &data, 3, &bad)).is_err());
    // Nor does the stream decode as another count of strands.
    for count in [2, 4] {
        assert!(decompress(m, &strand_stream(m, &data, count, &good)).is_err());
    }
}

#[test]
fn hostile_strand_headers_are_refused() {
    let m = small();
    let cpu = Device::cpu();
    let data = [&genesis()[..800], &log(8)].concat();
    let (payload, _) = encode_strands(&data, 3, setup(m, &cpu), &|_, _| {}).unwrap();
    let good = strand_stream(m, &data, 3, &payload);
    let (h, start) = read_header(&good).unwrap();
    assert_eq!(h.strands, Some(3));
    let payload = &good[start..];
    let with = |h: &Header| [write_header(h), payload.to_vec()].concat();
    for (what, bad) in [
        (
            "0 strands",
            Header {
                strands: Some(0),
                ..h.clone()
            },
        ),
        (
            "1 strand",
            Header {
                strands: Some(1),
                ..h.clone()
            },
        ),
        (
            "65 strands",
            Header {
                strands: Some(65),
                ..h.clone()
            },
        ),
        (
            "4 billion strands",
            Header {
                strands: Some(u32::MAX),
                ..h.clone()
            },
        ),
        (
            "strands without the LM",
            Header {
                flags: FLAG_MATCH | FLAG_STRANDS,
                model_hash: None,
                ..h.clone()
            },
        ),
    ] {
        let e = decompress(m, &with(&bad)).unwrap_err();
        assert_eq!(e.exit_code(), 3, "{what}: {e}");
        assert!(e.to_string().contains("text stream"), "{what}: {e}");
    }
    // Strands and blocks together: the block table is read, then refused.
    let both = Header {
        flags: h.flags | FLAG_BLOCKS,
        blocks: Some(lockstep::lm::cm::stream::Blocks {
            len: 1 << 20,
            coded: vec![payload.len() as u32],
        }),
        ..h.clone()
    };
    assert!(decompress(m, &with(&both)).is_err());
    // A count the model does not allow (the GPT-2-small shape allows 7) is refused before
    // any model work.
    let big = random_model(12, 768, 12, 1024, 50257, 1);
    let over = Header {
        strands: Some(8),
        model_hash: Some(big.hash),
        ..h.clone()
    };
    let e = text_codec::decompress(&big, &with(&over), &Device::cpu()).unwrap_err();
    assert!(e.to_string().contains("8 strands"), "{e}");
    // The flag without its count: a truncated header or a bad CRC.
    let mut lied = good[..start - 4].to_vec();
    lied[13] &= !FLAG_STRANDS;
    assert!(decompress(m, &[lied, payload.to_vec()].concat()).is_err());
    // A huge declared length, allowed to try: stops when the coded bytes run out.
    let huge = Header {
        original_len: 1 << 40,
        ..h.clone()
    };
    let e = text_codec::decompress_limited(m, &with(&huge), u64::MAX, &Device::cpu()).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    // Truncated anywhere, padded, or a payload byte changed: an error, never a panic.
    for len in [start - 1, start, good.len() - 1] {
        assert!(decompress(m, &good[..len]).is_err(), "truncated to {len}");
    }
    let mut padded = good.clone();
    padded.push(0);
    assert!(decompress(m, &padded).is_err());
    for i in (start..good.len()).step_by(7) {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        if let Ok(out) = decompress(m, &bad) {
            assert_eq!(out, data, "byte {i} changed, wrong text accepted");
        }
    }
}

#[test]
fn a_cut_damaged_or_padded_payload_is_an_error() {
    // A payload cut anywhere, one flipped bit, or a byte of padding: the strand loop must end
    // with a clear error (or, for the flipped bit, at least not the input), with one strand,
    // a few and the most.
    let m = small();
    let cpu = Device::cpu();
    let s = setup(m, &cpu);
    let data = [&genesis()[..2500], &log(20)].concat();
    let n = data.len() as u64;
    for count in [1, 3, MAX_STRANDS] {
        let (c, _) = encode_strands(&data, count, s, &|_, _| {}).unwrap();
        for cut in [0, 1, c.len() / 2, c.len() - 1] {
            let e = decode_strands(&c[..cut], n, count, s, &|_, _| {}).unwrap_err();
            assert!(
                e.to_string().contains("text stream"),
                "{count} strands, cut to {cut}: {e}"
            );
        }
        let mut bad = c.clone();
        bad[c.len() / 3] ^= 0x40;
        if let Ok(out) = decode_strands(&bad, n, count, s, &|_, _| {}) {
            assert_ne!(
                out, data,
                "{count} strands: a damaged payload decoded as the input"
            );
        }
        let padded = [c.as_slice(), &[0]].concat();
        assert!(decode_strands(&padded, n, count, s, &|_, _| {}).is_err());
    }
}

/// Prose in three strands with the shipped model, kept as a golden stream (bless a deliberate
/// change, with a version bump, by `LOCKSTEP_BLESS=1`).
#[test]
fn strands_golden() {
    let m = shipped();
    let data = &genesis()[..9000];
    let opts = Options {
        strands: Some(3),
        ..Options::default()
    };
    let c = compress(m, data, &opts, &Device::cpu(), &quiet).unwrap();
    let (h, _) = read_header(&c).unwrap();
    assert_eq!(h.flags, FLAG_LM | FLAG_MATCH | FLAG_STRANDS);
    models::check_golden("text_v2_strands.lst", "strand", &c, data, |g| {
        decompress(m, g).unwrap()
    });
}

/// Strand streams written on `device` equal the reference device's byte for byte, and each
/// decodes on the other.
fn same_strand_streams(device: &Device) {
    let reference = Device::reference();
    let data = [&genesis()[..1200], &log(10)].concat();
    for m in [small(), shipped()] {
        let (want, _) = encode_strands(&data, 4, setup(m, &reference), &|_, _| {}).unwrap();
        let (got, _) = encode_strands(&data, 4, setup(m, device), &|_, _| {}).unwrap();
        assert_eq!(got, want, "{}", device.name());
        let n = data.len() as u64;
        let on = |d: &Device, c: &[u8]| decode_strands(c, n, 4, setup(m, d), &|_, _| {}).unwrap();
        assert_eq!(on(device, &want), data, "{}", device.name());
        assert_eq!(on(&reference, &got), data);
    }
}

macro_rules! strands_parity {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn strand_streams_equal_the_reference() {
                if let Some(d) = devices::device(stringify!($name)) {
                    same_strand_streams(&d);
                }
            }
        }
    };
}

strands_parity!(portable);
strands_parity!(avx2);
strands_parity!(avx512);
strands_parity!(wgpu);
strands_parity!(cuda);
strands_parity!(cuda_emulated);
