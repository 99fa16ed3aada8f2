//! Backends: the parts of the delta codec that touch every element, behind one trait, so the
//! same tensor gives the same bytes on the CPU reference, the fast CPU path and a GPU.
//!
//! Split of work (DESIGN.md, "parity by construction"):
//!
//! - A backend owns the per-element stages: the residual transform (both directions), the
//!   per-tensor histograms of every stage under its context, the interleaved rANS lanes
//!   (encode and decode) and the raw-tail bit packing. Between these stages the residuals stay
//!   where the backend put them ([`Resident`]), so a GPU uploads a tensor once.
//! - The host owns everything that decides bytes from counts: table selection and
//!   normalization (`delta::model`, integer-only) and blob assembly (`delta::blob`).
//!
//! Backends:
//! - [`reference::ReferenceBackend`]: the readable oracle (`delta::chunk`, `delta::symbols`).
//! - [`cpu::CpuBackend`]: the fast one, and the default.
//! - [`wgpu::WgpuBackend`]: WGSL compute shaders on any Vulkan/Metal/DX12/GL adapter.
//!
//! Selection (`--backend auto|cpu|wgpu|cuda`) lives in [`select`].

pub mod cpu;
pub mod parity;
pub mod reference;
mod select;
pub mod wgpu;

use std::sync::{Arc, RwLock};

use crate::delta::chunk::{DecodeChunk, EncodedChunk};
use crate::delta::model::{Hist, Space, Tables};
use crate::delta::symbols::{Layout, JOINT_MAX_WIDTH};
use crate::dtype::FloatLayout;
use crate::Result;

pub use select::{available, select, BackendChoice, Found, Selected};

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
    /// contexts of the B and S stages, if either uses its neighbor form (`tables` says which).
    pub distance: Option<usize>,
    pub tables: &'a Tables,
    /// One per chunk of `CHUNK_ELEMS` elements, in order.
    pub chunks: &'a [DecodeChunk<'a>],
    pub reference: &'a [u8],
}

/// A compute engine for the delta codec. Implementations must be byte-identical to
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
    /// [`Backend::decode`] with the CRC-32 of its output and of the reference, which the
    /// blob checks. Hashing each chunk while it is in cache (and on every thread) instead of
    /// both whole tensors afterwards saved the CPU backend two passes over memory.
    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        let out = self.decode(job)?;
        Ok(Checked {
            crc: crate::bytes::crc32(&out),
            reference_crc: crate::bytes::crc32(job.reference),
            out,
        })
    }
}

/// What [`Backend::decode_checked`] returns.
pub struct Checked {
    pub out: Vec<u8>,
    /// CRC-32 of `out`.
    pub crc: u32,
    /// CRC-32 of the job's reference.
    pub reference_crc: u32,
}

/// One tensor's residuals, resident on a backend.
pub trait Resident {
    /// The residual stage as bytes, for parity checks: each element's w-bit displacement
    /// `key(target) - key(reference) mod 2^w`, little-endian, `w / 8` bytes per element.
    fn residual_bytes(&self) -> Result<Vec<u8>>;
    /// Histograms of every stage of `layout` (B, Q1, Q2 and, for Signed, S). With a
    /// `distance` (Signed only), B and S are counted in their neighbor forms
    /// ([`layout_spaces`]); the host folds a neighbor away where it does not pay. Chunk-local,
    /// like the coder.
    fn histograms(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>>;
    /// Code every chunk: interleaved rANS lanes and the packed raw tail. Each stage's context
    /// form is its table's `space` (`space.neighbor` for B and S); `distance` is the neighbor.
    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>>;
}

/// The stage spaces [`Resident::histograms`] counts: every stage of `layout`, B and S in their
/// neighbor forms when a neighbor `distance` is given.
pub fn layout_spaces(layout: Layout, width: u32, distance: Option<usize>) -> Vec<Space> {
    reference::layout_stages(layout)
        .iter()
        .map(|&s| Space::new(s, width, distance.is_some()))
        .collect()
}

/// Whether `layout` is defined for `width`-bit floats: the Joint layout only up to 32 bits
/// (docs/FORMAT.md); every backend refuses it above, with this error.
pub fn check_layout(layout: Layout, width: u32) -> Result<()> {
    if layout == Layout::Joint && width > JOINT_MAX_WIDTH {
        return Err(crate::Error::Unsupported(format!(
            "the joint (fast) layout for {width}-bit floats"
        )));
    }
    Ok(())
}

static DEFAULT: RwLock<Option<Arc<dyn Backend>>> = RwLock::new(None);

/// The backend used by calls that do not name one (the fast CPU backend unless
/// [`set_default`] chose another, as `--backend` does).
pub fn default_backend() -> Arc<dyn Backend> {
    if let Some(b) = DEFAULT.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return b.clone();
    }
    Arc::new(cpu::CpuBackend)
}

/// Make `backend` the process-wide default.
pub fn set_default(backend: Arc<dyn Backend>) {
    *DEFAULT.write().unwrap_or_else(|e| e.into_inner()) = Some(backend);
}
