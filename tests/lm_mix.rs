//! The context-mixing text stream (version 2): round trips of every mode, the stored
//! fallback, golden streams of both versions, hostile headers, determinism. Inputs are short:
//! the LM runs once per chunk of text, in order.

use std::path::PathBuf;

use lockstep::backend::Device;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::coder::{self, Setup};
use lockstep::lm::cm::stream::{
    self, compress, compress_unverified, read_header, write_header, Blocks, Header, Options,
    BLOCK_LEN, FLAG_BLOCKS, FLAG_LM, FLAG_MATCH, MODE_MIXED, MODE_STORED,
};
use lockstep::lm::text_codec::{self, Pass};

#[path = "lm_common/models.rs"]
mod models;
#[path = "lm_common/random_model.rs"]
mod random_model;
use models::{shipped, small};
use random_model::random_model;

/// The CPU device at its best level (the per-device parity of the LM is lm_codec.rs's).
fn cpu() -> Device {
    Device::cpu()
}

fn decompress(m: &Model, d: &[u8]) -> lockstep::Result<Vec<u8>> {
    text_codec::decompress(m, d, &cpu())
}

const PROSE: &[u8] = b"In the beginning the coder knew nothing of the file. Then it saw the \
first words, and the words came again, and the coder learned them: the words came again, and \
again, each time cheaper than the last.\n";

/// Plain English the shipped model knows: there the LM pays for its 32-byte hash.
const STORY: &[u8] = b"The river was low that summer, and the children walked out along the \
stones to the island where the old boat lay. Nobody remembered who had left it there. Their \
grandmother said it had belonged to a fisherman who went away to the city and never came back, \
but their grandmother said many things. In the evening they sat on the porch and listened to \
the frogs, and their father read to them from a book about a man who sailed around the world \
alone.\n";

fn log() -> Vec<u8> {
    (0..40)
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

/// Deterministic bytes that no model compresses.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn quiet(_: Pass, _: u64, _: u64) {}

fn roundtrip(m: &Model, data: &[u8], opts: Options) -> Vec<u8> {
    let c = compress(m, data, &opts, &cpu(), &quiet).unwrap();
    assert_eq!(decompress(m, &c).unwrap(), data);
    c
}

const ALL: [Options; 4] = [
    Options {
        lm: true,
        match_model: true,
        block_len: BLOCK_LEN,
        strands: None,
    },
    Options {
        lm: true,
        match_model: false,
        block_len: BLOCK_LEN,
        strands: None,
    },
    Options {
        lm: false,
        match_model: true,
        block_len: BLOCK_LEN,
        strands: None,
    },
    Options {
        lm: false,
        match_model: false,
        block_len: BLOCK_LEN,
        strands: None,
    },
];

#[test]
fn every_mode_roundtrips_odd_inputs() {
    let m = small();
    let utf8 = "na\u{ef}ve \u{2713} <|endoftext|>\r\n\t  x".repeat(4);
    let inputs: [&[u8]; 6] = [b"", b"x", b"\xff\x00", utf8.as_bytes(), PROSE, &log()];
    for data in inputs {
        for o in ALL {
            roundtrip(m, data, o);
        }
    }
}

#[test]
fn repetitive_text_is_mixed_and_small() {
    let m = small();
    let data = log();
    let c = roundtrip(m, &data, Options::default());
    let (h, _) = read_header(&c).unwrap();
    assert_eq!(h.mode, MODE_MIXED);
    assert_ne!(h.flags & FLAG_MATCH, 0);
    // 40 near-identical lines: the adaptive models must find the repetition.
    assert!(c.len() * 5 < data.len(), "{} of {}", c.len(), data.len());
}

#[test]
fn the_shipped_model_pays_on_prose() {
    // The LM is kept only where it beats the adaptive models alone by its 32-byte hash.
    let m = shipped();
    let data = STORY;
    let with = roundtrip(m, data, Options::default());
    let alone = roundtrip(
        m,
        data,
        Options {
            lm: false,
            ..Options::default()
        },
    );
    let (h, _) = read_header(&with).unwrap();
    assert_ne!(h.flags & FLAG_LM, 0, "LM not used");
    assert!(
        with.len() < alone.len(),
        "{} vs {}",
        with.len(),
        alone.len()
    );
}

#[test]
fn incompressible_input_is_stored_with_a_small_header() {
    let m = small();
    for n in [0, 1, 100, 5000] {
        let data = noise(n);
        let c = roundtrip(m, &data, Options::default());
        let (h, start) = read_header(&c).unwrap();
        assert_eq!(h.mode, MODE_STORED, "{n} bytes");
        assert_eq!(start, 58);
        assert_eq!(c.len(), n + 58, "never more than the header over the input");
    }
}

#[test]
fn output_is_independent_of_thread_count() {
    let m = small();
    let data = [PROSE, &log()].concat();
    let a = compress_unverified(m, &data, &Options::default(), &cpu(), &quiet).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let b = pool
        .install(|| compress_unverified(m, &data, &Options::default(), &cpu(), &quiet).unwrap());
    assert_eq!(a, b);
}

/// Streams of both versions written by landed encoders: today's decoder must read them and
/// today's encoder must write them byte for byte (bless a deliberate change, with a version
/// bump, by `LOCKSTEP_BLESS=1 cargo nextest run --release --test lm_mix`).
#[test]
fn golden_streams_of_both_versions() {
    let m = shipped();
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"));
    let bless = std::env::var_os("LOCKSTEP_BLESS").is_some();
    let v1 = text_codec::compress(m, PROSE, &text_codec::Options::default(), &cpu()).unwrap();
    let mixed = compress(m, STORY, &Options::default(), &cpu(), &quiet).unwrap();
    assert_ne!(read_header(&mixed).unwrap().0.flags & FLAG_LM, 0);
    let alone = compress(
        m,
        PROSE,
        &Options {
            lm: false,
            match_model: true,
            block_len: BLOCK_LEN,
            strands: None,
        },
        &cpu(),
        &quiet,
    )
    .unwrap();
    let stored = compress(m, &noise(64), &Options::default(), &cpu(), &quiet).unwrap();
    for (name, fresh, plain) in [
        ("text_v1.lst", v1, PROSE.to_vec()),
        ("text_v2_mixed.lst", mixed, STORY.to_vec()),
        ("text_v2_no_lm.lst", alone, PROSE.to_vec()),
        ("text_v2_stored.lst", stored, noise(64)),
    ] {
        let path = dir.join(name);
        if bless {
            std::fs::write(&path, &fresh).unwrap();
            continue;
        }
        let golden = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (bless with LOCKSTEP_BLESS=1)", path.display()));
        assert_eq!(
            decompress(m, &golden).unwrap(),
            plain,
            "{name} no longer decodes"
        );
        assert!(fresh == golden, "{name}: encoder output changed");
    }
}

#[test]
fn hostile_headers_are_refused_without_work() {
    let m = small();
    let good = compress(m, &log(), &Options::default(), &cpu(), &quiet).unwrap();
    let (h, start) = read_header(&good).unwrap();
    let payload = &good[start..];
    let with = |h: &Header, payload: &[u8]| [write_header(h), payload.to_vec()].concat();

    // A huge declared length: refused by the limit (exit 5) before any model work.
    let big = Header {
        original_len: 1 << 40,
        ..h.clone()
    };
    let e = decompress(m, &with(&big, payload)).unwrap_err();
    assert_eq!(e.exit_code(), 5, "{e}");
    assert!(e.to_string().contains("--max-size"), "{e}");
    // Allowed to try, the decoder stops when the coded bytes run out (damaged, exit 3).
    let e = text_codec::decompress_limited(m, &with(&big, payload), u64::MAX, &cpu()).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");

    // Unknown mode and flags, flags on a stored stream, a stored length that disagrees.
    for bad in [
        Header {
            mode: 7,
            ..h.clone()
        },
        Header {
            flags: 0x80 | FLAG_MATCH,
            ..h.clone()
        },
        Header {
            mode: MODE_STORED,
            ..h.clone()
        },
    ] {
        assert!(decompress(m, &with(&bad, payload)).is_err(), "{bad:?}");
    }
    // A flag without the model hash it announces reads as a bad CRC or a truncation.
    let mut lied = good.clone();
    lied[13] ^= FLAG_LM;
    assert!(decompress(m, &lied).is_err());
    // The header's CRC.
    let mut flipped = good.clone();
    flipped[20] ^= 1;
    assert_eq!(decompress(m, &flipped).unwrap_err().exit_code(), 3);
    // Truncated anywhere, padded, or a payload byte changed: an error, never a panic.
    for len in [0, 5, 12, 40, start, good.len() - 1] {
        assert!(decompress(m, &good[..len]).is_err(), "truncated to {len}");
    }
    let mut padded = good.clone();
    padded.push(0);
    assert!(decompress(m, &padded).is_err());
    // The last flushed bytes of the range coder may not matter; then the text is intact.
    let plain = log();
    for i in start..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x10;
        if let Ok(out) = decompress(m, &bad) {
            assert_eq!(out, plain, "byte {i} changed, wrong text accepted");
        }
    }
    // A stream written with another model names both hashes.
    let with_lm = compress(m, &PROSE.repeat(3), &Options::default(), &cpu(), &quiet).unwrap();
    let (hl, _) = read_header(&with_lm).unwrap();
    if hl.flags & FLAG_LM != 0 {
        let other = random_model(2, 16, 2, 16, 50257, 2);
        let e = decompress(&other, &with_lm).unwrap_err();
        assert!(e.to_string().contains("model"), "{e}");
    }
}

#[test]
fn stream_module_rejects_version_1() {
    let m = small();
    let v1 = text_codec::compress(m, b"hello", &text_codec::Options::default(), &cpu()).unwrap();
    assert!(!stream::is_v2(&v1));
    assert!(read_header(&v1).is_err());
    assert_eq!(decompress(m, &v1).unwrap(), b"hello");
}

/// A stream of independent blocks written by hand (any block length), and its input.
fn block_stream(m: &Model, data: &[u8], len: u32) -> Vec<u8> {
    let device = cpu();
    let setup = Setup {
        lm: Some((m, device.lm().unwrap())),
        match_model: true,
    };
    let mut payload = Vec::new();
    let mut coded = Vec::new();
    for part in data.chunks(len as usize) {
        let (c, _) = coder::encode(part, setup, &|_, _| {}).unwrap();
        coded.push(c.len() as u32);
        payload.extend_from_slice(&c);
    }
    let h = Header {
        mode: MODE_MIXED,
        flags: FLAG_LM | FLAG_MATCH | FLAG_BLOCKS,
        original_len: data.len() as u64,
        original_hash: *blake3::hash(data).as_bytes(),
        model_hash: Some(m.hash),
        blocks: Some(Blocks { len, coded }),
        strands: None,
    };
    [write_header(&h), payload].concat()
}

#[test]
fn blocks_decode_in_lockstep_to_the_input() {
    // Blocks of 300 bytes over prose, a log and odd bytes: many blocks, the LM's context (16
    // tokens) restarting inside each, blocks finishing at different times.
    let m = small();
    let data = [PROSE, &log(), STORY, b"\xff\x00 x"].concat();
    let s = block_stream(m, &data, 300);
    assert_eq!(decompress(m, &s).unwrap(), data);
    assert_eq!(
        read_header(&s).unwrap().0.blocks.unwrap().coded.len(),
        data.len().div_ceil(300)
    );
    // One thread or many, the same bytes.
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(one.install(|| decompress(m, &s)).unwrap(), data);
}

#[test]
fn hostile_block_tables_are_refused() {
    let m = small();
    let data = [PROSE, STORY].concat();
    let good = block_stream(m, &data, 200);
    let (h, start) = read_header(&good).unwrap();
    let payload = &good[start..];
    let with = |h: &Header| [write_header(h), payload.to_vec()].concat();
    let b = h.blocks.clone().unwrap();
    let mut shifted = b.coded.clone();
    shifted[0] += 1;
    shifted[1] -= 1;
    let mut short = b.coded.clone();
    short[0] -= 1;
    for (what, bad) in [
        (
            "block length 0",
            Blocks {
                len: 0,
                ..b.clone()
            },
        ),
        (
            "lengths that do not add up",
            Blocks {
                coded: short,
                ..b.clone()
            },
        ),
        (
            "lengths shifted between blocks",
            Blocks {
                coded: shifted,
                ..b.clone()
            },
        ),
        (
            "a longer block length",
            Blocks {
                len: 400,
                ..b.clone()
            },
        ),
    ] {
        let bad = Header {
            blocks: Some(bad),
            ..h.clone()
        };
        assert!(decompress(m, &with(&bad)).is_err(), "{what}");
    }
    // A table that claims more blocks than the file holds: truncated, nothing allocated.
    let huge = Header {
        original_len: 1 << 40,
        blocks: Some(Blocks {
            len: 1,
            ..b.clone()
        }),
        ..h.clone()
    };
    let e = text_codec::decompress_limited(m, &with(&huge), u64::MAX, &cpu()).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    // The flag without its table.
    let mut lied = good[..start].to_vec();
    lied[13] &= !FLAG_BLOCKS;
    assert!(decompress(m, &[lied, payload.to_vec()].concat()).is_err());
}

/// English over the block length: the compressor cuts it into blocks (the LM pays on prose),
/// and the stream it writes is kept as a golden file. Short blocks keep the test short.
#[test]
fn long_prose_is_coded_in_blocks_golden() {
    let m = shipped();
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/text/prose-genesis.txt"
    ));
    let text = std::fs::read(&path).unwrap();
    let data = &text[..12000];
    let opts = Options {
        block_len: 6000,
        strands: Some(1),
        ..Options::default()
    };
    let c = roundtrip(m, data, opts);
    let (h, _) = read_header(&c).unwrap();
    assert_eq!(h.flags, FLAG_LM | FLAG_MATCH | FLAG_BLOCKS);
    assert_eq!(h.blocks.unwrap().coded.len(), 2);
    models::check_golden("text_v2_blocks.lst", "block", &c, data, |g| {
        decompress(m, g).unwrap()
    });
}
