//! Inputs and outputs of the single-file codecs (`text compress|decompress`, `delta
//! encode|decode`, `model convert`) the way Unix compressors treat them: `-` is standard input
//! or output, `-c` writes to standard output, without `-o` the output is named after the input
//! (`f` -> `f.lst`, `f.lst` -> `f`), an existing file is replaced only with `-f`, and missing
//! output folders are created. Files are written through `output::AtomicFile` (temporary file,
//! fsync, rename); standard output, character devices (`-o /dev/null`) and named pipes
//! directly, with no `-f` needed (nothing is replaced).

use std::ffi::OsString;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use lockstep::output::AtomicFile;
use lockstep::{Error, Result};

/// Where the result goes.
#[derive(Args, Clone, Debug)]
pub struct OutArgs {
    /// Output file (`-` for standard output; default: named after the input).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Write to standard output.
    #[arg(short = 'c', long, conflicts_with = "output")]
    pub stdout: bool,
    /// Replace an existing output file (and write compressed data to a terminal).
    #[arg(short, long)]
    pub force: bool,
}

pub fn is_stdio(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// The whole of an input file (a named pipe read to its end; a device, which might never
/// end, refused), or of standard input for `-`.
pub fn read_input(p: &Path) -> Result<Vec<u8>> {
    if is_stdio(p) {
        let mut v = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut v)
            .map_err(|e| Error::io("(standard input)", e))?;
        Ok(v)
    } else {
        let file = std::fs::File::open(p).map_err(|e| Error::io(p, e))?;
        Ok(match lockstep::memory::FileBytes::of(p, &file)? {
            lockstep::memory::FileBytes::Owned(v) => v,
            mapped => mapped.to_vec(),
        })
    }
}

/// How an input's name is shown in messages.
pub fn shown(p: &Path) -> String {
    if is_stdio(p) {
        "(stdin)".into()
    } else {
        p.display().to_string()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dest {
    Stdout,
    File(PathBuf),
}

impl Dest {
    pub fn shown(&self) -> String {
        match self {
            Dest::Stdout => "(stdout)".into(),
            Dest::File(p) => p.display().to_string(),
        }
    }

    /// The path a JSON report names (`-` for standard output).
    pub fn json(&self) -> String {
        match self {
            Dest::Stdout => "-".into(),
            Dest::File(p) => p.display().to_string(),
        }
    }

    /// A path for error messages.
    pub fn path(&self) -> PathBuf {
        match self {
            Dest::Stdout => PathBuf::from("(standard output)"),
            Dest::File(p) => p.clone(),
        }
    }
}

/// `f` -> `f` + `suffix` (`notes.txt` -> `notes.txt.lst`).
pub fn add_suffix(input: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(input.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// `f.lst` -> `f`, or `f` + `replacement` for codecs whose original has its own suffix
/// (`step800.lsd` -> `step800.safetensors`); an error naming the suffix when it is absent.
pub fn strip_suffix(input: &Path, suffix: &str, replacement: &str) -> Result<PathBuf> {
    let name = input.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name.strip_suffix(suffix) {
        Some(stem) if !stem.is_empty() => Ok(input.with_file_name(format!("{stem}{replacement}"))),
        _ => Err(Error::Invalid(format!(
            "{}: the name does not end in {suffix}, so there is no default output name; \
             name one with -o FILE, or write to standard output with -c",
            input.display()
        ))),
    }
}

/// Where the output goes: `-c` or `-o -` is standard output; `-o FILE` is FILE; with neither,
/// standard output when the input is standard input, else `default_name(input)`.
pub fn destination(
    input: &Path,
    out: &OutArgs,
    default_name: impl FnOnce(&Path) -> Result<PathBuf>,
) -> Result<Dest> {
    match &out.output {
        _ if out.stdout => Ok(Dest::Stdout),
        Some(p) if is_stdio(p) => Ok(Dest::Stdout),
        Some(p) => Ok(Dest::File(p.clone())),
        None if is_stdio(input) => Ok(Dest::Stdout),
        None => Ok(Dest::File(default_name(input)?)),
    }
}

/// Check a destination before any work is done: an existing file is refused without `-f`, a
/// directory always; compressed (`binary`) data is not written to a terminal without `-f`;
/// `--json` cannot share standard output with the data. Creates missing parent folders.
pub fn prepare(dest: &Dest, force: bool, binary: bool, json: bool) -> Result<()> {
    match dest {
        Dest::Stdout => {
            if json {
                return Err(Error::Invalid(
                    "--json prints its report on standard output, which the data is written \
                     to; name an output file with -o"
                        .into(),
                ));
            }
            if binary && !force && std::io::stdout().is_terminal() {
                return Err(Error::Invalid(
                    "compressed data is not written to a terminal; redirect it, name a file \
                     with -o, or use -f"
                        .into(),
                ));
            }
            Ok(())
        }
        Dest::File(p) => {
            match lockstep::output::special(p) {
                // `-o /dev/null`, a named pipe: written in place, nothing replaced.
                Some(lockstep::output::Special::Stream) => return Ok(()),
                Some(lockstep::output::Special::Refused(what)) => {
                    return Err(lockstep::output::refused(p, what))
                }
                None => {}
            }
            if p.is_dir() {
                return Err(Error::Invalid(format!(
                    "{}: is a directory; name the output file with -o",
                    p.display()
                )));
            }
            if !force && std::fs::symlink_metadata(p).is_ok() {
                return Err(Error::Invalid(format!(
                    "{}: already exists; use -f (--force) to replace it",
                    p.display()
                )));
            }
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            }
            Ok(())
        }
    }
}

/// An open output: a crash-safe file, or standard output.
pub enum Sink {
    Stdout(std::io::BufWriter<std::io::Stdout>),
    File(AtomicFile),
}

impl Sink {
    pub fn open(dest: &Dest) -> Result<Sink> {
        Ok(match dest {
            Dest::Stdout => Sink::Stdout(std::io::BufWriter::with_capacity(
                1 << 20,
                std::io::stdout(),
            )),
            Dest::File(p) => Sink::File(AtomicFile::create(p)?),
        })
    }

    /// Flush standard output, or fsync the file and rename it into place.
    pub fn finish(self) -> Result<()> {
        match self {
            Sink::Stdout(mut w) => w.flush().map_err(|e| Error::io("(standard output)", e)),
            Sink::File(f) => f.commit(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Stdout(w) => w.write(buf),
            Sink::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stdout(w) => w.flush(),
            Sink::File(f) => f.flush(),
        }
    }
}

/// A writer that counts the bytes through it.
pub struct Counting<W> {
    pub inner: W,
    pub count: u64,
}

impl<W> Counting<W> {
    pub fn new(inner: W) -> Self {
        Counting { inner, count: 0 }
    }
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Write a whole result to `dest` and finish it.
pub fn write_all(dest: &Dest, bytes: &[u8]) -> Result<()> {
    let mut s = Sink::open(dest)?;
    s.write_all(bytes).map_err(|e| Error::io(dest.path(), e))?;
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names() {
        assert_eq!(
            add_suffix(Path::new("d/f.txt"), ".lst"),
            Path::new("d/f.txt.lst")
        );
        assert_eq!(
            strip_suffix(Path::new("d/f.txt.lst"), ".lst", "").unwrap(),
            Path::new("d/f.txt")
        );
        assert_eq!(
            strip_suffix(Path::new("step800.lsd"), ".lsd", ".safetensors").unwrap(),
            Path::new("step800.safetensors")
        );
        assert!(strip_suffix(Path::new("f.txt"), ".lst", "").is_err());
        assert!(strip_suffix(Path::new(".lst"), ".lst", "").is_err());
    }
}
