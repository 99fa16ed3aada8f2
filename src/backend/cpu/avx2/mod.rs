//! Explicit AVX2 paths for CPUs without AVX-512 (AMD Zen 2/3, Intel client cores): the
//! designs of `super::avx512` on 8-lane vectors, a chunk's 32 lanes as four of them. Same
//! operations in the same order as `format::chunk`, so the same bytes; only called when
//! [`super::Isa::Avx2`] is available. Each file's comments say what AVX2 lacks and what
//! replaces it.

pub(in crate::backend::cpu) mod crc;
pub mod decode;
pub mod encode;
mod gather;
pub mod hist;
pub mod joint;
pub mod joint_near;
