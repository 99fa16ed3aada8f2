//! The fast CPU backend: the reference codec's exact operations, specialized per element
//! width, on compact per-element codes, with rayon across chunks (and, through the callers,
//! across tensors). Its output is checked byte for byte against the reference in
//! tests/backend_parity.rs.

mod bits;
mod decode;
mod encode;
mod tables;
mod word;

use rayon::prelude::*;

use super::reference::layout_stages;
use super::{layout_spaces, Backend, DecodeJob, EncodeJob, Resident};
use crate::delta::chunk::{chunk_ranges, EncodedChunk, CHUNK_ELEMS};
use crate::delta::model::{Hist, Tables};
use crate::delta::symbols::Layout;
use crate::dtype::FloatLayout;
use crate::{Error, Result};
use tables::{DecStage, EncStage};
use word::{InfoFn, Word};

pub struct CpuBackend;

/// Residuals of one tensor: the w-bit displacement per element, and the reference facts
/// (exponent class, sign, top two mantissa bits) the contexts need, two bytes per element.
struct CpuResident<T: Word> {
    fl: FloatLayout,
    d: Vec<T>,
    info: Vec<u16>,
}

/// Run `f` compiled for AVX2 (and BMI, LZCNT, POPCNT) where the CPU has it, else as built.
/// No intrinsics: the same operations, so the same bytes; the compiler just vectorizes more
/// of the lane and counting loops (32-bit multiplies, gathers) than baseline x86-64 allows.
/// `f` and what it calls must be `#[inline(always)]` to be compiled inside the AVX2 copy.
#[inline(always)]
fn fast<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX2 (checked just above; the others come with it on every
        // CPU that has it, and are checked too).
        if std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("lzcnt")
            && std::arch::is_x86_feature_detected!("popcnt")
        {
            return unsafe { avx2(f) };
        }
    }
    f()
}

fn check_tables(layout: Layout, tables: &Tables) -> Result<()> {
    let want = layout_stages(layout).len();
    if tables.stages.len() != want {
        return Err(Error::Invalid(format!(
            "{} stage tables for a layout with {want} stages",
            tables.stages.len()
        )));
    }
    Ok(())
}

impl<T: Word> CpuResident<T> {
    fn new(job: &EncodeJob) -> Self {
        let info_fn = InfoFn::new(job.fl, job.condition);
        let size = T::SIZE;
        let n = job.reference.len() / size;
        let (mut d, mut info) = (vec![T::default(); n], vec![0u16; n]);
        d.par_chunks_mut(CHUNK_ELEMS)
            .zip(info.par_chunks_mut(CHUNK_ELEMS))
            .zip(job.reference.par_chunks(CHUNK_ELEMS * size))
            .zip(job.target.par_chunks(CHUNK_ELEMS * size))
            .for_each(|(((d, info), r), x)| {
                let elems = r.chunks_exact(size).zip(x.chunks_exact(size));
                for ((d, i), (r, x)) in d.iter_mut().zip(info.iter_mut()).zip(elems) {
                    let (r, x) = (T::read(r), T::read(x));
                    let k = word::key::<T>(x).wrapping_sub(word::key::<T>(r)) & word::mask::<T>();
                    *d = T::from_u64(k);
                    *i = info_fn.info::<T>(r) as u16;
                }
            });
        CpuResident {
            fl: job.fl,
            d,
            info,
        }
    }

    fn w1(&self) -> usize {
        self.fl.width as usize + 1
    }
}

impl<T: Word> Resident for CpuResident<T> {
    fn residual_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.d.len() * T::SIZE];
        for (o, &d) in out.chunks_exact_mut(T::SIZE).zip(&self.d) {
            T::write(d.get(), o);
        }
        Ok(out)
    }

    fn histograms(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>> {
        let signed = layout == Layout::Signed;
        let neighbor = if signed { distance } else { None };
        let spaces = layout_spaces(layout, self.fl.width, neighbor);
        let fresh = || -> Vec<Hist> { spaces.iter().map(|&sp| Hist::new(sp)).collect() };
        let hists = chunk_ranges(self.d.len())
            .into_par_iter()
            .fold(
                || (fresh(), Vec::new()),
                |(mut hists, mut codes), r| {
                    fast(
                        #[inline(always)]
                        || {
                            encode::codes(&self.d[r.clone()], signed, &mut codes, None);
                            encode::count(&codes, &self.info[r], self.w1(), neighbor, &mut hists);
                        },
                    );
                    (hists, codes)
                },
            )
            .map(|(h, _)| h)
            .reduce_with(|mut a, b| {
                for (x, y) in a.iter_mut().zip(&b) {
                    x.add(y);
                }
                a
            })
            .unwrap_or_else(fresh);
        Ok(hists)
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        check_tables(layout, tables)?;
        let signed = layout == Layout::Signed;
        let stages: Vec<EncStage> = tables.stages.iter().map(EncStage::new).collect();
        Ok(chunk_ranges(self.d.len())
            .into_par_iter()
            .map_init(encode::Scratch::default, |scratch, r| {
                let (d, info) = (&self.d[r.clone()], &self.info[r]);
                fast(
                    #[inline(always)]
                    || encode::chunk(d, info, signed, self.w1(), &stages, distance, scratch),
                )
            })
            .collect())
    }
}

fn residuals_of<'a, T: Word>(job: &EncodeJob) -> Box<dyn Resident + 'a> {
    Box::new(CpuResident::<T>::new(job))
}

fn decode_as<T: Word>(job: &DecodeJob) -> Result<Vec<u8>> {
    check_tables(job.layout, job.tables)?;
    let n = job.reference.len() / T::SIZE;
    if chunk_ranges(n).len() != job.chunks.len() {
        return Err(Error::format(
            "tensor blob",
            format!("{} chunks for {n} elements", job.chunks.len()),
        ));
    }
    let stages: Vec<DecStage> = job.tables.stages.iter().map(DecStage::new).collect();
    let info_fn = InfoFn::new(job.fl, job.condition);
    let signed = job.layout == Layout::Signed;
    let w1 = job.fl.width as usize + 1;
    let mut out = vec![0u8; job.reference.len()];
    out.par_chunks_mut(CHUNK_ELEMS * T::SIZE)
        .zip(job.reference.par_chunks(CHUNK_ELEMS * T::SIZE))
        .zip(job.chunks.par_iter())
        .try_for_each_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |scratch, ((o, r), c)| {
                fast(
                    #[inline(always)]
                    || {
                        decode::chunk::<T>(
                            c,
                            r,
                            o,
                            info_fn,
                            signed,
                            w1,
                            &stages,
                            job.distance,
                            scratch,
                        )
                    },
                )
            },
        )?;
    Ok(out)
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn device(&self) -> String {
        format!("CPU, {} threads", rayon::current_num_threads())
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        Ok(match job.fl.width {
            8 => residuals_of::<u8>(job),
            16 => residuals_of::<u16>(job),
            32 => residuals_of::<u32>(job),
            64 => residuals_of::<u64>(job),
            w => return Err(Error::Unsupported(format!("{w}-bit floats"))),
        })
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        match job.fl.width {
            8 => decode_as::<u8>(job),
            16 => decode_as::<u16>(job),
            32 => decode_as::<u32>(job),
            64 => decode_as::<u64>(job),
            w => Err(Error::Unsupported(format!("{w}-bit floats"))),
        }
    }
}
