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
//! ```
//! use lockstep::archive::{self, Archive, PackOptions};
//! # use safetensors::tensor::{serialize, Dtype, TensorView};
//! # let dir = tempfile::tempdir()?;
//! # let ckpt = |step: u32| {
//! #     let w: Vec<u8> = (0..4096u32)
//! #         .flat_map(|i| half::bf16::from_f32(((i * 7919 % 1000) as f32 - 500.0) * 1e-4 + step as f32 * 1e-5).to_le_bytes())
//! #         .collect();
//! #     let path = dir.path().join(format!("step{step}.safetensors"));
//! #     let view = TensorView::new(Dtype::BF16, vec![64, 64], &w).unwrap();
//! #     std::fs::write(&path, serialize([("w", view)], None).unwrap()).unwrap();
//! #     path
//! # };
//! let (a, b, c) = (ckpt(100), ckpt(200), ckpt(300)); // step100.safetensors, ...
//! let run = dir.path().join("run.lstp");
//!
//! // Pack two checkpoints (steps parsed from the names), append a third later.
//! let sources = archive::resolve_many(&[a, b.clone()])?;
//! archive::pack(&run, &sources, None, &PackOptions::default(), &|_bytes| {})?;
//! archive::append(&run, &archive::resolve(&c)?, None, &PackOptions::default(), &|_| {})?;
//!
//! // Restore step 200 byte for byte, read one tensor, check everything.
//! let ar = Archive::open(&run)?;
//! assert_eq!(ar.checkpoints.len(), 3);
//! let out = dir.path().join("restored.safetensors");
//! ar.extract(200, &out, &|_| {})?;
//! assert_eq!(std::fs::read(&out)?, std::fs::read(&b)?);
//! assert_eq!(ar.tensor(300, "w")?.len(), 4096 * 2);
//! assert!(ar.verify(&|_| {})?.ok());
//! println!("ratio {:.3}", ar.stats().ratio());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod format;
pub mod input;
pub mod inspect;
pub mod reader;
pub mod stats;
pub mod writer;

pub use format::{
    BlobKind, BlobRecord, CheckpointRecord, FileMeta, FileRecord, Layout, TensorRecord,
};
pub use input::{resolve, resolve_many, sort_by_step, CheckpointSource};
pub use inspect::{Change, Coding, Contents, Diff, FileDiff, FileInfo, TensorDiff, TensorInfo};
pub use reader::{default_max_size, Archive, Damage, ExtractOptions, Tail, VerifyReport};
pub use stats::{stored_as, CheckpointSummary, Stats};
pub use writer::{
    append, append_with_previous, pack, repair, AddReport, PackOptions, Repaired,
    DEFAULT_KEYFRAME_INTERVAL,
};
