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
/// for the shipped model's sessions varied 0.06-0.67 s against 0.09-0.35. Small buffers use
/// the heap.
pub struct ZeroedPages<T: bytemuck::Pod> {
    storage: Storage<T>,
}

enum Storage<T> {
    Heap(Box<[T]>),
    /// An anonymous mapping (page-aligned, zero-filled), `len` T's at its start.
    Mapped {
        map: memmap2::MmapMut,
        len: usize,
    },
}

/// Buffers below this stay on the heap, whose freed blocks the next session reuses.
const MAP_AT_LEAST: usize = 4 << 20;

impl<T: bytemuck::Pod> ZeroedPages<T> {
    /// `len` zeros; an allocation failure panics, as a `Vec`'s does.
    pub fn new(len: usize) -> Self {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("ZeroedPages: size overflows");
        if bytes >= MAP_AT_LEAST {
            if let Ok(map) = memmap2::MmapMut::map_anon(bytes) {
                return ZeroedPages {
                    storage: Storage::Mapped { map, len },
                };
            }
        }
        ZeroedPages {
            storage: Storage::Heap(vec![T::zeroed(); len].into_boxed_slice()),
        }
    }
}

impl<T: bytemuck::Pod> std::ops::Deref for ZeroedPages<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.storage {
            Storage::Heap(b) => b,
            Storage::Mapped { map, len } => {
                bytemuck::cast_slice(&map[..len * std::mem::size_of::<T>()])
            }
        }
    }
}

impl<T: bytemuck::Pod> std::ops::DerefMut for ZeroedPages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.storage {
            Storage::Heap(b) => b,
            Storage::Mapped { map, len } => {
                bytemuck::cast_slice_mut(&mut map[..*len * std::mem::size_of::<T>()])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ZeroedPages;

    #[test]
    fn zeroed_pages_start_zero_and_keep_what_is_written() {
        // One on the heap, one mapped.
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
