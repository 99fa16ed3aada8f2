//! One error type for the whole library. Decoders return these; they never panic on bad input.
//!
//! Each error knows the exit status the command line gives it ([`Error::exit_code`]); the
//! table is in the README ("Exit status") and `tests/exit_codes.rs` keeps the two in step.

use std::path::PathBuf;

/// Everything that can go wrong in lockstep, each variant naming what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O failure, with the path it concerned.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes that do not follow the documented format (truncated, bad magic, impossible values).
    #[error("format error in {what}: {detail}")]
    Format { what: String, detail: String },
    /// A stored checksum or hash did not match the bytes. `stored` and `computed` are the
    /// two values as text (hex digits, or a length where the lengths already differ).
    #[error("checksum mismatch in {what}: stored {stored}, computed {computed}")]
    Checksum {
        what: String,
        stored: String,
        computed: String,
    },
    /// An archive whose bytes after its last complete checkpoint are not a checkpoint: an
    /// interrupted append, a copy cut short, or a damaged last footer. The checkpoints before
    /// are intact; `detail` says which case it is and what to run.
    #[error("{path}: {detail}")]
    Incomplete { path: PathBuf, detail: String },
    /// A size or an amount of work declared by a file is over a limit the decoder enforces
    /// before allocating or computing anything (`--max-size` raises it where a legal file can
    /// be that large).
    #[error("limit exceeded: {0}")]
    Limit(String),
    /// Two inputs that must agree do not (tensor names, shapes, dtypes, model hashes).
    #[error("mismatch: {0}")]
    Mismatch(String),
    /// A valid request this build cannot serve.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Anything else the caller asked for that cannot be done, explained.
    #[error("{0}")]
    Invalid(String),
    /// Another error, with where it happened (a file, a checkpoint, a tensor) in front. Keeps
    /// the inner error's kind, so its exit status too.
    #[error("{context}: {source}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Exit status of a command that succeeded.
pub const EXIT_OK: i32 = 0;
/// The operation failed: I/O (a full disk, a missing file, no permission), a refused
/// overwrite, a request that cannot be served, inputs that do not match.
pub const EXIT_FAILURE: i32 = 1;
/// The command line could not be parsed (clap's own status).
pub const EXIT_USAGE: i32 = 2;
/// An input is damaged: a checksum does not match or the bytes break the format; `verify`
/// found damage.
pub const EXIT_DAMAGED: i32 = 3;
/// An archive is incomplete: bytes after its last complete checkpoint (an interrupted append,
/// a copy cut short) or a damaged last footer; `lockstep repair` says and fixes what it can.
pub const EXIT_INCOMPLETE: i32 = 4;
/// A file declares more output or work than a decoder allows (`--max-size` raises it).
pub const EXIT_LIMIT: i32 = 5;

impl Error {
    pub fn format(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Format {
            what: what.into(),
            detail: detail.into(),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A checksum mismatch of two 32-bit values.
    pub fn checksum32(what: impl Into<String>, stored: u32, computed: u32) -> Self {
        Error::Checksum {
            what: what.into(),
            stored: format!("{stored:#010x}"),
            computed: format!("{computed:#010x}"),
        }
    }

    /// A mismatch of two hashes (BLAKE3), in hex: the first 8 bytes of each, or all of them
    /// where those are equal (a damaged record can differ further in), so the two values
    /// shown always differ.
    pub fn hash_mismatch(what: impl Into<String>, stored: &[u8], computed: &[u8]) -> Self {
        let n = if stored.get(..8) == computed.get(..8) {
            usize::MAX
        } else {
            8
        };
        let hex = |b: &[u8]| {
            b.iter()
                .take(n)
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
        };
        Error::Checksum {
            what: what.into(),
            stored: hex(stored),
            computed: hex(computed),
        }
    }

    /// Put where it happened in front of an error, keeping its kind.
    pub fn context(self, context: impl Into<String>) -> Self {
        Error::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The innermost error, under any [`Error::Context`].
    pub fn root(&self) -> &Error {
        match self {
            Error::Context { source, .. } => source.root(),
            e => e,
        }
    }

    /// The command line's exit status for this error (the README's table).
    pub fn exit_code(&self) -> i32 {
        match self.root() {
            Error::Format { .. } | Error::Checksum { .. } => EXIT_DAMAGED,
            Error::Incomplete { .. } => EXIT_INCOMPLETE,
            Error::Limit(_) => EXIT_LIMIT,
            Error::Io { .. }
            | Error::Mismatch(_)
            | Error::Unsupported(_)
            | Error::Invalid(_)
            | Error::Context { .. } => EXIT_FAILURE,
        }
    }
}

/// Adds [`Error::context`] to results.
pub trait ResultExt<T> {
    /// On error, put `context()` in front of it.
    fn context_with(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context_with(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}
