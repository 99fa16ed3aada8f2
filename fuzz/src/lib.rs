//! The fuzz harnesses: one function per target, shared by the cargo-fuzz targets in
//! `fuzz/fuzz_targets/` and by the stable replay test `tests/fuzz_regressions.rs` (which
//! includes this file as a module), so a regression file is replayed through exactly the code
//! path that found it.
//!
//! Every harness takes arbitrary bytes and must return without panicking, whatever they are.
//! Most formats are guarded by checksums that random mutations almost never satisfy, so the
//! harnesses also run each input a second time with those checksums recomputed ("fixed up"):
//! that lets the fuzzer reach the parsers and decoders behind them. Where a harness can check
//! more than "no panic" it does (round trips, backends agreeing, appends that verify).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lockstep::archive::{self, Archive, PackOptions};
use lockstep::backend::cpu::lm::freq::answer;
use lockstep::backend::cpu::{CpuAt, Isa};
use lockstep::backend::lm::Find;
use lockstep::backend::reference::ReferenceBackend;
use lockstep::backend::{Backend, DecodeJob};
use lockstep::bytes::{crc32, ByteReader};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::{self, Layout, Mode, CHUNK_ELEMS, LANES};
use lockstep::dtype::DType;
use lockstep::entropy::freq::{normalize, PROB_BITS};
use lockstep::entropy::rans::{dec_advance, dec_get, enc_put, RANS_L};
use lockstep::format::chunk::DecodeChunk;
use lockstep::format::layout_stages;
use lockstep::format::lm::model_file::Model;
use lockstep::format::symbols::JOINT_MAX_WIDTH;
use lockstep::format::tables::{Space, Stage, StageTable, Tables};
use lockstep::lm::range_coder;
use lockstep::lm::text_codec;

/// Largest reference tensor a harness builds for a blob header (bigger blobs get an empty
/// reference, which the decoder must reject as the wrong size).
pub const MAX_REFERENCE_BYTES: u64 = 4 << 20;

/// Elements of the tensors `rans_decode` builds (one chunk).
pub const RANS_MAX_ELEMS: u64 = 1 << 14;

// ---------------------------------------------------------------------------------------------
// Shared fixtures

/// SplitMix64, so references are the same on every machine and in every process.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The reference tensor bytes the blob harnesses decode against: a deterministic function of
/// the length only, so the seed blobs (encoded against it) decode in full.
pub fn reference_bytes(len: usize) -> Vec<u8> {
    let mut s = 0x5eed ^ len as u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The repository root (this file is compiled both from `fuzz/` and from the root crate).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("models").is_dir() {
        here
    } else {
        here.parent().map(Path::to_path_buf).unwrap_or(here)
    }
}

/// A per-process scratch directory, kept for the process's life.
fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("create a temporary directory"))
        .path()
}

/// A fresh, empty directory under the scratch directory.
fn fresh_dir(name: &str) -> PathBuf {
    let d = scratch().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

/// Write a safetensors file from (name, dtype name, shape, bytes), in the given order.
pub fn safetensors_bytes(tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            shape.join(","),
            data.len(),
            data.len() + bytes.len()
        ));
        data.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

/// The small checkpoint the `.lsd` harness decodes against (and the seeds were coded against).
pub fn lsd_reference_tensors() -> Vec<(&'static str, &'static str, Vec<u64>, Vec<u8>)> {
    vec![
        ("a.weight", "BF16", vec![8, 40], reference_bytes(2 * 320)),
        ("b.bias", "F32", vec![33], reference_bytes(4 * 33)),
        ("c.ids", "I64", vec![5], reference_bytes(8 * 5)),
        ("d.half", "F16", vec![2, 3], reference_bytes(2 * 6)),
        ("e.f8", "F8_E4M3", vec![64], reference_bytes(64)),
    ]
}

fn lsd_reference() -> &'static Checkpoint {
    static CK: OnceLock<Checkpoint> = OnceLock::new();
    CK.get_or_init(|| {
        let p = scratch().join("lsd_reference.safetensors");
        std::fs::write(&p, safetensors_bytes(&lsd_reference_tensors())).unwrap();
        Checkpoint::open(&p).expect("the reference checkpoint opens")
    })
}

/// The small checkpoint `archive_read` appends: same names as the seeds' checkpoints.
pub fn append_tensors() -> Vec<(&'static str, &'static str, Vec<u64>, Vec<u8>)> {
    vec![
        (
            "a.weight",
            "BF16",
            vec![8, 40],
            reference_bytes(2 * 320 + 1)[1..].to_vec(),
        ),
        (
            "b.bias",
            "F32",
            vec![33],
            reference_bytes(4 * 33 + 1)[1..].to_vec(),
        ),
        ("c.ids", "I64", vec![5], reference_bytes(8 * 5)),
    ]
}

fn append_source() -> &'static archive::CheckpointSource {
    static SRC: OnceLock<archive::CheckpointSource> = OnceLock::new();
    SRC.get_or_init(|| {
        let d = scratch().join("append_src");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("appended.safetensors");
        std::fs::write(&p, safetensors_bytes(&append_tensors())).unwrap();
        archive::resolve(&p).expect("the append fixture resolves")
    })
}

/// The shipped text model, loaded once.
pub fn text_model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let p = repo_root().join("models/tinygpt2.lsm");
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        Model::from_bytes(&bytes).expect("the shipped model loads")
    })
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn get_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

// ---------------------------------------------------------------------------------------------
// blob_decode

/// Recompute a tensor blob's trailing CRC and, for modes that use one, its reference CRC
/// against `reference`. Returns false when the header does not parse.
pub fn fix_blob(blob: &mut [u8], reference: &[u8]) -> bool {
    let n = blob.len();
    if n < 8 {
        return false;
    }
    let c = crc32(&blob[..n - 4]);
    put_u32(blob, n - 4, c);
    let Ok((h, rest)) = delta::blob::read_header(blob) else {
        return false;
    };
    let payload_at = rest.as_ptr() as usize - blob.as_ptr() as usize;
    if h.mode != Mode::Raw && payload_at >= 8 {
        put_u32(blob, payload_at - 8, crc32(reference));
        let c = crc32(&blob[..n - 4]);
        put_u32(blob, n - 4, c);
    }
    true
}

/// The reference a blob's header asks for ([`reference_bytes`] of its size), or empty.
pub fn blob_reference(blob: &[u8]) -> Vec<u8> {
    let mut b = blob.to_vec();
    if b.len() >= 8 {
        let n = b.len();
        let c = crc32(&b[..n - 4]);
        put_u32(&mut b, n - 4, c);
    }
    match delta::blob::read_header(&b) {
        Ok((h, _)) => match h.n_elements.checked_mul(h.dtype.size() as u64) {
            Some(len) if len <= MAX_REFERENCE_BYTES => reference_bytes(len as usize),
            _ => Vec::new(),
        },
        Err(_) => Vec::new(),
    }
}

/// Every decoder of the modeled path this CPU runs: the reference backend and the fast CPU
/// backend at each instruction-set level.
fn backends() -> Vec<Box<dyn Backend>> {
    let mut v: Vec<Box<dyn Backend>> = vec![Box::new(ReferenceBackend)];
    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
        if let Some(b) = CpuAt::new(isa) {
            v.push(Box::new(b));
        }
    }
    v
}

fn agree(what: &str, results: &[(&str, lockstep::Result<Vec<u8>>)]) {
    let (name0, first) = &results[0];
    for (name, r) in &results[1..] {
        match (first, r) {
            (Ok(a), Ok(b)) => assert!(a == b, "{what}: {name0} and {name} decode differently"),
            (Ok(_), Err(e)) | (Err(e), Ok(_)) => {
                panic!("{what}: {name0} and {name} disagree on success: {e}")
            }
            (Err(_), Err(_)) => {}
        }
    }
}

/// A delta tensor blob against a reference buffer: as given (with an empty reference), then
/// with its checksums fixed up, on every backend; the backends must agree.
pub fn blob_decode(data: &[u8]) {
    let _ = delta::decode_tensor(data, &[], &lockstep::backend::cpu::CpuBackend);
    let reference = blob_reference(data);
    let mut b = data.to_vec();
    if !fix_blob(&mut b, &reference) {
        let _ = delta::decode_tensor(&b, &reference, &lockstep::backend::cpu::CpuBackend);
        return;
    }
    let results: Vec<(&str, lockstep::Result<Vec<u8>>)> = backends()
        .iter()
        .map(|be| (be.name(), delta::decode_tensor(&b, &reference, be.as_ref())))
        .collect();
    agree("blob", &results);
}

// ---------------------------------------------------------------------------------------------
// lsd_read

/// Fix up the checksums of every tensor blob of an `.lsd` file whose tensor the reference has.
pub fn fix_lsd(data: &[u8], reference: &Checkpoint) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut blobs = Vec::new();
    let mut r = ByteReader::new(data, "delta file");
    let parsed = (|| -> lockstep::Result<()> {
        r.take(4 + 1 + 8 + 32)?;
        r.blob()?;
        let n = r.varint_max(data.len() as u64, "tensor count")?;
        for _ in 0..n {
            let name = r.blob()?;
            let before = r.pos();
            let blob = r.blob()?;
            let start = r.pos() - blob.len();
            let _ = before;
            blobs.push((name.to_vec(), start..r.pos()));
        }
        Ok(())
    })();
    let _ = parsed;
    for (name, range) in blobs {
        let Ok(name) = std::str::from_utf8(&name) else {
            continue;
        };
        if let Some(t) = reference.get(name) {
            fix_blob(&mut out[range], reference.data(t));
        }
    }
    out
}

/// An `.lsd` delta file decoded against a small reference checkpoint: as given, then with its
/// tensor blobs' checksums fixed up.
pub fn lsd_read(data: &[u8]) {
    let ck = lsd_reference();
    let dir = fresh_dir("lsd");
    let out = dir.join("out.safetensors");
    let _ = delta::file::decode_file(ck, data, &out, &lockstep::backend::Device::cpu());
    let fixed = fix_lsd(data, ck);
    if fixed != data {
        let _ = delta::file::decode_file(ck, &fixed, &out, &lockstep::backend::Device::cpu());
    }
}

// ---------------------------------------------------------------------------------------------
// archive_read

/// Recompute the CRC of every footer-shaped record (start and end markers in place) and of the
/// commit record it points to.
pub fn fix_archive(data: &[u8]) -> Vec<u8> {
    use archive::format::{FILE_MAGIC, FOOTER_END, FOOTER_LEN, FOOTER_MAGIC};
    let mut b = data.to_vec();
    // The version-2 header's CRC-32 over its first 16 bytes.
    if b.len() >= 20 && &b[..8] == FILE_MAGIC && b[8] >= 2 {
        let c = crc32(&b[..16]);
        put_u32(&mut b, 16, c);
    }
    let mut p = 0;
    while p + FOOTER_LEN <= b.len() {
        if &b[p..p + 8] == FOOTER_MAGIC && &b[p + 36..p + 40] == FOOTER_END {
            let (off, len) = (get_u64(&b, p + 8).unwrap(), get_u64(&b, p + 16).unwrap());
            if let Some(end) = off.checked_add(len) {
                if len >= 4 && end as usize <= p && (off as usize) < b.len() {
                    let (off, end) = (off as usize, end as usize);
                    let c = crc32(&b[off..end - 4]);
                    put_u32(&mut b, end - 4, c);
                }
            }
            let c = crc32(&b[p..p + 32]);
            put_u32(&mut b, p + 32, c);
            p += FOOTER_LEN;
        } else {
            p += 1;
        }
    }
    b
}

/// Whether `verify` ran and found the archive complete and intact.
fn clean(v: &lockstep::Result<archive::VerifyReport>) -> bool {
    v.as_ref().is_ok_and(|v| v.ok())
}

fn archive_once(data: &[u8]) {
    let dir = fresh_dir("archive");
    let path = dir.join("in.lstp");
    std::fs::write(&path, data).expect("write the archive");
    let before = match Archive::open(&path) {
        Ok(a) => {
            // list
            let _ = a.summaries();
            let _ = a.stats();
            let _ = (a.ignored_tail(), a.damaged_last_footer());
            for ck in &a.checkpoints {
                let _ = ck.tensors().count();
                let _ = ck.input_bytes();
            }
            let v = a.verify(&|_| {});
            for (i, ck) in a.checkpoints.iter().take(3).enumerate() {
                let out = dir.join(format!("x{i}"));
                std::fs::create_dir_all(&out).unwrap();
                let _ = a.extract(ck.step, &out, &|_| {});
            }
            Some(clean(&v))
        }
        Err(_) => None,
    };
    // append onto it: it must refuse, or leave an archive whose new checkpoint verifies (and
    // that verifies in full if the archive did before).
    let opts = PackOptions::default();
    if archive::append(&path, append_source(), None, &opts, &|_| {}).is_ok() {
        let a = Archive::open(&path).expect("an archive that took an append opens");
        let last = a.checkpoints.last().expect("the appended checkpoint").step;
        let v = a.verify(&|_| {});
        if let Ok(v) = &v {
            let new_damage: Vec<_> = v.damaged.iter().filter(|d| d.step == last).collect();
            assert!(
                new_damage.is_empty(),
                "the appended checkpoint does not verify: {new_damage:?}"
            );
        }
        if before == Some(true) {
            assert!(
                clean(&v),
                "a clean archive no longer verifies after an append: {v:?}"
            );
        }
        let out = dir.join("appended");
        std::fs::create_dir_all(&out).unwrap();
        a.extract(last, &out, &|_| {})
            .expect("the appended checkpoint extracts");
    }
}

/// An archive file: open, list, verify, extract, then append a small checkpoint to it. As
/// given, then with its footer and commit checksums fixed up.
pub fn archive_read(data: &[u8]) {
    archive_once(data);
    let fixed = fix_archive(data);
    if fixed != data {
        archive_once(&fixed);
    }
}

// ---------------------------------------------------------------------------------------------
// text_decode

/// Put the model's hash into a text stream header and recompute the header CRC.
pub fn fix_text(data: &[u8], model: &Model) -> Vec<u8> {
    let mut b = data.to_vec();
    if b.len() >= 104 && &b[..8] == text_codec::MAGIC {
        b[12..44].copy_from_slice(&model.hash);
        let n_seg = get_u32(&b, 100).unwrap() as usize;
        if let Some(end) = n_seg.checked_mul(8).and_then(|x| x.checked_add(104)) {
            if end + 4 <= b.len() {
                let c = crc32(&b[..end]);
                put_u32(&mut b, end, c);
            }
        }
    }
    b
}

/// A `.lst` text stream decoded with the shipped model: as given, then with the model hash and
/// header CRC fixed up.
pub fn text_decode(data: &[u8]) {
    let model = text_model();
    let _ = text_codec::decompress(model, data, &lockstep::backend::Device::cpu());
    let fixed = fix_text(data, model);
    if fixed != data {
        let _ = text_codec::decompress(model, &fixed, &lockstep::backend::Device::cpu());
    }
}

// ---------------------------------------------------------------------------------------------
// model_load

/// A `.lsm` model file: as given, then with its trailing BLAKE3 recomputed. A model that loads
/// must serialize back to the same bytes.
pub fn model_load(data: &[u8]) {
    let _ = Model::from_bytes(data);
    if data.len() >= 44 && &data[..8] == lockstep::format::lm::model_file::MAGIC {
        let mut b = data.to_vec();
        let n = b.len();
        let h = blake3::hash(&b[..n - 32]);
        b[n - 32..].copy_from_slice(h.as_bytes());
        if let Ok(mut m) = Model::from_bytes(&b) {
            assert!(
                m.to_bytes() == b,
                "a loaded model does not serialize to its file"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// rans_decode

const FLOAT_DTYPES: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
];

/// The decoders' rANS lanes alone. Input: `dtype code u8, varint n (<= RANS_MAX_ELEMS)`, then
/// a modeled payload as in a tensor blob (docs/FORMAT.md 1.1) for one chunk; the reference is
/// [`reference_bytes`]. Parsed as `delta::blob` does, then decoded by every backend, which must
/// agree. Also a round trip of the rANS primitives on symbols taken from the input.
pub fn rans_decode(data: &[u8]) {
    rans_roundtrip(data);
    let _ = rans_chunk(data);
}

fn rans_roundtrip(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let alphabet = 2 + (k as usize % 63);
    let lanes = 1 + (k as usize / 64 % 4) * 10;
    let symbols: Vec<usize> = rest.iter().map(|&b| b as usize % alphabet).collect();
    if symbols.is_empty() {
        return;
    }
    let mut counts = vec![0u64; alphabet];
    for &s in &symbols {
        counts[s] += 1;
    }
    let freqs = normalize(&counts);
    assert_eq!(freqs.iter().sum::<u32>(), 1 << PROB_BITS);
    let starts: Vec<u32> = freqs
        .iter()
        .scan(0, |s, &f| {
            let v = *s;
            *s += f;
            Some(v)
        })
        .collect();
    let mut states = vec![RANS_L; lanes];
    let mut words = Vec::new();
    for (i, &s) in symbols.iter().enumerate().rev() {
        enc_put(&mut states[i % lanes], &mut words, starts[s], freqs[s]);
    }
    words.reverse();
    let mut pos = 0;
    for (i, &want) in symbols.iter().enumerate() {
        let st = &mut states[i % lanes];
        let slot = dec_get(*st);
        let s = (0..alphabet)
            .find(|&s| slot < starts[s] + freqs[s])
            .unwrap();
        assert_eq!(s, want, "rANS round trip");
        assert!(dec_advance(st, &words, &mut pos, starts[s], freqs[s]));
    }
    assert!(states.iter().all(|&s| s == RANS_L), "rANS lanes end at L");
    assert_eq!(pos, words.len(), "rANS words all consumed");
}

fn rans_chunk(data: &[u8]) -> lockstep::Result<()> {
    let mut r = ByteReader::new(data, "rans fuzz input");
    let dtype = FLOAT_DTYPES
        .iter()
        .copied()
        .find(|d| Some(&d.code()) == data.first())
        .unwrap_or(DType::BF16);
    r.u8()?;
    let fl = dtype.float_layout().unwrap();
    let n = r.varint_max(RANS_MAX_ELEMS, "element count")? as usize;
    // As delta::blob::decode_modeled parses it.
    let layout = match r.u8()? {
        0 => Layout::Paper,
        1 => Layout::Signed,
        2 if fl.width <= JOINT_MAX_WIDTH => Layout::Joint,
        _ => return Ok(()),
    };
    let flags = r.u8()?;
    if flags & !7 != 0 {
        return Ok(());
    }
    let condition = flags & 1 != 0;
    let (s_neighbor, b_neighbor) = (flags & 2 != 0, flags & 4 != 0);
    if layout == Layout::Joint && flags & 6 != 0 {
        return Ok(());
    }
    let distance = if s_neighbor || b_neighbor {
        let d = r.varint_max(u32::MAX as u64, "neighbor distance")? as usize;
        if d < LANES {
            return Ok(());
        }
        Some(d)
    } else {
        None
    };
    let (chunk_elems, lanes, prob_bits) = (r.varint()?, r.u8()?, r.u8()?);
    if (chunk_elems, lanes as usize, prob_bits as u32) != (CHUNK_ELEMS as u64, LANES, PROB_BITS) {
        return Ok(());
    }
    let stages = layout_stages(layout)
        .iter()
        .map(|&s| {
            let nb = match s {
                Stage::B => b_neighbor,
                Stage::S => s_neighbor,
                _ => false,
            };
            StageTable::read(&mut r, Space::new(s, fl.width, nb))
        })
        .collect::<lockstep::Result<Vec<_>>>()?;
    let tables = Tables { stages };
    let mut chunks = Vec::new();
    if n > 0 {
        let n_words = r.varint_max(n as u64 * 4, "chunk word count")? as usize;
        let tail_bits = r.varint_max(n as u64 * 64, "chunk tail bits")?;
        let mut states = [0u32; LANES];
        for s in states.iter_mut() {
            *s = r.u32()?;
        }
        let words: Vec<u16> = r
            .take(n_words * 2)?
            .chunks_exact(2)
            .map(|w| u16::from_le_bytes([w[0], w[1]]))
            .collect();
        let tail = r.take(tail_bits.div_ceil(8) as usize)?;
        chunks.push(DecodeChunk {
            words: words.into(),
            states,
            tail,
            tail_bits,
        });
    }
    let reference = reference_bytes(n * dtype.size());
    let job = DecodeJob {
        fl,
        layout,
        condition,
        distance,
        tables: &tables,
        chunks: &chunks,
        reference: &reference,
    };
    let results: Vec<(&str, lockstep::Result<Vec<u8>>)> = backends()
        .iter()
        .map(|be| (be.name(), be.decode(&job)))
        .collect();
    agree("rANS chunk", &results);
    Ok(())
}

/// The `rans_decode` input for a modeled blob of at most [`RANS_MAX_ELEMS`] elements (seeds).
pub fn rans_input_from_blob(blob: &[u8]) -> Option<Vec<u8>> {
    let (h, payload) = delta::blob::read_header(blob).ok()?;
    if h.mode != Mode::Modeled || h.n_elements > RANS_MAX_ELEMS {
        return None;
    }
    let mut w = lockstep::bytes::ByteWriter::new();
    w.u8(h.dtype.code());
    w.varint(h.n_elements);
    w.bytes(payload);
    Some(w.buf)
}

// ---------------------------------------------------------------------------------------------
// range_decode

/// The text codec's range coder alone. The first bytes choose a frequency table (total 2^32,
/// every frequency >= 1); the rest are (a) symbols to encode and decode again, which must
/// round trip, and (b) a stream to decode, which must give in-range symbols without panicking.
pub fn range_decode(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let n = 2 + k as usize % 200;
    let (weights, rest) = rest.split_at(rest.len().min(n));
    // Frequencies: 1 + a share of (2^32 - n) by weight; the first symbol takes what is left.
    let total = 1u64 << range_coder::TOTAL_BITS;
    let wsum: u64 = weights
        .iter()
        .map(|&w| w as u64 * w as u64)
        .sum::<u64>()
        .max(1);
    let mut freqs: Vec<u64> = (0..n)
        .map(|i| {
            1 + weights
                .get(i)
                .map_or(0, |&w| (total - n as u64) / wsum * (w as u64 * w as u64))
        })
        .collect();
    let used: u64 = freqs.iter().sum();
    freqs[0] += total - used;
    let mut cum = vec![0u64];
    for f in &freqs {
        cum.push(cum.last().unwrap() + f);
    }
    assert_eq!(*cum.last().unwrap(), total);

    let symbols: Vec<usize> = rest.iter().map(|&b| b as usize % n).collect();
    let mut e = range_coder::Encoder::new();
    for &s in &symbols {
        e.encode(cum[s], freqs[s]);
    }
    let bytes = e.finish();
    let mut d = range_coder::Decoder::new(&bytes);
    for &s in &symbols {
        let got = answer(&freqs, Find::Target(d.target())).expect("a target below 2^32");
        assert_eq!(got.symbol as usize, s, "range coder round trip");
        d.consume(got.cum, got.freq);
    }
    assert_eq!(d.overrun(), 0, "range decoder read past its stream");

    let mut d = range_coder::Decoder::new(rest);
    for _ in 0..4 * rest.len() + 16 {
        let s = answer(&freqs, Find::Target(d.target())).expect("a target below 2^32");
        assert!((s.symbol as usize) < n);
        d.consume(s.cum, s.freq);
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors_input

/// Arbitrary bytes as a checkpoint file: read it; if lockstep takes it, packing it into an
/// archive and coding it as an `.lsd` against itself must both give it back byte for byte.
pub fn safetensors_input(data: &[u8]) {
    let dir = fresh_dir("st");
    let path = dir.join("step100.safetensors");
    std::fs::write(&path, data).expect("write the checkpoint");
    let Ok(ck) = Checkpoint::open(&path) else {
        return;
    };
    let mut sum = 0u64;
    for t in &ck.tensors {
        sum += ck.data(t).iter().map(|&b| b as u64).sum::<u64>();
        let _ = delta::blob::element_count(&t.shape);
    }
    let _ = (sum, ck.header_bytes().len());
    let _ = delta::file::check_compatible(&ck, &ck);

    let lsd = dir.join("self.lsd");
    if delta::file::encode_file(
        &ck,
        &ck,
        &lsd,
        &Default::default(),
        1 << 20,
        &lockstep::backend::Device::cpu(),
    )
    .is_ok()
    {
        let back = dir.join("back.safetensors");
        let bytes = std::fs::read(&lsd).unwrap();
        delta::file::decode_file(&ck, &bytes, &back, &lockstep::backend::Device::cpu())
            .expect("an .lsd lockstep wrote decodes");
        assert!(
            std::fs::read(&back).unwrap() == data,
            ".lsd round trip changed the checkpoint"
        );
    }

    let Ok(src) = archive::resolve(&path) else {
        return;
    };
    let ar = dir.join("a.lstp");
    let opts = PackOptions {
        keyframe_interval: 2,
        ..Default::default()
    };
    if archive::pack(&ar, std::slice::from_ref(&src), None, &opts, &|_| {}).is_ok() {
        let a = Archive::open(&ar).expect("a packed archive opens");
        let v = a.verify(&|_| {});
        assert!(clean(&v), "a packed archive does not verify: {v:?}");
        let out = dir.join("x.safetensors");
        let step = a.checkpoints[0].step;
        a.extract(step, &out, &|_| {})
            .expect("a packed checkpoint extracts");
        assert!(
            std::fs::read(&out).unwrap() == data,
            "archive round trip changed the checkpoint"
        );
    }
}

/// Every target by name (for the replay test).
/// A harness: arbitrary bytes in, a panic out only for a bug.
pub type Harness = fn(&[u8]);

pub const TARGETS: [(&str, Harness); 8] = [
    ("blob_decode", blob_decode),
    ("lsd_read", lsd_read),
    ("archive_read", archive_read),
    ("text_decode", text_decode),
    ("model_load", model_load),
    ("rans_decode", rans_decode),
    ("range_decode", range_decode),
    ("safetensors_input", safetensors_input),
];
