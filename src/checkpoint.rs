//! safetensors checkpoints, memory-mapped: tensors are borrowed from the mapping, never read
//! into memory whole, so files of tens of GB work.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::memory::FileBytes;

use crate::dtype::DType;
use crate::{Error, Result};

/// One tensor's entry in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// The element type as coded. Types lockstep has no codec for (complex, 4/6-bit and
    /// scale-only floats) are carried as opaque bytes: `U8` with `shape = [bytes]`.
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// The dtype name as the file spells it.
    pub stored_dtype: String,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

/// A memory-mapped safetensors file.
pub struct Checkpoint {
    pub path: PathBuf,
    map: FileBytes,
    header_end: usize,
    /// Tensors in file (data offset) order.
    pub tensors: Vec<TensorEntry>,
    /// Name -> position in `tensors`: checkpoints with 10^5 tensors are looked up per tensor.
    by_name: HashMap<String, usize>,
}

impl Checkpoint {
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let bytes = FileBytes::of(&path, &file)?;
        Self::parse(path, bytes)
    }

    /// A checkpoint held in memory (read from standard input); `name` stands for its path
    /// in messages.
    pub fn from_bytes(name: impl AsRef<Path>, bytes: Vec<u8>) -> Result<Checkpoint> {
        Self::parse(name.as_ref().to_path_buf(), FileBytes::Owned(bytes))
    }

    fn parse(path: PathBuf, map: FileBytes) -> Result<Checkpoint> {
        let (n, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
            Error::format(
                format!("safetensors file {}", path.display()),
                format!("{e:?}"),
            )
        })?;
        let header_end = 8 + n;
        let mut tensors = Vec::new();
        for name in meta.offset_keys() {
            let info = meta.info(&name).expect("offset_keys names a tensor");
            let stored_dtype = format!("{:?}", info.dtype);
            let (start, end) = (
                header_end + info.data_offsets.0,
                header_end + info.data_offsets.1,
            );
            let (dtype, shape) = match DType::from_safetensors_name(&stored_dtype) {
                Ok(d) => (d, info.shape.iter().map(|&s| s as u64).collect()),
                Err(_) => (DType::U8, vec![(end - start) as u64]),
            };
            tensors.push(TensorEntry {
                name,
                dtype,
                shape,
                stored_dtype,
                start,
                end,
            });
        }
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Checkpoint {
            path,
            map,
            header_end,
            tensors,
            by_name,
        })
    }

    /// The file's first bytes: the 8-byte header length and the JSON header, verbatim.
    pub fn header_bytes(&self) -> &[u8] {
        &self.map[..self.header_end]
    }

    pub fn data(&self, t: &TensorEntry) -> &[u8] {
        &self.map[t.start..t.end]
    }

    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
}
