//! Trajectory archives: a whole training run in one file, appendable while training goes on,
//! any step restorable byte for byte.
//!
//! - The first checkpoint, and every K-th after it (keyframes), is coded standalone by the
//!   [`crate::anchor`] codec; every other checkpoint's tensors are coded by [`crate::delta`]
//!   against the same tensor of the previous checkpoint. Restoring a step decodes at most K
//!   blobs per tensor.
//! - Blobs are content-addressed by the BLAKE3 of the original bytes: a tensor identical to
//!   one stored before (frozen layers, tied weights, a checkpoint saved twice) is stored once.
//!   Blobs are per tensor, so batching never changes them.
//! - safetensors headers and every other file of a checkpoint (configs, tokenizer files,
//!   shard indexes) are stored verbatim (zstd), so extraction is byte-identical.
//! - An append writes new blobs after the last commit, then a commit record and a footer;
//!   readers use the last valid footer, so a crash at any point leaves the archive as it was.
//!
//! The byte layout is in docs/FORMAT.md ("Trajectory archive").
//!
//! ```no_run
//! use lockstep::archive::{self, Archive, PackOptions};
//! use std::path::Path;
//!
//! // Pack two checkpoints, add a third later, restore the second.
//! let sources = archive::resolve_many(&["run/step100.safetensors".into(), "run/step200.safetensors".into()])?;
//! archive::pack(Path::new("run.lstp"), &sources, None, &PackOptions::default(), &|_| {})?;
//! let next = archive::resolve(Path::new("run/step300.safetensors"))?;
//! archive::append(Path::new("run.lstp"), &next, None, &PackOptions::default(), &|_| {})?;
//! let a = Archive::open("run.lstp")?;
//! a.extract(200, Path::new("restored.safetensors"), &|_| {})?;
//! assert!(a.verify(&|_| {}).damaged.is_empty());
//! # Ok::<(), lockstep::Error>(())
//! ```

pub mod format;
pub mod input;
pub mod reader;
pub mod stats;
pub mod writer;

pub use format::{BlobKind, BlobRecord, CheckpointRecord, FileRecord, Layout, TensorRecord};
pub use input::{resolve, resolve_many, CheckpointSource};
pub use reader::{Archive, Damage, VerifyReport};
pub use stats::{CheckpointSummary, Stats};
pub use writer::{append, pack, AddReport, PackOptions, DEFAULT_KEYFRAME_INTERVAL};
