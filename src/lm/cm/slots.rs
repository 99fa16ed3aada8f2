//! The predictor's big tables (counter slots, the second APM), in memory that Linux may back
//! with 2 MiB pages.
//!
//! Every coded bit reads about ten slots at random in tables of megabytes (docs/INTEGER_GPT2.md
//! §13.2 fixes the hashing, so the reads cannot be made local without changing the bytes).
//! With 4 KiB pages nearly each read also misses the TLB and walks the page tables; with huge
//! pages the tables of even the largest input (8 × 16 MiB of counters) need a few dozen TLB
//! entries. On this kernel's default (`transparent_hugepage=madvise`) a heap allocation does
//! not get them: the table is mapped on its own, 2 MiB-aligned, and advised. Elsewhere, for
//! small tables, or when the mapping fails, it is an ordinary `Vec`. Where the table lives
//! changes no value in it.

use std::ops::{Deref, DerefMut};

use bytemuck::Pod;

/// Tables from this size on are mapped (one huge page).
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// A table of `T`s, every one starting at the same value.
pub struct Slots<T: Pod> {
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

impl<T: Pod> Slots<T> {
    /// `len` slots holding `fill`.
    pub fn new(len: usize, fill: T) -> Self {
        #[cfg(target_os = "linux")]
        if let Some(mem) = Self::mapped(len, fill) {
            return Slots { mem };
        }
        Slots {
            mem: Mem::Heap(vec![fill; len]),
        }
    }

    #[cfg(target_os = "linux")]
    fn mapped(len: usize, fill: T) -> Option<Mem<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        if bytes < HUGE {
            return None;
        }
        // One huge page more than the table, so that it can start on a 2 MiB boundary.
        let mut map = memmap2::MmapMut::map_anon(bytes.checked_add(HUGE)?).ok()?;
        // Only advice: without huge pages the table works the same.
        let _ = map.advise(memmap2::Advice::HugePage);
        let at = map.as_ptr().align_offset(HUGE);
        let table: &mut [T] = bytemuck::try_cast_slice_mut(&mut map[at..at + bytes]).ok()?;
        table.fill(fill);
        Some(Mem::Mapped { map, at, len })
    }
}

impl<T: Pod> Deref for Slots<T> {
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

impl<T: Pod> DerefMut for Slots<T> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_mapped_tables_hold_what_is_written() {
        for len in [2usize, 1000, 1 << 19, (1 << 20) + 3] {
            let mut t = Slots::new(len, 1u32 << 31);
            assert_eq!(t.len(), len);
            assert!(t.iter().all(|&v| v == 1 << 31));
            t[len - 1] = 7;
            t[0] = 5;
            assert_eq!((t[0], t[len - 1]), (5, 7));
        }
        let t = Slots::new(1 << 21, 9u16);
        assert_eq!(t.len(), 1 << 21);
        assert!(t.iter().all(|&v| v == 9));
    }
}
