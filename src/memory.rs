//! One process-wide allocator setting for a codec that allocates megabyte buffers per tensor.

/// Keep freed large buffers in the heap for the next tensor instead of returning them to the
/// kernel. glibc maps every block above its mmap threshold (128 KiB at first) afresh and
/// unmaps it on free, so each tensor's residual, info and output buffers were page-faulted
/// and zeroed by the kernel again: about 15% of a one-thread bf16 encode in a profile. With
/// the thresholds raised, the second tensor reuses the first one's pages. Elsewhere (other
/// allocators, other systems) this does nothing. Call once, early in `main`.
pub fn reuse_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; it is called before any other
    // thread exists (start of main) and its failure (a 0 return) leaves the defaults.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
