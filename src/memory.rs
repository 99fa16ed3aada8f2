//! Memory for a codec that allocates megabyte buffers per tensor: one process-wide allocator
//! setting, zeroed pages mapped on demand, tables read at random backed by huge pages, and
//! input files' bytes (mapped, or read whole from a pipe).

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;

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

/// A huge page (Linux, x86-64 and aarch64 with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// A table read at random, in memory that Linux may back with 2 MiB pages: with 4 KiB pages
/// nearly every read of a table of megabytes also misses the TLB and walks the page tables;
/// with huge pages it needs a few TLB entries. On the common kernel default
/// (`transparent_hugepage=madvise`) a heap allocation does not get them: from `map_from`
/// bytes the table is mapped on its own, 2 MiB-aligned, and advised. Elsewhere, for smaller
/// tables, or when the mapping fails, it is an ordinary `Vec`. Where the table lives changes
/// no value in it. Users: the text predictor's counter tables (`lm::cm::predictor`) and the
/// delta decoder's slot table of the Joint layout's neighbor form (`backend::cpu::joint_near`).
pub struct HugeTable<T: Pod> {
    mem: Mem<T>,
}

enum Mem<T: Pod> {
    Heap(Vec<T>),
    #[cfg(target_os = "linux")]
    Mapped {
        map: memmap2::MmapMut,
        /// The table's first byte in the mapping (the first 2 MiB boundary).
        at: usize,
        len: usize,
    },
}

impl<T: Pod> HugeTable<T> {
    /// `len` entries holding `fill`, mapped where they take `map_from` bytes or more.
    pub fn new(len: usize, fill: T, map_from: usize) -> Self {
        #[cfg(target_os = "linux")]
        if let Some(mem) = Self::mapped(len, fill, map_from) {
            return HugeTable { mem };
        }
        let _ = map_from;
        HugeTable {
            mem: Mem::Heap(vec![fill; len]),
        }
    }

    #[cfg(target_os = "linux")]
    fn mapped(len: usize, fill: T, map_from: usize) -> Option<Mem<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        if bytes < map_from.max(1) {
            return None;
        }
        // One huge page more than the table, so that it can start on a 2 MiB boundary.
        let mut map = memmap2::MmapMut::map_anon(bytes.checked_add(HUGE_PAGE)?).ok()?;
        // Only advice: without huge pages the table works the same.
        let _ = map.advise(memmap2::Advice::HugePage);
        let at = map.as_ptr().align_offset(HUGE_PAGE);
        let table: &mut [T] = bytemuck::try_cast_slice_mut(&mut map[at..at + bytes]).ok()?;
        // A fresh anonymous mapping reads as zeros: a zero fill would only touch every page
        // first (serially, before the callers' own parallel writes).
        if bytemuck::bytes_of(&fill).iter().any(|&b| b != 0) {
            table.fill(fill);
        }
        Some(Mem::Mapped { map, at, len })
    }
}

impl<T: Pod> Deref for HugeTable<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.mem {
            Mem::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Mem::Mapped { map, at, len } => {
                bytemuck::cast_slice(&map[*at..*at + len * std::mem::size_of::<T>()])
            }
        }
    }
}

impl<T: Pod> DerefMut for HugeTable<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.mem {
            Mem::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Mem::Mapped { map, at, len } => {
                bytemuck::cast_slice_mut(&mut map[*at..*at + *len * std::mem::size_of::<T>()])
            }
        }
    }
}

/// An input file's bytes: a regular file mapped (read in place, never copied), or what a
/// pipe carried (a named pipe, `<(...)` process substitution, standard input), read whole as
/// standard input is.
pub enum FileBytes {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Map(m) => m,
            FileBytes::Owned(v) => v,
        }
    }
}

impl FileBytes {
    /// The bytes of `file`, opened from `path`: a regular file mapped, a named pipe read to
    /// its end. Anything else (a device, a socket, a directory) is refused by name: mapping
    /// one failed with "No such device", and reading `/dev/zero` would never end.
    pub fn of(path: &std::path::Path, file: &std::fs::File) -> crate::Result<FileBytes> {
        use std::io::Read;
        let io = |e| crate::Error::io(path, e);
        let t = file.metadata().map_err(io)?.file_type();
        if t.is_file() {
            // SAFETY: read-only mapping; a file truncated underneath us is the one hazard
            // memory-mapping accepts, as every mmap-based reader does (writers of archives
            // only ever append past the committed length).
            return Ok(FileBytes::Map(
                unsafe { memmap2::Mmap::map(file) }.map_err(io)?,
            ));
        }
        if crate::output::is_fifo(&t) {
            let mut v = Vec::new();
            (&*file).read_to_end(&mut v).map_err(io)?;
            return Ok(FileBytes::Owned(v));
        }
        Err(crate::Error::Invalid(format!(
            "{}: {}, not a file",
            path.display(),
            crate::output::kind_of(&t)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::{HugeTable, ZeroedPages, HUGE_PAGE};

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

    #[test]
    fn small_and_mapped_tables_hold_what_is_written() {
        for len in [2usize, 1000, 1 << 19, (1 << 20) + 3] {
            let mut t = HugeTable::new(len, 1u32 << 31, HUGE_PAGE);
            assert_eq!(t.len(), len);
            assert!(t.iter().all(|&v| v == 1 << 31));
            t[len - 1] = 7;
            t[0] = 5;
            assert_eq!((t[0], t[len - 1]), (5, 7));
        }
        for map_from in [HUGE_PAGE, 1 << 10] {
            let t = HugeTable::new(1 << 21, 9u16, map_from);
            assert_eq!(t.len(), 1 << 21);
            assert!(t.iter().all(|&v| v == 9));
            let z = HugeTable::new(1 << 21, 0u8, map_from);
            assert!(z.iter().all(|&v| v == 0));
        }
    }
}
