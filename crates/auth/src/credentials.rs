//! The credential store: per user and SCRAM hash, a salt, an iteration count and the two keys
//! RFC 5802 derives from the password. PLAIN checks a password by deriving the same keys, so
//! there is one store and no password is kept anywhere.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use thiserror::Error;

use crate::mechanism::ScramAlgorithm;

/// Fewest PBKDF2 iterations a credential may have (Kafka's floor for SCRAM).
pub const MIN_ITERATIONS: u32 = 4096;
/// Most PBKDF2 iterations a credential may have (Kafka's ceiling).
pub const MAX_ITERATIONS: u32 = 16384;
/// Salt bytes of a credential made here.
const SALT_BYTES: usize = 32;

/// Why a credential cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CredentialsError {
    /// An iteration count outside Kafka's range.
    #[error("iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {0}")]
    Iterations(i64),
    /// An empty user name.
    #[error("the user name is empty")]
    EmptyUser,
    /// A salt, stored key or server key of the wrong shape.
    #[error("invalid credential: {0}")]
    Invalid(&'static str),
    /// The system random generator failed.
    #[error("no randomness available for a salt")]
    Random,
}

/// One user's SCRAM credential for one hash function.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// The salt PBKDF2 ran with.
    pub salt: Vec<u8>,
    /// H(ClientKey): what a client proof is checked against.
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key"): signs the server's final message.
    pub server_key: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are password equivalents for SCRAM: never in logs.
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential of `password` with `salt` and `iterations` (RFC 5802 section 3).
    pub fn derive(alg: ScramAlgorithm, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = alg.salted_password(password, salt, iterations);
        let client_key = alg.hmac(&salted, b"Client Key");
        Self {
            salt: salt.to_vec(),
            stored_key: alg.hash(&client_key),
            server_key: alg.hmac(&salted, b"Server Key"),
            iterations,
        }
    }

    /// The credential of `password` with a fresh random salt.
    pub fn generate(
        alg: ScramAlgorithm,
        password: &[u8],
        iterations: u32,
    ) -> Result<Self, CredentialsError> {
        check_iterations(i64::from(iterations))?;
        let mut salt = vec![0u8; SALT_BYTES];
        SystemRandom::new()
            .fill(&mut salt)
            .map_err(|_| CredentialsError::Random)?;
        Ok(Self::derive(alg, password, &salt, iterations))
    }

    /// A credential whose keys were derived elsewhere (Kafka's AlterUserScramCredentials
    /// sends a salt and a salted password; `salted_password` is Hi(password, salt, i)).
    pub fn from_salted_password(
        alg: ScramAlgorithm,
        salt: &[u8],
        salted_password: &[u8],
        iterations: i64,
    ) -> Result<Self, CredentialsError> {
        check_iterations(iterations)?;
        if salt.is_empty() {
            return Err(CredentialsError::Invalid("empty salt"));
        }
        if salted_password.len() != alg.output_len() {
            return Err(CredentialsError::Invalid(
                "salted password length does not match the hash",
            ));
        }
        let client_key = alg.hmac(salted_password, b"Client Key");
        Ok(Self {
            salt: salt.to_vec(),
            stored_key: alg.hash(&client_key),
            server_key: alg.hmac(salted_password, b"Server Key"),
            iterations: iterations as u32,
        })
    }

    /// Whether `password` is the one this credential was made from (constant time).
    pub fn matches(&self, alg: ScramAlgorithm, password: &[u8]) -> bool {
        let other = Self::derive(alg, password, &self.salt, self.iterations);
        bool::from(other.stored_key.ct_eq(&self.stored_key))
    }
}

fn check_iterations(i: i64) -> Result<(), CredentialsError> {
    if (i64::from(MIN_ITERATIONS)..=i64::from(MAX_ITERATIONS)).contains(&i) {
        Ok(())
    } else {
        Err(CredentialsError::Iterations(i))
    }
}

/// Every user's SCRAM credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    users: BTreeMap<String, BTreeMap<ScramAlgorithm, ScramCredential>>,
}

impl Credentials {
    /// The credential of `user` for `alg`.
    pub fn get(&self, user: &str, alg: ScramAlgorithm) -> Option<&ScramCredential> {
        self.users.get(user)?.get(&alg)
    }

    /// Sets the credential of `user` for `alg`.
    pub fn set(
        &mut self,
        user: &str,
        alg: ScramAlgorithm,
        credential: ScramCredential,
    ) -> Result<(), CredentialsError> {
        if user.is_empty() {
            return Err(CredentialsError::EmptyUser);
        }
        check_iterations(i64::from(credential.iterations))?;
        self.users
            .entry(user.to_string())
            .or_default()
            .insert(alg, credential);
        Ok(())
    }

    /// Removes the credential of `user` for `alg`; whether there was one.
    pub fn remove(&mut self, user: &str, alg: ScramAlgorithm) -> bool {
        let Some(algs) = self.users.get_mut(user) else {
            return false;
        };
        let had = algs.remove(&alg).is_some();
        if algs.is_empty() {
            self.users.remove(user);
        }
        had
    }

    /// Whether `password` is `user`'s, by any of the user's SCRAM credentials (what PLAIN
    /// checks). An unknown user costs the same derivation as a known one.
    pub fn check_password(&self, user: &str, password: &[u8]) -> bool {
        match self.users.get(user).and_then(|a| a.iter().next()) {
            Some((alg, cred)) => cred.matches(*alg, password),
            None => {
                // Same work as a real check, so timing does not tell who exists.
                let _ = ScramCredential::derive(
                    ScramAlgorithm::Sha256,
                    password,
                    b"no such user",
                    MIN_ITERATIONS,
                );
                false
            }
        }
    }

    /// Users and the (algorithm, iterations) of each of their credentials, by name.
    pub fn describe(&self) -> Vec<(String, Vec<(ScramAlgorithm, u32)>)> {
        self.users
            .iter()
            .map(|(u, a)| {
                (
                    u.clone(),
                    a.iter().map(|(k, c)| (*k, c.iterations)).collect(),
                )
            })
            .collect()
    }

    /// Whether `user` has any credential.
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Whether no user has a credential.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// The store as stored on disk or in the metadata log: salts and keys, base64.
    pub fn to_records(&self) -> Vec<CredentialRecord> {
        self.users
            .iter()
            .flat_map(|(user, algs)| {
                algs.iter()
                    .map(move |(alg, c)| CredentialRecord::new(user, *alg, c))
            })
            .collect()
    }

    /// The store of [`Credentials::to_records`]'s records.
    pub fn from_records(records: &[CredentialRecord]) -> Result<Self, CredentialsError> {
        let mut c = Self::default();
        for r in records {
            let (alg, cred) = r.credential()?;
            c.set(&r.user, alg, cred)?;
        }
        Ok(c)
    }
}

/// One credential as stored: what [`Credentials`] persists and replicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialRecord {
    /// The user.
    pub user: String,
    /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    /// Base64 salt.
    pub salt: String,
    /// Base64 StoredKey.
    pub stored_key: String,
    /// Base64 ServerKey.
    pub server_key: String,
    /// PBKDF2 iterations.
    pub iterations: u32,
}

impl CredentialRecord {
    /// The record of `user`'s credential for `alg`.
    pub fn new(user: &str, alg: ScramAlgorithm, c: &ScramCredential) -> Self {
        Self {
            user: user.to_string(),
            mechanism: alg.mechanism().name().to_string(),
            salt: B64.encode(&c.salt),
            stored_key: B64.encode(&c.stored_key),
            server_key: B64.encode(&c.server_key),
            iterations: c.iterations,
        }
    }

    /// The algorithm and credential it holds.
    pub fn credential(&self) -> Result<(ScramAlgorithm, ScramCredential), CredentialsError> {
        let alg = crate::Mechanism::parse(&self.mechanism)
            .and_then(|m| m.scram())
            .ok_or(CredentialsError::Invalid("not a SCRAM mechanism"))?;
        let bytes = |s: &str| {
            B64.decode(s)
                .map_err(|_| CredentialsError::Invalid("not base64"))
        };
        let c = ScramCredential {
            salt: bytes(&self.salt)?,
            stored_key: bytes(&self.stored_key)?,
            server_key: bytes(&self.server_key)?,
            iterations: self.iterations,
        };
        if c.stored_key.len() != alg.output_len() || c.server_key.len() != alg.output_len() {
            return Err(CredentialsError::Invalid(
                "key length does not match the hash",
            ));
        }
        Ok((alg, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_matches_its_credential_and_nothing_else() {
        for alg in ScramAlgorithm::ALL {
            let c = ScramCredential::generate(alg, b"pencil", 4096).unwrap();
            assert!(c.matches(alg, b"pencil"));
            assert!(!c.matches(alg, b"pencil "));
            assert!(!c.matches(alg, b""));
            let again = ScramCredential::generate(alg, b"pencil", 4096).unwrap();
            assert_ne!(c.salt, again.salt, "every credential gets its own salt");
        }
    }

    #[test]
    fn iterations_outside_kafkas_range_are_refused() {
        assert_eq!(
            ScramCredential::generate(ScramAlgorithm::Sha256, b"p", 4095),
            Err(CredentialsError::Iterations(4095))
        );
        let salted = vec![0u8; 32];
        assert!(ScramCredential::from_salted_password(
            ScramAlgorithm::Sha256,
            b"s",
            &salted,
            16385
        )
        .is_err());
        assert!(ScramCredential::from_salted_password(
            ScramAlgorithm::Sha256,
            b"s",
            &salted[..31],
            4096
        )
        .is_err());
        assert!(
            ScramCredential::from_salted_password(ScramAlgorithm::Sha256, b"", &salted, 4096)
                .is_err()
        );
    }

    #[test]
    fn a_salted_password_from_a_client_gives_the_same_credential_as_the_password() {
        let alg = ScramAlgorithm::Sha512;
        let salted = alg.salted_password(b"secret", b"salt", 8192);
        let c = ScramCredential::from_salted_password(alg, b"salt", &salted, 8192).unwrap();
        assert_eq!(c, ScramCredential::derive(alg, b"secret", b"salt", 8192));
        assert!(c.matches(alg, b"secret"));
    }

    #[test]
    fn the_store_checks_plain_passwords_removes_and_round_trips_through_records() {
        let mut s = Credentials::default();
        for alg in ScramAlgorithm::ALL {
            s.set(
                "alice",
                alg,
                ScramCredential::generate(alg, b"wonder", 4096).unwrap(),
            )
            .unwrap();
        }
        assert!(s.check_password("alice", b"wonder"));
        assert!(!s.check_password("alice", b"land"));
        assert!(!s.check_password("bob", b"wonder"));
        let records = s.to_records();
        let text = serde_json::to_string(&records).unwrap();
        assert!(!text.contains("wonder"), "no password is stored");
        let back: Vec<CredentialRecord> = serde_json::from_str(&text).unwrap();
        assert_eq!(Credentials::from_records(&back).unwrap(), s);
        assert!(s.remove("alice", ScramAlgorithm::Sha256));
        assert!(!s.remove("alice", ScramAlgorithm::Sha256));
        assert!(
            s.check_password("alice", b"wonder"),
            "the SHA-512 one remains"
        );
        assert!(s.remove("alice", ScramAlgorithm::Sha512));
        assert!(!s.contains("alice"));
        assert!(s
            .set(
                "",
                ScramAlgorithm::Sha256,
                ScramCredential::derive(ScramAlgorithm::Sha256, b"x", b"s", 4096)
            )
            .is_err());
    }
}
