//! Devices: what `--backend` selects. A [`Device`] offers the kernels it has for each codec:
//! the delta codec's per-element stages ([`Backend`], below) and the integer GPT-2's forward
//! pass and frequency step ([`lm::LmKernels`]). The same input gives the same bytes on every
//! device; a device passes through the codecs explicitly (no process-wide default).
//!
//! Dependency direction: this module builds on `crate::format` (what the bytes mean) and never
//! imports a codec (`crate::delta`, `crate::lm`); the codecs import it.
//!
//! Split of work (DESIGN.md, "parity by construction"):
//!
//! - A backend owns the per-element stages: the residual transform (both directions), the
//!   per-tensor histograms of every stage under its context, the interleaved rANS lanes
//!   (encode and decode) and the raw-tail bit packing. Between these stages the residuals stay
//!   where the backend put them ([`Resident`]), so a GPU uploads a tensor once.
//! - The host owns everything that decides bytes from counts: table selection and
//!   normalization (`format::tables`, integer-only) and blob assembly (`delta::blob`).
//!
//! Backends:
//! - [`reference::ReferenceBackend`]: the readable oracle (`format::chunk`, `format::symbols`).
//! - [`cpu::CpuBackend`]: the fast one, and the default.
//! - [`wgpu::WgpuBackend`]: WGSL compute shaders on any Vulkan/Metal/DX12/GL adapter.
//! - [`cuda::CudaBackend`]: CUDA kernels (kernels/*.cu) on a GPU through cudarc, or on the
//!   CPU through their host emulation (tests only).
//!
//! Selection (`--backend auto|cpu|wgpu|cuda|cuda-emulated|reference`) lives in `select.rs`.

pub mod cpu;
pub mod cuda;
mod device;
pub mod lm;
pub mod reference;
mod select;
pub mod wgpu;

use crate::dtype::FloatLayout;
use crate::format::chunk::{DecodeChunk, EncodedChunk};
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::Result;

pub use cpu::Isa;
pub use device::Device;
pub use select::{available, select, BackendChoice, Found};

/// "1 thread", "2 threads": how the CPU devices name their pool in `device()`.
pub fn threads_phrase(n: usize) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// One float tensor pair to encode. `reference` and `target` hold the same number of
/// `width / 8`-byte little-endian elements (checked by the caller).
#[derive(Clone, Copy, Debug)]
pub struct EncodeJob<'a> {
    pub fl: FloatLayout,
    pub reference: &'a [u8],
    pub target: &'a [u8],
    /// Condition on the reference exponent (off: every exponent class reads as 0).
    pub condition: bool,
}

/// Everything needed to rebuild a modeled tensor from its parsed blob.
#[derive(Clone, Copy, Debug)]
pub struct DecodeJob<'a> {
    pub fl: FloatLayout,
    pub layout: Layout,
    pub condition: bool,
    /// Distance to the neighbor element (one row up) whose bit length and update sign are
    /// contexts of the B and S stages (or J's), if any uses its neighbor form (`tables` says
    /// which).
    pub distance: Option<usize>,
    pub tables: &'a Tables,
    /// One per chunk of `CHUNK_ELEMS` elements, in order.
    pub chunks: &'a [DecodeChunk<'a>],
    pub reference: &'a [u8],
}

/// The delta codec's kernels on one device ([`Device::delta`]). Implementations must be byte-identical to
/// [`reference::ReferenceBackend`] at every stage, for any thread count.
pub trait Backend: Send + Sync {
    /// Short name used on the command line and in parity tables ("cpu", "wgpu", ...).
    fn name(&self) -> &'static str;
    /// What it runs on, for people (CPU threads, adapter name and driver).
    fn device(&self) -> String;
    /// Forward residual transform: the ordered-integer displacement of every element, kept
    /// resident for the stages that follow.
    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>>;
    /// rANS lane decoding, raw-tail unpacking and the inverse transform: the target's bytes.
    /// Malformed streams give an error, never a panic.
    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>>;
    /// [`Backend::decode`] with the CRC-32 of its output, which the blob checks. Hashing
    /// each chunk while it is in cache (and on every thread) instead of the whole tensor
    /// afterwards saved the CPU backend a pass over memory. The reference is not hashed: a
    /// wrong one decodes to a wrong output, which its CRC-32 catches, and only then does
    /// the blob hash the reference to name the error (`blob::decode`).
    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        let out = self.decode(job)?;
        Ok(Checked {
            crc: crate::bytes::crc32(&out),
            out,
        })
    }
    /// [`Backend::decode_checked`] handing the output to `sink` in order, a piece of
    /// `piece_chunks` chunks at a time (the last may be shorter), each piece in a buffer the
    /// next one reuses: a large tensor's output need not exist whole. (A one-shot decode of
    /// the fp32 trajectory pair faulted in a fresh page for every 4 KiB of its 26 MB
    /// embedding; pieces of a few MiB are faulted once and still in cache when `sink` reads
    /// them.) Returns the CRC-32 of the whole output. On an error, from the decode or from
    /// `sink`, what `sink` got is to be discarded. By default (devices that decode a tensor
    /// in one go) the whole output is one piece.
    fn decode_pieces(
        &self,
        job: &DecodeJob,
        piece_chunks: usize,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<u32> {
        let _ = piece_chunks;
        let c = self.decode_checked(job)?;
        sink(&c.out)?;
        Ok(c.crc)
    }
}

/// What [`Backend::decode_checked`] returns.
pub struct Checked {
    pub out: Vec<u8>,
    /// CRC-32 of `out`.
    pub crc: u32,
}

/// One tensor's residuals, resident on a backend.
pub trait Resident {
    /// The residual stage as bytes, for parity checks: each element's w-bit displacement
    /// `key(target) - key(reference) mod 2^w`, little-endian, `w / 8` bytes per element.
    fn residual_bytes(&self) -> Result<Vec<u8>>;
    /// For each request, in order, the histograms of every stage of its layout (B, Q1, Q2
    /// and, for Signed, S; J for Joint). With a `distance` (not Paper), B and S, or J, are
    /// counted in their neighbor forms ([`crate::format::layout_spaces`]); the host folds a
    /// neighbor away where it does not pay. Chunk-local, like the coder. A backend may answer
    /// several requests in one pass (the CPU counts Signed and Paper together).
    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>>;
    /// [`Resident::histograms_for`] of one request.
    fn histograms(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>> {
        let mut all = self.histograms_for(&[HistRequest { layout, distance }])?;
        all.pop()
            .ok_or_else(|| crate::Error::Invalid("backend answered no histograms".into()))
    }
    /// CRC-32s of the job's reference and target where the backend computed them on the way
    /// (the CPU's `--fast` histogram at AVX2 hashes each piece while it is in L1), so the
    /// blob's header needs no pass of its own over them; `None` otherwise.
    fn input_crcs(&self) -> Option<[u32; 2]> {
        None
    }
    /// Code every chunk: interleaved rANS lanes and the packed raw tail. Each stage's context
    /// form is its table's `space` (`space.neighbor` for B and S); `distance` is the neighbor.
    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>>;
}

/// One histogram request: every stage of `layout`, B and S (Signed) or J (Joint) in their
/// neighbor forms when a neighbor `distance` is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistRequest {
    pub layout: Layout,
    pub distance: Option<usize>,
}
