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
    /// A write met ENOSPC: nothing of it was kept and the log stays in service; writes
    /// succeed again once space is freed.
    #[error("{op} {path}: no space left on the device; nothing was written")]
    StorageFull {
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
    /// A batch larger than a segment can address.
    #[error("batch of {size} bytes exceeds segment capacity")]
    BatchTooLarge {
        /// Its size.
        size: usize,
    },
    /// A batch shorter than a RecordBatch header, or whose header does not parse.
    #[error("batch of {size} bytes is not a whole RecordBatch: {reason}")]
    InvalidBatch {
        /// Its size.
        size: usize,
        /// What is wrong.
        reason: String,
    },
    /// Stored bytes are not what the log wrote (damage found outside recovery).
    #[error("{path} at byte {position}: {reason}")]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Where in it.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// A stored batch could not be decoded.
    #[error("batch at offset {offset} does not decode: {reason}")]
    Decode {
        /// Its base offset.
        offset: i64,
        /// The decoder's complaint.
        reason: String,
    },
    /// A write or fsync failed earlier: the log is out of service until it is reopened.
    #[error(
        "the log at {path} is out of service after a failed write or fsync; restart to recover it"
    )]
    Failed {
        /// The log's directory.
        path: PathBuf,
    },
    /// A replica batch does not start at the log end.
    #[error("replica batch starts at offset {found}, the log ends at {expected}")]
    OffsetMismatch {
        /// The log end offset.
        expected: i64,
        /// The batch's base offset.
        found: i64,
    },
    /// A batch's leader epoch is older than the latest epoch in the log.
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleEpoch {
        /// The epoch offered.
        epoch: i32,
        /// The latest epoch stored.
        latest: i32,
    },
    /// A truncation beyond the end of the log.
    #[error("cannot truncate to offset {offset}: the log ends at {end}")]
    TruncationPastEnd {
        /// Requested offset.
        offset: i64,
        /// The log end offset.
        end: i64,
    },
}

impl LogError {
    /// True when the failure is a full file system (ENOSPC), not a failing disk.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, LogError::StorageFull { .. })
    }
}

/// Whether an I/O error means "no space left on the device".
pub fn is_enospc(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC)
}

pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T, LogError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T, LogError> {
        // ENOSPC from an fsync stays an I/O failure: the kernel may have dropped the pages it
        // could not write, so the file can no longer be trusted. From a write it is only "full".
        self.map_err(|source| {
            if is_enospc(&source) && !op.starts_with("fsync") {
                LogError::StorageFull {
                    op,
                    path: path.to_path_buf(),
                    source,
                }
            } else {
                LogError::Io {
                    op,
                    path: path.to_path_buf(),
                    source,
                }
            }
        })
    }
}
