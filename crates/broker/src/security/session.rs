//! One connection's security state: which requests it may send, its SASL exchange (KIP-152
//! framing, or raw tokens after a v0 handshake), its principal, and when its session expires
//! (KIP-368 re-authentication).

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use spate_auth::{AuthError, Mechanism, Principal, ScramServer, Step};
use spate_protocol::ResponseError;

use super::{CredentialStore, SecurityProtocol, SecuritySettings};

/// API keys a connection may send before it has authenticated.
const API_VERSIONS: i16 = 18;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;

/// Whether a request may go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Handle it.
    Allow,
    /// Close the connection (Kafka does, for a request out of the SASL sequence).
    Close(&'static str),
}

enum State {
    /// Authenticated (or a listener without SASL); `expires` once re-authentication is due.
    Open { expires: Option<Instant> },
    /// A SASL listener's connection before its handshake; `reauth_of` when re-authenticating.
    AwaitHandshake { reauth_of: Option<Principal> },
    /// After the handshake: the exchange of `mechanism`, raw tokens after a v0 handshake.
    Exchange {
        mechanism: Mechanism,
        scram: Option<Box<ScramServer>>,
        raw: bool,
        reauth_of: Option<Principal>,
    },
}

/// The security state of one connection.
pub struct Session {
    protocol: SecurityProtocol,
    peer: Option<IpAddr>,
    state: Mutex<State>,
    principal: RwLock<Principal>,
    /// Set after a failed authentication: the connection closes once its answer is out.
    close: AtomicBool,
    /// Another node of the cluster, on the inter-node port (mutual TLS when the cluster
    /// uses it): replica fetches and the like, allowed whatever the ACLs say.
    internal: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("protocol", &self.protocol)
            .field("principal", &*self.principal.read())
            .finish_non_exhaustive()
    }
}

/// A failed SASL step: the error for the client and the reason for the log.
pub type Refusal = (ResponseError, String);

impl Session {
    /// A connection on a `protocol` listener from `peer`; `tls_principal` from its client
    /// certificate, if it showed one.
    pub fn new(
        protocol: SecurityProtocol,
        peer: Option<IpAddr>,
        tls_principal: Option<Principal>,
    ) -> Self {
        let state = if protocol.uses_sasl() {
            State::AwaitHandshake { reauth_of: None }
        } else {
            State::Open { expires: None }
        };
        Self {
            protocol,
            peer,
            state: Mutex::new(state),
            principal: RwLock::new(tls_principal.unwrap_or_else(Principal::anonymous)),
            close: AtomicBool::new(false),
            internal: false,
        }
    }

    /// Another node's connection on the inter-node port (see [`Session::is_internal`]).
    pub fn internal(peer: Option<IpAddr>) -> Self {
        Self {
            internal: true,
            ..Self::new(SecurityProtocol::Plaintext, peer, None)
        }
    }

    /// Whether this is another node of the cluster: the authorizer allows it everything,
    /// as Kafka's brokers are super users of each other.
    pub fn is_internal(&self) -> bool {
        self.internal
    }

    /// The listener's protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The client's address as ACL bindings name hosts (`*` when unknown).
    pub fn host(&self) -> String {
        self.peer
            .map_or_else(|| "*".to_string(), |ip| ip.to_string())
    }

    /// Who the client is: its SASL user, its certificate's `CN=...`, or `User:ANONYMOUS`.
    pub fn principal(&self) -> Principal {
        self.principal.read().clone()
    }

    /// Whether the client may send requests: authenticated, or a listener without SASL.
    pub fn is_authenticated(&self) -> bool {
        matches!(&*self.state.lock(), State::Open { .. })
    }

    /// Whether the connection must close once the answers already given are written.
    pub fn should_close(&self) -> bool {
        self.close.load(Ordering::Relaxed)
    }

    /// Whether the next frame is a raw SASL token (after a v0 handshake), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(&*self.state.lock(), State::Exchange { raw: true, .. })
    }

    /// Whether a request with `api_key` may be handled now.
    pub fn gate(&self, api_key: i16) -> Gate {
        match &*self.state.lock() {
            State::Open { expires } => match expires {
                Some(at)
                    if Instant::now() >= *at
                        && !matches!(
                            api_key,
                            API_VERSIONS | SASL_HANDSHAKE | SASL_AUTHENTICATE
                        ) =>
                {
                    Gate::Close("the SASL session expired without re-authentication")
                }
                _ => Gate::Allow,
            },
            State::AwaitHandshake { .. } => match api_key {
                API_VERSIONS | SASL_HANDSHAKE => Gate::Allow,
                _ => Gate::Close("a request before SASL authentication"),
            },
            State::Exchange { raw: false, .. } => match api_key {
                SASL_AUTHENTICATE => Gate::Allow,
                _ => {
                    Gate::Close("a request other than SaslAuthenticate during SASL authentication")
                }
            },
            State::Exchange { raw: true, .. } => {
                Gate::Close("a request where a SASL token was due")
            }
        }
    }

    /// SaslHandshake: starts an exchange of `mechanism` (re-authentication when already
    /// authenticated). UNSUPPORTED_SASL_MECHANISM for one not enabled (the connection then
    /// closes); ILLEGAL_SASL_STATE on a listener without SASL or in the middle of an exchange.
    pub fn handshake(
        &self,
        version: i16,
        mechanism: &str,
        settings: &SecuritySettings,
    ) -> Result<(), Refusal> {
        if !self.protocol.uses_sasl() {
            return Err((
                ResponseError::IllegalSaslState,
                format!("the {} listener does not use SASL", self.protocol),
            ));
        }
        let mut state = self.state.lock();
        let reauth_of = match &*state {
            State::AwaitHandshake { reauth_of } => reauth_of.clone(),
            // KIP-368: re-authentication needs the v1 framing.
            State::Open { .. } if version >= 1 => Some(self.principal()),
            _ => {
                self.close.store(true, Ordering::Relaxed);
                return Err((
                    ResponseError::IllegalSaslState,
                    "SaslHandshake out of order".into(),
                ));
            }
        };
        let Some(m) = Mechanism::parse(mechanism).filter(|m| settings.mechanisms.contains(m))
        else {
            self.close.store(true, Ordering::Relaxed);
            return Err((
                ResponseError::UnsupportedSaslMechanism,
                format!("unsupported SASL mechanism {mechanism}"),
            ));
        };
        *state = State::Exchange {
            mechanism: m,
            scram: None,
            raw: version == 0,
            reauth_of,
        };
        Ok(())
    }

    /// SaslAuthenticate (or a raw token): the next step of the exchange. `Ok((token, Some(
    /// lifetime_ms)))` once authenticated (lifetime 0: the session never expires), `Ok((token,
    /// None))` while it goes on. A failure closes the connection after its answer.
    pub fn authenticate(
        &self,
        token: &[u8],
        store: &CredentialStore,
        settings: &SecuritySettings,
    ) -> Result<(Vec<u8>, Option<i64>), Refusal> {
        let mut state = self.state.lock();
        let State::Exchange {
            mechanism,
            scram,
            reauth_of,
            ..
        } = &mut *state
        else {
            self.close.store(true, Ordering::Relaxed);
            return Err((
                ResponseError::IllegalSaslState,
                "SaslAuthenticate without a SaslHandshake before it".into(),
            ));
        };
        let mechanism = *mechanism;
        // Who the client said it is, for the log line of a failure.
        let mut claimed = String::new();
        let step: Result<Step, AuthError> = match mechanism.scram() {
            None => spate_auth::plain(token, |u, p| {
                claimed = u.to_string();
                store.check_password(u, p)
            })
            .map(|user| Step::Done {
                response: Vec::new(),
                user,
            }),
            Some(alg) => {
                if scram.is_none() {
                    match ScramServer::new(alg, store.fake_salt_key()) {
                        Ok(s) => *scram = Some(Box::new(s)),
                        Err(e) => return Err(self.fail(store, "", mechanism, &e)),
                    }
                }
                let Some(server) = scram.as_mut() else {
                    return Err(self.fail(store, "", mechanism, &AuthError::Finished));
                };
                let before = server.user().map(str::to_string);
                let step = server.step(token, |u| store.get(u, alg));
                claimed = server
                    .user()
                    .map(str::to_string)
                    .or(before)
                    .unwrap_or_default();
                step
            }
        };
        match step {
            Ok(Step::Continue(response)) => Ok((response, None)),
            Ok(Step::Done { response, user }) => {
                let principal = Principal::user(user);
                if let Some(before) = reauth_of.as_ref().filter(|p| **p != principal) {
                    self.close.store(true, Ordering::Relaxed);
                    return Err((
                        ResponseError::SaslAuthenticationFailed,
                        format!("re-authentication as {principal} on a connection of {before}: a connection keeps its principal"),
                    ));
                }
                let lifetime = settings.reauth_ms.max(0);
                *state = State::Open {
                    expires: (lifetime > 0)
                        .then(|| Instant::now() + Duration::from_millis(lifetime as u64)),
                };
                *self.principal.write() = principal;
                Ok((response, Some(lifetime)))
            }
            Err(e) => Err(self.fail(store, &claimed, mechanism, &e)),
        }
    }

    fn fail(
        &self,
        store: &CredentialStore,
        user: &str,
        mechanism: Mechanism,
        e: &AuthError,
    ) -> Refusal {
        self.close.store(true, Ordering::Relaxed);
        store.log_failure(self.peer, user, mechanism.name(), &e.to_string());
        // The same words whatever went wrong with the credentials: a client never learns
        // whether the user exists.
        let message = match e {
            AuthError::InvalidCredentials => format!(
                "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                mechanism.name()
            ),
            other => format!("Authentication failed: {other}"),
        };
        (ResponseError::SaslAuthenticationFailed, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> CredentialStore {
        let s = CredentialStore::in_memory();
        s.bootstrap(&[
            ("alice".into(), "wonder".into()),
            ("bob".into(), "builder".into()),
        ])
        .unwrap();
        s
    }

    fn sasl() -> Session {
        Session::new(SecurityProtocol::SaslPlaintext, None, None)
    }

    #[test]
    fn before_authentication_only_api_versions_and_the_exchange_pass() {
        let s = sasl();
        assert_eq!(s.gate(API_VERSIONS), Gate::Allow);
        assert_eq!(s.gate(SASL_HANDSHAKE), Gate::Allow);
        for key in [0, 1, 3, SASL_AUTHENTICATE] {
            assert!(matches!(s.gate(key), Gate::Close(_)), "key {key}");
        }
        let settings = SecuritySettings::default();
        s.handshake(1, "PLAIN", &settings).unwrap();
        assert_eq!(s.gate(SASL_AUTHENTICATE), Gate::Allow);
        assert!(matches!(s.gate(3), Gate::Close(_)), "metadata mid-exchange");
        assert!(!s.is_authenticated());
        let (_, lifetime) = s
            .authenticate(b"\0alice\0wonder", &store(), &settings)
            .unwrap();
        assert_eq!(lifetime, Some(0));
        assert!(s.is_authenticated());
        assert_eq!(s.principal().to_string(), "User:alice");
        assert_eq!(s.gate(0), Gate::Allow);
        assert!(!s.should_close());
    }

    #[test]
    fn a_wrong_password_an_unknown_mechanism_or_an_out_of_order_step_closes_the_connection() {
        let settings = SecuritySettings::default();
        let s = sasl();
        s.handshake(1, "PLAIN", &settings).unwrap();
        let (code, message) = s
            .authenticate(b"\0alice\0nope", &store(), &settings)
            .unwrap_err();
        assert_eq!(code, ResponseError::SaslAuthenticationFailed);
        let unknown = sasl();
        unknown.handshake(1, "PLAIN", &settings).unwrap();
        let (_, unknown_message) = unknown
            .authenticate(b"\0nobody\0nope", &store(), &settings)
            .unwrap_err();
        assert_eq!(
            message, unknown_message,
            "the same words for an unknown user"
        );
        assert!(s.should_close());
        let s = sasl();
        let (code, _) = s.handshake(1, "GSSAPI", &settings).unwrap_err();
        assert_eq!(code, ResponseError::UnsupportedSaslMechanism);
        assert!(s.should_close());
        let only_scram = SecuritySettings {
            mechanisms: vec![Mechanism::ScramSha512],
            ..SecuritySettings::default()
        };
        let s = sasl();
        assert!(
            s.handshake(1, "PLAIN", &only_scram).is_err(),
            "PLAIN not enabled"
        );
        let s = sasl();
        let (code, _) = s.authenticate(b"x", &store(), &settings).unwrap_err();
        assert_eq!(code, ResponseError::IllegalSaslState);
        let plain = Session::new(SecurityProtocol::Plaintext, None, None);
        assert_eq!(
            plain.handshake(1, "PLAIN", &settings).unwrap_err().0,
            ResponseError::IllegalSaslState
        );
        assert_eq!(plain.principal().to_string(), "User:ANONYMOUS");
    }

    #[test]
    fn an_expired_session_must_re_authenticate_as_the_same_principal() {
        let settings = SecuritySettings {
            reauth_ms: 1,
            ..SecuritySettings::default()
        };
        let store = store();
        let s = sasl();
        s.handshake(1, "PLAIN", &settings).unwrap();
        let (_, lifetime) = s
            .authenticate(b"\0alice\0wonder", &store, &settings)
            .unwrap();
        assert_eq!(lifetime, Some(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(matches!(s.gate(0), Gate::Close(_)), "expired");
        assert_eq!(s.gate(SASL_HANDSHAKE), Gate::Allow);
        s.handshake(1, "PLAIN", &settings).unwrap();
        s.authenticate(b"\0alice\0wonder", &store, &settings)
            .unwrap();
        assert_eq!(s.gate(0), Gate::Allow, "fresh again");
        std::thread::sleep(Duration::from_millis(5));
        s.handshake(1, "PLAIN", &settings).unwrap();
        let (code, _) = s
            .authenticate(b"\0bob\0builder", &store, &settings)
            .unwrap_err();
        assert_eq!(code, ResponseError::SaslAuthenticationFailed);
        assert!(s.should_close());
    }

    #[test]
    fn a_v0_handshake_switches_to_raw_tokens() {
        let settings = SecuritySettings::default();
        let s = sasl();
        s.handshake(0, "PLAIN", &settings).unwrap();
        assert!(s.expects_raw_token());
        s.authenticate(b"\0bob\0builder", &store(), &settings)
            .unwrap();
        assert!(!s.expects_raw_token());
        assert_eq!(s.principal().to_string(), "User:bob");
    }
}
