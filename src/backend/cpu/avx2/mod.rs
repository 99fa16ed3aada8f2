//! Explicit AVX2 paths (8 lanes per vector) for CPUs without AVX-512; see `../avx512` for
//! the design they follow and the comments in each file for what AVX2 lacks.

pub mod decode;
