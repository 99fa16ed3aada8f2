//! Where a CUDA device's time goes, without a profiler: [`Profiled`] wraps any [`Launcher`]
//! and times every kernel launch between two timing marks (CUDA events on a GPU, the CPU
//! clock in the emulation), and every host round trip (upload, zeroed, write, read) by the
//! host's clock. `Device::cuda_profiled` gives a device over it and the handle whose
//! [`Profiled::report`] prints one row per kernel and host operation.
//!
//! Why it exists: a lent GPU's minutes are few and Nsight Compute's raw output did not fit
//! in what a lease returns (docs/BENCHMARKS.md, 2026-12-04); this table is a few lines.
//! The marks serialize nothing the stream did not already order, but each launch records
//! two events: use it to find the expensive kernels, not to quote end-to-end speed.
//! A fork ([`Launcher::fork`]) records into the same tables, so the report covers every
//! stream; with several streams busy a launch's span also holds other streams' work.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::launch::{Kernel, Launcher};
use super::lm::kernels::{LmKernel, LmParams};
use crate::backend::wgpu::params::Params;
use crate::Result;

/// One timed launch: the kernel, its grid, and the marks before and after it.
type Launch<E> = (&'static str, u32, E, E);

/// What a profiled device's handle offers, whichever launcher it wraps.
pub trait Report: Send + Sync {
    /// See [`Profiled::report`].
    fn report(&self) -> Result<String>;
    /// The report, then forget what it covered (one table per phase of a run).
    fn take_report(&self) -> Result<String>;
}

impl<L: Launcher> Report for Profiled<L> {
    fn report(&self) -> Result<String> {
        Profiled::report(self)
    }
    fn take_report(&self) -> Result<String> {
        let r = Profiled::report(self)?;
        self.tables
            .launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.tables
            .host
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        Ok(r)
    }
}

/// A launcher that times what it forwards.
pub struct Profiled<L: Launcher> {
    inner: L,
    /// Shared by the launcher and its forks.
    tables: Arc<Tables<L::Event>>,
}

/// What a profiled launcher and its forks record.
struct Tables<E> {
    launches: Mutex<Vec<Launch<E>>>,
    /// Per host operation: calls, words and seconds.
    host: Mutex<BTreeMap<&'static str, (u64, u64, f64)>>,
}

impl<L: Launcher> Profiled<L> {
    pub fn new(inner: L) -> Self {
        Profiled {
            inner,
            tables: Arc::new(Tables {
                launches: Mutex::new(Vec::new()),
                host: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    fn timed<T>(&self, what: &'static str, words: usize, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let mut h = self.tables.host.lock().unwrap_or_else(|e| e.into_inner());
        let e = h.entry(what).or_default();
        *e = (e.0 + 1, e.1 + words as u64, e.2 + t.elapsed().as_secs_f64());
        out
    }

    fn launched(
        &self,
        name: &'static str,
        grid: u32,
        go: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let from = self.inner.mark()?;
        go()?;
        let to = self.inner.mark()?;
        self.tables
            .launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, grid, from, to));
        Ok(())
    }

    /// The most launches in progress at once on the device's timeline (each from its start
    /// mark to its end mark; forks' launches included): whether several tensors in flight
    /// really overlapped. Waits for the device to finish what was launched.
    pub fn most_at_once(&self) -> Result<usize> {
        let launches = self
            .tables
            .launches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(origin) = launches.first().map(|l| &l.2) else {
            return Ok(0);
        };
        // Each mark's offset from the origin, signed: `seconds` gives 0 (the emulation) or
        // less (CUDA) for a mark before the origin, and then the other order is positive.
        let at = |e: &L::Event| -> Result<f64> {
            let after = self.inner.seconds(origin, e)?;
            Ok(if after > 0.0 {
                after
            } else {
                -self.inner.seconds(e, origin)?
            })
        };
        let mut edges = Vec::with_capacity(2 * launches.len());
        for (_, _, from, to) in launches.iter() {
            edges.push((at(from)?, 1i64));
            edges.push((at(to)?, -1));
        }
        // At equal times ends first: launches that only touch do not overlap.
        edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut most) = (0i64, 0i64);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        Ok(most as usize)
    }

    /// Every kernel's launches, total and mean time and grid range, the most expensive
    /// first; then the host operations. Waits for the device to finish what was launched.
    pub fn report(&self) -> Result<String> {
        let at_once = self.most_at_once()?;
        let launches = self
            .tables
            .launches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut by: BTreeMap<&str, (u64, f64, u32, u32)> = BTreeMap::new();
        let mut by_grid: BTreeMap<(&str, u32), (u64, f64)> = BTreeMap::new();
        for (name, grid, from, to) in launches.iter() {
            let s = self.inner.seconds(from, to)?;
            let e = by.entry(name).or_insert((0, 0.0, u32::MAX, 0));
            *e = (e.0 + 1, e.1 + s, e.2.min(*grid), e.3.max(*grid));
            let g = by_grid.entry((name, *grid)).or_insert((0, 0.0));
            *g = (g.0 + 1, g.1 + s);
        }
        let mut rows: Vec<_> = by.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        let mut out = format!(
            "kernels on {} ({} launches, {:.1} ms between marks, at most {at_once} at once)\n\
             {:<24} {:>9} {:>11} {:>10} {:>6}  grid\n",
            self.inner.describe(),
            launches.len(),
            total * 1e3,
            "kernel",
            "launches",
            "total ms",
            "mean us",
            "share"
        );
        for (name, (n, s, lo, hi)) in &rows {
            out += &format!(
                "{name:<24} {n:>9} {:>11.2} {:>10.1} {:>5.1}%  {lo}..{hi}\n",
                s * 1e3,
                s * 1e6 / *n as f64,
                100.0 * s / total.max(1e-12)
            );
            // A kernel launched on a few grid sizes (the LM's matmul: one per matrix shape)
            // is split by grid, where one mean would hide which launch costs.
            let grids: Vec<_> = by_grid.range((*name, 0)..=(*name, u32::MAX)).collect();
            if (2..=6).contains(&grids.len()) {
                for ((_, grid), (n, s)) in grids {
                    out += &format!(
                        "  grid {grid:<17} {n:>9} {:>11.2} {:>10.1}\n",
                        s * 1e3,
                        s * 1e6 / *n as f64
                    );
                }
            }
        }
        out += &format!(
            "{:<24} {:>9} {:>11} {:>10}  (host clock, the wait included)\n",
            "host operation", "calls", "total ms", "MB"
        );
        let host = self.tables.host.lock().unwrap_or_else(|e| e.into_inner());
        for (what, (n, words, s)) in host.iter() {
            out += &format!(
                "{what:<24} {n:>9} {:>11.2} {:>10.1}\n",
                s * 1e3,
                *words as f64 * 4e-6
            );
        }
        Ok(out)
    }
}

impl<L: Launcher> Launcher for Profiled<L> {
    type Buf = L::Buf;
    type Staging = L::Staging;
    type Event = L::Event;
    fn describe(&self) -> String {
        self.inner.describe()
    }
    /// The inner launcher's fork, recording into the same tables.
    fn fork(&self) -> Result<Self> {
        Ok(Profiled {
            inner: self.inner.fork()?,
            tables: self.tables.clone(),
        })
    }
    fn upload(&self, words: &[u32]) -> Result<Self::Buf> {
        self.timed("upload", words.len(), || self.inner.upload(words))
    }
    fn zeroed(&self, words: usize) -> Result<Self::Buf> {
        self.timed("zeroed", words, || self.inner.zeroed(words))
    }
    fn write(&self, buf: &mut Self::Buf, at: usize, words: &[u32]) -> Result<()> {
        self.timed("write", words.len(), || self.inner.write(buf, at, words))
    }
    fn read(&self, buf: &Self::Buf, words: usize) -> Result<Vec<u32>> {
        self.timed("read", words, || self.inner.read(buf, words))
    }
    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&Self::Buf; 6],
        at: [usize; 6],
    ) -> Result<()> {
        self.launched(kernel.symbol(), grid, || {
            self.inner.launch_at(kernel, grid, p, bufs, at)
        })
    }
    fn staging(&self, words: usize) -> Result<Self::Staging> {
        self.inner.staging(words)
    }
    fn staging_words<'s>(&self, s: &'s mut Self::Staging) -> Result<&'s mut [u32]> {
        self.inner.staging_words(s)
    }
    fn copy_in(
        &self,
        src: &Self::Staging,
        words: usize,
        dst: &mut Self::Buf,
        at: usize,
    ) -> Result<Self::Event> {
        self.inner.copy_in(src, words, dst, at)
    }
    fn copies_after_kernels(&self) -> Result<()> {
        self.inner.copies_after_kernels()
    }
    fn kernels_after(&self, e: &Self::Event) -> Result<()> {
        self.inner.kernels_after(e)
    }
    fn wait(&self, e: &Self::Event) -> Result<()> {
        self.inner.wait(e)
    }
    fn mark(&self) -> Result<Self::Event> {
        self.inner.mark()
    }
    fn seconds(&self, from: &Self::Event, to: &Self::Event) -> Result<f64> {
        self.inner.seconds(from, to)
    }
    fn copy_on_device(&self, src: &Self::Buf, dst: &mut Self::Buf, words: usize) -> Result<()> {
        self.inner.copy_on_device(src, dst, words)
    }
    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&Self::Buf; 8],
    ) -> Result<()> {
        self.launched(kernel.symbol(), grid, || {
            self.inner.launch_lm(kernel, grid, p, bufs)
        })
    }
    fn free_memory(&self) -> Option<usize> {
        self.inner.free_memory()
    }
}
