//! NVRTC, loaded at run time from a path or the library search path: compiles the kernels
//! to PTX for the device's architecture (and, in tests, for sm_90 without a GPU). Loaded
//! here rather than through cudarc so a test can name the library file it installed.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;

use crate::{Error, Result};

type Prog = *mut std::ffi::c_void;

/// The NVRTC library.
pub struct Nvrtc {
    lib: libloading::Library,
}

/// File names tried when no path is given.
const NAMES: [&str; 4] = [
    "libnvrtc.so.12",
    "libnvrtc.so.13",
    "libnvrtc.so",
    "nvrtc64_120_0.dll",
];

impl Nvrtc {
    /// Load NVRTC from `path`, or by name from the library search path.
    pub fn open(path: Option<&Path>) -> Result<Nvrtc> {
        let tried: Vec<String> = match path {
            Some(p) => vec![p.display().to_string()],
            None => NAMES.iter().map(|s| s.to_string()).collect(),
        };
        for name in &tried {
            // SAFETY: loading NVRTC runs only its (side-effect free) initializers.
            if let Ok(lib) = unsafe { libloading::Library::new(name) } {
                return Ok(Nvrtc { lib });
            }
        }
        Err(Error::Unsupported(format!(
            "NVRTC not found (tried {}); install the CUDA toolkit's NVRTC \
             (pip: nvidia-cuda-nvrtc-cu12) and put its lib folder on LD_LIBRARY_PATH",
            tried.join(", ")
        )))
    }

    /// NVRTC's version, (major, minor).
    pub fn version(&self) -> Result<(i32, i32)> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the signature of nvrtcVersion.
        unsafe {
            let f = self
                .sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>(b"nvrtcVersion\0")?;
            check(f(&mut major, &mut minor), "nvrtcVersion")?;
        }
        Ok((major, minor))
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> Result<T> {
        // SAFETY: the caller names the symbol's true type.
        unsafe { self.lib.get::<T>(name) }.map(|s| *s).map_err(|e| {
            Error::Unsupported(format!(
                "NVRTC lacks {}: {e}",
                String::from_utf8_lossy(&name[..name.len() - 1])
            ))
        })
    }

    /// Compile `source` (named `name` in messages) to PTX for `arch` (e.g. "compute_90").
    /// Integer kernels, and no fast-math: nothing here may change a result. 128-bit integers
    /// are on (`--device-int128`): the LM's kernels use them where the spec does.
    pub fn compile(&self, name: &str, source: &str, arch: &str) -> Result<String> {
        type Create = unsafe extern "C" fn(
            *mut Prog,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Compile = unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Prog, *mut usize) -> c_int;
        type Get = unsafe extern "C" fn(Prog, *mut c_char) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Prog) -> c_int;
        let create: Create = self.sym(b"nvrtcCreateProgram\0")?;
        let compile: Compile = self.sym(b"nvrtcCompileProgram\0")?;
        let log_size: Size = self.sym(b"nvrtcGetProgramLogSize\0")?;
        let get_log: Get = self.sym(b"nvrtcGetProgramLog\0")?;
        let ptx_size: Size = self.sym(b"nvrtcGetPTXSize\0")?;
        let get_ptx: Get = self.sym(b"nvrtcGetPTX\0")?;
        let destroy: Destroy = self.sym(b"nvrtcDestroyProgram\0")?;
        let src = CString::new(source).map_err(|_| Error::Invalid("NUL in a kernel".into()))?;
        let cname = CString::new(name).map_err(|_| Error::Invalid("NUL in a name".into()))?;
        let opts: Vec<CString> = [
            format!("--gpu-architecture={arch}"),
            "--fmad=false".into(),
            "--device-int128".into(),
        ]
        .into_iter()
        .map(|o| CString::new(o).unwrap())
        .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: NVRTC's documented signatures; every buffer is sized by NVRTC's answer.
        unsafe {
            check(
                create(
                    &mut prog,
                    src.as_ptr(),
                    cname.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                ),
                "nvrtcCreateProgram",
            )?;
            let rc = compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr());
            let mut n = 0usize;
            log_size(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            get_log(prog, log.as_mut_ptr() as *mut c_char);
            let log = CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            let out = if rc != 0 {
                Err(Error::Invalid(format!(
                    "NVRTC could not compile {name} for {arch} (error {rc}):\n{log}"
                )))
            } else {
                let mut n = 0usize;
                check(ptx_size(prog, &mut n), "nvrtcGetPTXSize")?;
                let mut ptx = vec![0u8; n.max(1)];
                check(
                    get_ptx(prog, ptx.as_mut_ptr() as *mut c_char),
                    "nvrtcGetPTX",
                )?;
                Ok(CStr::from_bytes_until_nul(&ptx)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default())
            };
            destroy(&mut prog);
            out
        }
    }
}

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Invalid(format!("{what} failed (NVRTC error {rc})")))
    }
}
