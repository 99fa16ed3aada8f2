//! The text-codec tests' model fixtures and golden-stream check, shared by the test files
//! that include this file beside `lm_common/random_model.rs` (as `mod models;` and
//! `mod random_model;` at the crate root).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use lockstep::format::lm::model_file::Model;

use crate::random_model::random_model;

/// A small random integer model with context 16, so the LM's context restarts from its last
/// half every few words.
pub fn small() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| random_model(2, 16, 2, 16, 50257, 1))
}

/// The shipped tinygpt2 model.
pub fn shipped() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let b = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/models/tinygpt2.lsm")).unwrap();
        Model::from_bytes(&b).unwrap()
    })
}

/// `coded`, the encoding of `data`, against the golden stream `tests/golden/NAME`: the golden
/// must still decode (by `decode`) to `data`, and the encoder must still write it byte for
/// byte. `LOCKSTEP_BLESS=1` writes it instead (a deliberate change, with a version bump).
pub fn check_golden(
    name: &str,
    what: &str,
    coded: &[u8],
    data: &[u8],
    decode: impl Fn(&[u8]) -> Vec<u8>,
) {
    let golden = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden")).join(name);
    if std::env::var_os("LOCKSTEP_BLESS").is_some() {
        std::fs::write(&golden, coded).unwrap();
        return;
    }
    let g = std::fs::read(&golden)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with LOCKSTEP_BLESS=1)", golden.display()));
    assert_eq!(
        decode(&g),
        data,
        "the golden {what} stream no longer decodes"
    );
    assert!(coded == g, "{what} stream: encoder output changed");
}
