#![no_main]
//! Fuzz target `lsd_read`; the harness is `lockstep_fuzz::lsd_read` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::lsd_read(data));
