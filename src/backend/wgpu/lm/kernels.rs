//! The LM's compute modules (shaders/lm/*.wgsl, each behind shaders/lm/wide.wgsl) and the
//! one way they are dispatched: a parameter block, the buffers in binding order, a grid.

use super::super::gpu::{compile, Gpu, Module, Slot};
use crate::{Error, Result};

const WIDE: &str = include_str!("../../../../shaders/lm/wide.wgsl");
const EMBED: &str = include_str!("../../../../shaders/lm/embed.wgsl");
const NORM: &str = include_str!("../../../../shaders/lm/norm.wgsl");
const QUANTIZE: &str = include_str!("../../../../shaders/lm/quantize.wgsl");
const MATMUL: &str = include_str!("../../../../shaders/lm/matmul.wgsl");
const ATTENTION: &str = include_str!("../../../../shaders/lm/attention.wgsl");
const ELEMENTWISE: &str = include_str!("../../../../shaders/lm/elementwise.wgsl");
const FREQ: &str = include_str!("../../../../shaders/lm/freq.wgsl");

/// `dot4` where the adapter offers WGSL's packed 4x8 dot product (naga lowers it to the
/// hardware instruction where the device has one).
const DOT_PACKED: &str = "fn dot4(a: u32, b: u32) -> i32 { return dot4I8Packed(a, b); }\n";
/// `dot4` spelled out: the same i32 on every adapter.
const DOT_SCALAR: &str = "fn dot4(a: u32, b: u32) -> i32 {
    var s = 0;
    for (var i = 0u; i < 32u; i = i + 8u) {
        s = s + (bitcast<i32>(a << (24u - i)) >> 24u) * (bitcast<i32>(b << (24u - i)) >> 24u);
    }
    return s;
}\n";

pub struct Kernels {
    pub embed: Module,
    pub norm: Module,
    pub quantize: Module,
    pub matmul: Module,
    pub attention: Module,
    pub elementwise: Module,
    pub freq: Module,
}

/// Whether this build's WGSL front end offers `dot4I8Packed` (wgpu reports it per instance).
pub fn packed_dot_available() -> bool {
    let instance = wgpu::Instance::new(&wgpu::InstanceDescriptor {
        backends: wgpu::Backends::empty(),
        ..Default::default()
    });
    instance
        .wgsl_language_features()
        .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct)
}

impl Kernels {
    pub fn build(gpu: &Gpu, packed_dot: bool) -> Result<Kernels> {
        use Slot::*;
        let device = &gpu.device;
        device.push_error_scope(wgpu::ErrorFilter::Validation);
        let m = |name: &str, body: &str, slots: &[Slot], entries: &[&'static str]| {
            compile(device, name, format!("{WIDE}\n{body}"), slots, entries)
        };
        let dot = if packed_dot { DOT_PACKED } else { DOT_SCALAR };
        let k = Kernels {
            embed: m(
                "lm embed",
                EMBED,
                &[Read, Read, Read, Read, ReadWrite],
                &["embed"],
            ),
            norm: m(
                "lm layer_norm",
                NORM,
                &[Read, Read, Read, ReadWrite],
                &["layer_norm"],
            ),
            quantize: m(
                "lm quantize",
                QUANTIZE,
                &[Read, ReadWrite, ReadWrite],
                &["quantize"],
            ),
            matmul: m(
                "lm matmul",
                &format!("{dot}{MATMUL}"),
                &[Read, Read, Read, Read, ReadWrite],
                &["matmul"],
            ),
            attention: m(
                "lm attention",
                ATTENTION,
                &[Read, Read, Read, ReadWrite, ReadWrite, ReadWrite, ReadWrite],
                &["kv_store", "attention"],
            ),
            elementwise: m(
                "lm elementwise",
                ELEMENTWISE,
                &[Read, Read, ReadWrite, ReadWrite],
                &["add_residual", "gelu"],
            ),
            freq: m(
                "lm frequencies",
                FREQ,
                &[Read, Read, Read, ReadWrite, ReadWrite, ReadWrite],
                &["frequencies"],
            ),
        };
        if let Some(e) = pollster::block_on(device.pop_error_scope()) {
            return Err(Error::Unsupported(format!(
                "wgpu could not build the language-model shaders on {}: {e}",
                gpu.info.name
            )));
        }
        Ok(k)
    }
}

/// Record one dispatch: `params` (up to 32 words, the shader's `Params` in order), the
/// buffers in binding order, `groups` workgroups in x and y.
pub fn dispatch(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    m: &Module,
    entry: &str,
    params: &[u32],
    buffers: &[&wgpu::Buffer],
    (x, y): (u32, u32),
) -> Result<()> {
    if x == 0 || y == 0 {
        return Ok(());
    }
    let max = gpu.limits.max_compute_workgroups_per_dimension;
    if x > max || y > max {
        return Err(Error::Unsupported(format!(
            "{entry}: a {x} x {y} grid exceeds {}'s {max} workgroups per dimension",
            gpu.info.name
        )));
    }
    let mut words = [0u32; 32];
    words[..params.len()].copy_from_slice(params);
    let p = gpu.params(&words);
    let bind = gpu.bind(m, &p, buffers);
    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(entry),
        timestamp_writes: None,
    });
    pass.set_pipeline(m.pipeline(entry));
    pass.set_bind_group(0, &bind, &[]);
    pass.dispatch_workgroups(x, y, 1);
    Ok(())
}

/// One workgroup per row, rows spread over y past 32768 (the shaders read
/// `wid.x + wid.y * 32768`).
pub fn row_grid(rows: usize) -> (u32, u32) {
    let x = rows.min(32768) as u32;
    (x, rows.div_ceil(32768) as u32)
}
