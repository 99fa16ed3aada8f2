//! Opening an archive (finding the last valid commit, rebuilding the index), decoding blobs
//! along their reference chains, extracting a checkpoint, and verifying everything.

use crate::backend::Device;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::memory::FileBytes;
use rayon::prelude::*;

use super::format::*;
use crate::output::{AtomicFile, Special};
use crate::{anchor, delta, Error, Result};

/// Where one checkpoint's commit lives and which blobs it added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitSpan {
    pub offset: u64,
    pub len: u64,
    pub first_blob: u64,
    pub n_blobs: u64,
}

/// An open, read-only trajectory archive.
pub struct Archive {
    pub path: PathBuf,
    map: FileBytes,
    pub header: Header,
    pub keyframe_interval: u32,
    pub blobs: Vec<BlobRecord>,
    pub checkpoints: Vec<CheckpointRecord>,
    pub commits: Vec<CommitSpan>,
    /// End of the last valid footer: the archive's committed length.
    pub valid_end: u64,
    /// Most bytes one command may decode ([`default_max_size`] unless set).
    pub max_size: u64,
    /// Where delta blobs are decoded (the CPU unless [`Archive::on`] says otherwise).
    device: Device,
}

/// What follows the last complete checkpoint of an archive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Tail {
    /// Nothing: the archive ends with its last footer.
    #[default]
    None,
    /// A whole footer that does not check out after the bytes of a newer checkpoint: damage
    /// (an append never leaves that). `lockstep repair` rebuilds it from the commit record.
    DamagedFooter,
    /// A complete commit record, its checksum intact, that follows the last checkpoint but
    /// has no footer: an append stopped between the two, or a copy cut short there. The
    /// checkpoint is all there; `lockstep repair` writes its footer.
    CommitWithoutFooter {
        step: u64,
        commit_offset: u64,
        commit_len: u64,
    },
    /// Bytes no commit covers: an append interrupted before its commit, or a copy cut short
    /// in the middle of a checkpoint. What they held cannot be read.
    Unfinished,
}

/// Default for [`Archive::max_size`]: a checkpoint of real weights never decodes to more
/// than a few times its coded size, so 64 times the archive's size (at least 256 MiB) only
/// stops files that claim far more than they could hold. `--max-size` raises it for the
/// legal exceptions (tensors of zeros, one checkpoint stored many times over).
pub fn default_max_size(archive_len: u64) -> u64 {
    archive_len.saturating_mul(64).max(256 << 20)
}

/// Decoded blobs kept for reuse (reference chains), shared across threads.
pub type BlobCache = HashMap<u64, Arc<Vec<u8>>>;

impl Archive {
    /// Open an archive: the last footer whose checksum and commit records check out defines
    /// its content; bytes after it (an interrupted append) are ignored.
    pub fn open(path: impl AsRef<Path>) -> Result<Archive> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Archive::from_file(path, &file)
    }

    pub(crate) fn from_file(path: &Path, file: &File) -> Result<Archive> {
        let map = FileBytes::of(path, file)?;
        let named = |e: Error| e.context(format!("archive {}", path.display()));
        let header = read_header(&map).map_err(named)?;
        let keyframe_interval = header.keyframe_interval;
        let (footer, end) = find_footer(&map, header.len).map_err(named)?.ok_or_else(|| {
            Error::format(
                format!("archive {}", path.display()),
                "no valid commit found (truncated or damaged before its first checkpoint was committed)",
            )
        })?;
        let mut spans = Vec::new();
        let mut commits = Vec::new();
        let (mut offset, mut len) = (footer.commit_offset, footer.commit_len);
        loop {
            let bytes = slice(&map, offset, len).ok_or_else(|| {
                Error::format("archive commit chain", "commit record outside the file")
            })?;
            let c = read_commit(bytes)?;
            let prev = c.prev_commit;
            spans.push(CommitSpan {
                offset,
                len,
                first_blob: c.first_blob,
                n_blobs: c.blobs.len() as u64,
            });
            commits.push(c);
            if prev == 0 {
                break;
            }
            if prev > offset || commits.len() as u64 > footer.n_checkpoints {
                return Err(Error::format(
                    "archive commit chain",
                    "commit records out of order",
                ));
            }
            // The previous commit ends where its footer starts.
            let prev_footer = read_footer(&map, prev as usize).ok_or_else(|| {
                Error::format("archive commit chain", "previous footer is damaged")
            })?;
            (offset, len) = (prev_footer.commit_offset, prev_footer.commit_len);
        }
        commits.reverse();
        spans.reverse();
        if commits.len() as u64 != footer.n_checkpoints {
            return Err(Error::format(
                "archive footer",
                format!(
                    "says {} checkpoints, the commit chain has {}",
                    footer.n_checkpoints,
                    commits.len()
                ),
            ));
        }
        let mut blobs: Vec<BlobRecord> = Vec::new();
        let mut checkpoints: Vec<CheckpointRecord> = Vec::new();
        for (c, span) in commits.into_iter().zip(&spans) {
            let bad = |d: String| Error::format("archive index", d);
            if c.first_blob != blobs.len() as u64 {
                return Err(bad(format!(
                    "commit at {} starts at blob {}",
                    span.offset, c.first_blob
                )));
            }
            for b in &c.blobs {
                if b.offset < header.len as u64
                    || b.offset.checked_add(b.len).is_none_or(|e| e > span.offset)
                {
                    return Err(bad(format!(
                        "a blob at {} lies outside the data it belongs to",
                        b.offset
                    )));
                }
            }
            for b in c.blobs {
                let want = match b.reference {
                    Some(r) => blobs[r as usize].depth.checked_add(1),
                    None => Some(0),
                };
                // A delta blob decodes to a tensor of its reference's size.
                if let Some(r) = b
                    .reference
                    .filter(|&r| blobs[r as usize].raw_len != b.raw_len)
                {
                    return Err(bad(format!(
                        "delta blob {} holds {} B, its reference blob {r} {} B",
                        blobs.len(),
                        b.raw_len,
                        blobs[r as usize].raw_len
                    )));
                }
                if want != Some(b.depth) || b.depth >= keyframe_interval {
                    return Err(bad(format!(
                        "blob {} has depth {} (expected {want:?}, below the keyframe interval {keyframe_interval})",
                        blobs.len(),
                        b.depth
                    )));
                }
                blobs.push(b);
            }
            let n = blobs.len() as u64;
            let k = c.checkpoint;
            if let Some(last) = checkpoints.last() {
                if k.step <= last.step {
                    return Err(bad(format!("step {} follows step {}", k.step, last.step)));
                }
            }
            // Checkpoint i is a keyframe exactly when i is a multiple of the interval: this
            // also catches a damaged interval in a version-1 header, which has no checksum.
            let want_key = (checkpoints.len() as u64).is_multiple_of(keyframe_interval as u64);
            if k.keyframe != want_key {
                return Err(bad(format!(
                    "step {} is{} a keyframe, but the header's keyframe interval {keyframe_interval} says it is{} (damaged header?)",
                    k.step,
                    if k.keyframe { "" } else { " not" },
                    if want_key { "" } else { " not" },
                )));
            }
            for f in &k.files {
                if let Some(id) = f.blob_ids().into_iter().find(|&id| id >= n) {
                    return Err(bad(format!("step {} refers to blob {id} of {n}", k.step)));
                }
                safe_rel_path(f.path())?;
                check_sizes(f, &blobs)
                    .map_err(|d| bad(format!("step {}, {}: {d}", k.step, f.path())))?;
            }
            checkpoints.push(k);
        }
        let max_size = default_max_size(map.len() as u64);
        Ok(Archive {
            path: path.to_path_buf(),
            map,
            header,
            keyframe_interval,
            blobs,
            checkpoints,
            commits: spans,
            valid_end: end as u64,
            max_size,
            device: Device::cpu(),
        })
    }

    /// Set the most bytes one command may decode (`--max-size`); `None` keeps the default.
    /// Decode delta blobs on `device` from now on.
    pub fn on(mut self, device: &Device) -> Archive {
        self.device = device.clone();
        self
    }

    /// The device delta blobs are decoded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn with_max_size(mut self, max: Option<u64>) -> Archive {
        if let Some(m) = max {
            self.max_size = m;
        }
        self
    }

    /// Refuse to decode `bytes` for `what` when that is over [`Archive::max_size`].
    pub fn check_limit(&self, bytes: u64, what: &str) -> Result<()> {
        if bytes <= self.max_size {
            return Ok(());
        }
        Err(Error::Limit(format!(
            "{}: {what} would decode to {bytes} B, over the limit of {} B (by default 64 times \
             the archive's size, at least 256 MiB, so that a small damaged or forged file cannot \
             ask for gigabytes); pass --max-size {bytes} if the archive is yours",
            self.path.display(),
            self.max_size
        )))
    }

    /// What follows the last complete checkpoint ([`Tail`]).
    pub fn tail(&self) -> Tail {
        if self.ignored_tail() == 0 {
            return Tail::None;
        }
        if self.damaged_last_footer() {
            return Tail::DamagedFooter;
        }
        match self.footerless_commit() {
            Some((offset, len, step)) => Tail::CommitWithoutFooter {
                step,
                commit_offset: offset,
                commit_len: len,
            },
            None => Tail::Unfinished,
        }
    }

    /// The commit record in the tail that checks out, follows the last complete checkpoint,
    /// and ends at the end of the file or less than a footer's length before it (a partial
    /// footer after it). Returns its offset, length and step.
    fn footerless_commit(&self) -> Option<(u64, u64, u64)> {
        let m = &self.map[..];
        // Commit records of huge checkpoints are megabytes long; look no further back than
        // this, and at few candidates, so a forged tail cannot make opening expensive.
        let lo = (self.valid_end as usize).max(m.len().saturating_sub(256 << 20));
        let first_end = m.len().saturating_sub(FOOTER_LEN - 1);
        let mut upto = m.len();
        for _ in 0..8 {
            let q = m[lo..upto].windows(4).rposition(|w| w == COMMIT_MAGIC)?;
            let at = lo + q;
            upto = at + 3;
            // "LSTC", version, then prev_end, which must be the last valid footer's end.
            let head = &m[at..m.len().min(at + 13)];
            if head.len() < 13
                || head[4] != COMMIT_VERSION
                || u64::from_le_bytes(head[5..13].try_into().unwrap()) != self.valid_end
            {
                continue;
            }
            // One CRC pass over the record, extended byte by byte over the candidate ends.
            let start_end = first_end.max(at + 13 + 4);
            let mut h = crc32fast::Hasher::new();
            h.update(&m[at..start_end - 4]);
            for end in start_end..=m.len() {
                let stored = u32::from_le_bytes(m[end - 4..end].try_into().unwrap());
                if h.clone().finalize() == stored {
                    if let Ok(c) = read_commit(&m[at..end]) {
                        return Some((at as u64, (end - at) as u64, c.checkpoint.step));
                    }
                }
                h.update(&m[end - 4..end - 3]);
            }
        }
        None
    }

    /// The error for an archive with a [`Tail`] (`None` when there is none): what it is, what
    /// is intact, and what to run.
    pub fn tail_error(&self) -> Option<Error> {
        let last = match self.checkpoints.last() {
            Some(c) => format!("step {}, checkpoint {}", c.step, self.checkpoints.len()),
            None => "none".into(),
        };
        let n = self.ignored_tail();
        let detail = match self.tail() {
            Tail::None => return None,
            Tail::DamagedFooter => format!(
                "its last footer is damaged: the {n} bytes after the last complete checkpoint \
                 ({last}) end in a footer whose checksum does not match. Damage, not an \
                 interrupted append; the newest checkpoint cannot be read until `lockstep \
                 repair` rebuilds the footer from its commit record. Earlier checkpoints are \
                 intact"
            ),
            Tail::CommitWithoutFooter { step, .. } => format!(
                "the {n} bytes after the last complete checkpoint ({last}) hold step {step} \
                 complete, but without its footer: an append stopped just before the end, or a \
                 copy cut short. `lockstep repair` writes the footer and makes step {step} \
                 readable"
            ),
            Tail::Unfinished => format!(
                "the archive ends in {n} bytes after its last complete checkpoint ({last}) that \
                 no commit covers: an append was interrupted, or this copy was cut short (a \
                 partial download or copy). Whatever they held is lost here: copy the archive \
                 again if you have the original; otherwise `lockstep repair` removes them (the \
                 next `lockstep append` would too). Checkpoints up to the last complete one are \
                 intact"
            ),
        };
        Some(Error::Incomplete {
            path: self.path.clone(),
            detail,
        })
    }

    /// The archive's length in bytes, as read (a pipe's too, which has no length on disk).
    pub fn read_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Bytes after the last valid commit (left by an interrupted append).
    pub fn ignored_tail(&self) -> u64 {
        self.map.len() as u64 - self.valid_end
    }

    /// Whether the bytes after the last valid commit end in a whole footer, recognizable by
    /// its start or end marker (one damaged bit cannot hit both), that does not check out.
    /// An interrupted append never leaves that (the footer is its last write, 40 bytes in
    /// one call): it is damage to a committed checkpoint, whose data may be intact before it.
    /// Readers still see every earlier checkpoint; `verify` fails and `append` refuses, as
    /// cutting the tail off (what it does to an interrupted append) would lose that data.
    pub fn damaged_last_footer(&self) -> bool {
        let m = &self.map[..];
        if self.ignored_tail() < FOOTER_LEN as u64 {
            return false;
        }
        let f = &m[m.len() - FOOTER_LEN..];
        &f[..8] == FOOTER_MAGIC || &f[FOOTER_LEN - 4..] == FOOTER_END
    }

    /// Check a blob's stored bytes, and those of its reference chain, without decoding
    /// tensors: anchor and delta blobs by their framing checksum (the writer verified they
    /// decode before writing them), bytes blobs by decoding them against their BLAKE3.
    pub fn check_stored(&self, id: u64) -> Result<()> {
        let mut cur = Some(id);
        while let Some(i) = cur {
            let rec = &self.blobs[i as usize];
            let bytes = self.blob_bytes(i)?;
            let what = |e: Error| e.context(format!("blob {i} ({})", rec.kind.name()));
            match rec.kind {
                BlobKind::Anchor => {
                    crate::bytes::open_checked(bytes, anchor::MAGIC, "anchor blob")
                        .map_err(what)?;
                }
                BlobKind::Delta => {
                    crate::bytes::open_checked(bytes, delta::blob::MAGIC, "tensor blob")
                        .map_err(what)?;
                }
                BlobKind::Bytes => {
                    self.decode_one(i, None)?;
                }
            }
            cur = rec.reference;
        }
        Ok(())
    }

    /// The stored (coded) bytes of a blob.
    pub fn blob_bytes(&self, id: u64) -> Result<&[u8]> {
        let b = self
            .blobs
            .get(id as usize)
            .ok_or_else(|| Error::format("archive index", format!("no blob {id}")))?;
        slice(&self.map, b.offset, b.len)
            .ok_or_else(|| Error::format("archive", format!("blob {id} is outside the file")))
    }

    /// The checkpoint with this step.
    pub fn checkpoint(&self, step: u64) -> Result<&CheckpointRecord> {
        self.checkpoints
            .iter()
            .find(|c| c.step == step)
            .ok_or_else(|| {
                let steps: Vec<String> = self
                    .checkpoints
                    .iter()
                    .map(|c| c.step.to_string())
                    .collect();
                let msg = format!(
                    "{}: no checkpoint at step {step} (steps: {})",
                    self.path.display(),
                    steps.join(", ")
                );
                // A newer step may be in bytes that do not read as a checkpoint: say so.
                match self.tail_error() {
                    Some(e) => e.context(msg),
                    None => Error::Invalid(msg),
                }
            })
    }

    /// The bytes of one tensor of the checkpoint at `step`, decoded and hash-checked.
    pub fn tensor(&self, step: u64, name: &str) -> Result<Vec<u8>> {
        let ck = self.checkpoint(step)?;
        let t = ck
            .tensors()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::Invalid(format!("step {step} has no tensor '{name}'")))?;
        self.check_limit(
            self.blobs[t.blob as usize].raw_len,
            &format!("tensor '{name}' of step {step}"),
        )?;
        self.decode_blob(t.blob)
    }

    /// Decode a blob (following its reference chain) and check its BLAKE3 hash.
    pub fn decode_blob(&self, id: u64) -> Result<Vec<u8>> {
        self.decode_cached(id, &BlobCache::new())
            .map(|a| a.as_ref().clone())
    }

    /// Like [`Archive::decode_blob`], taking already decoded blobs from `cache`.
    pub fn decode_cached(&self, id: u64, cache: &BlobCache) -> Result<Arc<Vec<u8>>> {
        // Walk the reference chain down to a cached blob or a standalone one (iteratively:
        // chain length is bounded by the keyframe interval, but the stack must not depend on
        // what a file claims), then decode back up.
        let mut chain = vec![id];
        let mut base: Option<Arc<Vec<u8>>> = None;
        while let Some(&cur) = chain.last() {
            if let Some(v) = cache.get(&cur) {
                chain.pop();
                base = Some(v.clone());
                break;
            }
            match self.blobs[cur as usize].reference {
                Some(r) => chain.push(r),
                None => break,
            }
        }
        while let Some(cur) = chain.pop() {
            base = Some(Arc::new(self.decode_one(cur, base.as_deref())?));
        }
        Ok(base.expect("the chain ends in a decoded blob"))
    }

    /// Decode one blob given its reference's decoded bytes (delta blobs), check its hash.
    fn decode_one(&self, id: u64, reference: Option<&Vec<u8>>) -> Result<Vec<u8>> {
        let rec = &self.blobs[id as usize];
        let bytes = self.blob_bytes(id)?;
        let what = |e: Error| e.context(format!("blob {id} ({})", rec.kind.name()));
        let out = match rec.kind {
            BlobKind::Anchor => anchor::decode_sized(bytes, rec.raw_len).map_err(what)?,
            BlobKind::Delta => {
                let r = reference.expect("delta blobs are decoded after their reference");
                delta::decode_tensor(bytes, r, self.device.delta()?).map_err(what)?
            }
            BlobKind::Bytes => decode_bytes_blob(bytes, rec.raw_len).map_err(what)?,
        };
        if out.len() as u64 != rec.raw_len {
            return Err(Error::Checksum {
                what: format!("blob {id}: length of the decoded bytes"),
                stored: format!("{} B", rec.raw_len),
                computed: format!("{} B", out.len()),
            });
        }
        let computed = crate::bytes::blake3(&out);
        if *computed.as_bytes() != rec.hash {
            return Err(Error::hash_mismatch(
                format!("blob {id}: BLAKE3 of the decoded bytes"),
                &rec.hash,
                computed.as_bytes(),
            ));
        }
        Ok(out)
    }
}

fn slice(map: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let end = offset.checked_add(len)?;
    if end > map.len() as u64 {
        return None;
    }
    Some(&map[offset as usize..end as usize])
}

/// The last valid footer and the offset just past it. A complete, valid footer at the very
/// end whose commit record is damaged is corruption, not an interrupted append (appends make
/// the commit durable before writing its footer): that is an error, not a silent fallback.
fn find_footer(map: &[u8], header_len: usize) -> Result<Option<(Footer, usize)>> {
    let mut end = map.len();
    loop {
        if let Some(f) = read_footer(map, end) {
            match slice(map, f.commit_offset, f.commit_len).map(read_commit) {
                Some(Ok(_)) => return Ok(Some((f, end))),
                Some(Err(e)) if end == map.len() => {
                    return Err(Error::format(
                        "archive",
                        format!("the last commit record is damaged ({e})"),
                    ))
                }
                _ => {}
            }
        }
        // Scan back for the previous footer's end marker.
        if end <= header_len + FOOTER_LEN {
            return Ok(None);
        }
        let search = &map[header_len..end - 1];
        let Some(pos) = search.windows(4).rposition(|w| w == FOOTER_END) else {
            return Ok(None);
        };
        end = header_len + pos + 4;
    }
}

/// A file's recorded length must be what its blobs decode to, and each tensor's blob as long
/// as its dtype and shape say: sizes are checked against each other before anything is
/// decoded or allocated.
fn check_sizes(f: &FileRecord, blobs: &[BlobRecord]) -> std::result::Result<(), String> {
    let raw = |id: u64| blobs[id as usize].raw_len;
    let total = match f {
        FileRecord::Verbatim { blob, .. } => raw(*blob),
        FileRecord::Safetensors {
            header_blob,
            tensors,
            ..
        } => {
            let mut total = raw(*header_blob);
            for t in tensors {
                let want = delta::blob::element_count(&t.shape)
                    .ok()
                    .and_then(|n| n.checked_mul(t.dtype.size() as u64));
                if want != Some(raw(t.blob)) {
                    return Err(format!(
                        "tensor '{}' is {} {:?}, its blob holds {} B",
                        t.name,
                        t.dtype,
                        t.shape,
                        raw(t.blob)
                    ));
                }
                total = total.saturating_add(raw(t.blob));
            }
            total
        }
    };
    if total != f.len() {
        return Err(format!(
            "recorded as {} B, its blobs hold {total} B",
            f.len()
        ));
    }
    Ok(())
}

/// Reject stored paths that would escape the output directory.
pub fn safe_rel_path(rel: &str) -> Result<()> {
    let bad = rel.is_empty()
        || rel.starts_with('/')
        || rel.contains('\\')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(Error::format(
            "archive index",
            format!("unsafe file path {rel:?}"),
        ));
    }
    Ok(())
}

/// Encode verbatim bytes: mode byte 0 (raw) or 1 (zstd) and the payload.
/// Files up to this size are compressed with zstd -19, larger ones (optimizer states, training
/// arguments pickles) with zstd -3, which is orders of magnitude faster on gigabytes.
pub const BYTES_BLOB_STRONG_LIMIT: usize = 4 << 20;

pub fn encode_bytes_blob(bytes: &[u8]) -> Result<Vec<u8>> {
    let level = if bytes.len() <= BYTES_BLOB_STRONG_LIMIT {
        19
    } else {
        3
    };
    let z = zstd::bulk::compress(bytes, level).map_err(|e| Error::Invalid(format!("zstd: {e}")))?;
    let mut out = Vec::with_capacity(z.len().min(bytes.len()) + 1);
    if z.len() < bytes.len() {
        out.push(1);
        out.extend_from_slice(&z);
    } else {
        out.push(0);
        out.extend_from_slice(bytes);
    }
    if decode_bytes_blob(&out, bytes.len() as u64)? != bytes {
        return Err(Error::Invalid(
            "internal error: bytes blob did not decode".into(),
        ));
    }
    Ok(out)
}

pub fn decode_bytes_blob(blob: &[u8], raw_len: u64) -> Result<Vec<u8>> {
    let bad = |d: String| Error::format("bytes blob", d);
    match blob.first() {
        Some(0) => Ok(blob[1..].to_vec()),
        Some(1) => {
            use std::io::Read;
            let mut out = Vec::new();
            zstd::stream::Decoder::new(&blob[1..])
                .and_then(|d| d.take(raw_len + 1).read_to_end(&mut out))
                .map_err(|e| bad(format!("zstd: {e}")))?;
            Ok(out)
        }
        Some(m) => Err(bad(format!("unknown mode {m}"))),
        None => Err(bad("empty".into())),
    }
}

/// What extraction may do to what is already at its destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtractOptions {
    /// Replace an existing file, or an existing non-empty directory (the result is then
    /// exactly the checkpoint: other files there are removed).
    pub force: bool,
}

/// An existing file at `dest` is replaced only with `force`; a directory never. A character
/// device or named pipe (`-o /dev/null`) is written in place, so nothing is replaced.
pub(crate) fn check_target_file(dest: &Path, force: bool) -> Result<()> {
    match crate::output::special(dest) {
        Some(Special::Stream) => return Ok(()),
        Some(Special::Refused(what)) => return Err(crate::output::refused(dest, what)),
        None => {}
    }
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => Err(Error::Invalid(format!(
            "{} is a directory (name the file to write)",
            dest.display()
        ))),
        Ok(_) if !force => Err(Error::Invalid(format!(
            "{} exists (use --force to replace it)",
            dest.display()
        ))),
        _ => Ok(()),
    }
}

/// Atomically exchange two paths (`renameat2(RENAME_EXCHANGE)`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

fn is_empty_dir(dir: &Path) -> Result<bool> {
    Ok(std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .next()
        .is_none())
}

/// Removes a temporary directory (and what is in it) unless disarmed.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Damage found by [`Archive::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub step: u64,
    pub file: String,
    /// The tensor, or `None` for the file as a whole (its header, its hash).
    pub tensor: Option<String>,
    pub error: String,
}

/// What [`Archive::verify`] checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub checkpoints: u64,
    pub files: u64,
    pub tensors: u64,
    pub bytes: u64,
    pub damaged: Vec<Damage>,
    /// Bytes after the last complete checkpoint ([`Archive::ignored_tail`]).
    pub ignored_tail: u64,
    /// What those bytes are ([`Archive::tail`]).
    pub tail: Tail,
    /// Files skipped because an earlier checkpoint has the identical file (same blobs, same
    /// hash), already checked.
    pub files_repeated: u64,
}

impl VerifyReport {
    /// Complete and intact: nothing damaged, nothing after the last complete checkpoint.
    pub fn ok(&self) -> bool {
        self.damaged.is_empty() && self.tail == Tail::None
    }
}

/// Receives (tensor name or `None` for the file itself, error) during `verify`.
type OnError<'a> = dyn FnMut(Option<&str>, Error) + 'a;

/// Decoded files of one checkpoint are produced tensor batch by tensor batch under this budget.
pub const DECODE_BATCH_BYTES: u64 = 64 << 20;
/// `verify` keeps the previous checkpoint's decoded tensors (reference chains) up to this size.
pub const VERIFY_CACHE_BYTES: u64 = 4 << 30;

impl Archive {
    /// Rebuild one file of a checkpoint, streaming it to `sink` in order. Tensor errors are
    /// passed to `on_error` (and the rebuild goes on, with the failed tensor missing) when it
    /// is given, otherwise returned. Returns the file's BLAKE3 and length as rebuilt.
    fn rebuild_file(
        &self,
        f: &FileRecord,
        cache: &BlobCache,
        keep: Option<&mut BlobCache>,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
        mut on_error: Option<&mut OnError>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<([u8; 32], u64)> {
        let mut hasher = blake3::Hasher::new();
        let mut len = 0u64;
        let mut emit = |b: &[u8], sink: &mut dyn FnMut(&[u8]) -> Result<()>| -> Result<()> {
            crate::bytes::blake3_update(&mut hasher, b);
            len += b.len() as u64;
            sink(b)
        };
        let mut keep = keep;
        match f {
            FileRecord::Verbatim { blob, .. } => match self.decode_cached(*blob, cache) {
                Ok(b) => {
                    progress(b.len() as u64);
                    emit(&b, sink)?
                }
                Err(e) => match on_error.as_mut() {
                    Some(cb) => cb(None, e),
                    None => return Err(e),
                },
            },
            FileRecord::Safetensors {
                header_blob,
                tensors,
                ..
            } => {
                match self.decode_cached(*header_blob, cache) {
                    Ok(h) => emit(&h, sink)?,
                    Err(e) => match on_error.as_mut() {
                        Some(cb) => cb(None, e),
                        None => return Err(e),
                    },
                }
                let sizes = tensors
                    .iter()
                    .map(|t| self.blobs[t.blob as usize].raw_len as usize);
                for batch in delta::batches(sizes, DECODE_BATCH_BYTES as usize) {
                    let decoded: Vec<Result<Arc<Vec<u8>>>> = tensors[batch.clone()]
                        .par_iter()
                        .map(|t| self.decode_cached(t.blob, cache))
                        .collect();
                    for (t, d) in tensors[batch].iter().zip(decoded) {
                        match d {
                            Ok(b) => {
                                progress(b.len() as u64);
                                emit(&b, sink)?;
                                if let Some(k) = keep.as_deref_mut() {
                                    k.insert(t.blob, b);
                                }
                            }
                            Err(e) => match on_error.as_mut() {
                                Some(cb) => cb(Some(&t.name), e),
                                None => return Err(e.context(format!("tensor '{}'", t.name))),
                            },
                        }
                    }
                }
            }
        }
        Ok((*hasher.finalize().as_bytes(), len))
    }

    /// Restore the checkpoint at `step` under `out`, refusing to replace anything there
    /// ([`Archive::extract_with`] without `force`). Returns the bytes written.
    pub fn extract(&self, step: u64, out: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        self.extract_with(step, out, &ExtractOptions::default(), progress)
    }

    /// Restore the checkpoint at `step` under `out`: the file itself for a checkpoint that was
    /// one `.safetensors` file (inside `out` if that is a directory), else a directory.
    /// Every file is checked against its stored BLAKE3 hash before it is renamed into place,
    /// and gets its stored mode and modification time (commit version 2).
    ///
    /// A directory checkpoint is written to a hidden directory beside `out` and renamed into
    /// place only when every file checks out, so `out` ends up holding exactly the
    /// checkpoint. An existing file, or an existing non-empty directory, at the destination
    /// is an error unless `opts.force`; with it, the old one is moved aside, the new one
    /// renamed in, the old one removed. Returns the bytes written.
    pub fn extract_with(
        &self,
        step: u64,
        out: &Path,
        opts: &ExtractOptions,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        let ck = self.checkpoint(step)?;
        self.check_limit(ck.input_bytes(), &format!("step {step}"))?;
        if ck.layout == Layout::SingleFile && ck.files.len() == 1 {
            let f = &ck.files[0];
            let dest = if out.is_dir() {
                out.join(f.path())
            } else {
                out.to_path_buf()
            };
            check_target_file(&dest, opts.force)?;
            return self.extract_one(step, f, &dest, progress);
        }
        let bad_name = || {
            Error::Invalid(format!(
                "{}: give the directory to extract into by name",
                out.display()
            ))
        };
        let name = out.file_name().ok_or_else(bad_name)?.to_string_lossy();
        if name == ".." {
            return Err(bad_name());
        }
        // The directory is renamed into place, moving away (and, with --force, deleting)
        // whatever is there: never `/dev/null` or a pipe.
        if crate::output::special(out).is_some() {
            return Err(Error::Invalid(format!(
                "{}: is not a directory or a file; step {step} is a directory checkpoint, \
                 extracted into a directory (`lockstep verify` checks it without writing)",
                out.display()
            )));
        }
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let existing = std::fs::symlink_metadata(out).ok();
        let replace = match &existing {
            None => false,
            Some(m) if m.is_dir() && is_empty_dir(out)? => false,
            Some(m) if !opts.force => {
                return Err(Error::Invalid(format!(
                    "{} exists{} (use --force to replace it: the result is exactly step {step}, \
                     other files there are removed)",
                    out.display(),
                    if m.is_dir() { " and is not empty" } else { "" }
                )))
            }
            Some(_) => true,
        };
        let pid = std::process::id();
        let tmp = parent.join(format!(".{name}.tmp-{pid}"));
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut guard = TempDir(Some(tmp.clone()));
        let mut total = 0;
        for f in &ck.files {
            total += self.extract_one(step, f, &tmp.join(f.path()), progress)?;
        }
        match existing {
            // Linux: swap the two in one atomic step; the old one, now at `tmp`, goes with
            // the guard. Elsewhere, or where the file system refuses, two renames.
            Some(m) if replace && m.is_dir() && exchange(&tmp, out).is_ok() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Some(m) if replace => {
                let old = parent.join(format!(".{name}.old-{pid}"));
                std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
                if let Err(e) = std::fs::rename(&tmp, out) {
                    let _ = std::fs::rename(&old, out);
                    return Err(Error::io(out, e));
                }
                // The checkpoint is in place; removing what it replaced is best effort.
                let _ = if m.is_dir() {
                    std::fs::remove_dir_all(&old)
                } else {
                    std::fs::remove_file(&old)
                };
            }
            Some(_) => {
                std::fs::remove_dir(out).map_err(|e| Error::io(out, e))?;
                std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e))?;
            }
            None => std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e))?,
        }
        guard.0 = None;
        Ok(total)
    }

    /// Rebuild one file of the checkpoint at `step` to `dest` (crash-safe: a temporary file
    /// renamed into place after its BLAKE3 checks out), with its stored mode and time.
    pub(crate) fn extract_one(
        &self,
        step: u64,
        f: &FileRecord,
        dest: &Path,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<u64> {
        if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let mut af = AtomicFile::create(dest)?;
        let (hash, len) = self.rebuild_file(
            f,
            &BlobCache::new(),
            None,
            &mut |b| af.write_all(b),
            None,
            progress,
        )?;
        if len != f.len() {
            return Err(Error::Checksum {
                what: format!("step {step}, {}: length of the rebuilt file", f.path()),
                stored: format!("{} B", f.len()),
                computed: format!("{len} B"),
            });
        }
        if &hash != f.hash() {
            return Err(Error::hash_mismatch(
                format!("step {step}, {}: BLAKE3 of the rebuilt file", f.path()),
                f.hash(),
                &hash,
            ));
        }
        let meta = f.meta();
        af.commit_with(meta.map(|m| m.permissions()), meta.map(|m| m.mtime()))?;
        Ok(len)
    }

    /// A key that is equal for two file records exactly when they rebuild the same bytes the
    /// same way (same blobs, same recorded hash): the second need not be checked again.
    fn file_key(f: &FileRecord) -> (Vec<u64>, [u8; 32], u64) {
        (f.blob_ids(), *f.hash(), f.len())
    }

    /// Bytes `verify` will decode: every file once (files repeated unchanged are not decoded
    /// again).
    pub fn verify_bytes(&self) -> u64 {
        let mut seen = std::collections::HashSet::new();
        self.checkpoints
            .iter()
            .flat_map(|c| &c.files)
            .filter(|f| seen.insert(Self::file_key(f)))
            .map(|f| f.len())
            .sum()
    }

    /// Decode every checkpoint and check every hash; damage is reported, not fatal. Fails
    /// only when the work is over [`Archive::max_size`].
    pub fn verify(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<VerifyReport> {
        self.check_limit(self.verify_bytes(), "verifying every checkpoint")?;
        let mut report = VerifyReport {
            ignored_tail: self.ignored_tail(),
            tail: self.tail(),
            ..Default::default()
        };
        let mut seen = std::collections::HashSet::new();
        let mut cache = BlobCache::new();
        for ck in &self.checkpoints {
            let mut next = BlobCache::new();
            for f in &ck.files {
                if !seen.insert(Self::file_key(f)) {
                    report.files += 1;
                    report.files_repeated += 1;
                    report.bytes += f.len();
                    progress(f.len());
                    continue;
                }
                let mut errors: Vec<(Option<String>, Error)> = Vec::new();
                let r = self.rebuild_file(
                    f,
                    &cache,
                    Some(&mut next),
                    &mut |_| Ok(()),
                    Some(&mut |t: Option<&str>, e| errors.push((t.map(str::to_string), e))),
                    progress,
                );
                let failed = !errors.is_empty();
                for (t, e) in errors {
                    report.damaged.push(Damage {
                        step: ck.step,
                        file: f.path().to_string(),
                        tensor: t,
                        error: e.to_string(),
                    });
                }
                match r {
                    Ok((hash, len)) if !failed && (len != f.len() || &hash != f.hash()) => {
                        report.damaged.push(Damage {
                            step: ck.step,
                            file: f.path().to_string(),
                            tensor: None,
                            error: "BLAKE3 of the rebuilt file does not match".into(),
                        })
                    }
                    Err(e) => report.damaged.push(Damage {
                        step: ck.step,
                        file: f.path().to_string(),
                        tensor: None,
                        error: e.to_string(),
                    }),
                    _ => {}
                }
                report.files += 1;
                report.bytes += f.len();
                if let FileRecord::Safetensors { tensors, .. } = f {
                    report.tensors += tensors.len() as u64;
                }
            }
            report.checkpoints += 1;
            let size: u64 = next.values().map(|v| v.len() as u64).sum();
            // A checkpoint whose files were all repeats decoded nothing: keep the cache.
            if !next.is_empty() || ck.files.is_empty() {
                cache = if size <= VERIFY_CACHE_BYTES {
                    next
                } else {
                    BlobCache::new()
                };
            }
        }
        Ok(report)
    }
}
