#![no_main]
//! Fuzz target `safetensors_input`; the harness is `lockstep_fuzz::safetensors_input` (fuzz/src/lib.rs).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| lockstep_fuzz::safetensors_input(data));
