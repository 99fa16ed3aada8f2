//! The integer GPT-2 on the CUDA device (docs/BACKENDS.md, "Language model"): every stage of
//! docs/INTEGER_GPT2.md §4–§5 and the match mix of §10 as CUDA kernels (kernels/lm/), giving
//! the CPU reference's integers. Written once against [`Launcher`], so the host emulation
//! (CI) and a real GPU run every line here. Weights are uploaded once in `load`, each layer's
//! KV cache lives on the device, and per queried position only three integers come back
//! ([`Coded`]): the frequency table is built, mixed and searched where the logits are.

pub mod kernels;

use std::sync::Arc;

use super::launch::Launcher;
use crate::backend::lm::{
    check_wanted, gather_sums, query_last, sequences_within, step_input, unmixed_queries, Coded,
    Item, LmKernels, LmSession, Readback, Tables, Trace,
};
use crate::format::lm::model_file::*;
use crate::{Error, Result};
use kernels::{LmKernel, LmParams};

/// The language model's kernels on a CUDA device (shared with its delta codec's backend).
pub struct CudaLm<L: Launcher> {
    dev: Arc<L>,
    /// The last model made resident, by hash: compression's verifying decode, every decode
    /// group and every later call reuse its weights instead of packing and uploading them
    /// again (GPT-2 small's blocks took 0.26 s on a Zen 5, through the emulation).
    resident: std::sync::Mutex<Option<Cached<L::Buf>>>,
}

/// A model's hash and its weights on the device.
type Cached<B> = ([u8; 32], Arc<Weights<B>>);

impl<L: Launcher> CudaLm<L> {
    pub fn new(dev: Arc<L>) -> Self {
        CudaLm {
            dev,
            resident: std::sync::Mutex::new(None),
        }
    }

    /// `model`'s weights on the device: the cached ones when they are this model's.
    fn weights(&self, model: &Model) -> Result<Arc<Weights<L::Buf>>> {
        let mut cached = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((hash, w)) = cached.as_ref() {
            if *hash == model.hash {
                return Ok(w.clone());
            }
        }
        // The old model's buffers go before the new one's are made.
        *cached = None;
        let w = Arc::new(Weights::new(&*self.dev, model)?);
        *cached = Some((model.hash, w.clone()));
        Ok(w)
    }
}

impl<L: Launcher> LmKernels for CudaLm<L> {
    fn describe(&self) -> String {
        // (describe names sm_XY on a GPU; the emulation is a host build: __dp4a)
        format!(
            "{}, int8 matmul on tensor cores (mma.sync) from sm_80, __dp4a below",
            self.dev.describe()
        )
    }

    /// KV caches sized by `positions` (a segment of 255 tokens needs a quarter of GPT-2's
    /// context: four times the sequences in the same memory, and less to allocate).
    fn load<'m>(
        &self,
        model: &'m Model,
        sequences: usize,
        positions: usize,
    ) -> Result<Box<dyn LmSession + 'm>> {
        let weights = self.weights(model)?;
        Ok(Box::new(CudaSession::new(
            self.dev.clone(),
            model,
            weights,
            sequences,
            positions,
        )?))
    }

    /// A step's cost hardly grows with its rows until thousands, so decoders run as many
    /// sequences as a quarter of the free memory holds in KV caches of `positions` each, at
    /// most 16 GiB and 1024 sequences.
    fn lockstep_sequences(&self, model: &Model, positions: usize) -> usize {
        let positions = positions.clamp(1, model.config.n_ctx as usize);
        sequences_within(model, positions, self.kv_budget(), 1024)
    }

    /// As many segments as keep a step to about 16K positions, within the same budget.
    fn compress_sequences(&self, model: &Model, positions: usize) -> usize {
        let rows = (STEP_POSITIONS / positions.max(1)).max(1);
        self.lockstep_sequences(model, positions).min(rows)
    }
}

/// Positions per compression step at most: activations of 16K rows of GPT-2 small are about
/// 2 GB.
const STEP_POSITIONS: usize = 1 << 14;

impl<L: Launcher> CudaLm<L> {
    /// Bytes of KV cache a session may hold: a quarter of the free memory (1 GiB where the
    /// device does not say), at most 16 GiB.
    fn kv_budget(&self) -> usize {
        self.dev
            .free_memory()
            .map_or(1 << 30, |free| free / 4)
            .min(16 << 30)
    }
}

/// An int8 matrix as the matmul reads it: word c of row j (four int8, zero padded) at
/// `c * rows + j`, and per row (m16, e16, bias, 0).
struct Matrix<B> {
    w: B,
    rowinfo: B,
    rows: usize,
    k4: usize,
}

struct Norm<B> {
    gamma: B,
    beta: B,
}

struct BlockBufs<B> {
    ln1: Norm<B>,
    qkv: Matrix<B>,
    attn_proj: Matrix<B>,
    ln2: Norm<B>,
    fc: Matrix<B>,
    proj: Matrix<B>,
}

fn i64_words(v: impl IntoIterator<Item = i64>) -> Vec<u32> {
    v.into_iter()
        .flat_map(|x| [x as u32, (x >> 32) as u32])
        .collect()
}

/// Rows of `k` int8 as rows of `k.div_ceil(4)` words, zero padded.
fn packed_rows(w: &[i8], rows: usize, k: usize) -> Vec<u32> {
    let k4 = k.div_ceil(4);
    let mut out = vec![0u32; rows * k4];
    for (dst, src) in out.chunks_exact_mut(k4).zip(w.chunks_exact(k)) {
        for (i, &b) in src.iter().enumerate() {
            dst[i / 4] |= (b as u8 as u32) << (8 * (i % 4));
        }
    }
    out
}

/// A matrix packed on the host for [`Matrix`]: weight words column-major (rows transposed
/// in tiles, which keeps both sides of the copy in cache) and the per-row information.
struct Packed {
    cols: Vec<u32>,
    info: Vec<u32>,
    rows: usize,
    k4: usize,
}

impl Packed {
    fn new(lin: &Linear, with_bias: bool) -> Packed {
        let k4 = lin.k.div_ceil(4);
        let rows = packed_rows(&lin.w, lin.rows, lin.k);
        // Whole k-steps of 8 words (zeros past k), and spare words for the last row tile
        // (kernels/lm/matmul.cu reads whole tiles).
        let mut cols = vec![0u32; k4.next_multiple_of(MM_K_WORDS) * lin.rows + MM_SPARE];
        const TILE: usize = 64;
        for j0 in (0..lin.rows).step_by(TILE) {
            for c0 in (0..k4).step_by(TILE) {
                for j in j0..(j0 + TILE).min(lin.rows) {
                    for c in c0..(c0 + TILE).min(k4) {
                        cols[c * lin.rows + j] = rows[j * k4 + c];
                    }
                }
            }
        }
        let mut info = Vec::with_capacity(lin.rows * 4);
        for j in 0..lin.rows {
            let (m16, e16) = lin.m16(j);
            let bias = if with_bias { lin.bias[j] } else { 0 };
            info.extend([m16 as u32, e16 as u32, bias as u32, 0]);
        }
        Packed {
            cols,
            info,
            rows: lin.rows,
            k4,
        }
    }

    fn upload<L: Launcher>(&self, dev: &L) -> Result<Matrix<L::Buf>> {
        Ok(Matrix {
            w: dev.upload(&self.cols)?,
            rowinfo: dev.upload(&self.info)?,
            rows: self.rows,
            k4: self.k4,
        })
    }
}

fn norm<L: Launcher>(dev: &L, ln: &LayerNorm) -> Result<Norm<L::Buf>> {
    Ok(Norm {
        gamma: dev.upload(bytemuck::cast_slice(&ln.gamma))?,
        beta: dev.upload(&i64_words(ln.beta.iter().copied()))?,
    })
}

/// A model's weights and tables on the device (shared by every session of that model).
struct Weights<B> {
    /// The head (the matmul's layout) and the embedding rows (token-major) of the same wte.
    wte: Matrix<B>,
    wte_rows: B,
    /// Per token: the embedding's full row scale (m, e).
    wte_scale: B,
    wpe: B,
    blocks: Vec<BlockBufs<B>>,
    ln_f: Norm<B>,
    gelu: B,
    exp24: B,
    exp40: B,
}

impl<B: Send + Sync> Weights<B> {
    /// Pack every matrix (in parallel: the host's share of a model's upload) and upload.
    fn new<L: Launcher<Buf = B>>(g: &L, model: &Model) -> Result<Weights<B>> {
        use rayon::prelude::*;
        if model.config.vocab > 1 << 16 {
            return Err(Error::Unsupported(format!(
                "the CUDA language model takes vocabularies up to 65536 (this model: {})",
                model.config.vocab
            )));
        }
        let scale: Vec<u32> = (0..model.wte.rows)
            .flat_map(|t| [model.wte.m[t] as u32, model.wte.e[t] as u32])
            .collect();
        let packed: Vec<[Packed; 4]> = model
            .blocks
            .par_iter()
            .map(|b| {
                [
                    Packed::new(&b.qkv, true),
                    Packed::new(&b.attn_proj, true),
                    Packed::new(&b.fc, true),
                    Packed::new(&b.proj, true),
                ]
            })
            .collect();
        let (wte, wte_rows) = rayon::join(
            || Packed::new(&model.wte, false),
            || packed_rows(&model.wte.w, model.wte.rows, model.wte.k),
        );
        let blocks = model
            .blocks
            .iter()
            .zip(&packed)
            .map(|(b, [qkv, attn_proj, fc, proj])| {
                Ok(BlockBufs {
                    ln1: norm(g, &b.ln1)?,
                    qkv: qkv.upload(g)?,
                    attn_proj: attn_proj.upload(g)?,
                    ln2: norm(g, &b.ln2)?,
                    fc: fc.upload(g)?,
                    proj: proj.upload(g)?,
                })
            })
            .collect::<Result<_>>()?;
        let t = &model.tables;
        let exp24: Vec<u32> = t.exp24.iter().map(|&v| v as u32).collect();
        Ok(Weights {
            wte: wte.upload(g)?,
            wte_rows: g.upload(&wte_rows)?,
            wte_scale: g.upload(&scale)?,
            wpe: g.upload(bytemuck::cast_slice(&model.wpe))?,
            blocks,
            ln_f: norm(g, &model.ln_f)?,
            gelu: g.upload(bytemuck::cast_slice(&t.gelu))?,
            exp24: g.upload(&exp24)?,
            exp40: g.upload(&i64_words(t.exp40.iter().map(|&v| v as i64)))?,
        })
    }
}

/// A model resident on the device ([`Weights`]), one KV cache per sequence.
struct CudaSession<'m, L: Launcher> {
    dev: Arc<L>,
    model: &'m Model,
    w: Arc<Weights<L::Buf>>,
    /// Per layer: keys (sequence x n_embd x positions i32, channel-major) and values
    /// (sequence x positions x n_embd i32), as kernels/lm/attention.cu reads them.
    kv: Vec<(L::Buf, L::Buf)>,
    /// Positions each cache holds (the kernels' `ctx`): at most the model's context.
    positions: usize,
    lens: Vec<usize>,
    /// The order `step_prefix_sums_at` sums in, and its copy on the device (uploaded once
    /// for the one order the mixing coder uses).
    order: Option<(Vec<u32>, L::Buf)>,
}

/// What `step_prefix_sums_at` asks of a step: the order on the device, its length, and per
/// query the indices of the sums wanted.
struct SumsAt<'a, B> {
    order: &'a B,
    len: usize,
    wanted: &'a [Vec<u32>],
}

/// What a step hands back: the answers, the traced integers, the tables asked for and the
/// sums at the wanted indices (each in query order).
type Stepped = (Vec<Coded>, Readback, Vec<Vec<u64>>, Vec<Vec<u32>>);
/// [`Stepped`] without the traced integers (a session's `run`).
type Answered = (Vec<Coded>, Vec<Vec<u64>>, Vec<Vec<u32>>);

/// The matmul's geometry (kernels/lm/matmul.cu): rows of a warp's tile, items per block,
/// warps per block, words per k-step, spare words after a weight matrix; and the blocks
/// below which a launch splits k over a block's warps (a decode step's few items).
const MM_TILE_ROWS: usize = 16;
const MM_ITEMS: usize = 64;
const MM_WARPS: usize = 4;
const MM_K_WORDS: usize = 8;
const MM_SPARE: usize = 64;
const MM_SPLIT_BELOW: usize = 512;
/// Queried rows per head launch: bounds the logits and frequency buffers (rows x vocab).
const HEAD_ROWS: usize = 1024;
/// The longest context whose scores an attention block keeps in shared memory (ATT_SPAN in
/// kernels/lm/attention.cu).
const ATT_SPAN: usize = 1024;

impl<'m, L: Launcher> CudaSession<'m, L> {
    fn new(
        dev: Arc<L>,
        model: &'m Model,
        w: Arc<Weights<L::Buf>>,
        sequences: usize,
        positions: usize,
    ) -> Result<CudaSession<'m, L>> {
        let c = &model.config;
        if c.n_ctx as usize > ATT_SPAN {
            return Err(Error::Unsupported(format!(
                "the CUDA language model attends over at most {ATT_SPAN} positions; this \
                 model's context is {}",
                c.n_ctx
            )));
        }
        let positions = positions.clamp(1, c.n_ctx as usize);
        let kv_words = sequences.max(1) * positions * c.n_embd as usize;
        let mut kv = Vec::new();
        for _ in 0..model.blocks.len() {
            kv.push((dev.zeroed(kv_words)?, dev.zeroed(kv_words)?));
        }
        Ok(CudaSession {
            w,
            kv,
            positions,
            lens: vec![0; sequences],
            order: None,
            dev,
            model,
        })
    }

    /// Put `order` on the device unless it is there; false when the kernel cannot sum in it
    /// (a token beyond the vocabulary or twice, or no token left out, so a sum could reach
    /// 2^32): the default's way then reports it as the CPU does.
    fn upload_order(&mut self, order: &[u32]) -> Result<bool> {
        if self.order.as_ref().is_some_and(|(o, _)| o == order) {
            return Ok(true);
        }
        let v = self.model.config.vocab as usize;
        let mut seen = vec![false; v];
        for &id in order {
            match seen.get_mut(id as usize) {
                Some(s) if !*s => *s = true,
                _ => return Ok(false),
            }
        }
        if order.len() >= v {
            return Ok(false);
        }
        // The kernel reads at least one word.
        let buf = self
            .dev
            .upload(if order.is_empty() { &[0] } else { order })?;
        self.order = Some((order.to_vec(), buf));
        Ok(true)
    }

    fn run(
        &mut self,
        items: &[Item],
        trace: Option<&mut Trace>,
        tables: Tables,
        at: Option<SumsAt<'_, L::Buf>>,
    ) -> Result<Answered> {
        let input = step_input(items, &self.lens, &self.model.config)?;
        if let Some(&too_far) = input.next.iter().find(|&&len| len > self.positions) {
            return Err(Error::Invalid(format!(
                "forward: a sequence of {too_far} positions in a session loaded for {} positions",
                self.positions
            )));
        }
        if items.is_empty() {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        let traced = trace.is_some();
        let (coded, rb, table, sums) =
            self.forward(&input.words, &input.queries, traced, tables, at)?;
        self.lens = input.next;
        if let Some(t) = trace {
            t.absorb(
                rb,
                self.model.blocks.len(),
                self.model.config.n_embd as usize,
            );
        }
        Ok((coded, table, sums))
    }

    /// Launch one step; returns the answers, the traced integers (when `traced`), the
    /// frequency tables `tables` asks for and the sums `at` asks for, in query order.
    fn forward(
        &self,
        items: &[u32],
        queries: &[(usize, [u32; 4])],
        traced: bool,
        tables: Tables,
        at: Option<SumsAt<'_, L::Buf>>,
    ) -> Result<Stepped> {
        let g = &*self.dev;
        let m = self.model;
        let cfg = &m.config;
        // (the caches' positions are the kernels' context)
        let (d, ctx, v) = (cfg.n_embd as usize, self.positions, cfg.vocab as usize);
        let heads = cfg.n_head as usize;
        let hd = m.head_dim();
        let n = items.len() / 4;
        let item_buf = g.upload(items)?;
        let h = g.zeroed(n * d)?;
        let y = g.zeroed(n * d * 2)?;
        // The widest quantized row is the MLP's 4d int8: d words; the matmul reads whole
        // tiles of items and 8 words past the last.
        let xq = g.zeroed(n.next_multiple_of(MM_ITEMS) * d + MM_K_WORDS)?;
        let sc = g.zeroed(n * 2)?;
        let qkv = g.zeroed(n * 3 * d)?;
        let o = g.zeroed(n * d * 2)?;
        let a = g.zeroed(n * d)?;
        let f = g.zeroed(n * 4 * d)?;
        let gq = g.zeroed(n * 4 * d * 2)?;
        let dummy = g.zeroed(4)?;

        let launch = |k: LmKernel, grid: usize, p: LmParams, bufs: &[&L::Buf]| {
            let mut all = [&dummy; 8];
            all[..bufs.len()].copy_from_slice(bufs);
            let grid = u32::try_from(grid).map_err(|_| {
                Error::Unsupported(format!("{}: a grid of {grid} blocks", k.symbol()))
            })?;
            g.launch_lm(k, grid, &p, all)
        };
        let per_thread = |len: usize| len.div_ceil(256);
        // LayerNorm of h's rows into y, quantized into (dq, dsc) in the same launch; with
        // `add`, the residual a is added to h first.
        let layer_norm = |src: &L::Buf,
                          add: Option<&L::Buf>,
                          ln: &Norm<L::Buf>,
                          dst: &L::Buf,
                          dq: &L::Buf,
                          dsc: &L::Buf,
                          rows: usize| {
            let p = LmParams {
                n: rows as u32,
                d: d as u32,
                k4: d.div_ceil(4) as u32,
                frac: FLN,
                eps: cfg.eps_q,
                add: add.is_some(),
                clamp: RES_MAX as u32,
                ..Default::default()
            };
            let a = add.unwrap_or(&dummy);
            launch(
                LmKernel::LayerNorm,
                rows,
                p,
                &[src, &ln.gamma, &ln.beta, dst, dq, dsc, a],
            )
        };
        let quantize = |src: &L::Buf, width: usize, frac: i32, dq: &L::Buf, dsc: &L::Buf, rows| {
            let p = LmParams {
                n: rows as u32,
                k: width as u32,
                k4: width.div_ceil(4) as u32,
                frac,
                ..Default::default()
            };
            launch(LmKernel::Quantize, rows, p, &[src, dq, dsc])
        };
        let matmul = |mat: &Matrix<L::Buf>,
                      xq: &L::Buf,
                      sc: &L::Buf,
                      out: &L::Buf,
                      frac: i32,
                      clamp: i64,
                      rows: usize| {
            let item_blocks = rows.div_ceil(MM_ITEMS);
            let whole = mat.rows.div_ceil(MM_TILE_ROWS * MM_WARPS) * item_blocks;
            let split = if whole < MM_SPLIT_BELOW { MM_WARPS } else { 1 };
            let p = LmParams {
                n: rows as u32,
                rows: mat.rows as u32,
                k4: mat.k4 as u32,
                frac,
                clamp: clamp as u32,
                split: split as u32,
                ..Default::default()
            };
            let grid = mat.rows.div_ceil(MM_TILE_ROWS * MM_WARPS / split) * item_blocks;
            launch(
                LmKernel::Matmul,
                grid,
                p,
                &[&mat.w, &mat.rowinfo, xq, sc, out],
            )
        };
        let add_residual = |src: &L::Buf| {
            let p = LmParams {
                n: (n * d) as u32,
                clamp: RES_MAX as u32,
                ..Default::default()
            };
            launch(LmKernel::AddResidual, per_thread(n * d), p, &[src, &h])
        };
        let read_i64s = |buf: &L::Buf, count: usize| -> Result<Vec<i64>> {
            Ok(g.read(buf, count * 2)?
                .chunks_exact(2)
                .map(|w| (w[0] as u64 | (w[1] as u64) << 32) as i64)
                .collect())
        };
        let mut rb = Readback::default();

        let p = LmParams {
            n: n as u32,
            d: d as u32,
            k4: self.w.wte.k4 as u32,
            clamp: RES_MAX as u32,
            ..Default::default()
        };
        launch(
            LmKernel::Embed,
            per_thread(n * d),
            p,
            &[
                &item_buf,
                &self.w.wte_rows,
                &self.w.wte_scale,
                &self.w.wpe,
                &h,
            ],
        )?;
        // The residual add that ends a block is left to the next block's first LayerNorm (one
        // launch fewer), except after the last block or where the trace reads h.
        let mut pending = None;
        let last = self.w.blocks.len().saturating_sub(1);
        for (l, blk) in self.w.blocks.iter().enumerate() {
            let (kc, vc) = &self.kv[l];
            layer_norm(&h, pending.take(), &blk.ln1, &y, &xq, &sc, n)?;
            if traced {
                rb.ln1.push(read_i64s(&y, n * d)?);
            }
            matmul(&blk.qkv, &xq, &sc, &qkv, FQKV, QKV_MAX, n)?;
            let p = LmParams {
                n: n as u32,
                d: d as u32,
                ctx: ctx as u32,
                ..Default::default()
            };
            launch(
                LmKernel::KvStore,
                per_thread(n * d),
                p,
                &[&qkv, &item_buf, kc, vc],
            )?;
            let p = LmParams {
                d: d as u32,
                hd: hd as u32,
                ctx: ctx as u32,
                heads: heads as u32,
                exp_len: m.tables.exp24.len() as u32,
                attn_m: m.tables.attn_m,
                ..Default::default()
            };
            launch(
                LmKernel::Attention,
                heads * n,
                p,
                &[&qkv, &item_buf, &self.w.exp24, kc, vc, &o],
            )?;
            quantize(&o, d, FQKV, &xq, &sc, n)?;
            matmul(&blk.attn_proj, &xq, &sc, &a, FR, RES_MAX, n)?;
            layer_norm(&h, Some(&a), &blk.ln2, &y, &xq, &sc, n)?;
            if traced {
                rb.ln2.push(read_i64s(&y, n * d)?);
            }
            matmul(&blk.fc, &xq, &sc, &f, FGELU, 1 << 15, n)?;
            let p = LmParams {
                n: n as u32,
                k: (4 * d) as u32,
                k4: d as u32,
                frac: FGELU,
                ..Default::default()
            };
            launch(LmKernel::Gelu, n, p, &[&f, &self.w.gelu, &gq, &xq, &sc])?;
            matmul(&blk.proj, &xq, &sc, &a, FR, RES_MAX, n)?;
            if traced || l == last {
                add_residual(&a)?;
            } else {
                pending = Some(&a);
            }
            if traced {
                let words = g.read(&h, n * d)?;
                rb.resid.push(words.iter().map(|&x| x as i32).collect());
            }
        }
        // The head and the tables, for the queried items only, in groups of rows.
        let exp_len = m.tables.exp40.len();
        let mut coded = Vec::with_capacity(queries.len());
        let mut table = Vec::new();
        let mut sums = Vec::new();
        let chunks = queries.len().div_ceil(HEAD_ROWS);
        for (c, chunk) in queries.chunks(HEAD_ROWS).enumerate() {
            let nq = chunk.len();
            let rows: Vec<u32> = chunk.iter().map(|&(i, _)| i as u32).collect();
            let qwords: Vec<u32> = chunk.iter().flat_map(|(_, q)| *q).collect();
            let (rows, qbuf) = (g.upload(&rows)?, g.upload(&qwords)?);
            let hq = g.zeroed(nq * d)?;
            let yq = g.zeroed(nq * d * 2)?;
            let xqq = g.zeroed(nq.next_multiple_of(MM_ITEMS) * self.w.wte.k4 + MM_K_WORDS)?;
            let scq = g.zeroed(nq * 2)?;
            let logits = g.zeroed(nq * v)?;
            let by_gap = g.zeroed(nq * exp_len)?;
            let freqs = g.zeroed(nq * v)?;
            let answers = g.zeroed(nq * 4)?;
            let p = LmParams {
                n: nq as u32,
                d: d as u32,
                ..Default::default()
            };
            launch(LmKernel::Gather, per_thread(nq * d), p, &[&h, &rows, &hq])?;
            layer_norm(&hq, None, &self.w.ln_f, &yq, &xqq, &scq, nq)?;
            matmul(&self.w.wte, &xqq, &scq, &logits, FLOGIT, LOGIT_MAX, nq)?;
            let p = LmParams {
                n: nq as u32,
                rows: v as u32,
                exp_len: exp_len as u32,
                ..Default::default()
            };
            launch(
                LmKernel::Frequencies,
                nq,
                p,
                &[&logits, &self.w.exp40, &qbuf, &by_gap, &freqs, &answers],
            )?;
            if let Some(at) = &at {
                // The wanted indices of this group's rows, one list after the other.
                let lists = &at.wanted[c * HEAD_ROWS..c * HEAD_ROWS + nq];
                let mut starts = Vec::with_capacity(nq + 1);
                let mut flat = Vec::new();
                starts.push(0u32);
                for w in lists {
                    flat.extend_from_slice(w);
                    starts.push(flat.len() as u32);
                }
                let words = flat.len();
                if flat.is_empty() {
                    flat.push(0);
                }
                let (sbuf, ibuf) = (g.upload(&starts)?, g.upload(&flat)?);
                let obuf = g.zeroed(flat.len())?;
                let p = LmParams {
                    n: nq as u32,
                    rows: v as u32,
                    k: at.len as u32,
                    ..Default::default()
                };
                launch(
                    LmKernel::PrefixAt,
                    nq,
                    p,
                    &[&freqs, at.order, &sbuf, &ibuf, &obuf],
                )?;
                let got = g.read(&obuf, words.max(1))?;
                for r in starts.windows(2) {
                    sums.push(got[r[0] as usize..r[1] as usize].to_vec());
                }
            }
            for w in g.read(&answers, nq * 4)?.chunks_exact(4) {
                coded.push(Coded {
                    symbol: w[0],
                    cum: w[1] as u64,
                    freq: w[2] as u64,
                });
            }
            let wanted = match tables {
                Tables::None => 0..0,
                Tables::Last if c + 1 == chunks => nq - 1..nq,
                Tables::Last => 0..0,
                Tables::All => 0..nq,
            };
            if traced || !wanted.is_empty() {
                let f = g.read(&freqs, nq * v)?;
                for r in wanted {
                    table.push(f[r * v..(r + 1) * v].iter().map(|&x| x as u64).collect());
                }
                if traced {
                    let l = g.read(&logits, nq * v)?;
                    rb.logits.extend(l.iter().map(|&x| x as i32));
                    rb.freqs.extend(
                        f.chunks_exact(v)
                            .map(|r| r.iter().map(|&x| x as u64).collect()),
                    );
                }
            }
        }
        Ok((coded, rb, table, sums))
    }
}

impl<L: Launcher> LmSession for CudaSession<'_, L> {
    fn clear(&mut self, seq: usize) -> Result<()> {
        // The cache's old values are overwritten before any position reads them.
        *self
            .lens
            .get_mut(seq)
            .ok_or_else(|| Error::Invalid(format!("no sequence {seq} in this session")))? = 0;
        Ok(())
    }

    fn step(&mut self, items: &[Item]) -> Result<Vec<Coded>> {
        Ok(self.run(items, None, Tables::None, None)?.0)
    }

    fn step_traced(&mut self, items: &[Item], trace: &mut Trace) -> Result<Vec<Coded>> {
        Ok(self.run(items, Some(trace), Tables::None, None)?.0)
    }

    fn step_table(&mut self, items: &[Item]) -> Result<Vec<u64>> {
        // Only the last item's logits are wanted, so only it carries a query.
        let run = query_last(items)?;
        self.run(&run, None, Tables::Last, None)?
            .1
            .pop()
            .ok_or_else(|| Error::Invalid("step_table: no table came back".into()))
    }

    /// One forward pass for the whole batch (the mixing coder's 64 words, or a word of every
    /// block decoded in lockstep), not the default's one pass per query.
    fn step_tables(&mut self, items: &[Item]) -> Result<Vec<Vec<u64>>> {
        Ok(self
            .run(&unmixed_queries(items), None, Tables::All, None)?
            .1)
    }

    /// The sums made on the device (`lm_prefix_at`, after the frequencies) and only the
    /// wanted ones read back: a few hundred words per query instead of its 50,257-entry
    /// table.
    fn step_prefix_sums_at(
        &mut self,
        items: &[Item],
        order: &[u32],
        wanted: &[Vec<u32>],
    ) -> Result<Vec<Vec<u32>>> {
        check_wanted(items, order, wanted)?;
        if !self.upload_order(order)? {
            return Ok(gather_sums(&self.step_prefix_sums(items, order)?, wanted));
        }
        // (taken out for the step, which borrows the session mutably; put back after)
        let (kept, buf) = self.order.take().expect("upload_order set it");
        let at = SumsAt {
            order: &buf,
            len: kept.len(),
            wanted,
        };
        let out = self.run(&unmixed_queries(items), None, Tables::None, Some(at));
        self.order = Some((kept, buf));
        Ok(out?.2)
    }
}
