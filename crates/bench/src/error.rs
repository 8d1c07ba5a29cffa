//! Errors of the library part; each renders as one line for the user.

use thiserror::Error;

/// Everything that can end a benchmark early.
#[derive(Debug, Error)]
pub enum BenchError {
    /// Flags that do not make sense together (or cannot be parsed).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The bootstrap servers did not answer a Metadata request in time.
    #[error("cannot reach bootstrap servers {bootstrap}: {reason}")]
    Unreachable { bootstrap: String, reason: String },
    /// The topic is missing and we were not asked to create it.
    #[error("topic '{0}' does not exist (pass --create-topic to create it)")]
    TopicMissing(String),
    /// CreateTopics failed.
    #[error("cannot create topic '{topic}': {reason}")]
    TopicCreate { topic: String, reason: String },
    /// DeleteTopics failed.
    #[error("cannot delete topic '{topic}': {reason}")]
    TopicDelete { topic: String, reason: String },
    /// The broker rejected every message it was sent (e.g. unsupported compression codec).
    #[error("broker rejected every message: {reason} ({failed} failed, 0 delivered)")]
    AllRejected { reason: String, failed: u64 },
    /// librdkafka refused to build a client from the configuration.
    #[error("librdkafka client error: {0}")]
    Client(String),
    /// Writing a report or reading a system file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A report could not be serialised.
    #[error("cannot serialise report: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl BenchError {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result alias for the library.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
