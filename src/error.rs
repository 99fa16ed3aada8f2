//! One error type for the whole library. Decoders return these; they never panic on bad input.

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
    /// A stored checksum or hash did not match the bytes.
    #[error("checksum mismatch in {what}: stored {stored:#x}, computed {computed:#x}")]
    Checksum {
        what: String,
        stored: u64,
        computed: u64,
    },
    /// Two inputs that must agree do not (tensor names, shapes, dtypes, model hashes).
    #[error("mismatch: {0}")]
    Mismatch(String),
    /// A valid request this build cannot serve.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Anything else the caller asked for that cannot be done, explained.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
}
