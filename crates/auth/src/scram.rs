//! The server side of a SCRAM exchange (RFC 5802, with SHA-256 per RFC 7677 or SHA-512):
//! client-first -> server-first, client-final -> server-final. Written here because it is a
//! few dozen lines over ring's HMAC and PBKDF2, and the crates that offer it pull a second
//! crypto stack into the binary.
//!
//! An unknown user gets a server-first like any other (a salt derived from the name with a
//! per-process key), and then the same failure as a wrong password: a client never learns
//! whether a user exists.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;

use crate::credentials::{ScramCredential, MIN_ITERATIONS};
use crate::mechanism::ScramAlgorithm;
use crate::AuthError;

/// Longest client message accepted.
const MAX_MESSAGE: usize = 4096;
/// Random bytes in the server's part of the nonce.
const NONCE_BYTES: usize = 24;

/// What a step of an exchange produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this to the client and wait for its next message.
    Continue(Vec<u8>),
    /// Authenticated as `user`; send `response` (the server-final message).
    Done {
        /// The server-final message.
        response: Vec<u8>,
        /// The authenticated user.
        user: String,
    },
}

enum State {
    ClientFirst,
    ClientFinal {
        user: String,
        /// `None` for an unknown user: the exchange goes on and fails at the proof.
        credential: Option<ScramCredential>,
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
    Over,
}

/// One SCRAM exchange on the server side.
pub struct ScramServer {
    alg: ScramAlgorithm,
    state: State,
    server_nonce: String,
    /// Key for the salts of unknown users (per process, so they are stable while it runs).
    fake_salt_key: [u8; 32],
}

fn malformed(alg: ScramAlgorithm, reason: impl Into<String>) -> AuthError {
    AuthError::Malformed {
        mechanism: alg.mechanism().name(),
        reason: reason.into(),
    }
}

impl ScramServer {
    /// A new exchange with a random server nonce. `fake_salt_key` (random, per process) makes
    /// the salts shown for unknown users.
    pub fn new(alg: ScramAlgorithm, fake_salt_key: [u8; 32]) -> Result<Self, AuthError> {
        let mut bytes = [0u8; NONCE_BYTES];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| AuthError::Unsupported("no randomness available".into()))?;
        Ok(Self::with_nonce(alg, B64.encode(bytes), fake_salt_key))
    }

    /// A new exchange with a given server nonce (tests: RFC 7677's example).
    pub fn with_nonce(alg: ScramAlgorithm, server_nonce: String, fake_salt_key: [u8; 32]) -> Self {
        Self {
            alg,
            state: State::ClientFirst,
            server_nonce,
            fake_salt_key,
        }
    }

    /// The user named in the client-first message, once it arrived.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            State::ClientFinal { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Takes the client's next message. `lookup` finds a user's credential for this hash.
    /// Any error ends the exchange.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Step, AuthError> {
        let state = std::mem::replace(&mut self.state, State::Over);
        let alg = self.alg;
        if message.len() > MAX_MESSAGE {
            return Err(malformed(alg, "longer than 4096 bytes"));
        }
        let text = std::str::from_utf8(message).map_err(|_| malformed(alg, "not UTF-8"))?;
        match state {
            State::ClientFirst => self.client_first(text, lookup),
            State::ClientFinal {
                user,
                credential,
                gs2_header,
                client_first_bare,
                server_first,
                nonce,
            } => {
                let ctx = Final {
                    gs2_header: &gs2_header,
                    client_first_bare: &client_first_bare,
                    server_first: &server_first,
                    nonce: &nonce,
                };
                let response = client_final(alg, text, &ctx, credential.as_ref())?;
                Ok(Step::Done { response, user })
            }
            State::Over => Err(AuthError::Finished),
        }
    }

    fn client_first(
        &mut self,
        text: &str,
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<Step, AuthError> {
        let alg = self.alg;
        // gs2-header: cbind-flag "," [authzid] ","
        let (flag, rest) = text
            .split_once(',')
            .ok_or_else(|| malformed(alg, "no GS2 header"))?;
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => {
                return Err(AuthError::Unsupported(
                    "channel binding is not supported".into(),
                ))
            }
            _ => return Err(malformed(alg, "bad channel binding flag")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| malformed(alg, "no GS2 header"))?;
        let authzid = match authzid {
            "" => None,
            a => Some(
                decode_name(
                    a.strip_prefix("a=")
                        .ok_or_else(|| malformed(alg, "bad authorization id"))?,
                )
                .ok_or_else(|| malformed(alg, "bad authorization id"))?,
            ),
        };
        let gs2_header = text[..text.len() - bare.len()].to_string();
        let mut attrs = bare.split(',');
        let user = attrs
            .next()
            .and_then(|a| a.strip_prefix("n="))
            .and_then(decode_name)
            .ok_or_else(|| malformed(alg, "the first attribute must be n=<user>"))?;
        if user.is_empty() {
            return Err(malformed(alg, "empty user"));
        }
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or_else(|| malformed(alg, "the second attribute must be r=<nonce>"))?;
        if client_nonce.is_empty() || !client_nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(malformed(alg, "bad client nonce"));
        }
        for ext in attrs {
            let (name, value) = ext
                .split_once('=')
                .ok_or_else(|| malformed(alg, "bad extension"))?;
            if name == "tokenauth" && value == "true" {
                return Err(AuthError::Unsupported(
                    "delegation tokens are not supported".into(),
                ));
            }
        }
        if authzid.as_ref().is_some_and(|a| *a != user) {
            return Err(AuthError::Unsupported(
                "an authorization id other than the user is not supported".into(),
            ));
        }
        let credential = lookup(&user);
        let (salt, iterations) = match &credential {
            Some(c) => (c.salt.clone(), c.iterations),
            None => (
                alg.hmac(&self.fake_salt_key, user.as_bytes()),
                MIN_ITERATIONS,
            ),
        };
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(salt));
        self.state = State::ClientFinal {
            user,
            credential,
            gs2_header,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok(Step::Continue(server_first.into_bytes()))
    }
}

/// What the final step checks against.
struct Final<'a> {
    gs2_header: &'a str,
    client_first_bare: &'a str,
    server_first: &'a str,
    nonce: &'a str,
}

fn client_final(
    alg: ScramAlgorithm,
    text: &str,
    ctx: &Final<'_>,
    credential: Option<&ScramCredential>,
) -> Result<Vec<u8>, AuthError> {
    let (without_proof, proof) = text
        .rsplit_once(",p=")
        .ok_or_else(|| malformed(alg, "no proof"))?;
    let mut attrs = without_proof.split(',');
    let binding = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or_else(|| malformed(alg, "the first attribute must be c=<binding>"))?;
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed(alg, "the second attribute must be r=<nonce>"))?;
    if B64.decode(binding).ok().as_deref() != Some(ctx.gs2_header.as_bytes()) {
        return Err(malformed(
            alg,
            "channel binding does not match the GS2 header",
        ));
    }
    let proof = B64
        .decode(proof)
        .map_err(|_| malformed(alg, "proof is not base64"))?;
    if proof.len() != alg.output_len() {
        return Err(malformed(alg, "proof has the wrong length"));
    }
    if nonce != ctx.nonce {
        // A replayed or forged final message.
        return Err(AuthError::InvalidCredentials);
    }
    let Some(credential) = credential else {
        return Err(AuthError::InvalidCredentials);
    };
    let auth_message = format!(
        "{},{},{without_proof}",
        ctx.client_first_bare, ctx.server_first
    );
    let signature = alg.hmac(&credential.stored_key, auth_message.as_bytes());
    let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
    if !bool::from(alg.hash(&client_key).ct_eq(&credential.stored_key)) {
        return Err(AuthError::InvalidCredentials);
    }
    let server_signature = alg.hmac(&credential.server_key, auth_message.as_bytes());
    Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
}

/// A saslname: `=2C` is a comma and `=3D` an equals sign; any other `=` is invalid.
fn decode_name(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 3) {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    /// RFC 7677's example: user "user", password "pencil".
    fn rfc7677_credential() -> ScramCredential {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        ScramCredential::derive(ScramAlgorithm::Sha256, b"pencil", &salt, 4096)
    }

    #[test]
    fn rfc_7677_example_exchange_succeeds_with_the_rfcs_messages() {
        let mut s = ScramServer::with_nonce(
            ScramAlgorithm::Sha256,
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            KEY,
        );
        let first = s
            .step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", |u| {
                (u == "user").then(rfc7677_credential)
            })
            .unwrap();
        assert_eq!(
            first,
            Step::Continue(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
                    .to_vec()
            )
        );
        let last = s
            .step(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                |_| None,
            )
            .unwrap();
        assert_eq!(
            last,
            Step::Done {
                response: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec(),
                user: "user".into()
            }
        );
        assert_eq!(s.step(b"again", |_| None), Err(AuthError::Finished));
    }

    /// A client's side of the exchange, to drive the server with any password.
    fn client_final(
        alg: ScramAlgorithm,
        password: &[u8],
        server_first: &str,
        bare: &str,
    ) -> String {
        let mut salt = None;
        let mut iterations = 0;
        let mut nonce = "";
        for a in server_first.split(',') {
            match a.split_at(2) {
                ("r=", v) => nonce = v,
                ("s=", v) => salt = Some(B64.decode(v).unwrap()),
                ("i=", v) => iterations = v.parse().unwrap(),
                _ => {}
            }
        }
        let salted = alg.salted_password(password, &salt.unwrap(), iterations);
        let client_key = alg.hmac(&salted, b"Client Key");
        let stored = alg.hash(&client_key);
        let without = format!("c=biws,r={nonce}");
        let auth = format!("{bare},{server_first},{without}");
        let sig = alg.hmac(&stored, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        format!("{without},p={}", B64.encode(proof))
    }

    fn exchange(alg: ScramAlgorithm, user: &str, password: &[u8]) -> Result<Step, AuthError> {
        let cred = ScramCredential::derive(alg, b"right", b"salty", 4096);
        let lookup = |u: &str| (u == "al,i=ce").then(|| cred.clone());
        let mut s = ScramServer::new(alg, KEY).unwrap();
        let bare = format!(
            "n={},r=abcdef",
            user.replace('=', "=3D").replace(',', "=2C")
        );
        let Step::Continue(first) = s.step(format!("n,,{bare}").as_bytes(), lookup)? else {
            panic!("no server-first")
        };
        let first = String::from_utf8(first).unwrap();
        s.step(
            client_final(alg, password, &first, &bare).as_bytes(),
            |_| None,
        )
    }

    #[test]
    fn both_hashes_authenticate_the_right_password_and_refuse_a_wrong_one_or_unknown_user() {
        for alg in ScramAlgorithm::ALL {
            assert!(matches!(
                exchange(alg, "al,i=ce", b"right"),
                Ok(Step::Done { user, .. }) if user == "al,i=ce"
            ));
            assert_eq!(
                exchange(alg, "al,i=ce", b"wrong"),
                Err(AuthError::InvalidCredentials)
            );
            assert_eq!(
                exchange(alg, "bob", b"right"),
                Err(AuthError::InvalidCredentials)
            );
        }
    }

    #[test]
    fn an_unknown_user_sees_a_stable_salt_and_the_usual_iterations() {
        let first = |user: &str| {
            let mut s = ScramServer::new(ScramAlgorithm::Sha256, KEY).unwrap();
            match s
                .step(format!("n,,n={user},r=x").as_bytes(), |_| None)
                .unwrap()
            {
                Step::Continue(m) => String::from_utf8(m).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        let salt = |m: String| m.split(',').nth(1).unwrap().to_string();
        assert_eq!(salt(first("ghost")), salt(first("ghost")));
        assert_ne!(salt(first("ghost")), salt(first("other")));
        assert!(first("ghost").ends_with(",i=4096"));
    }

    #[test]
    fn a_replayed_final_message_fails_against_a_new_server_nonce() {
        let alg = ScramAlgorithm::Sha256;
        let cred = ScramCredential::derive(alg, b"pw", b"salt", 4096);
        let mut s = ScramServer::new(alg, KEY).unwrap();
        let Step::Continue(first) = s.step(b"n,,n=u,r=nonce", |_| Some(cred.clone())).unwrap()
        else {
            panic!()
        };
        let fin = client_final(
            alg,
            b"pw",
            &String::from_utf8(first).unwrap(),
            "n=u,r=nonce",
        );
        assert!(matches!(
            s.step(fin.as_bytes(), |_| None),
            Ok(Step::Done { .. })
        ));
        let mut again = ScramServer::new(alg, KEY).unwrap();
        again
            .step(b"n,,n=u,r=nonce", |_| Some(cred.clone()))
            .unwrap();
        assert_eq!(
            again.step(fin.as_bytes(), |_| None),
            Err(AuthError::InvalidCredentials)
        );
    }

    #[test]
    fn malformed_and_unsupported_messages_are_refused() {
        let alg = ScramAlgorithm::Sha512;
        let cred = ScramCredential::derive(alg, b"pw", b"salt", 4096);
        let first = |m: &[u8]| {
            ScramServer::new(alg, KEY)
                .unwrap()
                .step(m, |_| Some(cred.clone()))
        };
        for bad in [
            &b""[..],
            b"n,,",
            b"x,,n=u,r=a",
            b"n,,r=a,n=u",
            b"n,,n=u",
            b"n,,n=,r=a",
            b"n,,n=u=41,r=a",
            b"n,,n=u,r=",
            b"n,,n=u,r=a b",
            b"n,b=x,n=u,r=a",
            b"\xff\xfe",
        ] {
            assert!(
                matches!(first(bad), Err(AuthError::Malformed { .. })),
                "{bad:?}"
            );
        }
        for unsupported in [
            &b"p=tls-unique,,n=u,r=a"[..],
            b"n,a=admin,n=u,r=a",
            b"n,,n=u,r=a,tokenauth=true",
        ] {
            assert!(
                matches!(first(unsupported), Err(AuthError::Unsupported(_))),
                "{unsupported:?}"
            );
        }
        assert!(matches!(
            first(&vec![b'n'; 5000]),
            Err(AuthError::Malformed { .. })
        ));
        let fin = |m: &[u8]| {
            let mut s = ScramServer::new(alg, KEY).unwrap();
            s.step(b"n,,n=u,r=a", |_| Some(cred.clone())).unwrap();
            s.step(m, |_| None)
        };
        for bad in [
            &b"c=biws,r=a"[..],
            b"r=a,c=biws,p=AA==",
            b"c=eSws,r=a,p=AA==",
            b"c=biws,r=a,p=***",
        ] {
            assert!(
                matches!(fin(bad), Err(AuthError::Malformed { .. })),
                "{bad:?}"
            );
        }
        // A wrong nonce or a proof of the right length that is wrong: invalid credentials.
        let proof = B64.encode([0u8; 64]);
        assert_eq!(
            fin(format!("c=biws,r=zzz,p={proof}").as_bytes()),
            Err(AuthError::InvalidCredentials)
        );
        let mut s = ScramServer::new(alg, KEY).unwrap();
        let Step::Continue(m) = s.step(b"n,,n=u,r=a", |_| Some(cred.clone())).unwrap() else {
            panic!()
        };
        let nonce = String::from_utf8(m).unwrap().split(',').next().unwrap()[2..].to_string();
        assert_eq!(
            s.step(format!("c=biws,r={nonce},p={proof}").as_bytes(), |_| None),
            Err(AuthError::InvalidCredentials)
        );
    }

    #[test]
    fn saslnames_decode_their_escapes_only() {
        assert_eq!(decode_name("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_name("plain").as_deref(), Some("plain"));
        assert_eq!(decode_name("bad=2"), None);
        assert_eq!(decode_name("bad=41"), None);
    }
}
