use thiserror::Error;

/// Failures of the broker that are not Kafka error codes for a client.
#[derive(Debug, Error)]
pub enum BrokerError {
    /// A log operation failed.
    #[error(transparent)]
    Log(#[from] spate_log::LogError),
    /// Metadata files could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A thread the broker cannot run without did not start.
    #[error("cannot start the {name} thread: {source}")]
    StartThread {
        /// The thread's name.
        name: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A metadata file holds something we cannot use.
    #[error("corrupt metadata file {path}: {reason}")]
    CorruptMetadata {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// Cluster mode could not be set up.
    #[error("cluster: {0}")]
    Cluster(String),
}

pub(crate) fn io<'a>(
    op: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(std::io::Error) -> BrokerError + 'a {
    move |source| BrokerError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}
