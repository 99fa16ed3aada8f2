//! The LM's CUDA kernels (kernels/lm/*.cu behind kernels/lm/lm.cuh): their names, modules and
//! block sizes, and the parameter block they all take.

const LM_CUH: &str = include_str!("../../../../kernels/lm/lm.cuh");
const EMBED_CU: &str = include_str!("../../../../kernels/lm/embed.cu");
const NORM_CU: &str = include_str!("../../../../kernels/lm/norm.cu");
const QUANTIZE_CU: &str = include_str!("../../../../kernels/lm/quantize.cu");
const MATMUL_CU: &str = include_str!("../../../../kernels/lm/matmul.cu");
const ATTENTION_CU: &str = include_str!("../../../../kernels/lm/attention.cu");
const ELEMENTWISE_CU: &str = include_str!("../../../../kernels/lm/elementwise.cu");
const FREQ_CU: &str = include_str!("../../../../kernels/lm/freq.cu");

/// The kernels, in the order of the emulation's table (LS_LM_KERNELS in
/// kernels/host/emulate.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LmKernel {
    Embed,
    LayerNorm,
    Quantize,
    Matmul,
    KvStore,
    Attention,
    AddResidual,
    Gelu,
    Gather,
    Frequencies,
    PrefixAt,
}

impl LmKernel {
    pub const ALL: [LmKernel; 11] = [
        LmKernel::Embed,
        LmKernel::LayerNorm,
        LmKernel::Quantize,
        LmKernel::Matmul,
        LmKernel::KvStore,
        LmKernel::Attention,
        LmKernel::AddResidual,
        LmKernel::Gelu,
        LmKernel::Gather,
        LmKernel::Frequencies,
        LmKernel::PrefixAt,
    ];

    /// The `extern "C"` name in kernels/lm/*.cu.
    pub fn symbol(self) -> &'static str {
        match self {
            LmKernel::Embed => "lm_embed",
            LmKernel::LayerNorm => "lm_layer_norm",
            LmKernel::Quantize => "lm_quantize",
            LmKernel::Matmul => "lm_matmul",
            LmKernel::KvStore => "lm_kv_store",
            LmKernel::Attention => "lm_attention",
            LmKernel::AddResidual => "lm_add_residual",
            LmKernel::Gelu => "lm_gelu",
            LmKernel::Gather => "lm_gather",
            LmKernel::Frequencies => "lm_frequencies",
            LmKernel::PrefixAt => "lm_prefix_at",
        }
    }

    /// The source file (module) that defines it.
    pub fn module(self) -> &'static str {
        match self {
            LmKernel::Embed => "lm/embed.cu",
            LmKernel::LayerNorm => "lm/norm.cu",
            LmKernel::Quantize => "lm/quantize.cu",
            LmKernel::Matmul => "lm/matmul.cu",
            LmKernel::KvStore | LmKernel::Attention => "lm/attention.cu",
            LmKernel::AddResidual | LmKernel::Gelu | LmKernel::Gather => "lm/elementwise.cu",
            LmKernel::Frequencies | LmKernel::PrefixAt => "lm/freq.cu",
        }
    }

    /// Threads per block: the row kernels' reductions are written for these sizes
    /// (NORM_THREADS, QUANT_THREADS, FREQ_THREADS, ATT_THREADS, MM_WARPS in the sources).
    pub fn block(self) -> u32 {
        match self {
            LmKernel::Matmul => 128,
            LmKernel::Frequencies | LmKernel::PrefixAt => 1024,
            _ => 256,
        }
    }
}

/// Every LM module as NVRTC compiles it: `(file name, full source, kernels it defines)`.
pub fn kernel_sources() -> Vec<(&'static str, String, Vec<&'static str>)> {
    [
        ("lm/embed.cu", EMBED_CU),
        ("lm/norm.cu", NORM_CU),
        ("lm/quantize.cu", QUANTIZE_CU),
        ("lm/matmul.cu", MATMUL_CU),
        ("lm/attention.cu", ATTENTION_CU),
        ("lm/elementwise.cu", ELEMENTWISE_CU),
        ("lm/freq.cu", FREQ_CU),
    ]
    .into_iter()
    .map(|(file, body)| {
        let kernels = LmKernel::ALL
            .iter()
            .filter(|k| k.module() == file)
            .map(|k| k.symbol())
            .collect();
        (file, format!("{LM_CUH}\n{body}"), kernels)
    })
    .collect()
}

/// The parameter block (LmParams in kernels/lm/lm.cuh); each kernel reads the fields its
/// comment there names, the rest stay 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct LmParams {
    pub n: u32,
    pub d: u32,
    pub k: u32,
    pub k4: u32,
    pub rows: u32,
    pub frac: i32,
    pub clamp: u32,
    pub hd: u32,
    pub ctx: u32,
    pub heads: u32,
    pub exp_len: u32,
    pub eps: i64,
    pub attn_m: i64,
    pub split: u32,
    pub add: bool,
}

impl LmParams {
    pub fn words(&self) -> [u32; 32] {
        let mut w = [0u32; 32];
        w[..17].copy_from_slice(&[
            self.n,
            self.d,
            self.k,
            self.k4,
            self.rows,
            self.frac as u32,
            self.clamp,
            self.hd,
            self.ctx,
            self.heads,
            self.exp_len,
            self.eps as u32,
            (self.eps >> 32) as u32,
            self.attn_m as u32,
            (self.attn_m >> 32) as u32,
            self.split,
            self.add as u32,
        ]);
        w
    }
}
