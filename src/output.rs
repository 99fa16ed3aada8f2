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
    pub fn commit(self) -> Result<()> {
        self.commit_with(None, None)
    }

    /// [`AtomicFile::commit`], first giving the file these permission bits (Unix; ignored
    /// elsewhere) and this modification time, so the file appears with them.
    pub fn commit_with(
        mut self,
        permissions: Option<u32>,
        modified: Option<std::time::SystemTime>,
    ) -> Result<()> {
        let f = self.file.take().expect("not committed");
        let file = f
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        #[cfg(unix)]
        if let Some(mode) = permissions {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io(&self.tmp, e))?;
        }
        #[cfg(not(unix))]
        let _ = permissions;
        if let Some(t) = modified {
            file.set_modified(t).map_err(|e| Error::io(&self.tmp, e))?;
        }
        file.sync_all().map_err(|e| Error::io(&self.tmp, e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| Error::io(&self.dest, e))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
