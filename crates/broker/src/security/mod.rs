//! Who is on each connection: the listeners and their security protocols, the SASL exchange
//! of one connection ([`Session`]), and the broker's credential store ([`CredentialStore`]).

mod acls;
pub mod addresses;
pub mod enforce;
pub mod enforce_cluster;
mod listeners;
mod session;
mod store;

pub use acls::Authorizer;
pub use listeners::{parse_listeners, Listener, SecurityProtocol};
pub use session::{Gate, Session};
pub(crate) use store::BOOTSTRAP_ITERATIONS;
pub use store::{Change, CredentialStore, SecuritySettings};

/// Metrics of authentication.
#[derive(Debug, Default)]
pub struct AuthMetrics {
    /// Successful SASL authentications (first and re-authentications).
    pub successes: spate_metrics::Counter,
    /// Failed SASL authentications (wrong password, unknown user, malformed exchange).
    pub failures: spate_metrics::Counter,
    /// Connections closed for a request before authentication or after the session expired.
    pub closed_unauthenticated: spate_metrics::Counter,
}
