//! Explicit aarch64 NEON paths (every Arm laptop and server: NEON is baseline on aarch64):
//! the Joint layout's lanes (`joint.rs`: a chunk's 32 lanes as eight 4-lane `u32` vectors)
//! and its neighbor form's decode lanes (`joint_near.rs`, on the same eight vectors),
//! the Paper and Signed layouts' lane decode (`chain.rs`: B, Q1, Q2 and S on the same eight
//! vectors, B's symbol counted for four lanes at once), every layout's codes-and-tails pass
//! and the Paper and Signed layouts' encoding lanes (`encode.rs`), every layout's tail pass
//! (`decode.rs`), each beside the portable function it must equal. Same operations in the
//! same order as `format::chunk`, so the same bytes as the portable level (checked under
//! qemu by `cargo xtask cross`, `tests/backend_parity.rs`'s `neon` module on an aarch64
//! build and the unit tests here). Only called when [`super::Isa::Neon`] is available.
//!
//! Left to the portable code: the histograms' index passes, which compile to NEON at
//! baseline aarch64 already (vector `clz`, variable shifts; their increments are scattered,
//! and NEON has no scatter); the neighbor form's encoding lanes.
//!
//! What NEON lacks next to AVX2, and what stands in for it:
//! - gathers: each lane's table lookup is a scalar load (AVX2's gathers are microcoded into
//!   as many loads anyway), or a lane load (`vld1q_lane_u32`) straight into the vector; the
//!   state arithmetic, the flush and the refill are vectors;
//! - `movemask`: the compare result ANDed with the lane bits `1, 2, 4, 8` and summed
//!   across the vector (`vaddvq_u32`); where counts are wanted (B's symbol), the compares'
//!   all-ones lanes summed by pairwise adds instead;
//! - the compressing store: a byte table lookup (`vtbl1_u8`) keyed by the 4-bit flush mask
//!   moves the flushed words to the top of a 4-word block stored to end at the cursor.
//!
//! Speed on Arm has not been measured (no Arm machine here; qemu is not a CPU):
//! `cargo run --release -p lockstep-measure -- stages --isa neon` on an Arm machine does.

pub mod chain;
pub mod decode;
pub mod encode;
pub mod joint;
pub mod joint_near;
