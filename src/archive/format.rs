//! The on-disk records of a trajectory archive (docs/FORMAT.md, "Trajectory archive").
//!
//! ```text
//! file    = header blob-data* (commit footer blob-data*)* ...
//! header  = "LSTPARCH" version:u8 = 2  0:u8 0:u8 0:u8 keyframe_interval:u32 crc32:u32
//!           (version 1, written before the checksum existed: the same without crc32)
//! commit  = "LSTC" version:u8 prev_end:u64 body_len:varint zstd(body) crc32:u32
//!           (prev_end: the end of the previous footer, 0 for the first commit; version 1,
//!           or 2 = version 1's body followed by each file's mode and modification time)
//! footer  = "LSTPFOOT" commit_offset:u64 commit_len:u64 n_checkpoints:u64 crc32:u32 "LSTE"
//! ```
//!
//! Every append writes its new blobs after the last valid footer, then one commit record and
//! its footer. The reader takes the last footer whose checksum and commit record check out;
//! anything after it is the remains of an interrupted append and is ignored (and cut off by
//! the next append).

use crate::bytes::{ByteReader, ByteWriter};
use crate::dtype::DType;
use crate::{Error, Result};

pub const FILE_MAGIC: &[u8; 8] = b"LSTPARCH";
/// The header this build writes: version 2, checksummed.
pub const HEADER_VERSION: u8 = 2;
/// Length of a version-2 header.
pub const HEADER_LEN: usize = 20;
/// Length of a version-1 header (no checksum), the shortest header there is.
pub const HEADER_LEN_V1: usize = 16;
pub const COMMIT_MAGIC: &[u8; 4] = b"LSTC";
/// The commit record version written: 2 adds each file's mode and modification time after
/// the version-1 body. Readers take both, per commit, so an append onto an archive of
/// version-1 commits simply adds version-2 ones.
pub const COMMIT_VERSION: u8 = 2;
/// The oldest commit record version read (no file metadata: files are extracted with the
/// default mode and the current time).
pub const COMMIT_VERSION_MIN: u8 = 1;
pub const FOOTER_MAGIC: &[u8; 8] = b"LSTPFOOT";
pub const FOOTER_END: &[u8; 4] = b"LSTE";
pub const FOOTER_LEN: usize = 40;
/// A commit body may be at most this many times its compressed size (plus 64 KiB): counts and
/// lengths read from a file never size an allocation far beyond the file.
const MAX_BODY_RATIO: u64 = 64;

/// How a blob's bytes are coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlobKind {
    /// A tensor coded standalone by [`crate::anchor`].
    Anchor = 0,
    /// A tensor coded by [`crate::delta`] against the decoded bytes of blob `reference`.
    Delta = 1,
    /// Verbatim bytes (safetensors headers, config files): a mode byte (0 raw, 1 zstd) and
    /// the payload.
    Bytes = 2,
}

impl BlobKind {
    pub fn name(self) -> &'static str {
        match self {
            BlobKind::Anchor => "anchor",
            BlobKind::Delta => "delta",
            BlobKind::Bytes => "bytes",
        }
    }
}

/// One stored blob. Blob ids are indices in order of creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobRecord {
    /// Absolute byte offset in the archive file.
    pub offset: u64,
    pub len: u64,
    pub kind: BlobKind,
    /// Delta blobs: the id of the blob whose decoded bytes are the reference.
    pub reference: Option<u64>,
    /// Blobs to decode to get this one (0 for anchor and bytes blobs).
    pub depth: u32,
    pub dtype: DType,
    /// Length of the decoded bytes.
    pub raw_len: u64,
    /// BLAKE3 of the decoded (original) bytes.
    pub hash: [u8; 32],
}

/// One tensor of a safetensors file, in data-offset order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRecord {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub blob: u64,
}

/// A file's mode and modification time as packed (commit version 2 and later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// `st_mode` as the OS reported it (file type and permission bits); never 0 for a
    /// recorded file (0 on disk means "not recorded"). Extraction restores `mode & 0o777`.
    pub mode: u32,
    /// Modification time: seconds since the Unix epoch (negative before it) and nanoseconds.
    pub mtime_s: i64,
    pub mtime_ns: u32,
}

impl FileMeta {
    /// The metadata of a file on disk (`None` where the platform has no Unix mode).
    pub fn of(meta: &std::fs::Metadata) -> Option<FileMeta> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let mode = meta.mode();
            (mode != 0).then_some(FileMeta {
                mode,
                mtime_s: meta.mtime(),
                mtime_ns: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }

    /// The permission bits restored on extraction.
    pub fn permissions(&self) -> u32 {
        self.mode & 0o777
    }

    pub fn mtime(&self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        let ns = Duration::from_nanos(self.mtime_ns as u64);
        if self.mtime_s >= 0 {
            UNIX_EPOCH + Duration::from_secs(self.mtime_s as u64) + ns
        } else {
            UNIX_EPOCH - Duration::from_secs(self.mtime_s.unsigned_abs()) + ns
        }
    }
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileRecord {
    /// Rebuilt as the header blob's bytes followed by every tensor's bytes in order.
    Safetensors {
        path: String,
        header_blob: u64,
        len: u64,
        hash: [u8; 32],
        tensors: Vec<TensorRecord>,
        /// Mode and modification time (`None` in version-1 commits).
        meta: Option<FileMeta>,
    },
    /// Stored verbatim in one bytes blob.
    Verbatim {
        path: String,
        blob: u64,
        len: u64,
        hash: [u8; 32],
        meta: Option<FileMeta>,
    },
}

impl FileRecord {
    pub fn path(&self) -> &str {
        match self {
            FileRecord::Safetensors { path, .. } | FileRecord::Verbatim { path, .. } => path,
        }
    }
    pub fn len(&self) -> u64 {
        match self {
            FileRecord::Safetensors { len, .. } | FileRecord::Verbatim { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn hash(&self) -> &[u8; 32] {
        match self {
            FileRecord::Safetensors { hash, .. } | FileRecord::Verbatim { hash, .. } => hash,
        }
    }
    pub fn meta(&self) -> Option<&FileMeta> {
        match self {
            FileRecord::Safetensors { meta, .. } | FileRecord::Verbatim { meta, .. } => {
                meta.as_ref()
            }
        }
    }
    /// Every blob the file is rebuilt from (the header blob first for safetensors).
    pub fn blob_ids(&self) -> Vec<u64> {
        match self {
            FileRecord::Safetensors {
                header_blob,
                tensors,
                ..
            } => std::iter::once(*header_blob)
                .chain(tensors.iter().map(|t| t.blob))
                .collect(),
            FileRecord::Verbatim { blob, .. } => vec![*blob],
        }
    }
}

/// How the checkpoint was given: one `.safetensors` file, or a directory of files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    SingleFile = 0,
    Directory = 1,
}

/// One checkpoint: its step, where it came from, and its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub step: u64,
    /// The name the checkpoint had (file or directory name), for listings.
    pub label: String,
    pub layout: Layout,
    /// Whether every tensor was coded standalone (a keyframe).
    pub keyframe: bool,
    pub files: Vec<FileRecord>,
}

impl CheckpointRecord {
    pub fn input_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len()).sum()
    }
    pub fn tensors(&self) -> impl Iterator<Item = &TensorRecord> {
        self.files.iter().flat_map(|f| match f {
            FileRecord::Safetensors { tensors, .. } => tensors.as_slice(),
            FileRecord::Verbatim { .. } => &[],
        })
    }
}

/// A decoded commit record.
#[derive(Clone, Debug)]
pub struct Commit {
    pub prev_commit: u64,
    pub first_blob: u64,
    pub blobs: Vec<BlobRecord>,
    pub checkpoint: CheckpointRecord,
}

pub fn write_header(keyframe_interval: u32) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.bytes(FILE_MAGIC);
    w.u8(HEADER_VERSION);
    w.bytes(&[0, 0, 0]);
    w.u32(keyframe_interval);
    let crc = crate::bytes::crc32(&w.buf);
    w.u32(crc);
    w.buf
}

/// The parsed file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub keyframe_interval: u32,
    /// Its length in bytes: where the first blob may start.
    pub len: usize,
    /// Whether the header carries a checksum (version 2). A version-1 header has none: its
    /// keyframe interval is checked against the commits instead.
    pub checksummed: bool,
}

/// Parse the file header (version 2, or version 1 from before the checksum).
pub fn read_header(bytes: &[u8]) -> Result<Header> {
    if bytes.len() < 8 || &bytes[..8] != FILE_MAGIC {
        return Err(Error::format(
            "archive",
            "not a lockstep trajectory archive (bad magic)",
        ));
    }
    let mut r = ByteReader::new(bytes, "archive header");
    r.take(8)?;
    let version = r.u8()?;
    let len = match version {
        1 => HEADER_LEN_V1,
        2 => HEADER_LEN,
        _ => {
            return Err(Error::Unsupported(format!(
                "archive header version {version} (this build reads 1 and 2)"
            )))
        }
    };
    if version >= 2 {
        if bytes.len() < HEADER_LEN {
            return Err(r.err("truncated header"));
        }
        let stored = u32::from_le_bytes(bytes[16..20].try_into().unwrap());
        let computed = crate::bytes::crc32(&bytes[..16]);
        if stored != computed {
            return Err(Error::checksum32(
                "archive header (CRC-32)",
                stored,
                computed,
            ));
        }
    }
    if r.take(3)? != [0, 0, 0] {
        return Err(r.err("reserved header bytes are not zero"));
    }
    let k = r.u32()?;
    if k == 0 {
        return Err(r.err("keyframe interval 0"));
    }
    Ok(Header {
        keyframe_interval: k,
        len,
        checksummed: version >= 2,
    })
}

fn hash32(r: &mut ByteReader) -> Result<[u8; 32]> {
    Ok(r.take(32)?.try_into().unwrap())
}

fn string(r: &mut ByteReader, what: &str) -> Result<String> {
    let b = r.blob()?;
    String::from_utf8(b.to_vec()).map_err(|_| r.err(format!("{what} is not UTF-8")))
}

fn write_body(w: &mut ByteWriter, c: &Commit) {
    w.varint(c.first_blob);
    w.varint(c.blobs.len() as u64);
    for b in &c.blobs {
        w.varint(b.offset);
        w.varint(b.len);
        w.u8(b.kind as u8);
        w.varint(b.reference.map_or(0, |r| r + 1));
        w.varint(b.depth as u64);
        w.u8(b.dtype.code());
        w.varint(b.raw_len);
        w.bytes(&b.hash);
    }
    let k = &c.checkpoint;
    w.varint(k.step);
    w.blob(k.label.as_bytes());
    w.u8(k.layout as u8);
    w.u8(k.keyframe as u8);
    w.varint(k.files.len() as u64);
    for f in &k.files {
        match f {
            FileRecord::Safetensors {
                path,
                header_blob,
                len,
                hash,
                tensors,
                ..
            } => {
                w.u8(0);
                w.blob(path.as_bytes());
                w.varint(*len);
                w.bytes(hash);
                w.varint(*header_blob);
                w.varint(tensors.len() as u64);
                for t in tensors {
                    w.blob(t.name.as_bytes());
                    w.u8(t.dtype.code());
                    w.varint(t.shape.len() as u64);
                    for &d in &t.shape {
                        w.varint(d);
                    }
                    w.varint(t.blob);
                }
            }
            FileRecord::Verbatim {
                path,
                blob,
                len,
                hash,
                ..
            } => {
                w.u8(1);
                w.blob(path.as_bytes());
                w.varint(*len);
                w.bytes(hash);
                w.varint(*blob);
            }
        }
    }
    // Version 2: each file's metadata, in file order, after the version-1 body.
    for f in &k.files {
        let m = f.meta().copied().unwrap_or(FileMeta {
            mode: 0,
            mtime_s: 0,
            mtime_ns: 0,
        });
        w.u32(m.mode);
        w.u64(m.mtime_s as u64);
        w.u32(m.mtime_ns);
    }
}

/// Serialize a commit record.
pub fn write_commit(c: &Commit) -> Vec<u8> {
    let mut body = ByteWriter::new();
    write_body(&mut body, c);
    let z = zstd::bulk::compress(&body.buf, 3).expect("zstd compresses in memory");
    let mut w = ByteWriter::new();
    w.bytes(COMMIT_MAGIC);
    w.u8(COMMIT_VERSION);
    w.u64(c.prev_commit);
    w.varint(body.buf.len() as u64);
    w.bytes(&z);
    let crc = crate::bytes::crc32(&w.buf);
    w.u32(crc);
    w.buf
}

/// Parse a commit record (the exact bytes, checksum last).
pub fn read_commit(bytes: &[u8]) -> Result<Commit> {
    if bytes.len() < 4 + 1 + 8 + 1 + 4 || &bytes[..4] != COMMIT_MAGIC {
        return Err(Error::format("archive commit record", "bad magic"));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(crc.try_into().unwrap());
    let computed = crate::bytes::crc32(body);
    if stored != computed {
        return Err(Error::checksum32(
            "archive commit record (CRC-32)",
            stored,
            computed,
        ));
    }
    let mut r = ByteReader::new(body, "archive commit record");
    r.take(4)?;
    let version = r.u8()?;
    if !(COMMIT_VERSION_MIN..=COMMIT_VERSION).contains(&version) {
        return Err(Error::Unsupported(format!(
            "archive commit version {version} (this build reads {COMMIT_VERSION_MIN} to {COMMIT_VERSION})"
        )));
    }
    let prev_commit = r.u64()?;
    // Bodies are mostly BLAKE3 hashes and varints, which zstd shrinks little; the bound keeps
    // a forged length from sizing a large allocation.
    let max_body = (r.remaining() as u64).saturating_mul(MAX_BODY_RATIO) + (64 << 10);
    let body_len = r.varint_max(max_body, "commit body length")? as usize;
    let z = r.take(r.remaining())?;
    let plain = zstd::bulk::decompress(z, body_len)
        .map_err(|e| Error::format("archive commit record", format!("zstd: {e}")))?;
    if plain.len() != body_len {
        return Err(Error::format(
            "archive commit record",
            "body has the wrong length",
        ));
    }
    let mut r = ByteReader::new(&plain, "archive commit record");
    let first_blob = r.varint()?;
    // offset, len, kind, reference, depth, dtype, raw_len (a byte each at least), BLAKE3.
    let n = r.count(7 + 32, "blob count")?;
    let mut blobs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let id = first_blob + i;
        let offset = r.varint()?;
        let len = r.varint()?;
        let kind = match r.u8()? {
            0 => BlobKind::Anchor,
            1 => BlobKind::Delta,
            2 => BlobKind::Bytes,
            k => return Err(r.err(format!("blob {id}: unknown kind {k}"))),
        };
        let reference = match r.varint()? {
            0 => None,
            x if x - 1 < id => Some(x - 1),
            x => return Err(r.err(format!("blob {id} refers to blob {} (not earlier)", x - 1))),
        };
        if (kind == BlobKind::Delta) != reference.is_some() {
            return Err(r.err(format!("blob {id}: reference does not match its kind")));
        }
        let depth = r.varint_max(u32::MAX as u64, "blob depth")? as u32;
        let dtype = DType::from_code(r.u8()?)?;
        let raw_len = r.varint()?;
        let hash = hash32(&mut r)?;
        blobs.push(BlobRecord {
            offset,
            len,
            kind,
            reference,
            depth,
            dtype,
            raw_len,
            hash,
        });
    }
    let step = r.varint()?;
    let label = string(&mut r, "checkpoint label")?;
    let layout = match r.u8()? {
        0 => Layout::SingleFile,
        1 => Layout::Directory,
        v => return Err(r.err(format!("unknown layout {v}"))),
    };
    let keyframe = r.u8()? != 0;
    let nf = r.count(1 + 1 + 1 + 32 + 1, "file count")?;
    let mut files = Vec::new();
    for _ in 0..nf {
        let kind = r.u8()?;
        let path = string(&mut r, "file path")?;
        let len = r.varint()?;
        let hash = hash32(&mut r)?;
        files.push(match kind {
            0 => {
                let header_blob = r.varint()?;
                let nt = r.count(1 + 1 + 1 + 1, "tensor count")?;
                let mut tensors = Vec::new();
                for _ in 0..nt {
                    let name = string(&mut r, "tensor name")?;
                    let dtype = DType::from_code(r.u8()?)?;
                    let nd = r.varint_max(64, "tensor rank")?;
                    let shape = (0..nd).map(|_| r.varint()).collect::<Result<Vec<_>>>()?;
                    let blob = r.varint()?;
                    tensors.push(TensorRecord {
                        name,
                        dtype,
                        shape,
                        blob,
                    });
                }
                FileRecord::Safetensors {
                    path,
                    header_blob,
                    len,
                    hash,
                    tensors,
                    meta: None,
                }
            }
            1 => FileRecord::Verbatim {
                path,
                blob: r.varint()?,
                len,
                hash,
                meta: None,
            },
            k => return Err(r.err(format!("unknown file kind {k}"))),
        });
    }
    if version >= 2 {
        for f in &mut files {
            let mode = r.u32()?;
            let mtime_s = r.u64()? as i64;
            let mtime_ns = r.u32()?;
            if mtime_ns >= 1_000_000_000 {
                return Err(r.err(format!("{}: mtime nanoseconds {mtime_ns}", f.path())));
            }
            let m = (mode != 0).then_some(FileMeta {
                mode,
                mtime_s,
                mtime_ns,
            });
            match f {
                FileRecord::Safetensors { meta, .. } | FileRecord::Verbatim { meta, .. } => {
                    *meta = m
                }
            }
        }
    }
    r.expect_end()?;
    Ok(Commit {
        prev_commit,
        first_blob,
        blobs,
        checkpoint: CheckpointRecord {
            step,
            label,
            layout,
            keyframe,
            files,
        },
    })
}

/// A footer: where the last commit record is, and how many checkpoints the archive holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    pub commit_offset: u64,
    pub commit_len: u64,
    pub n_checkpoints: u64,
}

pub fn write_footer(f: &Footer) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.bytes(FOOTER_MAGIC);
    w.u64(f.commit_offset);
    w.u64(f.commit_len);
    w.u64(f.n_checkpoints);
    let crc = crate::bytes::crc32(&w.buf);
    w.u32(crc);
    w.bytes(FOOTER_END);
    w.buf
}

/// Parse a footer that ends at `end` (its own offset is `end - FOOTER_LEN`); `None` if these
/// bytes are not a valid footer or it points outside the file.
pub fn read_footer(bytes: &[u8], end: usize) -> Option<Footer> {
    if end < HEADER_LEN_V1 + FOOTER_LEN || end > bytes.len() {
        return None;
    }
    let b = &bytes[end - FOOTER_LEN..end];
    if &b[..8] != FOOTER_MAGIC || &b[36..] != FOOTER_END {
        return None;
    }
    let crc = u32::from_le_bytes(b[32..36].try_into().unwrap());
    if crate::bytes::crc32(&b[..32]) != crc {
        return None;
    }
    let f = Footer {
        commit_offset: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        commit_len: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        n_checkpoints: u64::from_le_bytes(b[24..32].try_into().unwrap()),
    };
    // The commit record sits right before its footer.
    (f.commit_offset.checked_add(f.commit_len) == Some((end - FOOTER_LEN) as u64)).then_some(f)
}
