#![no_main]
//! Fuzz target `rans_decode`; the harness is `lockstep_fuzz::rans_decode` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::rans_decode(data));
