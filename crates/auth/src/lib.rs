//! Who a Kafka client is: the SASL mechanisms spate offers (PLAIN and SCRAM-SHA-256/512), each
//! a pure exchange of tokens, and the one credential store both check passwords against
//! (salted and iterated SCRAM credentials; no password is ever kept).

pub mod acl;
mod credentials;
mod mechanism;
mod plain;
mod scram;

pub use credentials::{
    CredentialRecord, Credentials, CredentialsError, ScramCredential, MAX_ITERATIONS,
    MIN_ITERATIONS,
};
pub use mechanism::{Mechanism, ScramAlgorithm};
pub use plain::plain;
pub use scram::{ScramServer, Step};

use thiserror::Error;

/// Why an exchange ended without a principal.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AuthError {
    /// The client's message does not follow the mechanism's grammar.
    #[error("malformed {mechanism} message: {reason}")]
    Malformed {
        /// The mechanism's name.
        mechanism: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// Wrong password or unknown user: the client is never told which.
    #[error("invalid credentials")]
    InvalidCredentials,
    /// Something the mechanism allows that spate does not offer (channel binding,
    /// delegation tokens, an authorization id other than the user).
    #[error("{0}")]
    Unsupported(String),
    /// A message after the exchange ended.
    #[error("the exchange is already over")]
    Finished,
}

/// A client's identity once authenticated, as Kafka writes it (`User:alice`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    /// `User` for every principal spate makes.
    pub kind: String,
    /// The user name (or a certificate's `CN=...`).
    pub name: String,
}

impl Principal {
    /// `User:<name>`.
    pub fn user(name: impl Into<String>) -> Self {
        Self {
            kind: "User".into(),
            name: name.into(),
        }
    }

    /// The principal of a client that did not authenticate: `User:ANONYMOUS`, as Kafka.
    pub fn anonymous() -> Self {
        Self::user("ANONYMOUS")
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}
