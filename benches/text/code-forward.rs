//! The integer forward pass (docs/INTEGER_GPT2.md §3–§4). Every value is an integer; the same
//! tokens give the same logits whatever the batch, the order of items, or the thread count.

use rayon::prelude::*;

use super::fixed::{div_recip, isqrt_u128, quantize_row, recip, round_shift, round_shift64};
use super::model_file::*;
use crate::{Error, Result};

/// Keys and values of one sequence, per layer, `len * n_embd` i32 each (Q10).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub k: Vec<Vec<i32>>,
    pub v: Vec<Vec<i32>>,
    pub len: usize,
}

impl KvCache {
    pub fn new(n_layer: usize) -> Self {
        KvCache {
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
            len: 0,
        }
    }

    pub fn clear(&mut self) {
        self.k.iter_mut().for_each(Vec::clear);
        self.v.iter_mut().for_each(Vec::clear);
        self.len = 0;
    }
}

/// One token to run: appended to `caches[cache]` at the next position.
#[derive(Clone, Copy, Debug)]
pub struct Item {
    pub cache: usize,
    pub token: u32,
    pub want_logits: bool,
}

/// Per-channel maxima of |LayerNorm output| (calibration for outlier equalization).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub ln1: Vec<Vec<i64>>,
    pub ln2: Vec<Vec<i64>>,
    /// The residual stream (Q12, items x n_embd) after each block of the last call: for
    /// localizing error layer by layer against a reference.
    pub resid: Vec<Vec<i32>>,
}

impl Stats {
    pub fn new(n_layer: usize, d: usize) -> Self {
        Stats {
            ln1: vec![vec![0; d]; n_layer],
            ln2: vec![vec![0; d]; n_layer],
            resid: Vec::new(),
        }
    }
    fn record(acc: &mut [i64], y: &[i64], d: usize) {
        for row in y.chunks_exact(d) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = (*a).max(v.abs());
            }
        }
    }
}

/// Run `items` through the model; returns the logits (Q8, `vocab` per item) of the items that
/// want them, in item order.
pub fn forward(
    model: &Model,
    caches: &mut [KvCache],
    items: &[Item],
    mut stats: Option<&mut Stats>,
) -> Result<Vec<i32>> {
    let d = model.config.n_embd as usize;
    let n = items.len();
    let ctx = model.config.n_ctx as usize;
    // Positions.
    let mut next: Vec<usize> = caches.iter().map(|c| c.len).collect();
    let mut pos = Vec::with_capacity(n);
    for it in items {
        let p = next
            .get_mut(it.cache)
            .ok_or_else(|| Error::Invalid("forward: cache index out of range".into()))?;
        if *p >= ctx {
            return Err(Error::Invalid(format!(
                "forward: position {} beyond context {ctx}",
                *p
            )));
        }
        if it.token >= model.config.vocab {
            return Err(Error::Invalid(format!(
                "forward: token {} beyond vocab",
                it.token
            )));
        }
        pos.push(*p);
        *p += 1;
    }
    // Embedding.
    let mut h = vec![0i32; n * d];
    h.par_chunks_mut(d).enumerate().for_each(|(i, row)| {
        let t = items[i].token as usize;
        let (m, e) = (model.wte.m[t] as i128, model.wte.e[t]);
        let w = &model.wte.w[t * d..(t + 1) * d];
        let pe = &model.wpe[pos[i] * d..(pos[i] + 1) * d];
        for k in 0..d {
            let v = round_shift(w[k] as i128 * m, e - FR) + pe[k] as i128;
            row[k] = v.clamp(-RES_MAX as i128, RES_MAX as i128) as i32;
        }
    });
    let hd = model.head_dim();
    for (l, blk) in model.blocks.iter().enumerate() {
        // Attention.
        let y = layer_norm(&h, d, &blk.ln1, model.config.eps_q);
        if let Some(s) = stats.as_deref_mut() {
            Stats::record(&mut s.ln1[l], &y, d);
        }
        let (xq, sc) = quantize(&y, d, FLN);
        let qkv = matmul(&blk.qkv, &xq, &sc, FQKV, QKV_MAX);
        for (i, it) in items.iter().enumerate() {
            let c = &mut caches[it.cache];
            let p = pos[i];
            for (dst, off) in [(&mut c.k[l], d), (&mut c.v[l], 2 * d)] {
                if dst.len() < (p + 1) * d {
                    dst.resize((p + 1) * d, 0);
                }
                dst[p * d..(p + 1) * d].copy_from_slice(&qkv[i * 3 * d + off..i * 3 * d + off + d]);
            }
        }
        let caches_ro: &[KvCache] = caches;
        let mut o = vec![0i64; n * d];
        o.par_chunks_mut(d).enumerate().for_each(|(i, out)| {
            let c = &caches_ro[items[i].cache];
            attention(
                &qkv[i * 3 * d..i * 3 * d + d],
                &c.k[l],
                &c.v[l],
                pos[i] + 1,
                d,
                hd,
                &model.tables,
                out,
            );
        });
        let (xq, sc) = quantize(&o, d, FQKV);
        let a = matmul(&blk.attn_proj, &xq, &sc, FR, RES_MAX);
        add_residual(&mut h, &a);
        // MLP.
        let y = layer_norm(&h, d, &blk.ln2, model.config.eps_q);
        if let Some(s) = stats.as_deref_mut() {
            Stats::record(&mut s.ln2[l], &y, d);
        }
        let (xq, sc) = quantize(&y, d, FLN);
        let f = matmul(&blk.fc, &xq, &sc, FGELU, 1 << 15);
        let g: Vec<i64> = f
            .iter()
            .map(|&x| model.tables.gelu[(x.clamp(-32768, 32767) + 32768) as usize] as i64)
            .collect();
        let (xq, sc) = quantize(&g, 4 * d, FGELU);
        let p = matmul(&blk.proj, &xq, &sc, FR, RES_MAX);
        add_residual(&mut h, &p);
        if let Some(s) = stats.as_deref_mut() {
            if l == 0 {
                s.resid.clear();
            }
            s.resid.push(h.clone());
        }
    }
    for (c, &nx) in caches.iter_mut().zip(&next) {
        c.len = nx;
    }
    // Head, only for the items that want logits.
    let hw: Vec<i32> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.want_logits)
        .flat_map(|(i, _)| h[i * d..(i + 1) * d].iter().copied())
        .collect();
    if hw.is_empty() {
        return Ok(Vec::new());
    }
    let y = layer_norm(&hw, d, &model.ln_f, model.config.eps_q);
    let (xq, sc) = quantize(&y, d, FLN);
    Ok(matmul(&model.wte, &xq, &sc, FLOGIT, LOGIT_MAX))
}

fn add_residual(h: &mut [i32], a: &[i32]) {
    for (x, &y) in h.iter_mut().zip(a) {
        *x = (*x as i64 + y as i64).clamp(-RES_MAX, RES_MAX) as i32;
    }
}

/// Integer LayerNorm of each row of `h` (Q12) to Q26 (docs §4).
pub fn layer_norm(h: &[i32], d: usize, ln: &LayerNorm, eps_q: i64) -> Vec<i64> {
    let mut y = vec![0i64; h.len()];
    // Rows are cheap: at least 8 per task, so small decode batches stay on one thread.
    y.par_chunks_mut(d)
        .zip(h.par_chunks(d))
        .with_min_len(8)
        .for_each(|(out, row)| layer_norm_row(row, ln, eps_q, out));
    y
}

pub fn layer_norm_row(row: &[i32], ln: &LayerNorm, eps_q: i64, out: &mut [i64]) {
    let n = row.len() as i64;
    let s: i64 = row.iter().map(|&x| x as i64).sum();
    let mut sq: i128 = 0;
    for &x in row {
        let dv = (n * x as i64 - s) as i128;
        sq += dv * dv;
    }
    let u = (sq << (2 * LN_G)) / n as i128 + eps_q as i128 * (n as i128 * n as i128);
    let dd = isqrt_u128(u as u128) as i128;
    let rc = if dd == 0 { (0, 0) } else { recip(dd) };
    for (i, &x) in row.iter().enumerate() {
        let dv = (n * x as i64 - s) as i128;
        // |dv| <= 2^40: dv * 2^22 * r <= 2^92.
        let z = if dd == 0 {
            0
        } else {
            div_recip(dv << (FZ + LN_G), rc)
        };
        out[i] = (ln.gamma[i] as i128 * z + ln.beta[i] as i128) as i64; // <= 2^51 + 2^40
    }
}

/// Per-row int8 quantization with integer scales.
pub fn quantize(y: &[i64], d: usize, frac: i32) -> (Vec<i8>, Vec<(i64, i32)>) {
    let mut q = vec![0i8; y.len()];
    let scales = q
        .par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .with_min_len(8)
        .map(|(qr, yr)| quantize_row(yr, frac, qr))
        .collect();
    (q, scales)
}

/// Reference dot product: int8 x int8 summed in i32 (exact in any order for k <= 2^17).
#[inline(always)]
pub fn dot_generic(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as i16 as i32) * (y as i16 as i32))
        .sum()
}

/// `out[t] = dot(w, xs[t*k..(t+1)*k])`: one weight row against every item (reference).
pub fn dot_rows_generic(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    for (o, x) in out.iter_mut().zip(xs.chunks_exact(k)) {
        *o = dot_generic(w, x);
    }
}

/// AVX2: |w| (u8) times sign(x, w) (i8) with `maddubs` gives exact i16 pair sums
/// (|w| <= 128, |x| <= 127: 2 * 128 * 127 = 32512 < 2^15), widened by `madd` into i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_rows_avx2(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    use std::arch::x86_64::*;
    let body = k / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    let hsum = |v: __m256i| -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    };
    let n = out.len();
    let mut t = 0;
    while t + 4 <= n {
        let x0 = xs.as_ptr().add(t * k);
        let (x1, x2, x3) = (x0.add(k), x0.add(2 * k), x0.add(3 * k));
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let mut c = 0;
        while c < body {
            let wv = _mm256_loadu_si256(w.as_ptr().add(c) as *const __m256i);
            let aw = _mm256_abs_epi8(wv);
            macro_rules! step {
                ($acc:ident, $x:ident) => {
                    let xv = _mm256_loadu_si256($x.add(c) as *const __m256i);
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv));
                    $acc = _mm256_add_epi32($acc, _mm256_madd_epi16(p, ones));
                };
            }
            step!(a0, x0);
            step!(a1, x1);
            step!(a2, x2);
            step!(a3, x3);
            c += 32;
        }
        let tail = |x: *const i8| -> i32 {
            dot_generic(
                &w[body..k],
                std::slice::from_raw_parts(x.add(body), k - body),
            )
        };
        out[t] = hsum(a0) + tail(x0);
        out[t + 1] = hsum(a1) + tail(x1);
        out[t + 2] = hsum(a2) + tail(x2);
        out[t + 3] = hsum(a3) + tail(x3);
        t += 4;
    }
    while t < n {
        let x0 = xs.as_ptr().add(t * k);
        let mut a0 = _mm256_setzero_si256();
        let mut c = 0;
        while c < body {
            let wv = _mm256_loadu_si256(w.as_ptr().add(c) as *const __m256i);
            let xv = _mm256_loadu_si256(x0.add(c) as *const __m256i);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p, ones));
            c += 32;
        }
        out[t] = hsum(a0)
            + dot_generic(
                &w[body..k],
                std::slice::from_raw_parts(x0.add(body), k - body),
            );
        t += 1;
    }
}

/// AVX-512 VNNI: `dpbusd` multiplies unsigned by signed bytes, so the activations go in as
/// `x + 128` (`xu`, u8) and `128 * sum(w)` is subtracted afterwards: exact, and no saturation
/// (`dpbusd` without `s` wraps, and |sum| stays far below 2^31).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_rows_vnni(w: &[i8], row_sum: i32, xu: &[u8], k: usize, out: &mut [i32]) {
    use std::arch::x86_64::*;
    let body = k / 64 * 64;
    // sum(w * x) = sum(w * (x + 128)) - 128 * sum(w), over the whole row.
    let bias = 128 * row_sum;
    let tail = |t: usize| -> i32 {
        w[body..k]
            .iter()
            .zip(&xu[t * k + body..(t + 1) * k])
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum()
    };
    let n = out.len();
    let mut t = 0;
    while t + 4 <= n {
        let x0 = xu.as_ptr().add(t * k);
        let (x1, x2, x3) = (x0.add(k), x0.add(2 * k), x0.add(3 * k));
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let mut c = 0;
        while c < body {
            let wv = _mm512_loadu_si512(w.as_ptr().add(c) as *const _);
            a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(x0.add(c) as *const _), wv);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(x1.add(c) as *const _), wv);
            a2 = _mm512_dpbusd_epi32(a2, _mm512_loadu_si512(x2.add(c) as *const _), wv);
            a3 = _mm512_dpbusd_epi32(a3, _mm512_loadu_si512(x3.add(c) as *const _), wv);
            c += 64;
        }
        out[t] = _mm512_reduce_add_epi32(a0) - bias + tail(t);
        out[t + 1] = _mm512_reduce_add_epi32(a1) - bias + tail(t + 1);
        out[t + 2] = _mm512_reduce_add_epi32(a2) - bias + tail(t + 2);
        out[t + 3] = _mm512_reduce_add_epi32(a3) - bias + tail(t + 3);
        t += 4;
    }
    while t < n {
        // One item: four independent accumulators hide the dpbusd latency.
        let x0 = xu.as_ptr().add(t * k);
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut c = 0;
        while c + 256 <= body {
            for (u, a) in acc.iter_mut().enumerate() {
                let off = c + 64 * u;
                let wv = _mm512_loadu_si512(w.as_ptr().add(off) as *const _);
                *a = _mm512_dpbusd_epi32(*a, _mm512_loadu_si512(x0.add(off) as *const _), wv);
            }
            c += 256;
        }
        while c < body {
            let wv = _mm512_loadu_si512(w.as_ptr().add(c) as *const _);
            acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_loadu_si512(x0.add(c) as *const _), wv);
            c += 64;
        }
        let sum = _mm512_add_epi32(
            _mm512_add_epi32(acc[0], acc[1]),
            _mm512_add_epi32(acc[2], acc[3]),
        );
        out[t] = _mm512_reduce_add_epi32(sum) - bias + tail(t);
        t += 1;
    }
}

/// Which dot-product kernel this CPU runs (all give the same integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Generic,
    Avx2,
    Vnni,
}

pub fn best_kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512bw")
        {
            return Kernel::Vnni;
        }
        if std::is_x86_feature_detected!("avx2") {
            return Kernel::Avx2;
        }
    }
    Kernel::Generic
}

static KERNEL_OVERRIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Force the dot-product kernel (tests and benches: every kernel must give the same bytes).
/// A kernel this CPU lacks is ignored; `None` returns to the best one.
pub fn force_kernel(k: Option<Kernel>) {
    let v = match k {
        None => 0,
        Some(Kernel::Generic) => 1,
        Some(Kernel::Avx2) => 2,
        Some(Kernel::Vnni) => 3,
    };
    KERNEL_OVERRIDE.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The kernel the matmul uses now: the forced one if this CPU has it, else the best.
pub fn active_kernel() -> Kernel {
    let best = best_kernel();
    let forced = match KERNEL_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => Kernel::Generic,
        2 => Kernel::Avx2,
        3 => Kernel::Vnni,
        _ => return best,
    };
    // Vnni implies Avx2 on every CPU that has it; never pick a kernel above the best.
    if rank(forced) <= rank(best) {
        forced
    } else {
        best
    }
}

/// One weight row against every item with a chosen kernel; `xu` is `xs` with the sign bit
/// flipped (x + 128 as u8), used by the VNNI kernel.
/// `row_sum` is the sum of `w[..k]` (only the VNNI kernel uses it).
pub fn dot_rows_with(
    kernel: Kernel,
    w: &[i8],
    row_sum: i32,
    xs: &[i8],
    xu: &[u8],
    k: usize,
    out: &mut [i32],
) {
    assert!(w.len() >= k && xs.len() >= out.len() * k);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row_sum, xu);
    // A kernel this CPU lacks falls back to the reference (never undefined behavior).
    let kernel = if rank(kernel) <= rank(best_kernel()) {
        kernel
    } else {
        Kernel::Generic
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni => {
            assert!(xu.len() >= out.len() * k);
            // SAFETY: AVX-512 VNNI/BW are present (checked just above); slices are in bounds.
            unsafe { dot_rows_vnni(w, row_sum, xu, k, out) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 is present (checked just above); slices are in bounds.
        Kernel::Avx2 => unsafe { dot_rows_avx2(w, xs, k, out) },
        _ => dot_rows_generic(w, xs, k, out),
    }
}

fn rank(k: Kernel) -> u8 {
    match k {
        Kernel::Generic => 1,
        Kernel::Avx2 => 2,
        Kernel::Vnni => 3,
    }
}

/// One weight row against every item; AVX2 when the CPU has it (same integers either way,
/// given activations in [-127, 127] as `quantize_row` produces: the sign trick cannot negate -128).
pub fn dot_rows(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    assert!(w.len() >= k && xs.len() >= out.len() * k);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present and the slices were bounds-checked above.
            unsafe { dot_rows_avx2(w, xs, k, out) };
            return;
        }
    }
    dot_rows_generic(w, xs, k, out)
}

/// int8 x int8 -> i32 matmul with integer rescale: `n` items (rows of `xq`), output `n x rows`.
pub fn matmul(lin: &Linear, xq: &[i8], sc: &[(i64, i32)], out_frac: i32, clamp: i64) -> Vec<i32> {
    let k = lin.k;
    let n = sc.len();
    debug_assert_eq!(xq.len(), n * k);
    const CHUNK: usize = 64;
    let kernel = active_kernel();
    let xu: Vec<u8> = if kernel == Kernel::Vnni {
        xq.iter().map(|&v| v as u8 ^ 0x80).collect()
    } else {
        Vec::new()
    };
    let tms: Vec<i64> = sc.iter().map(|s| s.0).collect();
    let tes: Vec<i32> = sc.iter().map(|s| s.1).collect();
    let mut out = vec![0i32; n * lin.rows];
    let outp = SyncPtr(out.as_mut_ptr());
    let rows = lin.rows;
    (0..rows.div_ceil(CHUNK)).into_par_iter().for_each(|ci| {
        let outp = &outp;
        let j0 = ci * CHUNK;
        let j1 = (j0 + CHUNK).min(rows);
        // acc[r * n + t]: the dots of rows j0.. against every item.
        let mut acc = vec![0i32; (j1 - j0) * n];
        for (j, a) in (j0..j1).zip(acc.chunks_mut(n.max(1))) {
            let w = &lin.w[j * k..(j + 1) * k];
            dot_rows_with(kernel, w, lin.row_sum[j], xq, &xu, k, a);
        }
        let (ms, es): (Vec<i64>, Vec<i32>) = (j0..j1).map(|j| lin.m16(j)).unzip();
        let bias = &lin.bias[j0..j1];
        let mut res = vec![0i32; (j1 - j0) * n];
        rescale(
            &acc, n, &ms, &es, bias, &tms, &tes, out_frac, clamp, &mut res,
        );
        let mut row = vec![0i32; j1 - j0];
        for t in 0..n {
            for (r, o) in row.iter_mut().enumerate() {
                *o = res[r * n + t];
            }
            // SAFETY: t < n and j0..j1 lie inside row t of `out`; row chunks are disjoint, so
            // each element is written by exactly one task.
            unsafe {
                std::ptr::copy_nonoverlapping(row.as_ptr(), outp.0.add(t * rows + j0), j1 - j0)
            };
        }
    });
    out
}

/// `res[r][t] = clamp(round_shift(acc[r][t] * m[r] * t_m[t], e[r] + t_e[t] - out_frac) + b[r])`
/// (docs §4). When every shift is in 1..=63 (always, for real scales) a branch-free loop
/// the compiler vectorizes computes exactly the same integers as `round_shift64`.
#[allow(clippy::too_many_arguments)]
fn rescale(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    let (emin, emax) = (
        es.iter().min().copied().unwrap_or(0),
        es.iter().max().copied().unwrap_or(0),
    );
    let (tmin, tmax) = (
        tes.iter().min().copied().unwrap_or(0),
        tes.iter().max().copied().unwrap_or(0),
    );
    let fast = emin + tmin - out_frac >= 1 && emax + tmax - out_frac <= 63;
    if !fast {
        for r in 0..ms.len() {
            for t in 0..n {
                let prod = acc[r * n + t] as i64 * ms[r] * tms[t];
                let v = round_shift64(prod, es[r] + tes[t] - out_frac) + bias[r] as i64;
                res[r * n + t] = v.clamp(-clamp, clamp) as i32;
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: the features are present; the body is safe code compiled with them.
            unsafe { rescale_fast_avx512(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res) };
            return;
        }
    }
    rescale_fast(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn rescale_fast_avx512(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    rescale_fast(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res)
}

/// The fast path of [`rescale`]: every shift is in 1..=63.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rescale_fast(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    for r in 0..ms.len() {
        let (m, b) = (ms[r], bias[r] as i64);
        let base = (es[r] - out_frac) as i64;
        let a = &acc[r * n..(r + 1) * n];
        let o = &mut res[r * n..(r + 1) * n];
        for t in 0..n {
            // |acc| <= 2^27, m < 2^16, t_m < 2^16: the product is below 2^59 (i64).
            let prod = a[t] as i64 * m * tms[t];
            let s = base + tes[t] as i64;
            let v = ((prod + (1i64 << (s - 1))) >> s) + b;
            o[t] = v.clamp(-clamp, clamp) as i32;
        }
    }
}

/// A raw pointer that tasks writing disjoint elements may share.
struct SyncPtr(*mut i32);
// SAFETY: used only for writes to disjoint indices from rayon tasks that end before the
// owning vector is used again.
unsafe impl Sync for SyncPtr {}

/// Causal attention of one item over `len` cached positions (docs §4).
#[allow(clippy::too_many_arguments)]
fn attention(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; the body is safe code compiled with AVX2 enabled.
            unsafe { attention_avx2(q, kc, vc, len, d, hd, tables, out) };
            return;
        }
    }
    attention_body(q, kc, vc, len, d, hd, tables, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_avx2(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    attention_body(q, kc, vc, len, d, hd, tables, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attention_body(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    let mut sc = vec![0i64; len];
    let mut p = vec![0i32; len]; // <= 2^24
    let mut acc = vec![0i64; hd];
    for h in 0..d / hd {
        let off = h * hd;
        let qh = &q[off..off + hd];
        for (s, scs) in sc.iter_mut().enumerate() {
            let kh = &kc[s * d + off..s * d + off + hd];
            // |q|, |k| <= 2^20: each product <= 2^40, the sum <= hd * 2^40 (i64).
            let dot: i64 = qh.iter().zip(kh).map(|(&a, &b)| a as i64 * b as i64).sum();
            *scs = round_shift(dot as i128 * tables.attn_m as i128, 52) as i64;
        }
        let mx = *sc.iter().max().unwrap_or(&0);
        let mut total: i64 = 0;
        for (ps, &s) in p.iter_mut().zip(&sc) {
            let gap = (mx - s) as usize;
            *ps = tables.exp24.get(gap).copied().unwrap_or(0) as i32;
            total += *ps as i64;
        }
        acc.iter_mut().for_each(|a| *a = 0);
        for (s, &ps) in p.iter().enumerate() {
            if ps == 0 {
                continue;
            }
            let vh = &vc[s * d + off..s * d + off + hd];
            for (a, &v) in acc.iter_mut().zip(vh) {
                *a += ps as i64 * v as i64;
            }
        }
        let rc = recip(total as i128);
        for (o, &a) in out[off..off + hd].iter_mut().zip(&acc) {
            // |a| <= 2^57, r <= 2^30
            *o = div_recip(a as i128, rc) as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_rescale_equals_round_shift() {
        let n = 37;
        let acc: Vec<i32> = (0..5 * n as i32)
            .map(|i| (i * 7919 % 20001 - 10000) * 3001)
            .collect();
        let ms = vec![32768i64, 40000, 65535, 50000, 33333];
        let es = vec![20, 30, 25, 41, 33];
        let bias = vec![0, 5, -7, 1 << 20, -3];
        let tms: Vec<i64> = (0..n as i64).map(|t| 32768 + t * 887).collect();
        let tes: Vec<i32> = (0..n as i32).map(|t| 10 + t % 9).collect();
        let mut fast = vec![0; 5 * n];
        rescale(&acc, n, &ms, &es, &bias, &tms, &tes, 12, 1 << 26, &mut fast);
        for r in 0..5 {
            for t in 0..n {
                let prod = acc[r * n + t] as i64 * ms[r] * tms[t];
                let v = round_shift64(prod, es[r] + tes[t] - 12) + bias[r] as i64;
                assert_eq!(fast[r * n + t] as i64, v.clamp(-(1 << 26), 1 << 26));
            }
        }
    }

    #[test]
    fn simd_dot_equals_reference() {
        let mut x = 7u64;
        let mut rnd = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for k in [1usize, 31, 32, 64, 128, 200, 768] {
            let w: Vec<i8> = (0..k).map(|_| (rnd() % 256) as i32 as i8).collect();
            let xs: Vec<i8> = (0..7 * k)
                .map(|_| ((rnd() % 255) as i32 - 127) as i8)
                .collect();
            let mut a = vec![0; 7];
            let mut b = vec![0; 7];
            dot_rows(&w, &xs, k, &mut a);
            dot_rows_generic(&w, &xs, k, &mut b);
            assert_eq!(a, b, "k={k}");
            let xu: Vec<u8> = xs.iter().map(|&v| v as u8 ^ 0x80).collect();
            let rs = w.iter().map(|&v| v as i32).sum();
            dot_rows_with(best_kernel(), &w, rs, &xs, &xu, k, &mut a);
            assert_eq!(a, b, "k={k} {:?}", best_kernel());
        }
    }
}
