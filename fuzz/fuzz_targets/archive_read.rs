#![no_main]
//! Fuzz target `archive_read`; the harness is `lockstep_fuzz::archive_read` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::archive_read(data));
