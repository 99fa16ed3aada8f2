//! The defects a hostile-input probe found (issue 16), each as a test: archives cut short or
//! with a damaged footer are never reported as fine or answered with an older step, the
//! header is checksummed, declared sizes are checked before allocation, a small file cannot
//! ask for gigabytes or hours, messages name the file and show real values.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use lockstep::archive::format::{
    write_commit, write_footer, write_header, BlobKind, BlobRecord, CheckpointRecord, Commit,
    FileRecord, Footer, Layout, TensorRecord, HEADER_LEN,
};
use lockstep::archive::{self, Archive, PackOptions, Tail};
use lockstep::dtype::DType;
use lockstep::lm::text_codec::{self, Header};
use lockstep::Error;

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An archive of three checkpoints (steps 1, 2, 3) and the byte offset where step 3 begins.
fn three_steps(dir: &Path) -> (PathBuf, Vec<u8>, u64) {
    let specs = small_model();
    let mut paths = Vec::new();
    for s in 1..=3u64 {
        let p = dir.join(format!("step{s}.safetensors"));
        write_ckpt(&p, &specs, s);
        paths.push(p);
    }
    let ar = dir.join("run.lstp");
    let src = archive::resolve_many(&paths[..2]).unwrap();
    archive::pack(&ar, &src, None, &PackOptions::default(), &|_| {}).unwrap();
    let two = std::fs::metadata(&ar).unwrap().len();
    archive::append(
        &ar,
        &archive::resolve(&paths[2]).unwrap(),
        None,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    (ar.clone(), std::fs::read(&ar).unwrap(), two)
}

#[test]
fn extract_of_the_last_step_refuses_a_cut_archive_instead_of_handing_out_an_older_step() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good, two) = three_steps(dir.path());
    // A copy cut in the middle of step 3 (a partial download).
    let cut = dir.path().join("cut.lstp");
    let mid = two + (good.len() as u64 - two) / 2;
    std::fs::write(&cut, &good[..mid as usize]).unwrap();
    let c = cut.to_str().unwrap();
    let out = dir.path().join("out.safetensors");
    let o = out.to_str().unwrap();
    let r = run(&["extract", c, "-o", o]);
    assert_eq!(r.status.code(), Some(4), "{}", stderr(&r));
    assert!(stderr(&r).contains("--step 2"), "{}", stderr(&r));
    assert!(!out.exists(), "nothing written");
    // The missing step: the answer says the archive is damaged and what to run.
    let r = run(&["extract", c, "--step", "3", "-o", o]);
    assert_eq!(r.status.code(), Some(4));
    assert!(stderr(&r).contains("lockstep repair"), "{}", stderr(&r));
    // A complete step asked for by name is extracted, with a warning.
    let r = run(&["extract", c, "--step", "2", "-o", o]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stderr(&r).contains("warning"));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(dir.path().join("step2.safetensors")).unwrap()
    );
    // A damaged last footer: the same refusal.
    let mut flipped = good.clone();
    let n = flipped.len();
    flipped[n - 30] ^= 0x04;
    let fl = dir.path().join("flipped.lstp");
    std::fs::write(&fl, &flipped).unwrap();
    std::fs::remove_file(&out).unwrap();
    let r = run(&["extract", fl.to_str().unwrap(), "-o", o]);
    assert_eq!(r.status.code(), Some(4), "{}", stderr(&r));
    assert!(stderr(&r).contains("footer is damaged"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn verify_fails_on_a_copy_cut_short_and_says_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good, two) = three_steps(dir.path());
    let cut = dir.path().join("cut.lstp");
    for at in [
        two + 1,
        two + 100,
        good.len() as u64 - 50,
        good.len() as u64 - 1,
    ] {
        std::fs::write(&cut, &good[..at as usize]).unwrap();
        let r = run(&["verify", cut.to_str().unwrap(), "--json"]);
        assert_eq!(r.status.code(), Some(4), "cut at {at}: {}", stderr(&r));
        let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        assert_eq!(v["ok"], false, "cut at {at}");
        assert_eq!(v["last_step"], 2);
        let kind = v["tail"].as_str().unwrap();
        let a = Archive::open(&cut).unwrap();
        match a.tail() {
            Tail::Unfinished => assert_eq!(kind, "unfinished"),
            Tail::CommitWithoutFooter { step: 3, .. } => assert_eq!(kind, "commit_without_footer"),
            t => panic!("cut at {at}: {t:?}"),
        }
        assert!(stderr(&r).contains("cut short"), "{}", stderr(&r));
    }
    // Cut exactly after a footer it is a valid, shorter archive: nothing can tell, so say
    // which step is last (the JSON's last_step, the text's last line).
    std::fs::write(&cut, &good[..two as usize]).unwrap();
    let r = run(&["verify", cut.to_str().unwrap()]);
    assert!(r.status.success());
    assert!(String::from_utf8_lossy(&r.stdout).contains("last complete checkpoint: step 2"));
}

#[test]
fn a_flipped_header_byte_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good, _) = three_steps(dir.path());
    assert_eq!(good[8], 2, "new archives have a version-2 header");
    let t = dir.path().join("flip.lstp");
    // keyframe_interval, the reserved bytes and the CRC itself.
    for at in [12, 13, 15, 10, 17] {
        let mut b = good.clone();
        b[at] ^= 0x01;
        std::fs::write(&t, &b).unwrap();
        let e = Archive::open(&t)
            .err()
            .expect("damaged header must not open");
        assert_eq!(e.exit_code(), 3, "byte {at}: {e}");
        assert!(e.to_string().contains(t.to_str().unwrap()), "{e}");
        let r = run(&["verify", t.to_str().unwrap()]);
        assert_eq!(r.status.code(), Some(3), "byte {at}");
        // And append leaves it alone.
        let r = run(&[
            "append",
            t.to_str().unwrap(),
            dir.path().join("step3.safetensors").to_str().unwrap(),
            "--step",
            "9",
        ]);
        assert!(!r.status.success());
        assert!(std::fs::read(&t).unwrap() == b);
    }
}

/// An archive written by hand: one checkpoint of one bf16 tensor whose commit record says
/// `shape`, stored as `blob` (an anchor blob).
fn forged_archive(path: &Path, shape: &[u64], blob: &[u8], raw_hash: [u8; 32]) {
    let header_bytes = b"\x02\x00\x00\x00\x00\x00\x00\x00{}".to_vec();
    let raw_len: u64 = shape.iter().product::<u64>() * 2;
    let mut out = write_header(8);
    assert_eq!(out.len(), HEADER_LEN);
    let t_off = out.len() as u64;
    out.extend_from_slice(blob);
    let h_blob = archive::reader::encode_bytes_blob(&header_bytes).unwrap();
    let h_off = out.len() as u64;
    out.extend_from_slice(&h_blob);
    let commit = Commit {
        prev_commit: 0,
        first_blob: 0,
        blobs: vec![
            BlobRecord {
                offset: t_off,
                len: blob.len() as u64,
                kind: BlobKind::Anchor,
                reference: None,
                depth: 0,
                dtype: DType::BF16,
                raw_len,
                hash: raw_hash,
            },
            BlobRecord {
                offset: h_off,
                len: h_blob.len() as u64,
                kind: BlobKind::Bytes,
                reference: None,
                depth: 0,
                dtype: DType::U8,
                raw_len: header_bytes.len() as u64,
                hash: *blake3::hash(&header_bytes).as_bytes(),
            },
        ],
        checkpoint: CheckpointRecord {
            step: 1,
            label: "bomb.safetensors".into(),
            layout: Layout::SingleFile,
            keyframe: true,
            files: vec![FileRecord::Safetensors {
                path: "bomb.safetensors".into(),
                header_blob: 1,
                len: header_bytes.len() as u64 + raw_len,
                hash: [7; 32],
                meta: None,
                tensors: vec![TensorRecord {
                    name: "w".into(),
                    dtype: DType::BF16,
                    shape: shape.to_vec(),
                    blob: 0,
                }],
            }],
        },
    };
    let c = write_commit(&commit);
    let c_off = out.len() as u64;
    out.extend_from_slice(&c);
    out.extend_from_slice(&write_footer(&Footer {
        commit_offset: c_off,
        commit_len: c.len() as u64,
        n_checkpoints: 1,
    }));
    std::fs::write(path, out).unwrap();
}

/// An anchor blob of a bf16 tensor of `n` zeros stored as a zstd frame, written as a stream
/// (never holding the tensor).
fn zstd_zeros_anchor(n: u64) -> Vec<u8> {
    use std::io::Write;
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = n * 2;
    while left > 0 {
        let k = left.min(zeros.len() as u64) as usize;
        enc.write_all(&zeros[..k]).unwrap();
        left -= k as u64;
    }
    let payload = enc.finish().unwrap();
    // magic | version 1 | mode 2 (zstd) | dtype | ndim 1 | n (varint) | crc of the data | payload | crc
    let mut w = lockstep::bytes::ByteWriter::new();
    w.bytes(b"LSAB");
    w.bytes(&[1, 2, DType::BF16.code(), 1]);
    w.varint(n);
    w.u32(0);
    let mut b = w.buf;
    b.extend_from_slice(&payload);
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn a_blob_that_claims_more_elements_than_its_record_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.lstp");
    // The blob says 2^32 elements (8 GiB), the commit record says 64: trusting the blob would
    // allocate gigabytes; the record's size is checked first.
    let blob = zstd_zeros_anchor(1 << 32);
    assert!(
        blob.len() < 1 << 20,
        "the bomb is small: {} bytes",
        blob.len()
    );
    forged_archive(&bomb, &[64], &blob, [0; 32]);
    let a = Archive::open(&bomb).unwrap();
    let e = a.decode_blob(0).unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("the archive records 128"), "{e}");
    let r = run(&["verify", bomb.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
}

#[test]
fn a_small_archive_that_declares_gigabytes_needs_max_size() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.lstp");
    // Consistent everywhere, and legal: 2^31 bf16 zeros (4 GiB) in a file of a few KB.
    let n = 1u64 << 31;
    forged_archive(&bomb, &[n], &zstd_zeros_anchor(n), [0; 32]);
    let len = std::fs::metadata(&bomb).unwrap().len();
    assert!(len < 1 << 20, "{len}");
    let b = bomb.to_str().unwrap();
    let out = dir.path().join("x.safetensors");
    for args in [
        vec!["verify", b],
        vec!["extract", b, "-o", out.to_str().unwrap()],
    ] {
        let r = run(&args);
        assert_eq!(r.status.code(), Some(5), "{args:?}: {}", stderr(&r));
        assert!(stderr(&r).contains("--max-size"), "{}", stderr(&r));
    }
    assert!(!out.exists());
    // The limit applies to honest archives too, and says how to raise it.
    let (ar, _, _) = three_steps(dir.path());
    let r = run(&["verify", ar.to_str().unwrap(), "--max-size", "1K"]);
    assert_eq!(r.status.code(), Some(5));
    let r = run(&["verify", ar.to_str().unwrap(), "--max-size", "1G"]);
    assert!(r.status.success(), "{}", stderr(&r));
}

#[test]
fn a_forged_count_cannot_size_an_allocation() {
    // A commit body that claims 2^24 blobs (each at least 39 bytes) in a few bytes: refused
    // by the bytes left, before any Vec::with_capacity.
    let mut body = lockstep::bytes::ByteWriter::new();
    body.varint(1 << 24);
    body.buf.extend_from_slice(&[0; 100]);
    let mut r = lockstep::bytes::ByteReader::new(&body.buf, "commit");
    let e = r.count(39, "blob count").unwrap_err();
    assert!(e.to_string().contains("exceeds its limit 2"), "{e}");
}

/// The shipped model.
fn model() -> lockstep::format::lm::model_file::Model {
    lockstep::format::lm::model_file::Model::from_bytes(include_bytes!("../models/tinygpt2.lsm"))
        .unwrap()
}

#[test]
fn a_tiny_text_stream_cannot_ask_for_minutes_of_model_work() {
    let m = model();
    // 117 bytes that declare one segment of 65,536 tokens.
    let h = Header {
        model_hash: m.hash,
        original_len: 65_536,
        original_hash: [0; 32],
        segment_tokens: 65_536,
        flags: text_codec::FLAG_MATCH,
        n_tokens: 65_536,
        segments: vec![(65_536, 5)],
    };
    let mut f = text_codec::write_header(&h);
    f.extend_from_slice(&[0x5a, 0x17, 0xc3, 0x99, 0x01]);
    assert!(f.len() < 130, "{}", f.len());
    // Over the default limit (64 times its size, at least 16 KiB): refused before any work.
    let e = text_codec::decompress(&m, &f, &lockstep::backend::Device::cpu()).unwrap_err();
    assert_eq!(e.exit_code(), 5, "{e}");
    assert!(e.to_string().contains("--max-size"), "{e}");
    // Allowed to try, the decoder stops as soon as the coded bytes run out.
    let e = text_codec::decompress_limited(&m, &f, u64::MAX, &lockstep::backend::Device::cpu())
        .unwrap_err();
    assert_eq!(e.exit_code(), 3, "{e}");
    let msg = e.to_string();
    let after: usize = msg
        .split("end after ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(after < 1000, "stopped after {after} of 65536 tokens");
    // The command line names the file and takes --max-size.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bomb.lst");
    std::fs::write(&p, &f).unwrap();
    let out = dir.path().join("bomb.txt");
    let r = run(&[
        "text",
        "decompress",
        p.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(5), "{}", stderr(&r));
    assert!(stderr(&r).contains("bomb.lst"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn checksum_errors_show_two_different_values_and_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = small_pair(dir.path());
    let lsd = dir.path().join("d.lsd");
    let r = run(&[
        "delta",
        "encode",
        "--reference",
        a.to_str().unwrap(),
        "--target",
        b.to_str().unwrap(),
        "-o",
        lsd.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    // Decoding against the wrong reference, the BLAKE3 of the whole file differs (or an
    // earlier tensor check catches it): whatever is reported names the .lsd file, and a
    // checksum message never shows the same value twice.
    let out = dir.path().join("out.safetensors");
    let mut bytes = std::fs::read(&lsd).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    let bad = dir.path().join("bad.lsd");
    std::fs::write(&bad, &bytes).unwrap();
    let r = run(&[
        "delta",
        "decode",
        "--reference",
        a.to_str().unwrap(),
        bad.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    let err = stderr(&r);
    assert!(err.contains("bad.lsd"), "{err}");
    if let Some(rest) = err.split("stored ").nth(1) {
        let stored = rest.split(',').next().unwrap();
        let computed = rest.split("computed ").nth(1).unwrap().trim();
        assert_ne!(stored.trim(), computed, "{err}");
    }
    assert!(!out.exists());
    // A damaged model file and a damaged text stream are named too.
    let lsm = dir.path().join("bad.lsm");
    let mut mb = include_bytes!("../models/tinygpt2.lsm").to_vec();
    mb[1000] ^= 1;
    std::fs::write(&lsm, &mb).unwrap();
    let txt = dir.path().join("t.txt");
    std::fs::write(&txt, b"hello").unwrap();
    let r = run(&[
        "text",
        "compress",
        txt.to_str().unwrap(),
        "-o",
        dir.path().join("t.lst").to_str().unwrap(),
        "--model",
        lsm.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    assert!(stderr(&r).contains("bad.lsm"), "{}", stderr(&r));
    let (mut h1, h2) = ([7u8; 32], [7u8; 32]);
    h1[20] = 8;
    let e = Error::hash_mismatch("x", &h1, &h2).to_string();
    assert!(
        e.contains(&"07".repeat(20)),
        "differing past 8 bytes, all are shown: {e}"
    );
    let e = Error::checksum32("x", 1, 2).to_string();
    assert!(e.contains("0x00000001") && e.contains("0x00000002"), "{e}");
}

#[test]
fn twenty_thousand_tensors_encode_and_decode() {
    // Checkpoint::get was a linear search, quadratic over a checkpoint: 50,000 tensors took
    // seconds, 200,000 minutes. Now a hash lookup; the time is linear (about 0.3 ms of table
    // work per tensor, measured in the closing note), which a test does not assert.
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000;
    let mk = |step: u8| -> Vec<(String, Vec<u8>)> {
        (0..n)
            .map(|i| (format!("t{i}"), vec![step, (i % 251) as u8, 0x3f, 0x80]))
            .collect()
    };
    let write = |path: &Path, ts: &[(String, Vec<u8>)]| {
        use safetensors::tensor::{serialize, Dtype, TensorView};
        let views: Vec<(&str, TensorView)> = ts
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    TensorView::new(Dtype::BF16, vec![2], v).unwrap(),
                )
            })
            .collect();
        std::fs::write(path, serialize(views, None).unwrap()).unwrap();
    };
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    write(&a, &mk(1));
    write(&b, &mk(2));
    let r = lockstep::checkpoint::Checkpoint::open(&a).unwrap();
    let t = lockstep::checkpoint::Checkpoint::open(&b).unwrap();
    assert_eq!(r.tensors.len(), n);
    assert_eq!(r.get("t19999").unwrap().shape, vec![2]);
    let out = dir.path().join("d.lsd");
    lockstep::delta::file::encode_file(
        &r,
        &t,
        &out,
        &lockstep::delta::EncodeOptions::default(),
        64 << 20,
        &lockstep::backend::Device::cpu(),
    )
    .unwrap();
    let back = dir.path().join("back.safetensors");
    lockstep::delta::file::decode_file(
        &r,
        &std::fs::read(&out).unwrap(),
        &back,
        &lockstep::backend::Device::cpu(),
    )
    .unwrap();
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn a_version_1_header_is_checked_against_the_commits() {
    // Written by the landed version before the header had a checksum.
    let golden = std::fs::read("tests/golden/archive_v1/v1.lstp").unwrap();
    assert_eq!(golden[8], 1, "a version-1 header");
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("v1.lstp");
    std::fs::write(&t, &golden).unwrap();
    let a = Archive::open(&t).unwrap();
    assert!(!a.header.checksummed);
    assert!(a.verify(&|_| {}).unwrap().ok());
    let k = a.keyframe_interval;
    assert!(k > 1 && a.checkpoints.len() > 1, "{k}");
    // An interval that would make the second checkpoint a keyframe contradicts its commit.
    let mut b = golden.clone();
    b[12..16].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&t, &b).unwrap();
    let e = Archive::open(&t).err().expect("damaged interval");
    assert_eq!(e.exit_code(), 3, "{e}");
    assert!(e.to_string().contains("keyframe"), "{e}");
}
