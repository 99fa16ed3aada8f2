//! Adding checkpoints: `pack` (a new archive, written to a temporary file and renamed into
//! place) and `append` (new blobs after the last commit, then a new commit and footer).

use crate::backend::Device;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;

use super::format::*;
use super::input::CheckpointSource;
use super::reader::{encode_bytes_blob, Archive, Tail};
use crate::checkpoint::Checkpoint;
use crate::delta::{self, EncodeOptions, Mode, TensorPair};
use crate::dtype::DType;
use crate::{anchor, Error, Result};

/// Test hook: when set to N, the process writes exactly N bytes of an append or pack and then
/// aborts (as if killed at that point). Used by the crash-safety tests.
pub const ABORT_ENV: &str = "LOCKSTEP_ABORT_AFTER_BYTES";

/// Default distance between keyframes (checkpoints coded standalone).
pub const DEFAULT_KEYFRAME_INTERVAL: u32 = 8;

/// How checkpoints are coded. None of it is needed to decode.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Every K-th checkpoint (the first included) is a keyframe, so restoring any step decodes
    /// at most K blobs per tensor. Fixed when the archive is created.
    pub keyframe_interval: u32,
    pub delta: EncodeOptions,
    /// Tensors are encoded in parallel in batches of this many bytes (changes memory and
    /// speed, never the bytes written).
    pub batch_bytes: usize,
    /// `pack`: replace an existing file at the output path.
    pub overwrite: bool,
    /// Also code delta-eligible tensors standalone and keep the smaller blob (slower encode;
    /// pays early in training when checkpoints are far apart).
    pub try_anchor: bool,
    /// Where tensors are coded (and, when appending, the archive's blobs decoded).
    pub device: Device,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            keyframe_interval: DEFAULT_KEYFRAME_INTERVAL,
            delta: EncodeOptions::default(),
            batch_bytes: delta::DEFAULT_BATCH_BYTES,
            overwrite: false,
            try_anchor: false,
            device: Device::cpu(),
        }
    }
}

/// What adding one checkpoint did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AddReport {
    pub step: u64,
    pub label: String,
    pub keyframe: bool,
    pub input_bytes: u64,
    /// Bytes this checkpoint added to the archive (blobs, commit record, footer).
    pub stored_bytes: u64,
    pub anchors: u64,
    pub deltas: u64,
    /// Tensors and files stored by reference to an identical earlier blob.
    pub reused: u64,
    pub seconds: f64,
}

/// The archive output: buffered, position-tracking, with the crash test hook.
struct Out {
    file: File,
    path: PathBuf,
    pos: u64,
    buf: Vec<u8>,
    written: u64,
    abort_after: Option<u64>,
}

impl Out {
    fn new(file: File, path: &Path, pos: u64) -> Out {
        Out {
            file,
            path: path.to_path_buf(),
            pos,
            buf: Vec::new(),
            written: 0,
            abort_after: std::env::var(ABORT_ENV).ok().and_then(|v| v.parse().ok()),
        }
    }
    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(b);
        self.pos += b.len() as u64;
        if self.buf.len() >= 8 << 20 {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        if let Some(limit) = self.abort_after {
            if self.written + self.buf.len() as u64 > limit {
                let k = (limit - self.written) as usize;
                let _ = self.file.write_all(&self.buf[..k]);
                let _ = self.file.sync_data();
                std::process::abort();
            }
        }
        self.file
            .write_all(&self.buf)
            .map_err(|e| Error::io(&self.path, e))?;
        self.written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
    fn sync(&mut self) -> Result<()> {
        self.flush()?;
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }
}

/// The index being extended.
struct State<'a> {
    /// The archive being appended to: a blob of it is checked before it is reused.
    existing: Option<&'a Archive>,
    k: u32,
    blobs: Vec<BlobRecord>,
    checkpoints: Vec<CheckpointRecord>,
    prev_end: u64,
    tensor_dedup: HashMap<([u8; 32], u8), u64>,
    bytes_dedup: HashMap<[u8; 32], u64>,
}

impl<'a> State<'a> {
    fn new(k: u32) -> State<'a> {
        State {
            existing: None,
            k,
            blobs: Vec::new(),
            checkpoints: Vec::new(),
            prev_end: 0,
            tensor_dedup: HashMap::new(),
            bytes_dedup: HashMap::new(),
        }
    }
    fn from_archive(a: &'a Archive) -> State<'a> {
        let mut s = State::new(a.keyframe_interval);
        s.existing = Some(a);
        s.checkpoints = a.checkpoints.clone();
        s.prev_end = a.valid_end;
        for (id, b) in a.blobs.iter().enumerate() {
            s.remember(id as u64, b);
        }
        s.blobs = a.blobs.clone();
        s
    }
    fn remember(&mut self, id: u64, b: &BlobRecord) {
        match b.kind {
            BlobKind::Bytes => self.bytes_dedup.entry(b.hash).or_insert(id),
            _ => self
                .tensor_dedup
                .entry((b.hash, b.dtype.code()))
                .or_insert(id),
        };
    }
    /// A blob already in the archive is reused only if its stored bytes are intact: otherwise
    /// the new checkpoint would inherit damage it does not have (found by fuzzing).
    fn check_reuse(&self, id: u64) -> Result<()> {
        match self.existing {
            Some(a) if id < a.blobs.len() as u64 => a.check_stored(id).map_err(|e| {
                e.context(format!(
                    "{}: the new checkpoint would reuse a damaged blob of the archive (run \
                     `lockstep verify`); nothing appended",
                    a.path.display()
                ))
            }),
            _ => Ok(()),
        }
    }
    fn push_blob(&mut self, out: &mut Out, rec: BlobRecord, bytes: &[u8]) -> Result<u64> {
        let id = self.blobs.len() as u64;
        let rec = BlobRecord {
            offset: out.pos,
            len: bytes.len() as u64,
            ..rec
        };
        out.write(bytes)?;
        self.remember(id, &rec);
        self.blobs.push(rec);
        Ok(id)
    }
    fn add_bytes(&mut self, out: &mut Out, bytes: &[u8], reused: &mut u64) -> Result<u64> {
        let hash = *crate::bytes::blake3(bytes).as_bytes();
        if let Some(&id) = self.bytes_dedup.get(&hash) {
            self.check_reuse(id)?;
            *reused += 1;
            return Ok(id);
        }
        let blob = encode_bytes_blob(bytes)?;
        let rec = BlobRecord {
            offset: 0,
            len: 0,
            kind: BlobKind::Bytes,
            reference: None,
            depth: 0,
            dtype: DType::U8,
            raw_len: bytes.len() as u64,
            hash,
        };
        self.push_blob(out, rec, &blob)
    }
}

/// Where the previous checkpoint's tensor bytes come from: its files (pack) or the archive.
enum Pred<'a> {
    Files(&'a [Option<Checkpoint>]),
    Archive(&'a Archive),
}

/// A checkpoint source with its safetensors files opened (memory-mapped).
struct Opened {
    cks: Vec<Option<Checkpoint>>,
}

fn open_source(src: &CheckpointSource) -> Result<Opened> {
    if src.files.is_empty() {
        return Err(Error::Invalid(format!("{}: no files", src.label)));
    }
    let mut cks = Vec::new();
    for f in &src.files {
        super::reader::safe_rel_path(&f.rel)?;
        cks.push(if f.safetensors {
            let ck = Checkpoint::open(&f.path)?;
            check_contiguous(&ck)?;
            Some(ck)
        } else {
            None
        });
    }
    Ok(Opened { cks })
}

/// The file must be exactly header + tensor data back to back, so it can be rebuilt.
fn check_contiguous(ck: &Checkpoint) -> Result<()> {
    let mut pos = ck.header_bytes().len();
    for t in &ck.tensors {
        if t.start != pos {
            return Err(Error::Unsupported(format!(
                "{}: tensor '{}' does not start where the previous data ended (gaps in the data section)",
                ck.path.display(),
                t.name
            )));
        }
        pos = t.end;
    }
    if pos != ck.file_len() {
        return Err(Error::Unsupported(format!(
            "{}: {} bytes after the last tensor",
            ck.path.display(),
            ck.file_len() - pos
        )));
    }
    Ok(())
}

enum Plan<'a> {
    Reuse(u64),
    SameAs(usize),
    Encode(Option<&'a TensorRecord>),
}

struct Coded {
    kind: BlobKind,
    bytes: Vec<u8>,
    reference: Option<u64>,
    depth: u32,
}

fn encode_one(
    t: &crate::checkpoint::TensorEntry,
    data: &[u8],
    pred: Option<&TensorRecord>,
    pred_src: &Pred,
    pred_names: &HashMap<&str, (usize, usize)>,
    state_blobs: &[BlobRecord],
    opts: &PackOptions,
) -> Result<Coded> {
    if let Some(p) = pred {
        let reference: std::borrow::Cow<[u8]> = match pred_src {
            Pred::Files(cks) => {
                let (fi, ti) = pred_names[p.name.as_str()];
                let ck = cks[fi].as_ref().expect("safetensors file");
                std::borrow::Cow::Borrowed(ck.data(&ck.tensors[ti]))
            }
            Pred::Archive(a) => std::borrow::Cow::Owned(a.decode_blob(p.blob)?),
        };
        let pair = TensorPair {
            dtype: t.dtype,
            shape: &t.shape,
            reference: &reference,
            target: data,
        };
        let (bytes, rep) = delta::encode_tensor(&pair, &opts.delta, opts.device.delta()?)
            .map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
        let keep = rep.mode != Some(Mode::Raw)
            && (!opts.try_anchor || {
                let (a, _) = anchor::encode(t.dtype, &t.shape, data)
                    .map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
                if a.len() < bytes.len() {
                    return Ok(Coded {
                        kind: BlobKind::Anchor,
                        bytes: a,
                        reference: None,
                        depth: 0,
                    });
                }
                true
            });
        if keep {
            return Ok(Coded {
                kind: BlobKind::Delta,
                bytes,
                reference: Some(p.blob),
                depth: state_blobs[p.blob as usize].depth + 1,
            });
        }
    }
    let (bytes, _) = anchor::encode(t.dtype, &t.shape, data)
        .map_err(|e| e.context(format!("tensor '{}'", t.name)))?;
    Ok(Coded {
        kind: BlobKind::Anchor,
        bytes,
        reference: None,
        depth: 0,
    })
}

#[allow(clippy::too_many_arguments)]
fn add_checkpoint(
    state: &mut State,
    out: &mut Out,
    src: &CheckpointSource,
    opened: &Opened,
    step: u64,
    pred_src: Option<Pred>,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<AddReport> {
    let t0 = Instant::now();
    let start = out.pos;
    if let Some(last) = state.checkpoints.last() {
        if step <= last.step {
            return Err(Error::Invalid(format!(
                "{}: step {step} is not after the archive's last step {} (give --step)",
                src.label, last.step
            )));
        }
    }
    let keyframe = state.checkpoints.len().is_multiple_of(state.k as usize);
    let first_blob = state.blobs.len() as u64;
    let mut report = AddReport {
        step,
        label: src.label.clone(),
        keyframe,
        ..Default::default()
    };

    // The previous checkpoint's tensors by name, and where their bytes live.
    let prev = state.checkpoints.last().cloned();
    let prev_tensors: HashMap<&str, &TensorRecord> = prev
        .iter()
        .flat_map(|c| c.tensors())
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut pred_names: HashMap<&str, (usize, usize)> = HashMap::new();
    if let Some(Pred::Files(cks)) = &pred_src {
        for (fi, ck) in cks.iter().enumerate() {
            for (ti, t) in ck.iter().flat_map(|c| c.tensors.iter().enumerate()) {
                pred_names.insert(t.name.as_str(), (fi, ti));
            }
        }
    }

    let mut files = Vec::new();
    for (sf, ck) in src.files.iter().zip(&opened.cks) {
        let Some(ck) = ck else {
            let bytes = std::fs::read(&sf.path).map_err(|e| Error::io(&sf.path, e))?;
            let blob = state.add_bytes(out, &bytes, &mut report.reused)?;
            progress(bytes.len() as u64);
            report.input_bytes += bytes.len() as u64;
            files.push(FileRecord::Verbatim {
                path: sf.rel.clone(),
                blob,
                len: bytes.len() as u64,
                hash: *crate::bytes::blake3(&bytes).as_bytes(),
                meta: file_meta(&sf.path)?,
            });
            continue;
        };
        let header_blob = state.add_bytes(out, ck.header_bytes(), &mut report.reused)?;
        let hashes: Vec<[u8; 32]> = ck
            .tensors
            .par_iter()
            .map(|t| *crate::bytes::blake3(ck.data(t)).as_bytes())
            .collect();
        let mut plans = Vec::with_capacity(ck.tensors.len());
        let mut in_file: HashMap<([u8; 32], u8), usize> = HashMap::new();
        for (i, (t, h)) in ck.tensors.iter().zip(&hashes).enumerate() {
            let key = (*h, t.dtype.code());
            plans.push(if let Some(&id) = state.tensor_dedup.get(&key) {
                state.check_reuse(id)?;
                Plan::Reuse(id)
            } else if let Some(&j) = in_file.get(&key) {
                Plan::SameAs(j)
            } else {
                in_file.insert(key, i);
                let pred = prev_tensors.get(t.name.as_str()).copied().filter(|p| {
                    !keyframe
                        && p.dtype == t.dtype
                        && p.shape == t.shape
                        && state.blobs[p.blob as usize].depth + 1 < state.k
                        && (!matches!(pred_src, Some(Pred::Files(_)))
                            || pred_names.contains_key(p.name.as_str()))
                });
                Plan::Encode(pred)
            });
        }
        let jobs: Vec<usize> = (0..plans.len())
            .filter(|&i| matches!(plans[i], Plan::Encode(_)))
            .collect();
        let mut ids = vec![u64::MAX; plans.len()];
        let sizes = jobs
            .iter()
            .map(|&i| ck.tensors[i].end - ck.tensors[i].start);
        for batch in delta::batches(sizes, opts.batch_bytes) {
            let coded: Vec<Result<Coded>> = jobs[batch.clone()]
                .par_iter()
                .map(|&i| {
                    let Plan::Encode(pred) = plans[i] else {
                        unreachable!()
                    };
                    let t = &ck.tensors[i];
                    let pred = if pred_src.is_some() { pred } else { None };
                    encode_one(
                        t,
                        ck.data(t),
                        pred,
                        pred_src.as_ref().unwrap_or(&Pred::Files(&[])),
                        &pred_names,
                        &state.blobs,
                        opts,
                    )
                })
                .collect();
            for (&i, c) in jobs[batch].iter().zip(coded) {
                let c = c.map_err(|e| e.context(sf.path.display().to_string()))?;
                let t = &ck.tensors[i];
                match c.kind {
                    BlobKind::Delta => report.deltas += 1,
                    _ => report.anchors += 1,
                }
                let rec = BlobRecord {
                    offset: 0,
                    len: 0,
                    kind: c.kind,
                    reference: c.reference,
                    depth: c.depth,
                    dtype: t.dtype,
                    raw_len: (t.end - t.start) as u64,
                    hash: hashes[i],
                };
                ids[i] = state.push_blob(out, rec, &c.bytes)?;
                progress((t.end - t.start) as u64);
            }
        }
        let mut tensors = Vec::with_capacity(plans.len());
        for (i, t) in ck.tensors.iter().enumerate() {
            match plans[i] {
                Plan::Reuse(id) => {
                    ids[i] = id;
                    report.reused += 1;
                    progress((t.end - t.start) as u64);
                }
                Plan::SameAs(j) => {
                    ids[i] = ids[j];
                    report.reused += 1;
                    progress((t.end - t.start) as u64);
                }
                Plan::Encode(_) => {}
            }
            tensors.push(TensorRecord {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                blob: ids[i],
            });
        }
        progress(ck.header_bytes().len() as u64);
        report.input_bytes += ck.file_len() as u64;
        files.push(FileRecord::Safetensors {
            path: sf.rel.clone(),
            header_blob,
            len: ck.file_len() as u64,
            hash: *crate::bytes::blake3(ck.bytes()).as_bytes(),
            tensors,
            meta: file_meta(&sf.path)?,
        });
    }

    let record = CheckpointRecord {
        step,
        label: src.label.clone(),
        layout: src.layout,
        keyframe,
        files,
    };
    let commit = Commit {
        prev_commit: state.prev_end,
        first_blob,
        blobs: state.blobs[first_blob as usize..].to_vec(),
        checkpoint: record.clone(),
    };
    let bytes = write_commit(&commit);
    let commit_offset = out.pos;
    out.write(&bytes)?;
    // New data and its commit record are durable before the footer that makes them visible.
    out.sync()?;
    out.write(&write_footer(&Footer {
        commit_offset,
        commit_len: bytes.len() as u64,
        n_checkpoints: state.checkpoints.len() as u64 + 1,
    }))?;
    out.sync()?;
    state.prev_end = out.pos;
    state.checkpoints.push(record);
    report.stored_bytes = out.pos - start;
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// A source file's mode and modification time, kept in the commit record (version 2).
fn file_meta(path: &Path) -> Result<Option<FileMeta>> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    Ok(FileMeta::of(&m))
}

/// Removes a temporary file unless disarmed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Create an archive at `out` from checkpoints in training order. `steps` overrides the steps
/// parsed from the names (checkpoints without one are numbered after the previous). The
/// archive is written to a temporary file and renamed into place only when complete.
pub fn pack(
    out: &Path,
    sources: &[CheckpointSource],
    steps: Option<&[u64]>,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<AddReport>> {
    if sources.is_empty() {
        return Err(Error::Invalid("no checkpoints to pack".into()));
    }
    if opts.keyframe_interval == 0 {
        return Err(Error::Invalid(
            "keyframe interval must be at least 1".into(),
        ));
    }
    if let Some(s) = steps {
        if s.len() != sources.len() {
            return Err(Error::Invalid(format!(
                "{} steps given for {} checkpoints",
                s.len(),
                sources.len()
            )));
        }
    }
    if out.exists() && !opts.overwrite {
        return Err(Error::Invalid(format!(
            "{} exists (append to it with `lockstep append`, or pass --force to replace it)",
            out.display()
        )));
    }
    let (file, tmp) = crate::output::create_temp(out)?;
    let mut guard = TempGuard(Some(tmp.clone()));
    // Errors name the archive asked for, not the hidden temporary file.
    let mut w = Out::new(file, out, 0);
    w.write(&write_header(opts.keyframe_interval))?;
    // Steps first, so an ordering mistake is reported before any work.
    let mut all_steps: Vec<u64> = Vec::with_capacity(sources.len());
    for (i, src) in sources.iter().enumerate() {
        let step = steps
            .map(|s| s[i])
            .or(src.step)
            .unwrap_or_else(|| all_steps.last().map_or(0, |&l| l + 1));
        if let Some(&last) = all_steps.last() {
            if step <= last {
                return Err(Error::Invalid(format!(
                    "{} (step {step}) does not come after {} (step {last}): give checkpoints in training order, or --steps",
                    src.label,
                    sources[i - 1].label
                )));
            }
        }
        all_steps.push(step);
    }
    let mut state = State::new(opts.keyframe_interval);
    let mut reports = Vec::new();
    let mut prev: Option<Opened> = None;
    for (i, src) in sources.iter().enumerate() {
        let opened = open_source(src)?;
        let step = all_steps[i];
        let pred = prev.as_ref().map(|p| Pred::Files(&p.cks));
        reports.push(add_checkpoint(
            &mut state, &mut w, src, &opened, step, pred, opts, progress,
        )?);
        prev = Some(opened);
    }
    w.sync()?;
    // Renamed while still open: the temporary file's lock (which tells a cleaner it is not
    // stale) is held until it has its final name.
    std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e))?;
    guard.0 = None;
    drop(w);
    Ok(reports)
}

/// Add one checkpoint to an existing archive without rewriting it. `step` overrides the step
/// parsed from the name (default: one after the last). A crash at any point leaves the
/// archive as it was; the remains of an interrupted append are cut off by the next one.
pub fn append(
    path: &Path,
    src: &CheckpointSource,
    step: Option<u64>,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<AddReport> {
    append_with_previous(path, src, None, step, opts, progress)
}

/// [`append`], taking the reference tensors from `previous` (the archive's last checkpoint as
/// the user still has it on disk) instead of decoding them from the archive: every tensor is
/// first checked against the archive's stored hashes. Saves decoding a reference chain of up
/// to K blobs per tensor; the archive bytes are the same either way.
pub fn append_with_previous(
    path: &Path,
    src: &CheckpointSource,
    previous: Option<&CheckpointSource>,
    step: Option<u64>,
    opts: &PackOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<AddReport> {
    let (file, archive) = open_for_writing(path)?;
    let archive = archive.on(&opts.device);
    let opened = open_source(src)?;
    let prev_opened = match previous {
        Some(p) => {
            let o = open_source(p)?;
            check_previous(&archive, p, &o)?;
            Some(o)
        }
        None => None,
    };
    // Bytes after the last checkpoint are cut off only when they cannot hold one: a damaged
    // footer or a complete commit without its footer is a checkpoint `repair` can recover.
    if matches!(
        archive.tail(),
        Tail::DamagedFooter | Tail::CommitWithoutFooter { .. }
    ) {
        return Err(archive.tail_error().expect("the archive has a tail"));
    }
    let mut state = State::from_archive(&archive);
    let step = step
        .or(src.step)
        .unwrap_or_else(|| state.checkpoints.last().map_or(0, |c| c.step + 1));
    if let Some(last) = state.checkpoints.last() {
        if step <= last.step {
            return Err(Error::Invalid(format!(
                "{}: step {step} is not after the archive's last step {} (give --step)",
                src.label, last.step
            )));
        }
    }
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if file_len > archive.valid_end {
        // The remains of an interrupted append: never committed, never read.
        file.set_len(archive.valid_end)
            .map_err(|e| Error::io(path, e))?;
    }
    let mut f = file.try_clone().map_err(|e| Error::io(path, e))?;
    f.seek(SeekFrom::Start(archive.valid_end))
        .map_err(|e| Error::io(path, e))?;
    let mut out = Out::new(f, path, archive.valid_end);
    let r = add_checkpoint(
        &mut state,
        &mut out,
        src,
        &opened,
        step,
        Some(match &prev_opened {
            Some(o) => Pred::Files(&o.cks),
            None => Pred::Archive(&archive),
        }),
        opts,
        progress,
    );
    if r.is_err() {
        // Nothing was committed; leave the file as it was (best effort: readers ignore the
        // uncommitted bytes anyway, and the next append would cut them off).
        drop(out);
        let _ = file.set_len(archive.valid_end);
    }
    r
}

/// Every tensor of the archive's last checkpoint must be in `o` with the same dtype, shape
/// and BLAKE3.
fn check_previous(archive: &Archive, p: &CheckpointSource, o: &Opened) -> Result<()> {
    let Some(last) = archive.checkpoints.last() else {
        return Ok(());
    };
    let mut by_name: HashMap<&str, (&Checkpoint, &crate::checkpoint::TensorEntry)> = HashMap::new();
    for ck in o.cks.iter().flatten() {
        for t in &ck.tensors {
            by_name.insert(t.name.as_str(), (ck, t));
        }
    }
    let wanted: Vec<&TensorRecord> = last.tensors().collect();
    let bad = wanted.par_iter().find_map_any(|t| {
        let why = match by_name.get(t.name.as_str()) {
            None => "is missing".to_string(),
            Some((_, e)) if e.dtype != t.dtype || e.shape != t.shape => {
                format!(
                    "is {} {:?}, the archive has {} {:?}",
                    e.dtype, e.shape, t.dtype, t.shape
                )
            }
            Some((ck, e)) => {
                if *crate::bytes::blake3(ck.data(e)).as_bytes()
                    == archive.blobs[t.blob as usize].hash
                {
                    return None;
                }
                "has different bytes".to_string()
            }
        };
        Some(format!("tensor '{}' {why}", t.name))
    });
    match bad {
        Some(why) => Err(Error::Mismatch(format!(
            "{} is not the archive's last checkpoint (step {}): {why}",
            p.label, last.step
        ))),
        None => Ok(()),
    }
}

/// Open an existing archive for writing under an exclusive lock (one writer at a time;
/// readers need none), and read it.
fn open_for_writing(path: &Path) -> Result<(File, Archive)> {
    // Before opening: a named pipe opened for reading and writing would wait on itself.
    let t = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .file_type();
    if !t.is_file() {
        return Err(Error::Invalid(format!(
            "{}: {}, not a file; an archive is changed in place, so it must be one",
            path.display(),
            crate::output::kind_of(&t)
        )));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.try_lock().map_err(|_| {
        Error::Invalid(format!(
            "{}: another process is writing to this archive",
            path.display()
        ))
    })?;
    let archive = Archive::from_file(path, &file)?;
    Ok((file, archive))
}

/// What [`repair`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repaired {
    /// The archive ends with its last footer: nothing to do.
    Nothing,
    /// A damaged last footer was written again from its commit record; this step is readable
    /// again.
    FooterRebuilt { step: u64 },
    /// A complete commit record without its footer got its footer; this step is readable.
    FooterWritten { step: u64 },
    /// Bytes no commit covers (an interrupted append, a copy cut short) were removed.
    TailRemoved { bytes: u64 },
}

/// Make an archive with a [`Tail`] complete again, under the same lock as `append`:
/// - a damaged last footer is rewritten from the commit record in front of it, whose own
///   checksum vouches for it (the footer holds nothing else: where that record is, and the
///   checkpoint count); only the footer's 40 bytes are written, in place;
/// - a complete commit record without its footer gets its footer (any partial footer bytes
///   after it are replaced);
/// - bytes no commit covers are cut off (they cannot be read; the checkpoints before them
///   are all there).
///
/// If the archive then does not open as expected, the old bytes are put back and it is an
/// error.
pub fn repair(path: &Path) -> Result<Repaired> {
    let (file, archive) = open_for_writing(path)?;
    match archive.tail() {
        Tail::None => Ok(Repaired::Nothing),
        Tail::DamagedFooter => {
            rebuild_footer(path, &file, &archive).map(|step| Repaired::FooterRebuilt { step })
        }
        Tail::CommitWithoutFooter {
            step,
            commit_offset,
            commit_len,
        } => {
            let end = commit_offset + commit_len;
            let footer = write_footer(&Footer {
                commit_offset,
                commit_len,
                n_checkpoints: archive.checkpoints.len() as u64 + 1,
            });
            let old = read_range(&file, path, end)?;
            let write = |bytes: &[u8]| {
                let mut f = &file;
                file.set_len(end)
                    .and_then(|_| f.seek(SeekFrom::Start(end)))
                    .and_then(|_| f.write_all(bytes))
                    .and_then(|_| file.sync_all())
                    .map_err(|e| Error::io(path, e))
            };
            write(&footer)?;
            check_repaired(path, &file, &archive, 1, || write(&old))?;
            Ok(Repaired::FooterWritten { step })
        }
        Tail::Unfinished => {
            let bytes = archive.ignored_tail();
            file.set_len(archive.valid_end)
                .and_then(|_| file.sync_all())
                .map_err(|e| Error::io(path, e))?;
            Ok(Repaired::TailRemoved { bytes })
        }
    }
}

/// The file's bytes from `from` to its end.
fn read_range(file: &File, path: &Path, from: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut f = file;
    let mut old = Vec::new();
    f.seek(SeekFrom::Start(from))
        .and_then(|_| f.read_to_end(&mut old))
        .map_err(|e| Error::io(path, e))?;
    Ok(old)
}

/// After a repair the archive must open with `more` checkpoints than before and nothing after
/// its last footer; otherwise `undo` puts the old bytes back and it is an error. Returns the
/// repaired archive.
fn check_repaired(
    path: &Path,
    file: &File,
    before: &Archive,
    more: usize,
    undo: impl Fn() -> Result<()>,
) -> Result<Archive> {
    match Archive::from_file(path, file) {
        Ok(a)
            if a.checkpoints.len() == before.checkpoints.len() + more && a.ignored_tail() == 0 =>
        {
            Ok(a)
        }
        other => {
            undo()?;
            Err(Error::format(
                format!("archive {}", path.display()),
                format!(
                    "the rebuilt footer did not give a readable archive ({}); left as it was",
                    other
                        .err()
                        .map_or("wrong checkpoint count".into(), |e| e.to_string())
                ),
            ))
        }
    }
}

/// Rewrite a damaged last footer from the commit record in front of it; returns the step made
/// readable again.
fn rebuild_footer(path: &Path, file: &File, archive: &Archive) -> Result<u64> {
    // SAFETY: read-only mapping of a file this process holds the write lock of.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
    let end = map.len() - FOOTER_LEN;
    let lo = archive.valid_end as usize;
    // The record ends where the footer starts; it begins at the last commit marker from
    // which the bytes up to there check out and that follows the last valid segment.
    let mut upto = end;
    let start = loop {
        let Some(q) = map[lo..upto].windows(4).rposition(|w| w == COMMIT_MAGIC) else {
            return Err(archive.tail_error().expect("the footer is damaged"));
        };
        let at = lo + q;
        if read_commit(&map[at..end]).is_ok_and(|c| c.prev_commit == archive.valid_end) {
            break at;
        }
        upto = at + 3;
    };
    let footer = write_footer(&Footer {
        commit_offset: start as u64,
        commit_len: (end - start) as u64,
        n_checkpoints: archive.checkpoints.len() as u64 + 1,
    });
    let old = map[end..].to_vec();
    drop(map);
    let write = |bytes: &[u8]| {
        let mut f = file;
        f.seek(SeekFrom::Start(end as u64))
            .and_then(|_| f.write_all(bytes))
            .and_then(|_| file.sync_all())
            .map_err(|e| Error::io(path, e))
    };
    write(&footer)?;
    let a = check_repaired(path, file, archive, 1, || write(&old))?;
    Ok(a.checkpoints.last().map_or(0, |c| c.step))
}
