//! Explicit AVX-512 (F, BW, VL, CD) versions of the rANS lane loops: a chunk's 32 lanes
//! are two 16-lane vectors, the shared word stream is read with an expanding load and
//! written with a compressing store in lane order, and the table lookups are gathers.
//! Same operations in the same order as `format::chunk`, so the same bytes; only called
//! when [`super::Isa::Avx512`] is available.

pub mod decode;
pub mod encode;
pub mod joint;
pub mod joint_near;
