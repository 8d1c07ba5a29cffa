//! SASL PLAIN (RFC 4616): `[authzid] NUL authcid NUL password`, checked against the SCRAM
//! credential store ([`crate::Credentials::check_password`]).

use crate::AuthError;

/// Longest PLAIN message accepted (user and password are far shorter in practice).
const MAX_MESSAGE: usize = 4096;

fn malformed(reason: &str) -> AuthError {
    AuthError::Malformed {
        mechanism: "PLAIN",
        reason: reason.to_string(),
    }
}

/// Checks a PLAIN message with `check_password(user, password)`; the authenticated user on
/// success. An authorization id other than the user is refused, as Kafka does.
pub fn plain(
    message: &[u8],
    check_password: impl FnOnce(&str, &[u8]) -> bool,
) -> Result<String, AuthError> {
    if message.len() > MAX_MESSAGE {
        return Err(malformed("longer than 4096 bytes"));
    }
    let mut parts = message.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("expected [authzid] NUL user NUL password"));
    };
    let user = std::str::from_utf8(user).map_err(|_| malformed("the user is not UTF-8"))?;
    if user.is_empty() {
        return Err(malformed("empty user"));
    }
    if password.is_empty() {
        return Err(malformed("empty password"));
    }
    if !authzid.is_empty() && authzid != user.as_bytes() {
        return Err(AuthError::Unsupported(
            "an authorization id other than the user is not supported".into(),
        ));
    }
    if check_password(user, password) {
        Ok(user.to_string())
    } else {
        Err(AuthError::InvalidCredentials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Credentials, ScramAlgorithm, ScramCredential};

    fn store() -> Credentials {
        let mut c = Credentials::default();
        let alg = ScramAlgorithm::Sha256;
        c.set(
            "admin",
            alg,
            ScramCredential::generate(alg, b"secret", 4096).unwrap(),
        )
        .unwrap();
        c
    }

    #[test]
    fn the_right_password_authenticates_and_anything_else_does_not() {
        let c = store();
        let s = |u: &str, p: &[u8]| c.check_password(u, p);
        assert_eq!(plain(b"\0admin\0secret", s), Ok("admin".into()));
        assert_eq!(plain(b"admin\0admin\0secret", s), Ok("admin".into()));
        assert_eq!(
            plain(b"\0admin\0wrong", s),
            Err(AuthError::InvalidCredentials)
        );
        assert_eq!(
            plain(b"\0nobody\0secret", s),
            Err(AuthError::InvalidCredentials)
        );
        assert!(matches!(
            plain(b"other\0admin\0secret", s),
            Err(AuthError::Unsupported(_))
        ));
        for bad in [
            &b""[..],
            b"admin",
            b"\0admin",
            b"\0\0secret",
            b"\0admin\0",
            b"\0a\0b\0c",
        ] {
            assert!(
                matches!(plain(bad, s), Err(AuthError::Malformed { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            plain(&vec![b'a'; 5000], s),
            Err(AuthError::Malformed { .. })
        ));
    }
}
