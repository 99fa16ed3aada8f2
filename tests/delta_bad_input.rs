//! Bad input gets a clear error, never a panic, an endless loop or a half-written file.

mod common;
mod devices;

use std::process::Command;

use common::Rng;
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::{decode_file, encode_file};
use lockstep::delta::{
    decode_tensor, encode_tensor, EncodeOptions, TensorPair, DEFAULT_BATCH_BYTES,
};
use lockstep::dtype::DType;
use lockstep::Error;

fn sample_blob() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (r, t) = common::bf16_pair(3000, 9);
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &[30, 100],
        reference: &r,
        target: &t,
    };
    let (blob, _) = encode_tensor(
        &pair,
        &EncodeOptions::default(),
        &lockstep::backend::cpu::CpuBackend,
    )
    .unwrap();
    (blob, r, t)
}

#[test]
fn every_truncation_is_an_error() {
    let (blob, r, _) = sample_blob();
    for len in 0..blob.len() {
        assert!(
            decode_tensor(&blob[..len], &r, &lockstep::backend::cpu::CpuBackend).is_err(),
            "prefix of {len} bytes decoded"
        );
    }
}

#[test]
fn corruption_is_caught_by_the_checksum() {
    let (blob, r, _) = sample_blob();
    for i in (0..blob.len()).step_by(7) {
        let mut b = blob.clone();
        b[i] ^= 0x10;
        match decode_tensor(&b, &r, &lockstep::backend::cpu::CpuBackend) {
            Err(Error::Checksum { .. }) | Err(Error::Format { .. }) => {}
            other => panic!("byte {i}: {other:?}"),
        }
    }
}

/// Corruption behind a recomputed checksum reaches the parser and the rANS decoder itself:
/// they must still answer with an error (or, by chance, the right bytes), never a panic.
#[test]
fn corruption_with_a_valid_checksum_never_panics() {
    let (blob, r, t) = sample_blob();
    let mut rng = Rng(77);
    for _ in 0..3000 {
        let mut b = blob.clone();
        let body = b.len() - 4;
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(body as u64) as usize;
            b[i] = rng.next() as u8;
        }
        let crc = crc32fast::hash(&b[..body]);
        b[body..].copy_from_slice(&crc.to_le_bytes());
        let result =
            std::panic::catch_unwind(|| decode_tensor(&b, &r, &lockstep::backend::cpu::CpuBackend));
        match result {
            Ok(Ok(out)) => assert_eq!(
                out, t,
                "corrupt blob decoded to different bytes without an error"
            ),
            Ok(Err(_)) => {}
            Err(_) => panic!("decoder panicked on a corrupt blob"),
        }
    }
}

#[test]
fn wrong_reference_is_named() {
    let (blob, r, _) = sample_blob();
    let mut other = r.clone();
    other[10] ^= 1;
    let err = decode_tensor(&blob, &other, &lockstep::backend::cpu::CpuBackend)
        .unwrap_err()
        .to_string();
    assert!(err.contains("wrong reference"), "{err}");
    let err = decode_tensor(&blob, &r[..100], &lockstep::backend::cpu::CpuBackend)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reference tensor has 100 bytes"), "{err}");
}

#[test]
fn encode_rejects_inconsistent_lengths() {
    let (r, t) = common::bf16_pair(100, 1);
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &[101],
        reference: &r,
        target: &t,
    };
    assert!(matches!(
        encode_tensor(
            &pair,
            &EncodeOptions::default(),
            &lockstep::backend::cpu::CpuBackend
        ),
        Err(Error::Mismatch(_))
    ));
}

fn mismatched(dir: &std::path::Path, change: &str) -> std::path::PathBuf {
    let (r, _) = common::bf16_pair(64 * 96, 1);
    let p = dir.join(format!("{change}.safetensors"));
    let (name, dtype, shape) = match change {
        "name" => ("layer.renamed", "BF16", vec![64, 96]),
        "shape" => ("layer.weight", "BF16", vec![96, 64]),
        _ => ("layer.weight", "F16", vec![64, 96]),
    };
    common::write_safetensors(&p, &[(name, dtype, shape, r)]);
    p
}

#[test]
fn mismatched_checkpoints_name_the_tensor_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = common::small_pair(dir.path());
    let reference = Checkpoint::open(&a).unwrap();
    for change in ["name", "shape", "dtype"] {
        let target = Checkpoint::open(mismatched(dir.path(), change)).unwrap();
        let out = dir.path().join("out.lsd");
        let err = encode_file(
            &reference,
            &target,
            &out,
            &EncodeOptions::default(),
            DEFAULT_BATCH_BYTES,
            &lockstep::backend::Device::cpu(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("layer."), "{change}: {err}");
        assert!(!out.exists());
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind");
}

#[test]
fn truncated_delta_file_fails_and_keeps_existing_output() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = common::small_pair(dir.path());
    let (ra, rb) = (Checkpoint::open(&a).unwrap(), Checkpoint::open(&b).unwrap());
    let lsd = dir.path().join("b.lsd");
    encode_file(
        &ra,
        &rb,
        &lsd,
        &EncodeOptions::default(),
        DEFAULT_BATCH_BYTES,
        &lockstep::backend::Device::cpu(),
    )
    .unwrap();
    let bytes = std::fs::read(&lsd).unwrap();
    let out = dir.path().join("out.safetensors");
    std::fs::write(&out, b"precious").unwrap();
    for len in [0, 3, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(
            decode_file(&ra, &bytes[..len], &out, &lockstep::backend::Device::cpu()).is_err(),
            "{len}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    }
    // Decoding against the wrong reference names the problem.
    let err = decode_file(&rb, &bytes, &out, &lockstep::backend::Device::cpu())
        .unwrap_err()
        .to_string();
    assert!(err.contains("wrong reference"), "{err}");
    decode_file(&ra, &bytes, &out, &lockstep::backend::Device::cpu()).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&b).unwrap());
}

#[test]
fn cli_reports_errors_with_a_nonzero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = common::small_pair(dir.path());
    let exe = env!("CARGO_BIN_EXE_lockstep");
    let lsd = dir.path().join("b.lsd");
    let ok = Command::new(exe)
        .args(["delta", "encode", "--reference"])
        .arg(&a)
        .arg("--target")
        .arg(&b)
        .arg("-o")
        .arg(&lsd)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let mut bytes = std::fs::read(&lsd).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&lsd, &bytes).unwrap();
    let out = dir.path().join("never.safetensors");
    let bad = Command::new(exe)
        .args(["delta", "decode", "--reference"])
        .arg(&a)
        .arg(&lsd)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    // Other lines (an `auto` backend note) may come first; the error must be there, named.
    assert!(
        stderr.lines().any(|l| l.starts_with("error:")) && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(!out.exists());
    let missing = Command::new(exe)
        .args(["delta", "decode", "--reference", "/nonexistent.safetensors"])
        .arg(&lsd)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.safetensors"));
}

/// A bf16 pair whose update sizes and signs follow the column (rows of `cols`): the data the
/// Joint layout's neighbor form pays on.
fn columned_pair(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    let (mut r, mut t) = (Vec::new(), Vec::new());
    for j in 0..rows * cols {
        let col = j % cols;
        // The reference's top two mantissa bits by column too (random ones split every
        // context four ways for nothing).
        let v =
            half::bf16::from_f64(rng.gauss() * 0.02).to_bits() & !0x60 | ((col % 4) << 5) as u16;
        let v = half::bf16::from_bits(v);
        let scale = [1.0, 8.0, 64.0, 512.0][col % 4];
        let step = (rng.gauss().abs() * scale) as i32 * if col.is_multiple_of(3) { 1 } else { -1 };
        let moved = half::bf16::from_bits((v.to_bits() as i32 + step).clamp(0, 0xffff) as u16);
        r.extend_from_slice(&v.to_bits().to_le_bytes());
        t.extend_from_slice(&moved.to_bits().to_le_bytes());
    }
    (r, t)
}

/// A 1024 × 64 bf16 pair coded by `backend` in the Joint layout's neighbor form (checked
/// chosen): reference, target and blob.
fn neighbor_sample(backend: &dyn lockstep::backend::Backend) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (r, t) = columned_pair(1024, 64, 5);
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &[1024, 64],
        reference: &r,
        target: &t,
    };
    let opts = EncodeOptions {
        layout: lockstep::delta::LayoutChoice::FastNeighbor,
        ..EncodeOptions::default()
    };
    let (blob, report) = encode_tensor(&pair, &opts, backend).unwrap();
    assert!(
        report.j_neighbor,
        "the sample did not choose the neighbor form"
    );
    (r, t, blob)
}

/// A blob with its trailing CRC-32 recomputed over the rest, so a corruption reaches the
/// decoder instead of the checksum.
fn with_crc(mut b: Vec<u8>) -> Vec<u8> {
    let body = b.len() - 4;
    let crc = crc32fast::hash(&b[..body]);
    b[body..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The Joint layout's neighbor form behind a recomputed checksum: corrupt tables, maps and
/// streams are errors (or, by chance, the right bytes), never a panic; its flag outside the
/// joint layout, and B's or S's inside it, are refused.
#[test]
fn fast_neighbor_corruption_never_panics_and_flags_are_checked() {
    let cpu = lockstep::backend::cpu::CpuBackend;
    let (r, t, blob) = neighbor_sample(&cpu);
    let body = blob.len() - 4;
    // The modeled payload starts with the layout and flag bytes: find them as the encoder
    // wrote them (joint = 2, flags = conditioning | bit 3).
    let at = (0..body - 1)
        .find(|&i| blob[i] == 2 && blob[i + 1] == 0b1001)
        .expect("layout and flags");
    for (layout, flags, want) in [
        (2u8, 0b1011u8, "stages B or S in the joint layout"),
        (2, 0b1101, "stages B or S in the joint layout"),
        (1, 0b1001, "outside the joint layout"),
        (2, 0b11001, "unknown flags"),
    ] {
        let mut b = blob.clone();
        (b[at], b[at + 1]) = (layout, flags);
        let err = decode_tensor(&with_crc(b), &r, &cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{layout} {flags:#b}: {err}");
    }
    let mut rng = Rng(78);
    for _ in 0..3000 {
        let mut b = blob.clone();
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(body as u64) as usize;
            b[i] = rng.next() as u8;
        }
        let b = with_crc(b);
        match std::panic::catch_unwind(|| decode_tensor(&b, &r, &cpu)) {
            Ok(Ok(out)) => assert_eq!(out, t, "corrupt blob decoded to other bytes"),
            Ok(Err(_)) => {}
            Err(_) => panic!("decoder panicked on a corrupt blob"),
        }
    }
}

/// The GPUs' neighbor-form decoders on corrupt blobs (the CPU's, with a byte or three
/// changed and the CRC fixed): the target or an error, never a panic or a hang. A class
/// outside the map's window or a missing row must set the kernels' error, not index past
/// the map.
#[test]
fn fast_neighbor_corruption_on_the_gpus_never_panics() {
    let (r, t, blob) = neighbor_sample(&lockstep::backend::cpu::CpuBackend);
    let body = blob.len() - 4;
    for name in ["wgpu", "cuda_emulated", "cuda"] {
        let Some(d) = devices::device(name) else {
            continue;
        };
        let gpu = d.delta().unwrap();
        assert_eq!(decode_tensor(&blob, &r, gpu).unwrap(), t, "{name}");
        let mut rng = Rng(79);
        for _ in 0..300 {
            let mut b = blob.clone();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(body as u64) as usize;
                b[i] = rng.next() as u8;
            }
            let b = with_crc(b);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                decode_tensor(&b, &r, gpu)
            })) {
                Ok(Ok(out)) => assert_eq!(out, t, "{name}: corrupt blob decoded to other bytes"),
                Ok(Err(_)) => {}
                Err(_) => panic!("{name}: decoder panicked on a corrupt blob"),
            }
        }
    }
}

/// The neighbor form's vector decode lanes (AVX2, AVX-512, NEON) against its portable lanes
/// on corrupt blobs behind a recomputed checksum: every level this CPU runs gives the
/// portable level's result, the same bytes or the same error, message included (the lanes'
/// bounds refusals and stream checks must be the portable lanes' own).
#[test]
fn fast_neighbor_corruption_same_result_at_every_level() {
    use lockstep::backend::{Device, Isa};
    let portable = Device::cpu_at(Isa::Portable).unwrap();
    let portable = portable.delta().unwrap();
    let (r, _, blob) = neighbor_sample(portable);
    let levels: Vec<Device> = Isa::ALL
        .into_iter()
        .filter(|&i| i != Isa::Portable)
        .filter_map(Device::cpu_at)
        .collect();
    let body = blob.len() - 4;
    let mut rng = Rng(79);
    for i in 0..400 {
        let mut b = blob.clone();
        // Mostly the second half (the chunk's words and tails), some anywhere.
        let at = if i % 4 == 0 {
            rng.below(body as u64) as usize
        } else {
            body / 2 + rng.below((body - body / 2) as u64) as usize
        };
        b[at] ^= 1 << rng.below(8);
        let b = with_crc(b);
        let want = decode_tensor(&b, &r, portable).map_err(|e| e.to_string());
        for level in &levels {
            let got = decode_tensor(&b, &r, level.delta().unwrap()).map_err(|e| e.to_string());
            assert_eq!(got, want, "{}: byte {at}", level.delta().unwrap().name());
        }
    }
}
