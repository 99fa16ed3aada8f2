//! Summaries for `list` and `stats`: per checkpoint, and per coding stage and dtype.

use std::collections::BTreeMap;

use super::format::{BlobKind, FOOTER_LEN};
use super::reader::Archive;

/// One checkpoint as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointSummary {
    pub step: u64,
    pub label: String,
    pub keyframe: bool,
    pub files: u64,
    pub tensors: u64,
    pub input_bytes: u64,
    /// Bytes this checkpoint added to the archive (new blobs, commit record, footer; the
    /// first one also carries the file header).
    pub stored_bytes: u64,
    pub anchors: u64,
    pub deltas: u64,
    /// Tensor and file references to blobs stored by an earlier checkpoint.
    pub reused: u64,
}

/// What a checkpoint's new tensors really are, for listings: `key` (a keyframe), `delta`
/// (some tensors delta-coded), `anchor` (not a keyframe, yet every new tensor was coded
/// standalone: e.g. an fp32 checkpoint after bf16 ones, or a new tensor set), `reused`
/// (nothing new: every tensor identical to one stored before).
pub fn stored_as(keyframe: bool, anchors: u64, deltas: u64) -> &'static str {
    if keyframe {
        "key"
    } else if deltas > 0 {
        "delta"
    } else if anchors > 0 {
        "anchor"
    } else {
        "reused"
    }
}

impl CheckpointSummary {
    /// [`stored_as`] of this checkpoint.
    pub fn stored_as(&self) -> &'static str {
        stored_as(self.keyframe, self.anchors, self.deltas)
    }
}

/// Blobs of one coding stage and dtype.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageRow {
    pub kind: &'static str,
    pub dtype: String,
    pub blobs: u64,
    pub raw_bytes: u64,
    pub stored_bytes: u64,
}

/// Whole-archive statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub checkpoints: Vec<CheckpointSummary>,
    pub stages: Vec<StageRow>,
    /// Committed archive length in bytes.
    pub archive_bytes: u64,
    pub input_bytes: u64,
    /// References to an identical earlier blob, and the original bytes they stand for.
    pub dedup_refs: u64,
    pub dedup_bytes: u64,
    pub keyframe_interval: u32,
}

impl Stats {
    /// Archive bytes over input bytes.
    pub fn ratio(&self) -> f64 {
        self.archive_bytes as f64 / self.input_bytes.max(1) as f64
    }
    /// The same, leaving out the first checkpoint (the anchor), as the ULPack paper reports.
    pub fn ratio_without_anchor(&self) -> Option<f64> {
        let first = self.checkpoints.first()?;
        (self.checkpoints.len() > 1).then(|| {
            (self.archive_bytes - first.stored_bytes) as f64
                / (self.input_bytes - first.input_bytes).max(1) as f64
        })
    }
}

impl Archive {
    pub fn summaries(&self) -> Vec<CheckpointSummary> {
        let mut prev_end = 0u64;
        self.checkpoints
            .iter()
            .zip(&self.commits)
            .map(|(c, span)| {
                let end = span.offset + span.len + FOOTER_LEN as u64;
                let new = span.first_blob..span.first_blob + span.n_blobs;
                let blobs = &self.blobs[new.start as usize..new.end as usize];
                let mut refs: Vec<u64> = Vec::new();
                for f in &c.files {
                    match f {
                        super::FileRecord::Safetensors {
                            header_blob,
                            tensors,
                            ..
                        } => {
                            refs.push(*header_blob);
                            refs.extend(tensors.iter().map(|t| t.blob));
                        }
                        super::FileRecord::Verbatim { blob, .. } => refs.push(*blob),
                    }
                }
                let mut seen = std::collections::HashSet::new();
                let reused = refs
                    .iter()
                    .filter(|&&id| !new.contains(&id) || !seen.insert(id))
                    .count() as u64;
                let s = CheckpointSummary {
                    step: c.step,
                    label: c.label.clone(),
                    keyframe: c.keyframe,
                    files: c.files.len() as u64,
                    tensors: c.tensors().count() as u64,
                    input_bytes: c.input_bytes(),
                    stored_bytes: end - prev_end,
                    anchors: blobs.iter().filter(|b| b.kind == BlobKind::Anchor).count() as u64,
                    deltas: blobs.iter().filter(|b| b.kind == BlobKind::Delta).count() as u64,
                    reused,
                };
                prev_end = end;
                s
            })
            .collect()
    }

    pub fn stats(&self) -> Stats {
        let mut rows: BTreeMap<(&'static str, String), StageRow> = BTreeMap::new();
        for b in &self.blobs {
            let dtype = if b.kind == BlobKind::Bytes {
                "-".to_string()
            } else {
                b.dtype.to_string()
            };
            let r = rows
                .entry((b.kind.name(), dtype.clone()))
                .or_insert_with(|| StageRow {
                    kind: b.kind.name(),
                    dtype,
                    ..Default::default()
                });
            r.blobs += 1;
            r.raw_bytes += b.raw_len;
            r.stored_bytes += b.len;
        }
        let checkpoints = self.summaries();
        // Every reference beyond the first to a blob is a dedup hit.
        let mut seen = std::collections::HashSet::new();
        let (mut dedup_refs, mut dedup_bytes) = (0, 0);
        for c in &self.checkpoints {
            for f in &c.files {
                let ids: Vec<u64> = match f {
                    super::FileRecord::Safetensors {
                        header_blob,
                        tensors,
                        ..
                    } => std::iter::once(*header_blob)
                        .chain(tensors.iter().map(|t| t.blob))
                        .collect(),
                    super::FileRecord::Verbatim { blob, .. } => vec![*blob],
                };
                for id in ids {
                    if !seen.insert(id) {
                        dedup_refs += 1;
                        dedup_bytes += self.blobs[id as usize].raw_len;
                    }
                }
            }
        }
        Stats {
            input_bytes: checkpoints.iter().map(|c| c.input_bytes).sum(),
            checkpoints,
            stages: rows.into_values().collect(),
            archive_bytes: self.valid_end,
            dedup_refs,
            dedup_bytes,
            keyframe_interval: self.keyframe_interval,
        }
    }
}
