//! Errors of indexing and searching, with the Elasticsearch error type each maps to.

use thiserror::Error;

/// A failed search or index operation.
#[derive(Debug, Error)]
pub enum SearchError {
    /// The request is malformed or uses something unsupported; answered 400 with the clause.
    #[error("{reason}")]
    BadRequest {
        /// Elasticsearch's error type, e.g. `parsing_exception`.
        kind: &'static str,
        /// What is wrong, naming the clause.
        reason: String,
    },
    /// The topic does not exist.
    #[error("no such index [{0}]")]
    NoSuchTopic(String),
    /// The topic exists but `search.enabled` is off.
    #[error("topic [{0}] is not searchable: set search.enabled=true on it")]
    NotSearchable(String),
    /// The query ran past its time budget.
    #[error("the search took longer than {0} ms and was stopped; narrow the query")]
    Timeout(u64),
    /// No search slot came free within the queue limit (milliseconds): 429, which clients
    /// retry, as Elasticsearch refuses a search its full search queue cannot hold.
    #[error("no search slot came free within {0} ms: too many searches at once; retry")]
    Rejected(u64),
    /// No partition of the search could be answered (indexes not open yet, replicas down):
    /// 503, which clients retry, as Elasticsearch answers while shards start.
    #[error("all shards failed: {0}")]
    Unavailable(String),
    /// The index could not be read or written.
    #[error("index error: {reason}")]
    Index {
        /// What failed.
        reason: String,
    },
}

impl SearchError {
    /// A 400 `parsing_exception` about a clause.
    pub fn parsing(reason: impl Into<String>) -> Self {
        Self::BadRequest {
            kind: "parsing_exception",
            reason: reason.into(),
        }
    }

    /// A 400 `illegal_argument_exception`.
    pub fn illegal(reason: impl Into<String>) -> Self {
        Self::BadRequest {
            kind: "illegal_argument_exception",
            reason: reason.into(),
        }
    }

    /// The HTTP status Elasticsearch would answer.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest { .. } | Self::NotSearchable(_) | Self::Timeout(_) => 400,
            Self::NoSuchTopic(_) => 404,
            Self::Rejected(_) => 429,
            Self::Unavailable(_) => 503,
            Self::Index { .. } => 500,
        }
    }

    /// Elasticsearch's error `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::BadRequest { kind, .. } => kind,
            Self::NoSuchTopic(_) => "index_not_found_exception",
            Self::NotSearchable(_) => "illegal_argument_exception",
            Self::Timeout(_) => "search_timeout_exception",
            Self::Rejected(_) => "es_rejected_execution_exception",
            Self::Unavailable(_) | Self::Index { .. } => "search_phase_execution_exception",
        }
    }

    /// The error body in Elasticsearch's shape.
    pub fn to_json(&self) -> serde_json::Value {
        let cause = serde_json::json!({"type": self.kind(), "reason": self.to_string()});
        serde_json::json!({
            "error": {"root_cause": [cause.clone()], "type": self.kind(), "reason": self.to_string()},
            "status": self.status(),
        })
    }
}

impl From<tantivy::TantivyError> for SearchError {
    fn from(e: tantivy::TantivyError) -> Self {
        Self::Index {
            reason: e.to_string(),
        }
    }
}
