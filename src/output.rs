//! Crash-safe output: write to a temporary file beside the destination, rename into place only
//! when complete. On error or drop the temporary file is removed and the destination untouched.
//!
//! A process killed outright (SIGKILL, power loss) cannot remove its temporary file. Each
//! writer therefore holds an exclusive lock (`flock`) on its temporary file while it lives;
//! the next writer to the same destination removes the temporary files nobody holds
//! ([`remove_stale_temps`]), so remains of dead runs do not pile up.
//!
//! A destination that is not a file ([`Special`]) is never renamed over: a rename would put
//! a file in place of `/dev/null` or of a named pipe. Character devices and FIFOs are written
//! in place, as a stream (as standard output is); other kinds are refused.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// What an existing destination is when it is neither a regular file nor a directory
/// (symbolic links followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// A character device (`/dev/null`, a terminal) or a FIFO: written in place.
    Stream,
    /// A block device or a socket: refused ("block device", "socket").
    Refused(&'static str),
}

/// [`Special`] of `dest`, or None where it is a path for a file: absent, a regular file, a
/// directory (which the callers refuse themselves), or a link to one of those.
pub fn special(dest: &Path) -> Option<Special> {
    let t = std::fs::metadata(dest).ok()?.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() || t.is_fifo() {
            return Some(Special::Stream);
        }
        if t.is_block_device() {
            return Some(Special::Refused("block device"));
        }
        if t.is_socket() {
            return Some(Special::Refused("socket"));
        }
    }
    let _ = t;
    None
}

/// Whether `t` is a named pipe (always false off Unix).
pub fn is_fifo(t: &std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        t.is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = t;
        false
    }
}

/// What `t` is, for messages: "a directory", "a character device", ...
pub fn kind_of(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if is_fifo(t) {
        "a named pipe"
    } else if t.is_file() {
        "a file"
    } else {
        "not a regular file"
    }
}

/// The error for writing to a destination of kind `what`.
pub fn refused(dest: &Path, what: &str) -> Error {
    Error::Invalid(format!(
        "{}: is a {what}, not a file; write to a file, a character device such as /dev/null, \
         a named pipe or standard output",
        dest.display()
    ))
}

pub struct AtomicFile {
    dest: PathBuf,
    /// The temporary file renamed onto `dest` at the end; None where `dest` is a
    /// [`Special::Stream`], written in place.
    tmp: Option<PathBuf>,
    file: Option<BufWriter<File>>,
    /// Set once the temporary file has been renamed into place; until then, dropping this
    /// removes it (also when a flush, fsync or rename fails).
    committed: bool,
}

/// The hidden temporary name used for `dest` by this process: `.NAME.tmp-PID`.
pub fn temp_path(dest: &Path) -> Result<PathBuf> {
    let dir = parent_dir(dest);
    let name = dest
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{} is not a file path", dest.display())))?;
    Ok(dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

fn parent_dir(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Create a temporary file for `dest` and lock it (see the module comment); removes stale
/// temporary files of `dest` first. Returns the file and its path.
pub fn create_temp(dest: &Path) -> Result<(File, PathBuf)> {
    // Whatever is written here is renamed onto `dest` at the end: never onto a device,
    // pipe or socket.
    match special(dest) {
        Some(Special::Stream) => {
            return Err(Error::Invalid(format!(
                "{}: is a character device or a named pipe; this output must be a file",
                dest.display()
            )))
        }
        Some(Special::Refused(what)) => return Err(refused(dest, what)),
        None => {}
    }
    remove_stale_temps(dest);
    let tmp = temp_path(dest)?;
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    // Only fails where the file system has no locks; the file is still ours to write.
    let _ = file.try_lock();
    Ok((file, tmp))
}

/// Remove the temporary files of `dest` (`.NAME.tmp-PID`) that no living writer holds: the
/// remains of runs that were killed. Returns the paths removed. Best effort: a directory that
/// cannot be read is left alone (the write that follows reports its own error).
pub fn remove_stale_temps(dest: &Path) -> Vec<PathBuf> {
    let Some(name) = dest.file_name() else {
        return Vec::new();
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(parent_dir(dest)) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let fname = e.file_name();
        let fname = fname.to_string_lossy();
        let Some(pid) = fname.strip_prefix(&prefix) else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let path = e.path();
        // A writer that is alive holds the lock; one we can lock is dead.
        let stale = File::open(&path).is_ok_and(|f| f.try_lock().is_ok());
        if stale && std::fs::remove_file(&path).is_ok() {
            eprintln!(
                "note: removed {}, left by a run that was killed",
                path.display()
            );
            removed.push(path);
        }
    }
    removed
}

impl AtomicFile {
    /// A crash-safe file for `dest`; where `dest` is a character device or a FIFO, that
    /// device or pipe itself, written in place (nothing there to replace or to keep whole).
    pub fn create(dest: &Path) -> Result<AtomicFile> {
        let (file, tmp) = match special(dest) {
            Some(Special::Stream) => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dest)
                    .map_err(|e| Error::io(dest, e))?;
                (f, None)
            }
            Some(Special::Refused(what)) => return Err(refused(dest, what)),
            None => {
                let (f, tmp) = create_temp(dest)?;
                (f, Some(tmp))
            }
        };
        Ok(AtomicFile {
            dest: dest.to_path_buf(),
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            committed: false,
        })
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("not committed");
        // Errors name the file the user asked for, not the hidden temporary one.
        f.write_all(bytes).map_err(|e| Error::io(&self.dest, e))
    }

    /// Flush, fsync and rename into place. On any failure the temporary file is removed.
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
            .map_err(|e| Error::io(&self.dest, e.into_error()))?;
        let Some(tmp) = self.tmp.clone() else {
            // A device or pipe written in place: all written; its mode, times and
            // durability are not this file's to set.
            self.committed = true;
            return Ok(());
        };
        #[cfg(unix)]
        if let Some(mode) = permissions {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io(&self.dest, e))?;
        }
        #[cfg(not(unix))]
        let _ = permissions;
        if let Some(t) = modified {
            file.set_modified(t).map_err(|e| Error::io(&self.dest, e))?;
        }
        file.sync_all().map_err(|e| Error::io(&self.dest, e))?;
        std::fs::rename(&tmp, &self.dest).map_err(|e| Error::io(&self.dest, e))?;
        self.committed = true;
        // The lock goes with the file, after the rename: a concurrent cleaner never sees an
        // unlocked temporary file of a live writer.
        drop(file);
        Ok(())
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
        if !self.committed {
            // Drop the writer without flushing more into a file that is going away.
            if let Some(w) = self.file.take() {
                let (file, _) = w.into_parts();
                drop(file);
            }
            if let Some(tmp) = &self.tmp {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}
