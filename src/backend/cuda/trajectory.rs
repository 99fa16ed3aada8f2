//! `cargo xtask gpu-check`'s timed trajectory: the delta codec's encode and decode of a
//! large bf16 trajectory on a CUDA device, per stage and end to end, beside the floor each
//! stage cannot beat.
//!
//! The trajectory is the real tensors of a checkpoint pair (gpt2 steps 200 and 400) tiled:
//! each tensor is `copies` copies of the real one stacked along its rows, every copy after
//! the first with a few low bits flipped (different in reference and target), so that no two
//! copies code alike. Per tensor, in order: the host-to-device copy alone (reference and
//! target through the staging ring: streaming's bandwidth), the codec's encode of the
//! tensor (`blob::encode_unverified`: the device stages plus the host's table selection and
//! blob assembly) and its decode, which must give the target back.
//!
//! Then the same tensors all in flight at once, as the CLI's `delta::encode_batched` runs a
//! batch: one rayon task per tensor (`blob::encode_unverified`), then every decode the same
//! way; each operation on an engine of its own (streams of its own on a GPU). Timed by the
//! host clock: every operation ends by reading its results back, so when the last task
//! returns the device has finished them all. Each blob must be the one coded alone (streams
//! do not mix) and each decode the target.
//!
//! Timers are the launcher's marks: CUDA events on a GPU; on the host emulation the CPU
//! clock, and the report then says EMULATED on every line that has a speed (the emulation
//! runs the same host code and kernels' logic on the CPU: it proves this code path, not a
//! GPU's speed).
//!
//! Floors: a stage cannot beat moving the bytes it must move once, at the measured device
//! copy bandwidth (a device-to-device copy, counting bytes read plus bytes written) for
//! device memory and at the measured staged host-to-device bandwidth for the bus. T is the
//! target's bytes, S the coded stream's:
//!
//! | stage      | device bytes                   | bus bytes          |
//! |------------|--------------------------------|--------------------|
//! | residuals  | 3T (read both, write residuals)| 2T (both up)       |
//! | histograms | 2T per layout counted (2: default) | 0              |
//! | encode     | 2T + S                         | S (chunks back)    |
//! | decode     | 2T + S                         | T + S up, T back   |
//!
//! A stage's floor is the larger of its two; measured/floor says how far from it we are.

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use super::launch::Launcher;
use super::{CudaBackend, Stage};
use crate::backend::Device;
use crate::checkpoint::Checkpoint;
use crate::delta::{blob, decode_tensor, EncodeOptions, TensorPair};
use crate::dtype::DType;
use crate::{Error, Result};

/// One tiled tensor.
pub struct Tiled {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub reference: Vec<u8>,
    pub target: Vec<u8>,
}

/// The trajectory: the bf16 tensors of `dir`'s steps 200 and 400, each tiled `copies`
/// times, `copies` the least that reaches `target_bytes` (at least 2, so the perturbed copies
/// are always exercised); if one copy of every tensor is more than half of `target_bytes`,
/// only the tensors (in file order) that fit in it twice.
pub fn tile(dir: &Path, target_bytes: u64) -> Result<(Vec<Tiled>, usize)> {
    let reference = Checkpoint::open(dir.join("gpt2_step000200_bf16.safetensors"))?;
    let target = Checkpoint::open(dir.join("gpt2_step000400_bf16.safetensors"))?;
    let all: u64 = target
        .tensors
        .iter()
        .filter(|t| t.dtype == DType::BF16)
        .map(|t| (t.end - t.start) as u64)
        .sum();
    if all == 0 {
        return Err(Error::Invalid(format!(
            "{}: no bf16 tensors to tile",
            target.path.display()
        )));
    }
    let copies = target_bytes.div_ceil(all).max(2) as usize;
    let mut budget = target_bytes;
    let mut out = Vec::new();
    for t in target.tensors.iter().filter(|t| t.dtype == DType::BF16) {
        let bytes = ((t.end - t.start) * copies) as u64;
        if bytes > budget {
            continue;
        }
        budget -= bytes;
        let r = reference.get(&t.name).ok_or_else(|| {
            Error::Mismatch(format!("tensor '{}' is not in the reference", t.name))
        })?;
        let mut shape = t.shape.clone();
        match shape.first_mut() {
            Some(rows) => *rows *= copies as u64,
            None => shape.push(copies as u64),
        }
        out.push(Tiled {
            name: t.name.clone(),
            dtype: t.dtype,
            shape,
            reference: stacked(reference.data(r), copies, 0),
            target: stacked(target.data(t), copies, 1),
        });
    }
    if out.is_empty() {
        return Err(Error::Invalid(format!(
            "no tensor of {} fits {target_bytes} bytes twice",
            dir.display()
        )));
    }
    Ok((out, copies))
}

/// `copies` copies of a bf16 tensor; copy c > 0 has the lowest mantissa bit of about one
/// element in 64 flipped (which ones depends on c and on `side`).
fn stacked(one: &[u8], copies: usize, side: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(one.len() * copies);
    for c in 0..copies as u32 {
        let start = out.len();
        out.extend_from_slice(one);
        if c == 0 {
            continue;
        }
        for (j, e) in out[start..].chunks_exact_mut(2).enumerate() {
            let h = (j as u32 ^ c.wrapping_mul(0x9e37_79b9) ^ side.wrapping_mul(0x85eb_ca6b))
                .wrapping_mul(0xc2b2_ae35);
            if h >> 26 == 0 {
                e[0] ^= 1;
            }
        }
    }
    out
}

/// Seconds per stage, summed over tensors, and the sizes the floors need.
#[derive(Default, Debug, Clone)]
pub struct Timing {
    pub device: String,
    pub emulated: bool,
    pub tensors: usize,
    pub copies: usize,
    /// T: target bytes.
    pub target_bytes: u64,
    /// S: coded stream bytes (the blobs).
    pub coded_bytes: u64,
    /// Device copy bandwidth, bytes read plus written per second.
    pub device_bw: f64,
    /// Staged host-to-device bandwidth, bytes per second.
    pub h2d_bw: f64,
    pub h2d_s: f64,
    pub residuals_s: f64,
    pub histograms_s: f64,
    pub encode_s: f64,
    pub decode_s: f64,
    pub decode_kernels_s: f64,
    pub encode_e2e_s: f64,
    pub decode_e2e_s: f64,
    /// Every tensor's encode (then decode) in flight at once, on the host clock.
    pub encode_inflight_s: f64,
    pub decode_inflight_s: f64,
    /// The rayon threads that ran them, and the engines (stream pairs) the backend had made.
    pub inflight_threads: usize,
    pub engines: usize,
    /// Tensors whose blob was compared with the CPU's (all equal, or this is an error).
    pub cpu_checked: usize,
}

/// Encode and decode every tensor on `backend`, timed; each decode must give the target
/// back, and the first `check_cpu` blobs must be the CPU backend's bytes.
pub fn run<L: Launcher>(
    backend: &CudaBackend<L>,
    tensors: &[Tiled],
    copies: usize,
    emulated: bool,
    check_cpu: usize,
) -> Result<Timing> {
    use crate::backend::Backend;
    let dev = backend.launcher();
    let mut t = Timing {
        device: backend.device(),
        emulated,
        tensors: tensors.len(),
        copies,
        ..Default::default()
    };
    t.device_bw = device_bandwidth(dev, tensors)?;
    let opts = EncodeOptions::default();
    let cpu = Device::cpu();
    let seconds = |a: &L::Event, b: &L::Event| dev.seconds(a, b);
    let mut blobs = Vec::with_capacity(tensors.len());
    for (i, x) in tensors.iter().enumerate() {
        let what = |e: Error| e.context(format!("timed trajectory, tensor '{}'", x.name));
        t.target_bytes += x.target.len() as u64;
        // The host-to-device copy alone (with its fresh buffers' allocation and clearing on
        // the kernel stream: 2T of device writes, small beside 2T over the bus).
        let a = dev.mark()?;
        backend
            .copy_in_only(&[&x.reference, &x.target])
            .map_err(what)?;
        let b = dev.mark()?;
        t.h2d_s += seconds(&a, &b)?;

        backend.record_stages(true);
        let a = dev.mark()?;
        let (blob, _) = blob::encode_unverified(&pair(x), &opts, backend).map_err(what)?;
        let b = dev.mark()?;
        let decoded = decode_tensor(&blob, &x.reference, backend).map_err(what)?;
        let c = dev.mark()?;
        let stages = backend.take_stages();
        backend.record_stages(false);
        t.encode_e2e_s += seconds(&a, &b)?;
        t.decode_e2e_s += seconds(&b, &c)?;
        for m in &stages {
            let s = seconds(&m.from, &m.to)?;
            *match m.stage {
                Stage::Residuals => &mut t.residuals_s,
                Stage::Histograms => &mut t.histograms_s,
                Stage::Encode => &mut t.encode_s,
                Stage::Decode => &mut t.decode_s,
                Stage::DecodeKernels => &mut t.decode_kernels_s,
            } += s;
        }
        t.coded_bytes += blob.len() as u64;
        if decoded != x.target {
            return Err(what(Error::Invalid(
                "decoded tensor differs from the target".into(),
            )));
        }
        if i < check_cpu {
            let (theirs, _) = blob::encode_unverified(&pair(x), &opts, cpu.delta()?)?;
            if theirs != blob {
                return Err(what(Error::Invalid(
                    "blob differs from the CPU backend's".into(),
                )));
            }
            t.cpu_checked += 1;
        }
        blobs.push(blob);
    }
    let bus = 2.0 * t.target_bytes as f64;
    t.h2d_bw = if t.h2d_s > 0.0 { bus / t.h2d_s } else { 0.0 };
    in_flight(backend, tensors, &blobs, &mut t)?;
    Ok(t)
}

/// Every tensor encoded at once from host memory (a rayon task each, as
/// `delta::encode_batched` runs a batch), each blob the one `alone` holds (coded one at a
/// time); then every blob decoded at once, each the target. Host clock (see the module
/// docs); the decodes are compared after the clock stops.
fn in_flight<L: Launcher>(
    backend: &CudaBackend<L>,
    tensors: &[Tiled],
    alone: &[Vec<u8>],
    t: &mut Timing,
) -> Result<()> {
    let opts = EncodeOptions::default();
    t.inflight_threads = rayon::current_num_threads();
    let start = Instant::now();
    let blobs = tensors
        .par_iter()
        .map(|x| {
            let (blob, _) = blob::encode_unverified(&pair(x), &opts, backend).map_err(about(x))?;
            Ok(blob)
        })
        .collect::<Result<Vec<_>>>()?;
    t.encode_inflight_s = start.elapsed().as_secs_f64();
    for ((x, ours), theirs) in tensors.iter().zip(&blobs).zip(alone) {
        if ours != theirs {
            return Err(about(x)(Error::Invalid(
                "blob coded with every tensor in flight differs from the one coded alone".into(),
            )));
        }
    }
    let start = Instant::now();
    let decoded = tensors
        .par_iter()
        .zip(&blobs)
        .map(|(x, blob)| decode_tensor(blob, &x.reference, backend).map_err(about(x)))
        .collect::<Result<Vec<_>>>()?;
    t.decode_inflight_s = start.elapsed().as_secs_f64();
    for (x, out) in tensors.iter().zip(&decoded) {
        if *out != x.target {
            return Err(about(x)(Error::Invalid(
                "decoded tensor (every tensor in flight) differs from the target".into(),
            )));
        }
    }
    t.engines = backend.engines();
    Ok(())
}

/// A tiled tensor as the codec's input.
fn pair(x: &Tiled) -> TensorPair<'_> {
    TensorPair {
        dtype: x.dtype,
        shape: &x.shape,
        reference: &x.reference,
        target: &x.target,
    }
}

/// An error's context: which tensor of the trajectory.
fn about(x: &Tiled) -> impl Fn(Error) -> Error + '_ {
    |e| e.context(format!("timed trajectory, tensor '{}'", x.name))
}

/// Bytes read plus written per second by a device-to-device copy of the largest tensor's
/// size (at least 64 MiB where a GPU is timed), best of three after a warm-up.
fn device_bandwidth<L: Launcher>(dev: &L, tensors: &[Tiled]) -> Result<f64> {
    let words = tensors
        .iter()
        .map(|x| x.target.len() / 4)
        .max()
        .unwrap_or(0)
        .max(1 << 10);
    let src = dev.zeroed(words)?;
    let mut dst = dev.zeroed(words)?;
    dev.copy_on_device(&src, &mut dst, words)?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let a = dev.mark()?;
        dev.copy_on_device(&src, &mut dst, words)?;
        let b = dev.mark()?;
        best = best.min(dev.seconds(&a, &b)?);
    }
    Ok(if best > 0.0 {
        8.0 * words as f64 / best
    } else {
        0.0
    })
}

/// Width of the report's stage column.
const NAME: usize = 54;

impl Timing {
    /// The report: one line per stage with seconds, target GB/s, floor and measured/floor.
    pub fn table(&self) -> String {
        let tag = if self.emulated {
            " [EMULATED: CUDA kernels' host emulation on the CPU, CPU clock; not a GPU]"
        } else {
            " [CUDA events]"
        };
        let (t, s) = (self.target_bytes as f64, self.coded_bytes as f64);
        let dev = |bytes: f64| bytes / self.device_bw;
        let bus = |bytes: f64| bytes / self.h2d_bw;
        let mut out = format!(
            "timed trajectory on {}{tag}\n{} bf16 tensors ({} stacked copies each), T = {:.1} MB target, S = {:.1} MB coded ({:.2}% of T)\n\
             device copy bandwidth {:.1} GB/s (read + write); staged host-to-device {:.2} GB/s\n\n\
             {:<NAME$} {:>10} {:>10} {:>10} {:>14}\n",
            self.device,
            self.tensors,
            self.copies,
            t / 1e6,
            s / 1e6,
            100.0 * s / t.max(1.0),
            self.device_bw / 1e9,
            self.h2d_bw / 1e9,
            "stage",
            "seconds",
            "T GB/s",
            "floor s",
            "measured/floor"
        );
        let threads = self.inflight_threads;
        let in_flight = format!("encode end to end, all tensors in flight ({threads} threads)");
        let rows = [
            (
                "host-to-device copy (ref + target)",
                self.h2d_s,
                bus(2.0 * t),
            ),
            (
                "residuals (with streamed copy)",
                self.residuals_s,
                dev(3.0 * t).max(bus(2.0 * t)),
            ),
            ("histograms (2 layouts)", self.histograms_s, dev(4.0 * t)),
            (
                "encode (lanes, tails, readback)",
                self.encode_s,
                dev(2.0 * t + s).max(bus(s)),
            ),
            (
                "encode resident (histograms + encode)",
                self.histograms_s + self.encode_s,
                dev(6.0 * t + s),
            ),
            (
                "encode end to end (from host memory)",
                self.encode_e2e_s,
                dev(9.0 * t + s).max(bus(2.0 * t + s)),
            ),
            (
                "decode (copies in and out, CRCs)",
                self.decode_s,
                dev(2.0 * t + s).max(bus(2.0 * t + s)),
            ),
            (
                "decode resident (lanes, tails)",
                self.decode_kernels_s,
                dev(2.0 * t + s),
            ),
            (
                "decode end to end (from host memory)",
                self.decode_e2e_s,
                dev(2.0 * t + s).max(bus(2.0 * t + s)),
            ),
            (
                in_flight.as_str(),
                self.encode_inflight_s,
                dev(9.0 * t + s).max(bus(2.0 * t + s)),
            ),
            (
                "decode end to end, all tensors in flight",
                self.decode_inflight_s,
                dev(2.0 * t + s).max(bus(2.0 * t + s)),
            ),
        ];
        for (name, secs, floor) in rows {
            out += &format!(
                "{name:<NAME$} {secs:>10.4} {:>10.2} {floor:>10.4} {:>14.1}\n",
                t / secs.max(1e-12) / 1e9,
                secs / floor.max(1e-12),
            );
        }
        out += &format!(
            "\n{} of {} blobs compared with the CPU backend's bytes: equal; every decode gave the target back.\n\
             All tensors in flight: host clock, {threads} rayon threads, {} engines (a launcher with streams of its own each); every blob equal to the one coded alone.\n",
            self.cpu_checked, self.tensors, self.engines
        );
        if self.emulated {
            out += "EMULATED: these seconds time the host emulation; they say nothing of a GPU, and no target is judged.\n";
        } else {
            let gbs = |secs: f64| t / secs / 1e9;
            let (re, rd) = (
                gbs(self.histograms_s + self.encode_s),
                gbs(self.decode_kernels_s),
            );
            let (ee, ed) = (gbs(self.encode_e2e_s), gbs(self.decode_e2e_s));
            let (fe, fd) = (gbs(self.encode_inflight_s), gbs(self.decode_inflight_s));
            let met = |ok: bool| if ok { "met" } else { "not met" };
            out += &format!(
                "targets: resident encode {re:.1} and decode {rd:.1} GB/s (>= 300: {}); end to end encode {ee:.1} and decode {ed:.1} GB/s (>= 40: {}); all in flight encode {fe:.1} and decode {fd:.1} GB/s (>= 40: {})\n",
                met(re >= 300.0 && rd >= 300.0),
                met(ee >= 40.0 && ed >= 40.0),
                met(fe >= 40.0 && fd >= 40.0),
            );
        }
        out
    }
}

/// Tile `dir`'s trajectory to about `target_bytes` and time it on `device`: `"cuda"` (a GPU,
/// CUDA events) or `"cuda-emulated"` (the host emulation, CPU clock, labelled EMULATED).
/// With `profile`, also where the device's time went per kernel (profile.rs; the marks
/// around every launch are part of the timings then).
pub fn run_on(
    device: &str,
    dir: &Path,
    target_bytes: u64,
    check_cpu: usize,
    profile: bool,
) -> Result<(Timing, Option<String>)> {
    let (tensors, copies) = tile(dir, target_bytes)?;
    fn go<L: Launcher>(
        dev: L,
        name: &'static str,
        emulated: bool,
        tensors: &[Tiled],
        copies: usize,
        check_cpu: usize,
        profile: bool,
    ) -> Result<(Timing, Option<String>)> {
        if profile {
            let dev = std::sync::Arc::new(super::profile::Profiled::new(dev));
            let b = CudaBackend::new(dev.clone(), name);
            let timing = run(&b, tensors, copies, emulated, check_cpu)?;
            return Ok((timing, Some(dev.report()?)));
        }
        let b = CudaBackend::new(dev, name);
        Ok((run(&b, tensors, copies, emulated, check_cpu)?, None))
    }
    match device {
        "cuda" => {
            let dev = super::driver::CudaDriver::open()?;
            go(dev, "cuda", false, &tensors, copies, check_cpu, profile)
        }
        #[cfg(cuda_emulation)]
        "cuda-emulated" => {
            let dev = super::emulated::HostEmulation::new();
            go(
                dev,
                "cuda-emulated",
                true,
                &tensors,
                copies,
                check_cpu,
                profile,
            )
        }
        other => Err(Error::Unsupported(format!(
            "timed trajectory: no device '{other}' (cuda, or cuda-emulated where it is built)"
        ))),
    }
}
