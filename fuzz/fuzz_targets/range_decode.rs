#![no_main]
//! Fuzz target `range_decode`; the harness is `lockstep_fuzz::range_decode` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::range_decode(data));
