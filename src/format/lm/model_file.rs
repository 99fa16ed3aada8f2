//! The integer model in memory and its file format (`.lsm`, docs/INTEGER_GPT2.md §2).

use super::fixed;
use crate::{Error, Result};

pub const MAGIC: &[u8; 8] = b"LSTPGPT2";
pub const VERSION: u32 = 1;
/// Residual stream fraction bits.
pub const FR: i32 = 12;
/// q, k, v and attention output fraction bits.
pub const FQKV: i32 = 10;
/// GELU input/output fraction bits.
pub const FGELU: i32 = 10;
/// LayerNorm gamma fraction bits.
pub const FGAMMA: i32 = 12;
/// LayerNorm normalized value fraction bits.
pub const FZ: i32 = 14;
/// LayerNorm output (and beta) fraction bits.
pub const FLN: i32 = FZ + FGAMMA;
/// Extra bits inside the LayerNorm square root.
pub const LN_G: i32 = 8;
/// Logit fraction bits (the exp tables step in 1/256).
pub const FLOGIT: i32 = 8;
/// Residual clamp.
pub const RES_MAX: i64 = 1 << 26;
/// q/k/v clamp.
pub const QKV_MAX: i64 = 1 << 20;
/// Logit clamp.
pub const LOGIT_MAX: i64 = 1 << 24;
/// Flag bit: per-channel outlier equalization was applied at conversion.
pub const FLAG_EQUALIZED: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_head: u32,
    pub n_ctx: u32,
    pub vocab: u32,
    pub flags: u32,
    /// round_half_even(eps * 2^(2*FR + 2*LN_G))
    pub eps_q: i64,
}

/// An int8 matrix with per-row scales `m * 2^-e` and an i32 bias in the output format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    pub rows: usize,
    pub k: usize,
    pub w: Vec<i8>,
    pub m: Vec<i64>,
    pub e: Vec<i32>,
    pub bias: Vec<i32>,
    /// Sum of each row's weights (derived at load, not stored): the VNNI kernel's offset.
    pub row_sum: Vec<i32>,
}

impl Linear {
    /// The 16-bit row multiplier the rescale uses: `m16 = m >> 15` ∈ [2^15, 2^16), scale
    /// `m16 * 2^-(e - 15)` (docs §4).
    #[inline(always)]
    pub fn m16(&self, j: usize) -> (i64, i32) {
        (self.m[j] >> 15, self.e[j] - 15)
    }

    pub fn row_sums(w: &[i8], k: usize) -> Vec<i32> {
        w.chunks_exact(k.max(1))
            .map(|r| r.iter().map(|&v| v as i32).sum())
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerNorm {
    /// Q12
    pub gamma: Vec<i32>,
    /// Q26, |beta| <= 2^40
    pub beta: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub ln1: LayerNorm,
    pub qkv: Linear,
    pub attn_proj: Linear,
    pub ln2: LayerNorm,
    pub fc: Linear,
    pub proj: Linear,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    pub gelu: Vec<i32>,
    pub exp24: Vec<u64>,
    pub exp40: Vec<u64>,
    /// round(2^40 / sqrt(head_dim))
    pub attn_m: i64,
}

impl Tables {
    pub fn compute(head_dim: u32) -> Tables {
        Tables {
            gelu: fixed::gelu_table(),
            exp24: fixed::exp_table(24),
            exp40: fixed::exp_table(40),
            attn_m: fixed::inv_sqrt_q40(head_dim) as i64,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub config: Config,
    /// Token embedding and tied output head (vocab rows, n_embd columns, no bias).
    pub wte: Linear,
    /// Position embedding, Q12, n_ctx x n_embd.
    pub wpe: Vec<i32>,
    pub blocks: Vec<Block>,
    pub ln_f: LayerNorm,
    pub tables: Tables,
    /// blake3 of the file bytes before the hash: the model's name.
    pub hash: [u8; 32],
}

impl Model {
    pub fn head_dim(&self) -> usize {
        (self.config.n_embd / self.config.n_head) as usize
    }

    pub fn hash_hex(&self) -> String {
        hex(&self.hash)
    }

    /// Serialize; returns the file bytes and sets `self.hash`.
    pub fn to_bytes(&mut self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.0.extend_from_slice(MAGIC);
        w.u32(VERSION);
        let c = &self.config;
        for v in [c.n_layer, c.n_embd, c.n_head, c.n_ctx, c.vocab, c.flags] {
            w.u32(v);
        }
        w.i64(c.eps_q);
        w.linear(&self.wte);
        w.i32s(&self.wpe);
        for b in &self.blocks {
            w.ln(&b.ln1);
            w.linear(&b.qkv);
            w.linear(&b.attn_proj);
            w.ln(&b.ln2);
            w.linear(&b.fc);
            w.linear(&b.proj);
        }
        w.ln(&self.ln_f);
        w.i32s(&self.tables.gelu);
        w.u64s(&self.tables.exp24);
        w.u64s(&self.tables.exp40);
        w.i64(self.tables.attn_m);
        let hash = blake3::hash(&w.0);
        self.hash = *hash.as_bytes();
        w.0.extend_from_slice(hash.as_bytes());
        w.0
    }

    /// Parse and validate a model file. Every length and range is checked; the tables must equal
    /// the ones the specification defines.
    pub fn from_bytes(data: &[u8]) -> Result<Model> {
        const WHAT: &str = "model file";
        if data.len() < 8 + 4 + 32 || &data[..8] != MAGIC {
            return Err(Error::format(
                WHAT,
                "not a lockstep integer GPT-2 model (bad magic)",
            ));
        }
        let (body, stored) = data.split_at(data.len() - 32);
        let computed = blake3::hash(body);
        if computed.as_bytes() != stored {
            return Err(Error::hash_mismatch(
                "model file content hash (BLAKE3)",
                stored,
                computed.as_bytes(),
            ));
        }
        let mut r = Reader { d: body, p: 8 };
        let version = r.u32()?;
        if version != VERSION {
            return Err(Error::Unsupported(format!("model file version {version}")));
        }
        let mut v = [0u32; 6];
        for x in v.iter_mut() {
            *x = r.u32()?;
        }
        let config = Config {
            n_layer: v[0],
            n_embd: v[1],
            n_head: v[2],
            n_ctx: v[3],
            vocab: v[4],
            flags: v[5],
            eps_q: r.i64()?,
        };
        validate_config(&config)?;
        let (d, vocab, ctx) = (
            config.n_embd as usize,
            config.vocab as usize,
            config.n_ctx as usize,
        );
        let wte = r.linear(vocab, d)?;
        let wpe = r.i32s(ctx * d)?;
        let mut blocks = Vec::new();
        for _ in 0..config.n_layer {
            blocks.push(Block {
                ln1: r.ln(d)?,
                qkv: r.linear(3 * d, d)?,
                attn_proj: r.linear(d, d)?,
                ln2: r.ln(d)?,
                fc: r.linear(4 * d, d)?,
                proj: r.linear(d, 4 * d)?,
            });
        }
        let ln_f = r.ln(d)?;
        let gelu = r.i32s(65536)?;
        let n = r.u32()? as usize;
        let exp24 = r.u64s(n)?;
        let n = r.u32()? as usize;
        let exp40 = r.u64s(n)?;
        let attn_m = r.i64()?;
        if r.p != body.len() {
            return Err(Error::format(WHAT, "trailing bytes after the tables"));
        }
        let tables = Tables {
            gelu,
            exp24,
            exp40,
            attn_m,
        };
        if tables != Tables::compute(config.n_embd / config.n_head) {
            return Err(Error::format(
                WHAT,
                "GELU/exp tables differ from the specification",
            ));
        }
        let mut hash = [0u8; 32];
        hash.copy_from_slice(stored);
        Ok(Model {
            config,
            wte,
            wpe,
            blocks,
            ln_f,
            tables,
            hash,
        })
    }
}

pub fn validate_config(c: &Config) -> Result<()> {
    let bad = |s: &str| Err(Error::format("model config", s.to_string()));
    if c.n_layer == 0 || c.n_layer > 256 {
        return bad("n_layer out of range 1..=256");
    }
    if c.n_embd == 0 || c.n_embd > 8192 || c.n_head == 0 || !c.n_embd.is_multiple_of(c.n_head) {
        return bad("n_embd must be in 1..=8192 and divisible by n_head");
    }
    if c.n_embd / c.n_head > 1024 {
        return bad("head dim above 1024");
    }
    if c.n_ctx < 2 || c.n_ctx > 8192 {
        return bad("n_ctx out of range 2..=8192");
    }
    if c.vocab < 2 || c.vocab > 65536 {
        return bad("vocab out of range 2..=65536");
    }
    if c.eps_q < 0 || c.eps_q > 1 << 40 {
        return bad("layer norm eps out of range");
    }
    Ok(())
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32s(&mut self, v: &[i32]) {
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    fn u64s(&mut self, v: &[u64]) {
        self.u32(v.len() as u32);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    fn ln(&mut self, l: &LayerNorm) {
        self.i32s(&l.gamma);
        for &b in &l.beta {
            self.i64(b);
        }
    }
    fn linear(&mut self, l: &Linear) {
        self.0.extend(l.w.iter().map(|&x| x as u8));
        for (&m, &e) in l.m.iter().zip(&l.e) {
            self.u32(m as u32);
            self.0.extend_from_slice(&(e as i16).to_le_bytes());
        }
        self.i32s(&l.bias);
    }
}

struct Reader<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .p
            .checked_add(n)
            .filter(|&e| e <= self.d.len())
            .ok_or_else(|| Error::format("model file", "truncated"))?;
        let s = &self.d[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn i32s(&mut self, n: usize) -> Result<Vec<i32>> {
        let b = self.take(
            n.checked_mul(4)
                .ok_or_else(|| Error::format("model file", "size"))?,
        )?;
        Ok(b.chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }
    fn u64s(&mut self, n: usize) -> Result<Vec<u64>> {
        let b = self.take(
            n.checked_mul(8)
                .ok_or_else(|| Error::format("model file", "size"))?,
        )?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect())
    }
    fn ln(&mut self, d: usize) -> Result<LayerNorm> {
        let gamma = self.i32s(d)?;
        let beta = (0..d).map(|_| self.i64()).collect::<Result<Vec<i64>>>()?;
        if gamma.iter().any(|&v| v.unsigned_abs() > 1 << 30)
            || beta.iter().any(|&v| v.unsigned_abs() > 1 << 40)
        {
            return Err(Error::format("model file", "layer norm value out of range"));
        }
        Ok(LayerNorm { gamma, beta })
    }
    fn linear(&mut self, rows: usize, k: usize) -> Result<Linear> {
        let w: Vec<i8> = self.take(rows * k)?.iter().map(|&b| b as i8).collect();
        if w.contains(&i8::MIN) {
            return Err(Error::format(
                "model file",
                "int8 weight -128 (range is ±127)",
            ));
        }
        let mut m = Vec::with_capacity(rows);
        let mut e = Vec::with_capacity(rows);
        for _ in 0..rows {
            let mv = self.u32()? as i64;
            let ev = i16::from_le_bytes(self.take(2)?.try_into().unwrap()) as i32;
            if mv != 0 && !(1 << 30..1 << 31).contains(&mv) {
                return Err(Error::format(
                    "model file",
                    "row scale mantissa out of range",
                ));
            }
            m.push(mv);
            e.push(ev);
        }
        let bias = self.i32s(rows)?;
        Ok(Linear {
            rows,
            k,
            row_sum: Linear::row_sums(&w, k),
            w,
            m,
            e,
            bias,
        })
    }
}
