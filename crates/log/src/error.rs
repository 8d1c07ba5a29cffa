use std::path::PathBuf;
use thiserror::Error;

/// Failures of the log.
#[derive(Debug, Error)]
pub enum LogError {
    /// An I/O call failed; the path says on what.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The requested offset is below the log start or above the log end.
    #[error("offset {offset} is out of range [{start}, {end}]")]
    OffsetOutOfRange {
        /// Requested offset.
        offset: i64,
        /// First offset in the log.
        start: i64,
        /// Offset the next append will get.
        end: i64,
    },
    /// A batch that would be appended is unusable.
    #[error("batch of {size} bytes exceeds segment capacity")]
    BatchTooLarge {
        /// Its size.
        size: usize,
    },
}

pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T, LogError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T, LogError> {
        self.map_err(|source| LogError::Io {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}
