//! Crash-safe output: write to a temporary file beside the destination, rename into place only
//! when complete. On error or drop the temporary file is removed and the destination untouched.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

pub struct AtomicFile {
    dest: PathBuf,
    tmp: PathBuf,
    file: Option<BufWriter<File>>,
}

impl AtomicFile {
    pub fn create(dest: &Path) -> Result<AtomicFile> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .ok_or_else(|| Error::Invalid(format!("{} is not a file path", dest.display())))?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        Ok(AtomicFile {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("not committed");
        f.write_all(bytes).map_err(|e| Error::io(&self.tmp, e))
    }

    /// Flush, fsync and rename into place.
    pub fn commit(mut self) -> Result<()> {
        let f = self.file.take().expect("not committed");
        let file = f
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| Error::io(&self.dest, e))
    }
}

/// So a codec can write to a file or to standard output through one `std::io::Write`.
impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.as_mut().expect("not committed").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().expect("not committed").flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
