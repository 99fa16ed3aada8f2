//! The integer GPT-2 on a wgpu adapter (docs/BACKENDS.md, "Language model"): every stage of
//! docs/INTEGER_GPT2.md §4–§5 and the match mix of §10 as WGSL (shaders/lm/), giving the CPU
//! reference's integers. Weights are uploaded once in `load`, each layer's KV cache lives on
//! the device, and per queried position only three integers come back ([`Coded`]): the
//! frequency table is built, mixed and searched where the logits are.

mod kernels;

use std::sync::{Arc, OnceLock};

use super::gpu::Gpu;
use crate::backend::lm::{
    query_last, step_input, unmixed_queries, Coded, Item, LmKernels, LmSession, Readback, Tables,
    Trace,
};
use crate::format::lm::model_file::*;
use crate::{Error, Result};
use kernels::{dispatch, row_grid, Kernels};

/// The language model's kernels on the wgpu device (shares its adapter and queue).
pub struct WgpuLm {
    gpu: Arc<Gpu>,
    packed_dot: bool,
    kernels: OnceLock<std::result::Result<Arc<Kernels>, String>>,
}

impl WgpuLm {
    pub(super) fn new(gpu: Arc<Gpu>) -> WgpuLm {
        WgpuLm {
            gpu,
            packed_dot: kernels::packed_dot_available(),
            kernels: OnceLock::new(),
        }
    }

    /// The same kernels with the matmul's scalar dot product even where `dot4I8Packed`
    /// exists (parity of the two spellings).
    pub fn scalar_dot(mut self) -> WgpuLm {
        self.packed_dot = false;
        self
    }

    /// Built on first use: a delta-only run never compiles them.
    fn kernels(&self) -> Result<Arc<Kernels>> {
        self.kernels
            .get_or_init(|| {
                Kernels::build(&self.gpu, self.packed_dot)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(Error::Unsupported)
    }
}

impl LmKernels for WgpuLm {
    fn describe(&self) -> String {
        format!(
            "{}, {}",
            super::gpu::describe(&self.gpu.info),
            if self.packed_dot {
                "dot4I8Packed"
            } else {
                "scalar int8 dot"
            }
        )
    }

    /// (Caches for the whole context: `positions` is a GPU's memory question.)
    fn load<'m>(
        &self,
        model: &'m Model,
        sequences: usize,
        _positions: usize,
    ) -> Result<Box<dyn LmSession + 'm>> {
        let k = self.kernels()?;
        let gpu = self.gpu.clone();
        let s = gpu.clone().checked("language model upload", || {
            WgpuSession::new(gpu, k, model, sequences)
        })?;
        Ok(Box::new(s))
    }
}

/// An int8 matrix as the matmul reads it: rows of `k4` words (four int8 each, zero padded),
/// and per row (m16, e16, bias, 0).
struct Matrix {
    w: wgpu::Buffer,
    rowinfo: wgpu::Buffer,
    rows: usize,
    k4: usize,
}

struct Norm {
    gamma: wgpu::Buffer,
    beta: wgpu::Buffer,
}

struct BlockBufs {
    ln1: Norm,
    qkv: Matrix,
    attn_proj: Matrix,
    ln2: Norm,
    fc: Matrix,
    proj: Matrix,
}

fn i64_words(v: impl IntoIterator<Item = i64>) -> Vec<u32> {
    v.into_iter()
        .flat_map(|x| [x as u32, (x >> 32) as u32])
        .collect()
}

fn matrix(g: &Gpu, lin: &Linear, with_bias: bool) -> Result<Matrix> {
    let k4 = lin.k.div_ceil(4);
    let mut w = vec![0u8; lin.rows * k4 * 4];
    for (dst, src) in w.chunks_exact_mut(k4 * 4).zip(lin.w.chunks_exact(lin.k)) {
        dst[..lin.k].copy_from_slice(bytemuck::cast_slice(src));
    }
    let mut info = Vec::with_capacity(lin.rows * 4);
    for j in 0..lin.rows {
        let (m16, e16) = lin.m16(j);
        let bias = if with_bias { lin.bias[j] } else { 0 };
        info.extend([m16 as u32, e16 as u32, bias as u32, 0]);
    }
    Ok(Matrix {
        w: g.upload(&w, 0)?,
        rowinfo: g.upload_u32(&info)?,
        rows: lin.rows,
        k4,
    })
}

fn norm(g: &Gpu, ln: &LayerNorm) -> Result<Norm> {
    Ok(Norm {
        gamma: g.upload(bytemuck::cast_slice(&ln.gamma), 0)?,
        beta: g.upload_u32(&i64_words(ln.beta.iter().copied()))?,
    })
}

/// The model resident on the device, one KV cache per sequence.
struct WgpuSession<'m> {
    gpu: Arc<Gpu>,
    k: Arc<Kernels>,
    model: &'m Model,
    wte: Matrix,
    /// Per token: the embedding's full row scale (m, e).
    wte_scale: wgpu::Buffer,
    wpe: wgpu::Buffer,
    blocks: Vec<BlockBufs>,
    ln_f: Norm,
    gelu: wgpu::Buffer,
    exp24: wgpu::Buffer,
    exp40: wgpu::Buffer,
    /// Per layer: keys and values, sequence x n_ctx x n_embd i32.
    kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    lens: Vec<usize>,
}

impl<'m> WgpuSession<'m> {
    fn new(
        gpu: Arc<Gpu>,
        k: Arc<Kernels>,
        model: &'m Model,
        sequences: usize,
    ) -> Result<WgpuSession<'m>> {
        let g = &*gpu;
        let c = &model.config;
        let (d, ctx) = (c.n_embd as usize, c.n_ctx as usize);
        if c.n_embd > 1 << 13 || c.vocab > 1 << 16 {
            return Err(Error::Unsupported(format!(
                "the wgpu language model takes n_embd up to 8192 and vocabularies up to 65536 \
                 (this model: {} and {})",
                c.n_embd, c.vocab
            )));
        }
        let scale: Vec<u32> = (0..model.wte.rows)
            .flat_map(|t| [model.wte.m[t] as u32, model.wte.e[t] as u32])
            .collect();
        let kv_bytes = sequences.max(1) * ctx * d * 4;
        let mut kv = Vec::new();
        for _ in 0..model.blocks.len() {
            kv.push((g.zeroed(kv_bytes)?, g.zeroed(kv_bytes)?));
        }
        let blocks = model
            .blocks
            .iter()
            .map(|b| {
                Ok(BlockBufs {
                    ln1: norm(g, &b.ln1)?,
                    qkv: matrix(g, &b.qkv, true)?,
                    attn_proj: matrix(g, &b.attn_proj, true)?,
                    ln2: norm(g, &b.ln2)?,
                    fc: matrix(g, &b.fc, true)?,
                    proj: matrix(g, &b.proj, true)?,
                })
            })
            .collect::<Result<_>>()?;
        let t = &model.tables;
        let exp24: Vec<u32> = t.exp24.iter().map(|&v| v as u32).collect();
        Ok(WgpuSession {
            wte: matrix(g, &model.wte, false)?,
            wte_scale: g.upload_u32(&scale)?,
            wpe: g.upload(bytemuck::cast_slice(&model.wpe), 0)?,
            blocks,
            ln_f: norm(g, &model.ln_f)?,
            gelu: g.upload(bytemuck::cast_slice(&t.gelu), 0)?,
            exp24: g.upload_u32(&exp24)?,
            exp40: g.upload_u32(&i64_words(t.exp40.iter().map(|&v| v as i64)))?,
            kv,
            lens: vec![0; sequences],
            gpu: gpu.clone(),
            k,
            model,
        })
    }

    fn run(
        &mut self,
        items: &[Item],
        trace: Option<&mut Trace>,
        tables: Tables,
    ) -> Result<(Vec<Coded>, Vec<Vec<u64>>)> {
        let input = step_input(items, &self.lens, &self.model.config)?;
        if items.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let traced = trace.is_some();
        let gpu = self.gpu.clone();
        let (coded, rb, table) = gpu.checked("language model step", || {
            self.forward(&input.words, &input.queries, traced, tables)
        })?;
        self.lens = input.next;
        if let Some(t) = trace {
            t.absorb(
                rb,
                self.model.blocks.len(),
                self.model.config.n_embd as usize,
            );
        }
        Ok((coded, table))
    }

    /// Record and run one step; returns the answers, the traced integers (when `traced`) and
    /// the frequency tables `tables` asks for, in query order.
    fn forward(
        &self,
        items: &[u32],
        queries: &[(usize, [u32; 4])],
        traced: bool,
        tables: Tables,
    ) -> Result<(Vec<Coded>, Readback, Vec<Vec<u64>>)> {
        let g = &*self.gpu;
        let k = &*self.k;
        let m = self.model;
        let cfg = &m.config;
        let (d, ctx, v) = (cfg.n_embd as usize, cfg.n_ctx as usize, cfg.vocab as usize);
        let heads = cfg.n_head as usize;
        let hd = m.head_dim();
        let n = items.len() / 4;
        let nu = n as u32;
        let item_buf = g.upload_u32(items)?;
        let h = g.zeroed(n * d * 4)?;
        let y = g.zeroed(n * d * 8)?;
        let xq = g.zeroed(n * d * 4)?;
        let sc = g.zeroed(n * 8)?;
        let qkv = g.zeroed(n * 3 * d * 4)?;
        let o = g.zeroed(n * d * 8)?;
        let a = g.zeroed(n * d * 4)?;
        let f = g.zeroed(n * 4 * d * 4)?;
        let gq = g.zeroed(n * 4 * d * 8)?;
        let dummy = g.zeroed(16)?;
        // Attention scores: items in groups small enough for one scratch buffer.
        let span = items
            .chunks_exact(4)
            .map(|w| w[1] as usize + 1)
            .max()
            .unwrap_or(1);
        let per_item = heads * span * 8;
        let max_bind = (g.limits.max_storage_buffer_binding_size as usize).min(64 << 20);
        let attn_group = (max_bind / per_item).clamp(1, n);
        let scratch = g.zeroed(attn_group * per_item)?;
        let nl = m.blocks.len();
        let trace_ln: Vec<(wgpu::Buffer, wgpu::Buffer, wgpu::Buffer)> = if traced {
            (0..nl)
                .map(|_| {
                    Ok((
                        g.zeroed(n * d * 8)?,
                        g.zeroed(n * d * 8)?,
                        g.zeroed(n * d * 4)?,
                    ))
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };

        let mut enc = g.encoder();
        let cols = |c: usize, wg: usize| c.div_ceil(wg) as u32;
        dispatch(
            g,
            &mut enc,
            &k.embed,
            "embed",
            &[d as u32, self.wte.k4 as u32, nu, RES_MAX as u32],
            &[&item_buf, &self.wte.w, &self.wte_scale, &self.wpe, &h],
            (cols(d, 256), nu),
        )?;
        let layer_norm = |enc: &mut wgpu::CommandEncoder,
                          src: &wgpu::Buffer,
                          ln: &Norm,
                          dst: &wgpu::Buffer,
                          rows: usize| {
            let eps = cfg.eps_q;
            dispatch(
                g,
                enc,
                &k.norm,
                "layer_norm",
                &[d as u32, rows as u32, eps as u32, (eps >> 32) as u32],
                &[src, &ln.gamma, &ln.beta, dst],
                row_grid(rows),
            )
        };
        let quantize = |enc: &mut wgpu::CommandEncoder,
                        src: &wgpu::Buffer,
                        width: usize,
                        frac: i32,
                        dq: &wgpu::Buffer,
                        dsc: &wgpu::Buffer,
                        rows: usize| {
            dispatch(
                g,
                enc,
                &k.quantize,
                "quantize",
                &[
                    width as u32,
                    width.div_ceil(4) as u32,
                    rows as u32,
                    frac as u32,
                ],
                &[src, dq, dsc],
                row_grid(rows),
            )
        };
        let matmul = |enc: &mut wgpu::CommandEncoder,
                      mat: &Matrix,
                      xq: &wgpu::Buffer,
                      sc: &wgpu::Buffer,
                      out: &wgpu::Buffer,
                      frac: i32,
                      clamp: i64,
                      rows: usize| {
            dispatch(
                g,
                enc,
                &k.matmul,
                "matmul",
                &[
                    mat.rows as u32,
                    mat.k4 as u32,
                    rows as u32,
                    frac as u32,
                    clamp as u32,
                ],
                &[&mat.w, &mat.rowinfo, xq, sc, out],
                (cols(mat.rows, 64), rows.div_ceil(4) as u32),
            )
        };
        let elementwise = |enc: &mut wgpu::CommandEncoder,
                           entry: &str,
                           src: &wgpu::Buffer,
                           h: &wgpu::Buffer,
                           gq: &wgpu::Buffer,
                           len: usize| {
            let groups = len.div_ceil(256);
            let x = groups.min(32768);
            dispatch(
                g,
                enc,
                &k.elementwise,
                entry,
                &[len as u32, RES_MAX as u32],
                &[src, &self.gelu, h, gq],
                (x as u32, groups.div_ceil(x.max(1)) as u32),
            )
        };
        for (l, blk) in self.blocks.iter().enumerate() {
            let (kc, vc) = &self.kv[l];
            layer_norm(&mut enc, &h, &blk.ln1, &y, n)?;
            if traced {
                enc.copy_buffer_to_buffer(&y, 0, &trace_ln[l].0, 0, (n * d * 8) as u64);
            }
            quantize(&mut enc, &y, d, FLN, &xq, &sc, n)?;
            matmul(&mut enc, &blk.qkv, &xq, &sc, &qkv, FQKV, QKV_MAX, n)?;
            let attn_params = |first: usize| {
                [
                    d as u32,
                    hd as u32,
                    ctx as u32,
                    nu,
                    heads as u32,
                    m.tables.exp24.len() as u32,
                    m.tables.attn_m as u32,
                    (m.tables.attn_m >> 32) as u32,
                    first as u32,
                    span as u32,
                ]
            };
            dispatch(
                g,
                &mut enc,
                &k.attention,
                "kv_store",
                &attn_params(0),
                &[&qkv, &item_buf, &self.exp24, kc, vc, &scratch, &o],
                (cols(d, 256), nu),
            )?;
            for first in (0..n).step_by(attn_group) {
                let count = attn_group.min(n - first);
                dispatch(
                    g,
                    &mut enc,
                    &k.attention,
                    "attention",
                    &attn_params(first),
                    &[&qkv, &item_buf, &self.exp24, kc, vc, &scratch, &o],
                    (heads as u32, count as u32),
                )?;
            }
            quantize(&mut enc, &o, d, FQKV, &xq, &sc, n)?;
            matmul(&mut enc, &blk.attn_proj, &xq, &sc, &a, FR, RES_MAX, n)?;
            elementwise(&mut enc, "add_residual", &a, &h, &dummy, n * d)?;
            layer_norm(&mut enc, &h, &blk.ln2, &y, n)?;
            if traced {
                enc.copy_buffer_to_buffer(&y, 0, &trace_ln[l].1, 0, (n * d * 8) as u64);
            }
            quantize(&mut enc, &y, d, FLN, &xq, &sc, n)?;
            matmul(&mut enc, &blk.fc, &xq, &sc, &f, FGELU, 1 << 15, n)?;
            elementwise(&mut enc, "gelu", &f, &dummy, &gq, n * 4 * d)?;
            quantize(&mut enc, &gq, 4 * d, FGELU, &xq, &sc, n)?;
            matmul(&mut enc, &blk.proj, &xq, &sc, &a, FR, RES_MAX, n)?;
            elementwise(&mut enc, "add_residual", &a, &h, &dummy, n * d)?;
            if traced {
                enc.copy_buffer_to_buffer(&h, 0, &trace_ln[l].2, 0, (n * d * 4) as u64);
            }
        }
        // The head and the tables, for the queried items only, in groups of rows small
        // enough for one binding of logits and of frequencies.
        let exp_len = m.tables.exp40.len();
        let rows_per = (max_bind / (v * 4)).max(1);
        let mut pending = Vec::new();
        for chunk in queries.chunks(rows_per) {
            let nq = chunk.len();
            let hq = g.zeroed(nq * d * 4)?;
            for (r, (i, _)) in chunk.iter().enumerate() {
                enc.copy_buffer_to_buffer(
                    &h,
                    (i * d * 4) as u64,
                    &hq,
                    (r * d * 4) as u64,
                    (d * 4) as u64,
                );
            }
            let qwords: Vec<u32> = chunk.iter().flat_map(|(_, q)| *q).collect();
            let qbuf = g.upload_u32(&qwords)?;
            let yq = g.zeroed(nq * d * 8)?;
            let xqq = g.zeroed(nq * self.wte.k4 * 4)?;
            let scq = g.zeroed(nq * 8)?;
            let logits = g.zeroed(nq * v * 4)?;
            let by_gap = g.zeroed(nq * exp_len * 4)?;
            let freqs = g.zeroed(nq * v * 4)?;
            let coded = g.zeroed(nq * 16)?;
            layer_norm(&mut enc, &hq, &self.ln_f, &yq, nq)?;
            quantize(&mut enc, &yq, d, FLN, &xqq, &scq, nq)?;
            matmul(
                &mut enc, &self.wte, &xqq, &scq, &logits, FLOGIT, LOGIT_MAX, nq,
            )?;
            dispatch(
                g,
                &mut enc,
                &k.freq,
                "frequencies",
                &[v as u32, exp_len as u32, nq as u32],
                &[&logits, &self.exp40, &qbuf, &by_gap, &freqs, &coded],
                row_grid(nq),
            )?;
            pending.push((nq, coded, logits, freqs));
        }
        // The last query's whole table, for step_table: copied to a buffer of its own.
        let table_row = match (tables, pending.last()) {
            (Tables::Last, Some((nq, _, _, freqs))) => {
                let row = g.zeroed(v * 4)?;
                enc.copy_buffer_to_buffer(
                    freqs,
                    ((nq - 1) * v * 4) as u64,
                    &row,
                    0,
                    (v * 4) as u64,
                );
                Some(row)
            }
            _ => None,
        };
        // One submission, then the readbacks: answers always, the rest when asked.
        let mut reads: Vec<(&wgpu::Buffer, u64)> = Vec::new();
        let read_freqs = traced || tables == Tables::All;
        for (nq, coded, logits, freqs) in &pending {
            reads.push((coded, (nq * 16) as u64));
            if traced {
                reads.push((logits, (nq * v * 4) as u64));
            }
            if read_freqs {
                reads.push((freqs, (nq * v * 4) as u64));
            }
        }
        if let Some(row) = &table_row {
            reads.push((row, (v * 4) as u64));
        }
        for (a, b, c) in &trace_ln {
            reads.push((a, (n * d * 8) as u64));
            reads.push((b, (n * d * 8) as u64));
            reads.push((c, (n * d * 4) as u64));
        }
        let data = g.finish_and_read(enc, &reads)?;
        let mut it = data.into_iter();
        let mut coded = Vec::with_capacity(queries.len());
        let mut rb = Readback::default();
        let mut table = Vec::new();
        for (nq, _, _, _) in &pending {
            let words = super::u32s(&it.next().unwrap());
            for w in words.chunks_exact(4).take(*nq) {
                coded.push(Coded {
                    symbol: w[0],
                    cum: w[1] as u64,
                    freq: w[2] as u64,
                });
            }
            if traced {
                let l = super::u32s(&it.next().unwrap());
                rb.logits.extend(l.iter().map(|&x| x as i32));
            }
            if read_freqs {
                let f = super::u32s(&it.next().unwrap());
                let rows = f
                    .chunks_exact(v)
                    .map(|r| r.iter().map(|&x| x as u64).collect());
                if traced {
                    rb.freqs.extend(rows.clone());
                }
                if tables == Tables::All {
                    table.extend(rows);
                }
            }
        }
        if table_row.is_some() {
            let words = super::u32s(&it.next().unwrap());
            table.push(words.iter().map(|&x| x as u64).collect());
        }
        for _ in 0..trace_ln.len() {
            rb.ln1.push(i64s(&it.next().unwrap()));
            rb.ln2.push(i64s(&it.next().unwrap()));
            rb.resid.push(
                super::u32s(&it.next().unwrap())
                    .iter()
                    .map(|&x| x as i32)
                    .collect(),
            );
        }
        Ok((coded, rb, table))
    }
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

impl LmSession for WgpuSession<'_> {
    fn clear(&mut self, seq: usize) -> Result<()> {
        // The cache's old values are overwritten before any position reads them.
        *self
            .lens
            .get_mut(seq)
            .ok_or_else(|| Error::Invalid(format!("no sequence {seq} in this session")))? = 0;
        Ok(())
    }

    fn step(&mut self, items: &[Item]) -> Result<Vec<Coded>> {
        Ok(self.run(items, None, Tables::None)?.0)
    }

    fn step_traced(&mut self, items: &[Item], trace: &mut Trace) -> Result<Vec<Coded>> {
        Ok(self.run(items, Some(trace), Tables::None)?.0)
    }

    fn step_table(&mut self, items: &[Item]) -> Result<Vec<u64>> {
        // Only the last item's logits are wanted, so only it carries a query.
        let run = query_last(items)?;
        self.run(&run, None, Tables::Last)?
            .1
            .pop()
            .ok_or_else(|| Error::Invalid("step_table: no table came back".into()))
    }

    /// One step for the whole batch and every query's table read back, instead of the
    /// default's one step per query.
    fn step_tables(&mut self, items: &[Item]) -> Result<Vec<Vec<u64>>> {
        Ok(self.run(&unmixed_queries(items), None, Tables::All)?.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::lm::{Find, Query};

    /// `dot4I8Packed` and the scalar `dot4` give the same integers (the trace of the shipped
    /// model on a batch, both against the CPU's portable reference). Skips without an adapter.
    #[test]
    fn packed_and_scalar_dots_agree_with_the_cpu() {
        let backend = match super::super::WgpuBackend::new(false) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("SKIP: no wgpu adapter: {e}");
                return;
            }
        };
        let model = Model::from_bytes(include_bytes!("../../../../models/tinygpt2.lsm")).unwrap();
        let items: Vec<Item> = (0..12u32)
            .map(|i| Item {
                seq: (i % 2) as usize,
                token: 50 + 97 * i,
                query: Some(Query {
                    find: Find::Symbol(7 * i),
                    mix: None,
                }),
            })
            .collect();
        let run = |k: &dyn LmKernels| {
            let mut s = k.load(&model, 2, model.config.n_ctx as usize).unwrap();
            let mut t = Trace::default();
            let a = s.step_traced(&items, &mut t).unwrap();
            (t, a)
        };
        let cpu = crate::backend::cpu::lm::CpuLm::new(crate::backend::cpu::Isa::Portable).unwrap();
        let want = run(&cpu);
        assert_eq!(run(&backend.lm()), want, "default dot");
        assert_eq!(run(&backend.lm().scalar_dot()), want, "scalar dot");
    }
}
