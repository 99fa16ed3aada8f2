//! Explicit AVX2 version of the rANS encoding lanes, for CPUs without AVX-512 (AMD Zen 2/3,
//! Intel client cores): the design of `super::avx512::encode` on 8-lane vectors, a chunk's
//! 32 lanes as four of them. Same operations in the same order as `delta::chunk`, so the
//! same bytes; only called when [`super::Isa::Avx2`] is available.

pub mod encode;
