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

/// A fixed-size buffer of zeros mapped from the kernel, which fills each page in on first
/// touch: for the KV caches, hundreds of megabytes sized once per session and written a
/// position at a time. Vectors grown as positions arrived copied every byte on each
/// doubling and faulted the pages of every copy (328K faults, 16% of a GPT-2-small decode's
/// samples on a VM); mapped, a page is faulted once, when first written, and pages never
/// written cost nothing. Huge pages (`MADV_HUGEPAGE`) were tried and not kept: on the Zen 5
/// VM they made the decode no faster (9.4-10.3 s against 8.4-10.3) and the kernel's time
/// for the shipped model's sessions varied 0.06-0.67 s against 0.09-0.35. Small buffers,
/// and other systems, use the heap.
pub struct ZeroedPages<T: bytemuck::Zeroable + Copy> {
    storage: Storage<T>,
}

enum Storage<T> {
    Heap(Box<[T]>),
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    Mapped {
        ptr: std::ptr::NonNull<T>,
        len: usize,
        bytes: usize,
    },
}

// SAFETY: the mapping is owned by the buffer alone (like a Box), so it moves and is shared
// between threads as a `[T]` would be.
unsafe impl<T: bytemuck::Zeroable + Copy + Send> Send for ZeroedPages<T> {}
unsafe impl<T: bytemuck::Zeroable + Copy + Sync> Sync for ZeroedPages<T> {}

/// Buffers below this stay on the heap, whose freed blocks the next session reuses.
const MAP_AT_LEAST: usize = 4 << 20;

impl<T: bytemuck::Zeroable + Copy> ZeroedPages<T> {
    /// `len` zeros; an allocation failure panics, as a `Vec`'s does.
    pub fn new(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("ZeroedPages: size overflows");
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if bytes >= MAP_AT_LEAST && std::mem::align_of::<T>() <= 4096 {
            // SAFETY: a fresh private anonymous mapping, checked for failure; the kernel
            // fills it with zeros, a valid T (Zeroable), and it is page-aligned, enough for
            // T.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    let ptr = std::ptr::NonNull::new(p as *mut T).expect("mmap gave null");
                    return ZeroedPages {
                        storage: Storage::Mapped { ptr, len, bytes },
                    };
                }
            }
        }
        ZeroedPages {
            storage: Storage::Heap(vec![T::zeroed(); len].into_boxed_slice()),
        }
    }
}

impl<T: bytemuck::Zeroable + Copy> std::ops::Deref for ZeroedPages<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.storage {
            Storage::Heap(b) => b,
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: `len` initialized T's (zeros or what was written) at `ptr`, borrowed
            // with `self`.
            Storage::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: bytemuck::Zeroable + Copy> std::ops::DerefMut for ZeroedPages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.storage {
            Storage::Heap(b) => b,
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: as for `deref`, borrowed mutably with `self`.
            Storage::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: bytemuck::Zeroable + Copy> Drop for ZeroedPages<T> {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if let Storage::Mapped { ptr, bytes, .. } = self.storage {
            // SAFETY: the mapping made in `new`, unmapped once; no borrow outlives self.
            unsafe {
                libc::munmap(ptr.as_ptr() as *mut libc::c_void, bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ZeroedPages;

    #[test]
    fn zeroed_pages_start_zero_and_keep_what_is_written() {
        // One on the heap, one mapped (on Linux with glibc).
        for len in [1000usize, (8 << 20) / 4 + 3] {
            let mut b = ZeroedPages::<i32>::new(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            for (i, x) in b.iter_mut().enumerate().step_by(997) {
                *x = i as i32;
            }
            assert!(b
                .iter()
                .enumerate()
                .all(|(i, &x)| x == if i % 997 == 0 { i as i32 } else { 0 }));
        }
        assert!(ZeroedPages::<u8>::new(0).is_empty());
    }
}
