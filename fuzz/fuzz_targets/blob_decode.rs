#![no_main]
//! Fuzz target `blob_decode`; the harness is `lockstep_fuzz::blob_decode` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::blob_decode(data));
