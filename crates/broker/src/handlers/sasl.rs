//! SaslHandshake and SaslAuthenticate: a connection's SASL exchange, run by its
//! [`Session`](crate::security::Session).

use bytes::Bytes;
use spate_auth::Mechanism;
use spate_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use spate_protocol::StrBytes;

use super::msg;
use crate::security::Session;
use crate::Broker;

/// Answers SaslHandshake with the enabled mechanisms; an unknown one is
/// UNSUPPORTED_SASL_MECHANISM (and the connection closes after the answer, as in Kafka).
pub fn handshake(
    b: &Broker,
    session: &Session,
    version: i16,
    req: SaslHandshakeRequest,
) -> SaslHandshakeResponse {
    let settings = &b.config.security;
    let mut resp = SaslHandshakeResponse::default();
    resp.mechanisms = settings
        .mechanisms
        .iter()
        .map(|m| StrBytes::from_static_str(Mechanism::name(*m)))
        .collect();
    if let Err((code, reason)) = session.handshake(version, &req.mechanism, settings) {
        tracing::debug!(reason, "SaslHandshake refused");
        b.metrics.error(ApiKey::SaslHandshake as i16, code.code());
        resp.error_code = code.code();
    }
    resp
}

/// Answers SaslAuthenticate with the mechanism's next token; a failure is
/// SASL_AUTHENTICATION_FAILED with a message that never says whether the user exists, and
/// closes the connection after the answer.
pub fn authenticate(
    b: &Broker,
    session: &Session,
    version: i16,
    req: SaslAuthenticateRequest,
) -> SaslAuthenticateResponse {
    let mut resp = SaslAuthenticateResponse::default();
    match session.authenticate(&req.auth_bytes, &b.credentials, &b.config.security) {
        Ok((token, lifetime)) => {
            resp.auth_bytes = Bytes::from(token);
            if let Some(ms) = lifetime {
                b.auth.successes.inc();
                if version >= 1 {
                    resp.session_lifetime_ms = ms;
                }
            }
        }
        Err((code, message)) => {
            b.auth.failures.inc();
            b.metrics
                .error(ApiKey::SaslAuthenticate as i16, code.code());
            resp.error_code = code.code();
            resp.error_message = msg(message);
        }
    }
    resp
}

/// A raw SASL token after a v0 handshake: the mechanism's answer, or `None` when the
/// exchange failed (the connection then closes; raw framing has no way to say why).
pub fn raw_token(b: &Broker, session: &Session, token: &[u8]) -> Option<Vec<u8>> {
    match session.authenticate(token, &b.credentials, &b.config.security) {
        Ok((response, lifetime)) => {
            if lifetime.is_some() {
                b.auth.successes.inc();
            }
            Some(response)
        }
        Err(_) => {
            b.auth.failures.inc();
            None
        }
    }
}
