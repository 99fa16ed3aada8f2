#![no_main]
//! Fuzz target `model_load`; the harness is `lockstep_fuzz::model_load` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::model_load(data));
