//! Builds the host emulation of the CUDA kernels (kernels/host/emulate.c, which includes
//! kernels/*.cu as C), so the kernels' logic runs in tests on machines without a GPU. Linux
//! only (fibers on ucontext); elsewhere the emulated device is absent.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cuda_emulation)");
    println!("cargo::rerun-if-changed=kernels");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    cc::Build::new()
        .file("kernels/host/emulate.c")
        .std("gnu11")
        // The fibers jump between stacks, which glibc's fortified longjmp refuses.
        .flag("-U_FORTIFY_SOURCE")
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2)
        .warnings(true)
        .compile("lockstep_cuda_emulation");
    println!("cargo::rustc-cfg=cuda_emulation");
}
