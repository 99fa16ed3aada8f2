//! The `.lsd` delta file: one checkpoint coded against another (docs/FORMAT.md, "delta file").
//! Decoding reproduces the target file byte for byte, header and metadata included.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use super::{decode_tensor_pieces, encode_batched, EncodeOptions, Report, TensorPair};
use crate::backend::Device;
use crate::bytes::{ByteReader, ByteWriter};
use crate::checkpoint::Checkpoint;
use crate::output::AtomicFile;
use crate::{Error, Result};

pub const FILE_MAGIC: &[u8; 4] = b"LSDF";
pub const FILE_END: &[u8; 4] = b"LSDE";
pub const FILE_VERSION: u8 = 1;

/// Per-tensor outcome of a file encode.
#[derive(Clone, Debug)]
pub struct TensorOutcome {
    pub name: String,
    pub dtype: crate::dtype::DType,
    pub report: Report,
}

/// Check that every target tensor has a reference tensor of the same dtype and shape.
pub fn check_compatible(reference: &Checkpoint, target: &Checkpoint) -> Result<()> {
    let refs: HashMap<&str, _> = reference
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    for t in &target.tensors {
        let r = refs.get(t.name.as_str()).ok_or_else(|| {
            Error::Mismatch(format!(
                "tensor '{}' is in the target but not in the reference {}",
                t.name,
                reference.path.display()
            ))
        })?;
        if r.stored_dtype != t.stored_dtype || r.shape != t.shape {
            return Err(Error::Mismatch(format!(
                "tensor '{}': reference is {} {:?}, target is {} {:?}",
                t.name, r.stored_dtype, r.shape, t.stored_dtype, t.shape
            )));
        }
    }
    Ok(())
}

/// Encode `target` against `reference` into `out` (written to a temporary file, renamed into
/// place only when complete). Every tensor is verified by decoding before it is written.
pub fn encode_file(
    reference: &Checkpoint,
    target: &Checkpoint,
    out: &Path,
    opts: &EncodeOptions,
    budget: usize,
    device: &Device,
) -> Result<Vec<TensorOutcome>> {
    check_compatible(reference, target)?;
    let mut f = AtomicFile::create(out)?;
    let outcomes = encode_to(
        reference,
        target,
        &mut f,
        out,
        opts,
        budget,
        device,
        &|_| {},
    )?;
    f.commit()?;
    Ok(outcomes)
}

/// [`encode_file`] into any writer (standard output, a file the caller commits); `name` is
/// what write errors are reported against. `progress` gets the target bytes of each batch
/// once it is coded and written.
#[allow(clippy::too_many_arguments)]
pub fn encode_to(
    reference: &Checkpoint,
    target: &Checkpoint,
    f: &mut dyn Write,
    name: &Path,
    opts: &EncodeOptions,
    budget: usize,
    device: &Device,
    progress: &dyn Fn(u64),
) -> Result<Vec<TensorOutcome>> {
    check_compatible(reference, target)?;
    let backend = device.delta()?;
    let mut f = Named { w: f, name };
    let mut w = ByteWriter::new();
    w.bytes(FILE_MAGIC);
    w.u8(FILE_VERSION);
    w.u64(target.file_len() as u64);
    w.bytes(crate::bytes::blake3(target.bytes()).as_bytes());
    w.blob(target.header_bytes());
    w.varint(target.tensors.len() as u64);
    f.write_all(&w.buf)?;

    // Each batch is coded on the pool while this thread writes the batch before: a
    // checkpoint of many batches does not wait for the disk between them.
    let code = |batch: std::ops::Range<usize>| -> Result<Vec<Coded>> {
        let pairs: Vec<TensorPair> = target.tensors[batch]
            .iter()
            .map(|t| TensorPair {
                dtype: t.dtype,
                shape: &t.shape,
                reference: reference.data(reference.get(&t.name).unwrap()),
                target: target.data(t),
            })
            .collect();
        encode_batched(&pairs, opts, usize::MAX, backend)
    };
    let mut outcomes = Vec::new();
    let mut write = |batch: std::ops::Range<usize>, coded: Vec<Coded>| -> Result<()> {
        let entries = &target.tensors[batch];
        for (t, (blob, report)) in entries.iter().zip(coded) {
            // The blob is written from where it was coded, behind its framing: copied into
            // one buffer with its name, a large tensor's blob faulted in pages of its own
            // (a fifth of a one-shot fp32 encode's page faults).
            let mut w = ByteWriter::new();
            w.blob(t.name.as_bytes());
            w.varint(blob.len() as u64);
            f.write_all(&w.buf)?;
            f.write_all(&blob)?;
            outcomes.push(TensorOutcome {
                name: t.name.clone(),
                dtype: t.dtype,
                report,
            });
        }
        progress(entries.iter().map(|t| (t.end - t.start) as u64).sum());
        Ok(())
    };
    let mut coded: Option<(std::ops::Range<usize>, Vec<Coded>)> = None;
    for batch in super::batches(target.tensors.iter().map(|t| t.end - t.start), budget) {
        let mut next = None;
        let slot = &mut next;
        let (code, range) = (&code, batch.clone());
        // The next batch as a task of the current pool (the caller's, if it installed one).
        let wrote = rayon::in_place_scope(|s| {
            s.spawn(move |_| *slot = Some(code(range)));
            match coded.take() {
                Some((batch, blobs)) => write(batch, blobs),
                None => Ok(()),
            }
        });
        wrote?;
        coded = Some((batch, next.expect("the scope ran its task")?));
    }
    if let Some((batch, blobs)) = coded {
        write(batch, blobs)?;
    }
    f.write_all(FILE_END)?;
    f.flush()?;
    Ok(outcomes)
}

/// A tensor's blob and its report.
type Coded = (Vec<u8>, Report);

/// A writer and the name its errors are reported against.
struct Named<'a> {
    w: &'a mut dyn Write,
    name: &'a Path,
}

impl Named<'_> {
    fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.w.write_all(bytes).map_err(|e| Error::io(self.name, e))
    }

    fn flush(&mut self) -> Result<()> {
        self.w.flush().map_err(|e| Error::io(self.name, e))
    }
}

/// Decode `delta` (the bytes of an `.lsd` file) against `reference` into `out`; the result is
/// checked against the stored BLAKE3 hash of the original before it is renamed into place.
pub fn decode_file(
    reference: &Checkpoint,
    delta: &[u8],
    out: &Path,
    device: &Device,
) -> Result<()> {
    let mut f = AtomicFile::create(out)?;
    decode_to(reference, delta, &mut f, out, device, &|_| {})?;
    f.commit()
}

/// The length of the checkpoint an `.lsd` file restores, from its header (for progress).
pub fn decoded_len(delta: &[u8]) -> Result<u64> {
    let mut r = ByteReader::new(delta, "delta file");
    if r.take(4)? != FILE_MAGIC {
        return Err(r.err("not a lockstep delta file (bad magic)"));
    }
    r.u8()?;
    r.u64()
}

/// [`decode_file`] into any writer. Bytes reach `f` as each tensor is decoded (each checked
/// against its blob's checksums); the BLAKE3 of the whole is checked at the end, so a caller
/// writing to a stream rather than a file it commits must treat an error as "discard what was
/// written". `progress` gets the bytes of each piece written.
pub fn decode_to(
    reference: &Checkpoint,
    delta: &[u8],
    f: &mut dyn Write,
    name: &Path,
    device: &Device,
    progress: &dyn Fn(u64),
) -> Result<()> {
    let backend = device.delta()?;
    let mut f = Named { w: f, name };
    let mut r = ByteReader::new(delta, "delta file");
    if r.take(4)? != FILE_MAGIC {
        return Err(r.err("not a lockstep delta file (bad magic)"));
    }
    let version = r.u8()?;
    if version != FILE_VERSION {
        return Err(Error::Unsupported(format!("delta file version {version}")));
    }
    let file_len = r.u64()?;
    let hash: [u8; 32] = r.take(32)?.try_into().unwrap();
    let header = r.blob()?;
    let n = r.varint_max(delta.len() as u64, "tensor count")?;

    let mut hasher = blake3::Hasher::new();
    let mut written = 0u64;
    let mut emit = |bytes: &[u8], f: &mut Named| -> Result<()> {
        written += bytes.len() as u64;
        progress(bytes.len() as u64);
        // Not on the pool, which decodes the next piece meanwhile (`update_rayon`'s tasks
        // queued behind that decode: the hash took 27-48 ms of a one-shot fp32 decode). A
        // large piece is hashed on a thread of its own while this one writes it: with the
        // pool's decode, three things at once instead of hash-then-write on the path.
        if bytes.len() < 1 << 20 {
            hasher.update(bytes);
            return f.write_all(bytes);
        }
        std::thread::scope(|s| {
            let hashing = s.spawn(|| {
                hasher.update(bytes);
            });
            let wrote = f.write_all(bytes);
            hashing.join().expect("hashing a piece does not panic");
            wrote
        })
    };
    emit(header, &mut f)?;
    for _ in 0..n {
        let name = std::str::from_utf8(r.blob()?)
            .map_err(|_| r.err("tensor name is not UTF-8"))?
            .to_string();
        let blob = r.blob()?;
        let reference_tensor = reference.get(&name).ok_or_else(|| {
            Error::Mismatch(format!(
                "tensor '{name}' is not in the reference {}",
                reference.path.display()
            ))
        })?;
        decode_tensor_pieces(
            blob,
            reference.data(reference_tensor),
            backend,
            None,
            &mut |piece| emit(piece, &mut f),
        )
        .map_err(|e| e.context(format!("tensor '{name}'")))?;
    }
    if r.take(4)? != FILE_END {
        return Err(r.err("missing end marker (truncated?)"));
    }
    r.expect_end()?;
    if written != file_len {
        return Err(Error::Checksum {
            what: "decoded checkpoint file (length)".into(),
            stored: format!("{file_len} B"),
            computed: format!("{written} B"),
        });
    }
    let computed = hasher.finalize();
    if *computed.as_bytes() != hash {
        return Err(Error::hash_mismatch(
            "decoded checkpoint file (BLAKE3)",
            &hash,
            computed.as_bytes(),
        ));
    }
    f.flush()
}
