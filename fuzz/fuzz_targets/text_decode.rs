#![no_main]
//! Fuzz target `text_decode`; the harness is `lockstep_fuzz::text_decode` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::text_decode(data));
