//! The forward pass (docs/INTEGER_GPT2.md §3–§4) from the kernels of this folder. Every value
//! is an integer; the same tokens give the same logits whatever the batch, the order of items,
//! the thread count or the instruction-set level.

use rayon::prelude::*;

use super::attention::attention;
use super::attention_many::{attention_head_many, many_supported, Kv, MANY_ITEMS};
use super::matmul::{matmul_tops, CpuLinear};
use super::norm::{layer_norm, lookup_quantize, quantize};
use super::split::Split;
use crate::backend::cpu::Isa;
use crate::backend::lm::{record, Item, Trace};
use crate::format::lm::fixed::round_shift;
use crate::format::lm::model_file::*;
use crate::memory::ZeroedPages;
use crate::{Error, Result};

/// Every sequence's keys and values, per layer, up to `positions` rows of `n_embd` i32 each
/// (Q10), in one buffer laid out `[sequence][layer][key, value][position][channel]`.
///
/// The buffer is sized for the whole session when it is loaded and its pages filled in by
/// the kernel as positions arrive ([`ZeroedPages`]): a decoder's caches are hundreds of
/// megabytes written once, and a `Vec` per layer grown a position at a time copied them on
/// every doubling.
///
/// Beside them the same rows as i16 while every value of a sequence's layer fits
/// (`narrow`): q, k and v are clamped to +-2^20, but the shipped model's stay inside +-2^15
/// (every row of a 21,872-byte decode did), and the decoder's attention reads each sequence's
/// whole cache every step (16 MB per step over 21 strands, from L3), so half the bytes is
/// half the traffic. The values are the same integers; the kernels widen them as they load.
/// The narrow copy is only touched while it is used.
pub(super) struct KvCaches {
    wide: ZeroedPages<i32>,
    narrow16: ZeroedPages<i16>,
    /// Per sequence and layer: whether the i16 copy holds every position (no value outside
    /// i16 yet).
    narrow: Vec<bool>,
    /// Positions cached per sequence.
    pub lens: Vec<usize>,
    n_layer: usize,
    positions: usize,
    d: usize,
}

impl KvCaches {
    pub fn new(sequences: usize, n_layer: usize, positions: usize, d: usize) -> Self {
        let words = sequences * n_layer * 2 * positions * d;
        KvCaches {
            wide: ZeroedPages::new(words),
            narrow16: ZeroedPages::new(words),
            narrow: vec![true; sequences * n_layer],
            lens: vec![0; sequences],
            n_layer,
            positions,
            d,
        }
    }

    /// The positions each sequence holds at most.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Empty sequence `seq` (its rows are overwritten as positions arrive again).
    pub fn clear(&mut self, seq: usize) {
        self.lens[seq] = 0;
        self.narrow[seq * self.n_layer..(seq + 1) * self.n_layer].fill(true);
    }

    /// Where sequence `seq`'s layer `l` keys (`part` 0) or values (1) begin.
    fn start(&self, seq: usize, l: usize, part: usize) -> usize {
        ((seq * self.n_layer + l) * 2 + part) * self.positions * self.d
    }

    /// Store sequence `seq`'s layer `l` key and value rows of position `p` (`p` below
    /// `positions`, checked by the caller).
    fn store(&mut self, seq: usize, l: usize, p: usize, key: &[i32], value: &[i32]) {
        let d = self.d;
        let narrow = &mut self.narrow[seq * self.n_layer + l];
        let fits = |row: &[i32]| row.iter().all(|&x| x == x as i16 as i32);
        *narrow &= fits(key) && fits(value);
        let narrow = *narrow;
        for (part, row) in [key, value].into_iter().enumerate() {
            let at = self.start(seq, l, part) + p * d;
            self.wide[at..at + d].copy_from_slice(row);
            if narrow {
                for (o, &x) in self.narrow16[at..at + d].iter_mut().zip(row) {
                    *o = x as i16;
                }
            }
        }
    }

    /// Sequence `seq`'s layer `l`: its first `len` positions' keys and values, as i16 when
    /// every one fits.
    pub fn kv(&self, seq: usize, l: usize, len: usize) -> Kv<'_> {
        let (k, v) = (self.start(seq, l, 0), self.start(seq, l, 1));
        let n = len * self.d;
        match self.narrow[seq * self.n_layer + l] {
            true => Kv::Narrow(&self.narrow16[k..k + n], &self.narrow16[v..v + n]),
            false => {
                let (k, v) = self.wide(seq, l, len);
                Kv::Wide(k, v)
            }
        }
    }

    /// As [`KvCaches::kv`], always as i32.
    fn wide(&self, seq: usize, l: usize, len: usize) -> (&[i32], &[i32]) {
        let (k, v) = (self.start(seq, l, 0), self.start(seq, l, 1));
        let n = len * self.d;
        (&self.wide[k..k + n], &self.wide[v..v + n])
    }
}

/// The model's linear layers prepared for one level's kernels ([`CpuLinear`]), once per
/// session.
pub(super) struct CpuWeights<'m> {
    /// Per block: qkv, attention projection, MLP up (fc), MLP down (proj).
    blocks: Vec<[CpuLinear<'m>; 4]>,
    /// The LM head: the embedding's rows in token order, or in the session's order
    /// (`CpuSession::head_order`).
    pub head: CpuLinear<'m>,
}

impl<'m> CpuWeights<'m> {
    pub fn new(isa: Isa, model: &'m Model) -> CpuWeights<'m> {
        let l = |lin| CpuLinear::new(isa, lin);
        CpuWeights {
            blocks: model
                .blocks
                .iter()
                .map(|b| [l(&b.qkv), l(&b.attn_proj), l(&b.fc), l(&b.proj)])
                .collect(),
            head: l(&model.wte),
        }
    }
}

/// The outputs of the layers' matmuls, kept by the session from step to step: fresh, a
/// GPT-2-small compress step's (255 items) are 7 MB a layer of new pages, faulted in and
/// zeroed by the kernel every layer (docs/BENCHMARKS.md, "The CPU LM answers a coder's
/// query without its table").
#[derive(Default)]
pub(super) struct StepBuffers {
    qkv: Vec<i32>,
    attn: Vec<i32>,
    fc: Vec<i32>,
    proj: Vec<i32>,
}

/// [`matmul_tops`] into `out`, its storage reused, without the tops.
fn matmul_into<'a>(
    isa: Isa,
    split: Split,
    cl: &CpuLinear,
    (xq, sc): (&[i8], &[(i64, i32)]),
    out_frac: i32,
    clamp: i64,
    out: &'a mut Vec<i32>,
) -> &'a [i32] {
    matmul_tops(isa, split, cl, xq, sc, out_frac, clamp, false, out);
    out
}

/// The final LayerNorm's output of the items that have a query, quantized for the LM head
/// ([`head`]): int8 rows of `n_embd` and each row's scale.
pub struct HeadInput {
    pub xq: Vec<i8>,
    pub sc: Vec<(i64, i32)>,
}

/// Run `items` through the model up to the LM head; returns the head's input for the items
/// that have a query, in item order. `split` says whether the kernels may use the pool (the
/// caller runs this inside [`Split::run`]).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    isa: Isa,
    split: Split,
    model: &Model,
    weights: &CpuWeights,
    caches: &mut KvCaches,
    items: &[Item],
    mut stats: Option<&mut Trace>,
    bufs: &mut StepBuffers,
) -> Result<HeadInput> {
    let d = model.config.n_embd as usize;
    let n = items.len();
    if let Some(t) = stats.as_deref_mut() {
        let nl = model.blocks.len();
        if t.ln1.len() != nl || t.ln2.len() != nl {
            *t = Trace {
                ln1: vec![vec![0; d]; nl],
                ln2: vec![vec![0; d]; nl],
                ..std::mem::take(t)
            };
        }
    }
    let ctx = caches.positions();
    // Positions.
    let mut next = caches.lens.clone();
    let mut pos = Vec::with_capacity(n);
    for it in items {
        let p = next
            .get_mut(it.seq)
            .ok_or_else(|| Error::Invalid("forward: cache index out of range".into()))?;
        if *p >= ctx {
            return Err(Error::Invalid(format!(
                "forward: a sequence of {} positions in a session loaded for {ctx} positions",
                *p + 1
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
    h.par_chunks_mut(d)
        .with_min_len(split.min_len(1))
        .enumerate()
        .for_each(|(i, row)| {
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
    // The items of each sequence in order (consecutive positions), in runs of at most
    // MANY_ITEMS: the multi-item attention's calls.
    let mut by_seq: Vec<Vec<usize>> = vec![Vec::new(); caches.lens.len()];
    for (i, it) in items.iter().enumerate() {
        by_seq[it.seq].push(i);
    }
    let runs: Vec<&[usize]> = by_seq.iter().flat_map(|s| s.chunks(MANY_ITEMS)).collect();
    for (l, (blk, [qkv_w, attn_w, fc_w, proj_w])) in
        model.blocks.iter().zip(&weights.blocks).enumerate()
    {
        // Attention.
        let y = layer_norm(&h, d, &blk.ln1, model.config.eps_q, split);
        if let Some(s) = stats.as_deref_mut() {
            record(&mut s.ln1[l], &y, d);
        }
        let (xq, sc) = quantize(isa, &y, d, FLN, split);
        let qkv = matmul_into(isa, split, qkv_w, (&xq, &sc), FQKV, QKV_MAX, &mut bufs.qkv);
        for (i, it) in items.iter().enumerate() {
            let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
            caches.store(it.seq, l, pos[i], &row[d..2 * d], &row[2 * d..]);
        }
        let caches_ro: &KvCaches = caches;
        let mut o = vec![0i64; n * d];
        if many_supported(isa, hd) && runs.iter().any(|r| r.len() > 1) {
            // One task per run of a sequence's items and head: each reads the head's cache
            // once for the run's items.
            let tasks: Vec<(usize, usize)> = (0..runs.len())
                .flat_map(|r| (0..d / hd).map(move |h| (r, h)))
                .collect();
            // The tasks' outputs one after the other in one buffer (run r's items x hd
            // each: n * d in all), and each task's queries and lengths on the stack: no
            // allocation per task.
            let mut heads = vec![0i64; n * d];
            let mut parts = Vec::with_capacity(tasks.len());
            let mut rest = &mut heads[..];
            for &(r, _) in &tasks {
                let (part, after) = rest.split_at_mut(runs[r].len() * hd);
                parts.push(part);
                rest = after;
            }
            tasks
                .par_iter()
                .zip(parts)
                .with_min_len(split.min_len(1))
                .for_each(|(&(r, h), out)| {
                    let run = &runs[r];
                    let (mut qs, mut lens) = ([&[][..]; MANY_ITEMS], [0; MANY_ITEMS]);
                    for (j, &i) in run.iter().enumerate() {
                        (qs[j], lens[j]) = (&qkv[i * 3 * d..], pos[i] + 1);
                    }
                    let (qs, lens) = (&qs[..run.len()], &lens[..run.len()]);
                    let kv = caches_ro.kv(items[run[0]].seq, l, pos[run[run.len() - 1]] + 1);
                    let dims = (d, hd, h);
                    attention_head_many(isa, qs, lens, kv, dims, &model.tables, out);
                });
            let mut outs = heads.chunks_exact(hd);
            for &(r, h) in &tasks {
                for (&i, oh) in runs[r].iter().zip(&mut outs) {
                    o[i * d + h * hd..i * d + (h + 1) * hd].copy_from_slice(oh);
                }
            }
        } else {
            o.par_chunks_mut(d)
                .with_min_len(split.min_len(1))
                .enumerate()
                .for_each(|(i, out)| {
                    let (q, len) = (&qkv[i * 3 * d..i * 3 * d + d], pos[i] + 1);
                    let t = &model.tables;
                    match caches_ro.kv(items[i].seq, l, len) {
                        Kv::Wide(k, v) => attention(isa, q, k, v, len, d, hd, t, out),
                        Kv::Narrow(k, v) => attention(isa, q, k, v, len, d, hd, t, out),
                    }
                });
        }
        let (xq, sc) = quantize(isa, &o, d, FQKV, split);
        let a = matmul_into(isa, split, attn_w, (&xq, &sc), FR, RES_MAX, &mut bufs.attn);
        add_residual(&mut h, a);
        // MLP.
        let y = layer_norm(&h, d, &blk.ln2, model.config.eps_q, split);
        if let Some(s) = stats.as_deref_mut() {
            record(&mut s.ln2[l], &y, d);
        }
        let (xq, sc) = quantize(isa, &y, d, FLN, split);
        let f = matmul_into(isa, split, fc_w, (&xq, &sc), FGELU, 1 << 15, &mut bufs.fc);
        let (xq, sc) = lookup_quantize(isa, f, &model.tables.gelu, 4 * d, FGELU, split);
        let p = matmul_into(isa, split, proj_w, (&xq, &sc), FR, RES_MAX, &mut bufs.proj);
        add_residual(&mut h, p);
        if let Some(s) = stats.as_deref_mut() {
            if l == 0 {
                s.resid.clear();
            }
            s.resid.push(h.clone());
        }
    }
    caches.lens = next;
    // Head, only for the items that want logits.
    let hw: Vec<i32> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.query.is_some())
        .flat_map(|(i, _)| h[i * d..(i + 1) * d].iter().copied())
        .collect();
    if hw.is_empty() {
        return Ok(HeadInput {
            xq: Vec::new(),
            sc: Vec::new(),
        });
    }
    let y = layer_norm(&hw, d, &model.ln_f, model.config.eps_q, split);
    let (xq, sc) = quantize(isa, &y, d, FLN, split);
    Ok(HeadInput { xq, sc })
}

/// The LM head over rows `range` of `input`: their logits (Q8, `vocab` each) replace the
/// contents of `logits`, and each one's largest logit is returned where the kernel found it
/// on the way.
pub fn head(
    isa: Isa,
    split: Split,
    weights: &CpuWeights,
    input: &HeadInput,
    range: std::ops::Range<usize>,
    logits: &mut Vec<i32>,
) -> Option<Vec<i32>> {
    let k = weights.head.shape().1;
    let (xq, sc) = (&input.xq[range.start * k..range.end * k], &input.sc[range]);
    let head = &weights.head;
    matmul_tops(isa, split, head, xq, sc, FLOGIT, LOGIT_MAX, true, logits)
}

fn add_residual(h: &mut [i32], a: &[i32]) {
    for (x, &y) in h.iter_mut().zip(a) {
        *x = (*x as i64 + y as i64).clamp(-RES_MAX, RES_MAX) as i32;
    }
}
