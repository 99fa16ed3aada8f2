//! Golden blobs freeze the format: today's encoder must produce exactly these bytes, and
//! today's decoder must read them. Regenerate (only for a deliberate format change, with a
//! version bump) with `LOCKSTEP_BLESS=1 cargo test --release --test golden`.

mod common;

use std::path::PathBuf;

use common::golden_cases::cases;
use lockstep::delta::{decode_tensor, encode_tensor, TensorPair};

#[test]
fn golden_blobs_are_stable() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden"));
    let bless = std::env::var_os("LOCKSTEP_BLESS").is_some();
    for c in cases() {
        let pair = TensorPair {
            dtype: c.dtype,
            shape: &c.shape,
            reference: &c.reference,
            target: &c.target,
        };
        let (blob, _) = encode_tensor(&pair, &c.opts, &lockstep::backend::cpu::CpuBackend).unwrap();
        let path = dir.join(format!("{}.lsdb", c.name));
        if bless {
            std::fs::write(&path, &blob).unwrap();
            continue;
        }
        let golden = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (bless with LOCKSTEP_BLESS=1)", path.display()));
        assert_eq!(
            decode_tensor(&golden, &c.reference, &lockstep::backend::cpu::CpuBackend).unwrap(),
            c.target,
            "{}: golden blob no longer decodes",
            c.name
        );
        assert!(
            blob == golden,
            "{}: encoder output changed ({} vs {} bytes): a format change needs a version bump",
            c.name,
            blob.len(),
            golden.len()
        );
    }
}
