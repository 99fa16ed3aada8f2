//! The device, its pipelines with explicit bind group layouts, and the one readback helper.

use std::borrow::Cow;

use wgpu::util::DeviceExt;

use crate::format::chunk::{CHUNK_ELEMS, LANES};
use crate::{Error, Result};

const PRELUDE: &str = include_str!("../../../shaders/prelude.wgsl");
const SCAN: &str = include_str!("../../../shaders/scan.wgsl");
const RESIDUAL: &str = include_str!("../../../shaders/residual.wgsl");
const ENCODE: &str = include_str!("../../../shaders/encode.wgsl");
const DECODE: &str = include_str!("../../../shaders/decode.wgsl");

/// Binding kinds, in binding order, of one module's bind group (binding 0 is the uniform
/// parameter block).
#[derive(Clone, Copy)]
pub enum Slot {
    Read,
    ReadWrite,
}

pub struct Module {
    pub layout: wgpu::BindGroupLayout,
    pipelines: Vec<(&'static str, wgpu::ComputePipeline)>,
}

impl Module {
    pub fn pipeline(&self, entry: &str) -> &wgpu::ComputePipeline {
        &self.pipelines.iter().find(|(e, _)| *e == entry).unwrap().1
    }
}

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub residual: Module,
    pub encode: Module,
    pub decode: Module,
    /// One operation at a time: error scopes are per device, and the device is the parallel
    /// part anyway.
    lock: std::sync::Mutex<()>,
}

/// Every adapter wgpu finds, honoring `WGPU_BACKEND` (e.g. `gl`).
pub fn enumerate() -> Vec<wgpu::Adapter> {
    let instance = wgpu::Instance::new(&wgpu::InstanceDescriptor::from_env_or_default());
    instance.enumerate_adapters(wgpu::Backends::all())
}

pub fn describe(info: &wgpu::AdapterInfo) -> String {
    format!(
        "{} ({:?}, {:?}{}{})",
        info.name,
        info.device_type,
        info.backend,
        if info.driver.is_empty() { "" } else { ", " },
        info.driver
    )
}

impl Gpu {
    pub fn new(adapter: wgpu::Adapter) -> Result<Gpu> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lockstep"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Unsupported(format!("wgpu device on {}: {e}", info.name)))?;
        // wgpu's default reaction to an error outside an error scope is a panic; report it
        // instead (every operation below also runs inside scopes, see `checked`).
        device.on_uncaptured_error(Box::new(|e| eprintln!("wgpu error: {e}")));
        device.push_error_scope(wgpu::ErrorFilter::Validation);
        use Slot::*;
        let residual = module(
            &device,
            "residual",
            RESIDUAL,
            &[Read, Read, ReadWrite, ReadWrite, ReadWrite],
            &["residuals", "symbols", "histogram", "er_range"],
        );
        let encode = module(
            &device,
            "encode",
            ENCODE,
            &[Read, Read, Read, Read, ReadWrite, ReadWrite],
            &["enc_lanes", "enc_scan", "enc_tail"],
        );
        let decode = module(
            &device,
            "decode",
            DECODE,
            &[Read, Read, Read, ReadWrite, ReadWrite, ReadWrite],
            &["dec_lanes", "dec_tail"],
        );
        if let Some(e) = pollster::block_on(device.pop_error_scope()) {
            return Err(Error::Unsupported(format!(
                "wgpu could not build the shaders on {}: {e}",
                info.name
            )));
        }
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            residual,
            encode,
            decode,
            lock: std::sync::Mutex::new(()),
        })
    }

    /// Run `f` with wgpu's validation and out-of-memory errors turned into an `Error`.
    pub fn checked<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let validation = pollster::block_on(self.device.pop_error_scope());
        let oom = pollster::block_on(self.device.pop_error_scope());
        match validation.or(oom) {
            Some(e) => Err(Error::Invalid(format!(
                "wgpu {what} on {}: {e}",
                self.info.name
            ))),
            None => out,
        }
    }

    /// A storage buffer holding `bytes` (padded to whole u32 words plus `pad_words` zeros).
    pub fn upload(&self, bytes: &[u8], pad_words: usize) -> Result<wgpu::Buffer> {
        let len = bytes.len().div_ceil(4) * 4 + pad_words * 4;
        self.check_size(len)?;
        let mut data = Vec::with_capacity(len.max(16));
        data.extend_from_slice(bytes);
        data.resize(len.max(16), 0);
        Ok(self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: &data,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            }))
    }

    pub fn upload_u32(&self, words: &[u32]) -> Result<wgpu::Buffer> {
        self.upload(bytemuck::cast_slice(words), 0)
    }

    /// A zeroed storage buffer of at least `bytes` bytes.
    pub fn zeroed(&self, bytes: usize) -> Result<wgpu::Buffer> {
        let len = (bytes.div_ceil(4) * 4).max(16);
        self.check_size(len)?;
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: len as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    fn check_size(&self, len: usize) -> Result<()> {
        let max =
            (self.limits.max_storage_buffer_binding_size as u64).min(self.limits.max_buffer_size);
        if len as u64 > max {
            return Err(Error::Unsupported(format!(
                "a {len}-byte buffer exceeds {}'s limit of {max} bytes per binding",
                self.info.name
            )));
        }
        Ok(())
    }

    pub fn params(&self, p: &[u32]) -> wgpu::Buffer {
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::cast_slice(p),
                usage: wgpu::BufferUsages::UNIFORM,
            })
    }

    pub fn bind(
        &self,
        m: &Module,
        params: &wgpu::Buffer,
        buffers: &[&wgpu::Buffer],
    ) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        }];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &m.layout,
            entries: &entries,
        })
    }

    /// Record one dispatch of `entry` with `groups` workgroups (spread over two dimensions
    /// when above the per-dimension limit).
    pub fn dispatch(
        &self,
        enc: &mut wgpu::CommandEncoder,
        m: &Module,
        entry: &str,
        bind: &wgpu::BindGroup,
        groups: u32,
    ) {
        if groups == 0 {
            return;
        }
        let x = groups.min(32768);
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(entry),
            timestamp_writes: None,
        });
        pass.set_pipeline(m.pipeline(entry));
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(x, groups.div_ceil(x), 1);
    }

    pub fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Submit `enc`, then copy `bytes` bytes of each buffer back to the host. The only place
    /// data leaves the device.
    pub fn finish_and_read(
        &self,
        mut enc: wgpu::CommandEncoder,
        reads: &[(&wgpu::Buffer, u64)],
    ) -> Result<Vec<Vec<u8>>> {
        let mut staging = Vec::new();
        for &(buf, bytes) in reads {
            let size = (bytes.div_ceil(4) * 4).max(4);
            let s = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            enc.copy_buffer_to_buffer(buf, 0, &s, 0, size);
            staging.push((s, bytes));
        }
        self.queue.submit([enc.finish()]);
        let mut out = Vec::new();
        for (s, bytes) in staging {
            let (tx, rx) = std::sync::mpsc::channel();
            s.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            self.device
                .poll(wgpu::PollType::Wait)
                .map_err(|e| Error::Invalid(format!("wgpu device wait failed: {e}")))?;
            rx.recv()
                .map_err(|_| Error::Invalid("wgpu readback never completed".into()))?
                .map_err(|e| Error::Invalid(format!("wgpu readback failed: {e}")))?;
            let data = s.slice(..).get_mapped_range()[..bytes as usize].to_vec();
            s.unmap();
            out.push(data);
        }
        Ok(out)
    }
}

fn module(
    device: &wgpu::Device,
    name: &str,
    body: &str,
    slots: &[Slot],
    entries: &[&'static str],
) -> Module {
    // The chunk geometry comes from the Rust constants, so the two cannot drift apart.
    let source = format!(
        "const CHUNK: u32 = {CHUNK_ELEMS}u;\nconst GROUPS: u32 = {}u;\n{PRELUDE}\n{SCAN}\n{body}",
        CHUNK_ELEMS / LANES * 4
    );
    compile(device, name, source, slots, entries)
}

/// A module from complete WGSL `source`: binding 0 the uniform parameters, then `slots`.
pub fn compile(
    device: &wgpu::Device,
    name: &str,
    source: String,
    slots: &[Slot],
    entries: &[&'static str],
) -> Module {
    let shader = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(name),
        source: wgpu::ShaderSource::Wgsl(Cow::Owned(source)),
    });
    let mut layout_entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }];
    for (i, s) in slots.iter().enumerate() {
        layout_entries.push(wgpu::BindGroupLayoutEntry {
            binding: i as u32 + 1,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage {
                    read_only: matches!(s, Slot::Read),
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
    }
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(name),
        entries: &layout_entries,
    });
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(name),
        bind_group_layouts: &[&layout],
        push_constant_ranges: &[],
    });
    let pipelines = entries
        .iter()
        .map(|&e| {
            let p = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(e),
                layout: Some(&pl),
                module: &shader,
                entry_point: Some(e),
                compilation_options: Default::default(),
                cache: None,
            });
            (e, p)
        })
        .collect();
    Module { layout, pipelines }
}
