//! Looking inside an archive without restoring whole checkpoints: every file and tensor of a
//! checkpoint with how it is stored (`list --tensors`), what changed between two steps
//! (`diff`), and one file or one tensor written out on its own (`extract --file/--tensor`).
//!
//! Listing and diffing read only the index (the commit records): no blob is decoded, except
//! for the optional element count of [`Archive::diff`].

use std::collections::{HashMap, HashSet};
use std::path::Path;

use rayon::prelude::*;

use super::format::*;
use super::reader::{check_target_file, Archive, ExtractOptions};
use crate::dtype::DType;
use crate::output::AtomicFile;
use crate::{Error, Result};

/// How a tensor or file of a checkpoint is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// A new blob, coded standalone by the anchor codec.
    Anchor,
    /// A new blob, coded by the delta codec against the previous checkpoint's tensor.
    Delta,
    /// New verbatim bytes (zstd): a safetensors header or a non-tensor file.
    Bytes,
    /// Identical to a blob stored earlier (by an earlier checkpoint, or earlier in this
    /// one): costs only its index entry.
    Reused,
}

impl Coding {
    pub fn name(self) -> &'static str {
        match self {
            Coding::Anchor => "anchor",
            Coding::Delta => "delta",
            Coding::Bytes => "bytes",
            Coding::Reused => "reused",
        }
    }
}

/// One tensor of a checkpoint, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The file (inside the checkpoint) that holds it.
    pub file: String,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Its bytes in the checkpoint.
    pub raw_bytes: u64,
    /// Bytes this checkpoint stored for it (0 when reused).
    pub stored_bytes: u64,
    pub coding: Coding,
    pub blob: u64,
    /// The step of the checkpoint that stored the blob.
    pub stored_at: u64,
    /// Delta blobs: the step whose tensor is the reference.
    pub reference_step: Option<u64>,
    /// Blobs to decode to restore it, this one included.
    pub chain: u32,
}

/// One file of a checkpoint, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub path: String,
    /// `safetensors` (rebuilt from its header and tensors) or `verbatim`.
    pub kind: &'static str,
    pub len: u64,
    pub hash: [u8; 32],
    pub meta: Option<FileMeta>,
    pub tensors: u64,
    /// Bytes this checkpoint stored for the file: its new blobs (header, tensors or bytes).
    pub stored_bytes: u64,
    /// How its bytes blob is stored (safetensors files: their header blob).
    pub coding: Coding,
}

/// Every file and tensor of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contents {
    pub step: u64,
    pub label: String,
    pub layout: Layout,
    pub keyframe: bool,
    pub files: Vec<FileInfo>,
    pub tensors: Vec<TensorInfo>,
}

/// How a tensor or file differs between two steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Same bytes (the same blob, or blobs with the same BLAKE3), same dtype and shape.
    Same,
    /// Same dtype and shape, different bytes.
    Changed,
    /// A different dtype or shape.
    Retyped,
    Added,
    Removed,
}

impl Change {
    pub fn name(self) -> &'static str {
        match self {
            Change::Same => "same",
            Change::Changed => "changed",
            Change::Retyped => "retyped",
            Change::Added => "added",
            Change::Removed => "removed",
        }
    }
}

/// One tensor in [`Diff`], matched by name across the two checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDiff {
    pub name: String,
    pub change: Change,
    /// dtype and shape at each step (`None` where absent).
    pub a: Option<(DType, Vec<u64>)>,
    pub b: Option<(DType, Vec<u64>)>,
    /// Its bytes at the second step (the first for removed tensors).
    pub raw_bytes: u64,
    /// The stored size of its blob at the second step (a delta's size measures the change;
    /// 0 for removed tensors).
    pub stored_bytes: u64,
    /// With `elements`: how many elements differ bitwise, of `elements`.
    pub changed_elements: Option<u64>,
    pub elements: u64,
}

/// One file in [`Diff`], matched by path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDiff {
    pub path: String,
    pub change: Change,
    pub len_a: Option<u64>,
    pub len_b: Option<u64>,
    /// The permission bits differ (both recorded).
    pub mode_changed: bool,
}

/// What changed between two checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    pub step_a: u64,
    pub step_b: u64,
    pub files: Vec<FileDiff>,
    pub tensors: Vec<TensorDiff>,
}

impl Diff {
    pub fn count(&self, c: Change) -> usize {
        self.tensors.iter().filter(|t| t.change == c).count()
    }
}

/// Which checkpoint (by index) stored each blob.
fn blob_owners(a: &Archive) -> Vec<usize> {
    let mut owner = vec![0; a.blobs.len()];
    for (i, span) in a.commits.iter().enumerate() {
        for id in span.first_blob..span.first_blob + span.n_blobs {
            owner[id as usize] = i;
        }
    }
    owner
}

impl Archive {
    /// Every file and tensor of the checkpoint at `step`, with how each is stored. Reads the
    /// index only.
    pub fn contents(&self, step: u64) -> Result<Contents> {
        let idx = self
            .checkpoints
            .iter()
            .position(|c| c.step == step)
            .ok_or_else(|| self.checkpoint(step).err().unwrap())?;
        let ck = &self.checkpoints[idx];
        let owner = blob_owners(self);
        let mut seen = HashSet::new();
        // A blob is new here the first time this checkpoint names it, if its commit stored it.
        let mut coding = |id: u64| -> (Coding, u64) {
            let b = &self.blobs[id as usize];
            if owner[id as usize] != idx || !seen.insert(id) {
                return (Coding::Reused, 0);
            }
            let c = match b.kind {
                BlobKind::Anchor => Coding::Anchor,
                BlobKind::Delta => Coding::Delta,
                BlobKind::Bytes => Coding::Bytes,
            };
            (c, b.len)
        };
        let mut files = Vec::new();
        let mut tensors = Vec::new();
        for f in &ck.files {
            let (kind, own, ts) = match f {
                FileRecord::Safetensors {
                    header_blob,
                    tensors,
                    ..
                } => ("safetensors", *header_blob, tensors.as_slice()),
                FileRecord::Verbatim { blob, .. } => ("verbatim", *blob, &[][..]),
            };
            let (fc, mut stored) = coding(own);
            for t in ts {
                let (c, s) = coding(t.blob);
                stored += s;
                let b = &self.blobs[t.blob as usize];
                tensors.push(TensorInfo {
                    file: f.path().to_string(),
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    raw_bytes: b.raw_len,
                    stored_bytes: s,
                    coding: c,
                    blob: t.blob,
                    stored_at: self.checkpoints[owner[t.blob as usize]].step,
                    reference_step: b
                        .reference
                        .map(|r| self.checkpoints[owner[r as usize]].step),
                    chain: b.depth + 1,
                });
            }
            files.push(FileInfo {
                path: f.path().to_string(),
                kind,
                len: f.len(),
                hash: *f.hash(),
                meta: f.meta().copied(),
                tensors: ts.len() as u64,
                stored_bytes: stored,
                coding: fc,
            });
        }
        Ok(Contents {
            step: ck.step,
            label: ck.label.clone(),
            layout: ck.layout,
            keyframe: ck.keyframe,
            files,
            tensors,
        })
    }

    /// What changed from the checkpoint at `step_a` to the one at `step_b`: tensors matched
    /// by name, files by path, compared by their stored BLAKE3 (the index only). With
    /// `elements`, every changed tensor of unchanged dtype and shape is also decoded at both
    /// steps (hash-checked; at most `2 × keyframe_interval` blobs each) and its elements
    /// compared bitwise.
    pub fn diff(&self, step_a: u64, step_b: u64, elements: bool) -> Result<Diff> {
        let (ca, cb) = (self.checkpoint(step_a)?, self.checkpoint(step_b)?);
        fn by_name(c: &CheckpointRecord) -> HashMap<&str, &TensorRecord> {
            c.tensors().map(|t| (t.name.as_str(), t)).collect()
        }
        let (ta, tb) = (by_name(ca), by_name(cb));
        let mut tensors = Vec::new();
        for t in cb.tensors() {
            let bb = &self.blobs[t.blob as usize];
            let n = t.shape.iter().product::<u64>();
            let (change, a) = match ta.get(t.name.as_str()) {
                None => (Change::Added, None),
                Some(p) => {
                    let ba = &self.blobs[p.blob as usize];
                    let change = if p.dtype != t.dtype || p.shape != t.shape {
                        Change::Retyped
                    } else if p.blob == t.blob || (ba.hash == bb.hash && ba.raw_len == bb.raw_len) {
                        Change::Same
                    } else {
                        Change::Changed
                    };
                    (change, Some((p.dtype, p.shape.clone())))
                }
            };
            tensors.push(TensorDiff {
                name: t.name.clone(),
                change,
                a,
                b: Some((t.dtype, t.shape.clone())),
                raw_bytes: bb.raw_len,
                stored_bytes: bb.len,
                changed_elements: None,
                elements: n,
            });
        }
        for t in ca.tensors().filter(|t| !tb.contains_key(t.name.as_str())) {
            tensors.push(TensorDiff {
                name: t.name.clone(),
                change: Change::Removed,
                a: Some((t.dtype, t.shape.clone())),
                b: None,
                raw_bytes: self.blobs[t.blob as usize].raw_len,
                stored_bytes: 0,
                changed_elements: None,
                elements: t.shape.iter().product(),
            });
        }
        if elements {
            let counts: Vec<(usize, Result<u64>)> = tensors
                .par_iter()
                .enumerate()
                .filter(|(_, t)| matches!(t.change, Change::Changed | Change::Same))
                .map(|(i, t)| {
                    let name = t.name.as_str();
                    if t.change == Change::Same {
                        return (i, Ok(0));
                    }
                    let r = (|| {
                        let x = self.decode_blob(ta[name].blob)?;
                        let y = self.decode_blob(tb[name].blob)?;
                        let w = tb[name].dtype.size().max(1);
                        Ok(x.chunks(w).zip(y.chunks(w)).filter(|(p, q)| p != q).count() as u64)
                    })();
                    (i, r)
                })
                .collect();
            for (i, r) in counts {
                tensors[i].changed_elements =
                    Some(r.map_err(|e| {
                        Error::Invalid(format!("tensor '{}': {e}", tensors[i].name))
                    })?);
            }
        }
        // Files match by path; two single-file checkpoints (step100.safetensors,
        // step200.safetensors) compare their one file whatever its name.
        let single = |c: &CheckpointRecord| c.layout == Layout::SingleFile && c.files.len() == 1;
        let fa: HashMap<&str, &FileRecord> = if single(ca) && single(cb) {
            [(cb.files[0].path(), &ca.files[0])].into()
        } else {
            ca.files.iter().map(|f| (f.path(), f)).collect()
        };
        let fb: HashSet<&str> = cb.files.iter().map(|f| f.path()).collect();
        let mut files = Vec::new();
        for f in &cb.files {
            let (change, len_a, mode_changed) = match fa.get(f.path()) {
                None => (Change::Added, None, false),
                Some(p) => (
                    if p.hash() == f.hash() && p.len() == f.len() {
                        Change::Same
                    } else {
                        Change::Changed
                    },
                    Some(p.len()),
                    matches!((p.meta(), f.meta()), (Some(x), Some(y)) if x.permissions() != y.permissions()),
                ),
            };
            files.push(FileDiff {
                path: f.path().to_string(),
                change,
                len_a,
                len_b: Some(f.len()),
                mode_changed,
            });
        }
        let removed = ca.files.iter().filter(|f| !fb.contains(f.path()));
        for f in removed.filter(|_| !(single(ca) && single(cb))) {
            files.push(FileDiff {
                path: f.path().to_string(),
                change: Change::Removed,
                len_a: Some(f.len()),
                len_b: None,
                mode_changed: false,
            });
        }
        Ok(Diff {
            step_a,
            step_b,
            files,
            tensors,
        })
    }

    /// Write one file of the checkpoint at `step` (its path inside the checkpoint, as
    /// `list --step` shows it) to `out` (inside `out` if that is a directory), hash-checked,
    /// with its stored mode and time. Returns the bytes written.
    pub fn extract_file(
        &self,
        step: u64,
        path: &str,
        out: &Path,
        opts: &ExtractOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        let ck = self.checkpoint(step)?;
        let f = ck.files.iter().find(|f| f.path() == path).ok_or_else(|| {
            let names: Vec<&str> = ck.files.iter().map(|f| f.path()).collect();
            Error::Invalid(format!(
                "step {step} has no file '{path}' (files: {})",
                names.join(", ")
            ))
        })?;
        let dest = if out.is_dir() {
            out.join(path.rsplit('/').next().unwrap_or(path))
        } else {
            out.to_path_buf()
        };
        check_target_file(&dest, opts.force)?;
        self.extract_one(step, f, &dest, progress)
    }

    /// Write one tensor of the checkpoint at `step` to `out`: a safetensors file holding just
    /// that tensor (same name, dtype and shape), or with `raw` its bytes alone (little-endian,
    /// row-major, as in the checkpoint). Decoded and hash-checked. Returns the tensor's bytes.
    pub fn extract_tensor(
        &self,
        step: u64,
        name: &str,
        out: &Path,
        raw: bool,
        opts: &ExtractOptions,
    ) -> Result<u64> {
        let ck = self.checkpoint(step)?;
        let t = ck.tensors().find(|t| t.name == name).ok_or_else(|| {
            Error::Invalid(format!(
                "step {step} has no tensor '{name}' (`lockstep list --tensors --step {step}` \
                 lists them)"
            ))
        })?;
        check_target_file(out, opts.force)?;
        let data = self.decode_blob(t.blob)?;
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let mut af = AtomicFile::create(out)?;
        if !raw {
            af.write_all(&one_tensor_header(t, data.len() as u64))?;
        }
        af.write_all(&data)?;
        af.commit()?;
        Ok(data.len() as u64)
    }
}

/// The 8-byte length and JSON header of a safetensors file holding only `t`.
fn one_tensor_header(t: &TensorRecord, len: u64) -> Vec<u8> {
    let entry = serde_json::json!({
        "dtype": t.dtype.safetensors_name(),
        "shape": t.shape,
        "data_offsets": [0, len],
    });
    let mut map = serde_json::Map::new();
    map.insert(t.name.clone(), entry);
    let mut json = serde_json::to_string(&map).expect("JSON of strings and numbers");
    while !json.len().is_multiple_of(8) {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out
}
