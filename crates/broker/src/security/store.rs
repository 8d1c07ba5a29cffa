//! The broker's SCRAM credential store: what SASL checks passwords against, what
//! AlterUserScramCredentials changes. Standalone it lives in `<data>/security/scram-credentials.json`
//! (salts and derived keys only), written atomically.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use ring::rand::{SecureRandom, SystemRandom};
use spate_auth::{
    CredentialRecord, Credentials, CredentialsError, Mechanism, ScramAlgorithm, ScramCredential,
};

use crate::error::BrokerError;

/// Iterations of the credentials made for bootstrap users.
pub(crate) const BOOTSTRAP_ITERATIONS: u32 = 4096;
/// Addresses remembered for rate-limiting failure logs before the table is cleared.
const MAX_LOGGED_ADDRESSES: usize = 10_000;

/// How the broker authenticates clients.
#[derive(Debug, Clone)]
pub struct SecuritySettings {
    /// Mechanisms offered on SASL listeners (`--sasl-mechanisms`).
    pub mechanisms: Vec<Mechanism>,
    /// `connections.max.reauth.ms`: an authenticated session lasts this long before the
    /// client must re-authenticate (KIP-368); 0 for ever.
    pub reauth_ms: i64,
    /// Users given credentials on the first start (`SPATE_BOOTSTRAP_USERS`), as (user,
    /// password).
    pub bootstrap_users: Vec<(String, String)>,
    /// `--authorizer acl`: ACLs are enforced.
    pub authorizer: bool,
    /// Super users and the rule for resources without ACLs.
    pub acl: spate_auth::acl::AuthorizerConfig,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        Self {
            mechanisms: Mechanism::ALL.to_vec(),
            reauth_ms: 0,
            bootstrap_users: Vec::new(),
            authorizer: false,
            acl: Default::default(),
        }
    }
}

/// The credential store and what every SASL exchange shares.
pub struct CredentialStore {
    credentials: RwLock<Credentials>,
    /// Where it is kept; `None` for a store only in memory (tests).
    path: Option<PathBuf>,
    /// Salts shown to unknown users are derived from their names with this key.
    fake_salt_key: [u8; 32],
    /// When a failure from each address was last logged.
    logged: Mutex<std::collections::HashMap<IpAddr, Instant>>,
    /// Recently verified (user, password) pairs, by a keyed digest of both, so HTTP Basic
    /// (a password on every request) does not pay PBKDF2 each time. Cleared on any change.
    verified: Mutex<std::collections::HashMap<Vec<u8>, Instant>>,
}

impl std::fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn corrupt(path: &Path, reason: impl std::fmt::Display) -> BrokerError {
    BrokerError::CorruptMetadata {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

impl CredentialStore {
    /// A store kept only in memory.
    pub fn in_memory() -> Self {
        Self {
            credentials: RwLock::new(Credentials::default()),
            path: None,
            fake_salt_key: random_key(),
            logged: Mutex::new(Default::default()),
            verified: Mutex::new(Default::default()),
        }
    }

    /// Opens the store under `data_dir` (empty when it does not exist yet) and gives each
    /// bootstrap user without credentials SCRAM-SHA-256 and -512 ones.
    pub fn open(data_dir: &Path, bootstrap: &[(String, String)]) -> Result<Self, BrokerError> {
        let path = data_dir.join("security").join("scram-credentials.json");
        let credentials = match std::fs::read(&path) {
            Ok(bytes) => {
                let records: Vec<CredentialRecord> =
                    serde_json::from_slice(&bytes).map_err(|e| corrupt(&path, e))?;
                Credentials::from_records(&records).map_err(|e| corrupt(&path, e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Credentials::default(),
            Err(e) => return Err(crate::error::io("read", &path)(e)),
        };
        let store = Self {
            credentials: RwLock::new(credentials),
            path: Some(path),
            fake_salt_key: random_key(),
            logged: Mutex::new(Default::default()),
            verified: Mutex::new(Default::default()),
        };
        store.bootstrap(bootstrap)?;
        Ok(store)
    }

    /// A store whose contents come from the cluster's metadata ([`CredentialStore::replace`]):
    /// nothing on this node's disk, and the bootstrap users are proposed to the quorum.
    pub fn replicated(data_dir: &Path) -> Self {
        let old = data_dir.join("security").join("scram-credentials.json");
        if old.exists() {
            tracing::warn!(path = %old.display(), "this node is in a cluster: its credentials are the cluster's, the local file is not used");
        }
        Self::in_memory()
    }

    /// Replaces every credential with `records` (the cluster's, from a metadata image).
    pub fn replace(&self, records: &[CredentialRecord]) -> Result<(), CredentialsError> {
        let fresh = Credentials::from_records(records)?;
        *self.credentials.write() = fresh;
        self.verified.lock().clear();
        Ok(())
    }

    /// Gives each of `users` without any credential SCRAM-SHA-256 and -512 credentials.
    pub fn bootstrap(&self, users: &[(String, String)]) -> Result<(), BrokerError> {
        let mut added = Vec::new();
        {
            let mut c = self.credentials.write();
            for (user, password) in users {
                if c.contains(user) {
                    continue;
                }
                for alg in ScramAlgorithm::ALL {
                    let cred =
                        ScramCredential::generate(alg, password.as_bytes(), BOOTSTRAP_ITERATIONS)
                            .and_then(|cred| c.set(user, alg, cred));
                    cred.map_err(|e| BrokerError::Cluster(format!("bootstrap user {user}: {e}")))?;
                }
                added.push(user.clone());
            }
        }
        if !added.is_empty() {
            self.save()?;
            tracing::info!(users = ?added, "bootstrap users got SCRAM-SHA-256 and SCRAM-SHA-512 credentials");
        }
        Ok(())
    }

    /// A copy of the credentials, for a SASL exchange or a describe.
    pub fn snapshot(&self) -> Credentials {
        self.credentials.read().clone()
    }

    /// `user`'s credential for `alg`.
    pub fn get(&self, user: &str, alg: ScramAlgorithm) -> Option<ScramCredential> {
        self.credentials.read().get(user, alg).cloned()
    }

    /// Whether `password` is `user`'s (PLAIN).
    pub fn check_password(&self, user: &str, password: &[u8]) -> bool {
        // The derivation runs outside the lock: a copy of one user's credentials is cheap.
        let one = {
            let c = self.credentials.read();
            let mut one = Credentials::default();
            for alg in ScramAlgorithm::ALL {
                if let Some(cred) = c.get(user, alg) {
                    let _ = one.set(user, alg, cred.clone());
                }
            }
            one
        };
        one.check_password(user, password)
    }

    /// [`CredentialStore::check_password`] remembering a success for a minute (at most
    /// 1,024 pairs), for callers that see the password on every request (HTTP Basic).
    pub fn check_password_cached(&self, user: &str, password: &[u8]) -> bool {
        let key = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.fake_salt_key),
            &[user.as_bytes(), &[0], password].concat(),
        )
        .as_ref()
        .to_vec();
        let now = Instant::now();
        if self
            .verified
            .lock()
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < Duration::from_secs(60))
        {
            return true;
        }
        let ok = self.check_password(user, password);
        if ok {
            let mut v = self.verified.lock();
            if v.len() >= 1024 {
                v.clear();
            }
            v.insert(key, now);
        }
        ok
    }

    /// The key unknown users' salts are derived with.
    pub fn fake_salt_key(&self) -> [u8; 32] {
        self.fake_salt_key
    }

    /// Applies upserts and deletions (AlterUserScramCredentials) and saves once; each
    /// change's outcome in order.
    pub fn alter(
        &self,
        changes: Vec<Change>,
    ) -> Result<Vec<Result<(), CredentialsError>>, BrokerError> {
        let outcomes: Vec<Result<(), CredentialsError>> = {
            let mut c = self.credentials.write();
            changes
                .into_iter()
                .map(|change| match change {
                    Change::Upsert {
                        user,
                        alg,
                        credential,
                    } => c.set(&user, alg, credential),
                    Change::Delete { user, alg } => {
                        if c.remove(&user, alg) {
                            Ok(())
                        } else {
                            Err(CredentialsError::Invalid("no such credential"))
                        }
                    }
                })
                .collect()
        };
        if outcomes.iter().any(Result::is_ok) {
            self.verified.lock().clear();
            self.save()?;
        }
        Ok(outcomes)
    }

    fn save(&self) -> Result<(), BrokerError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let records = self.credentials.read().to_records();
        let bytes = serde_json::to_vec_pretty(&records).map_err(|e| corrupt(path, e))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(crate::error::io("create", dir))?;
        }
        crate::registry::write_atomically(path, &bytes)
    }

    /// Logs an authentication failure from `addr`, at most once a second per address.
    pub fn log_failure(&self, addr: Option<IpAddr>, user: &str, mechanism: &str, reason: &str) {
        let now = Instant::now();
        if let Some(ip) = addr {
            let mut logged = self.logged.lock();
            if logged.len() > MAX_LOGGED_ADDRESSES {
                logged.clear();
            }
            match logged.get(&ip) {
                Some(at) if now.duration_since(*at) < Duration::from_secs(1) => return,
                _ => {
                    logged.insert(ip, now);
                }
            }
        }
        tracing::warn!(
            address = ?addr,
            principal = %format!("User:{user}"),
            mechanism,
            reason,
            "authentication failed"
        );
    }
}

/// One change of AlterUserScramCredentials.
#[derive(Debug)]
pub enum Change {
    /// Sets a credential.
    Upsert {
        /// The user.
        user: String,
        /// Its hash.
        alg: ScramAlgorithm,
        /// The credential.
        credential: ScramCredential,
    },
    /// Removes a credential.
    Delete {
        /// The user.
        user: String,
        /// Its hash.
        alg: ScramAlgorithm,
    },
}

fn random_key() -> [u8; 32] {
    let mut k = [0u8; 32];
    // Without randomness every process derives the same fake salts: still no user shown.
    let _ = SystemRandom::new().fill(&mut k);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_users_get_both_credentials_once_and_they_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let users = vec![("admin".to_string(), "secret".to_string())];
        let s = CredentialStore::open(dir.path(), &users).unwrap();
        assert!(s.check_password("admin", b"secret"));
        for alg in ScramAlgorithm::ALL {
            assert!(s.get("admin", alg).is_some());
        }
        let text =
            std::fs::read_to_string(dir.path().join("security/scram-credentials.json")).unwrap();
        assert!(!text.contains("secret"), "no password on disk");
        // A second start with another password keeps the first credential.
        let changed = vec![("admin".to_string(), "other".to_string())];
        let s = CredentialStore::open(dir.path(), &changed).unwrap();
        assert!(s.check_password("admin", b"secret"));
        assert!(!s.check_password("admin", b"other"));
        let out = s
            .alter(vec![
                Change::Delete {
                    user: "admin".into(),
                    alg: ScramAlgorithm::Sha256,
                },
                Change::Delete {
                    user: "nobody".into(),
                    alg: ScramAlgorithm::Sha256,
                },
            ])
            .unwrap();
        assert!(out[0].is_ok() && out[1].is_err());
        let s = CredentialStore::open(dir.path(), &[]).unwrap();
        assert!(s.get("admin", ScramAlgorithm::Sha256).is_none());
        assert!(s.get("admin", ScramAlgorithm::Sha512).is_some());
    }

    #[test]
    fn a_corrupt_store_is_an_error_not_an_empty_store() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("security")).unwrap();
        std::fs::write(dir.path().join("security/scram-credentials.json"), b"{nope").unwrap();
        assert!(CredentialStore::open(dir.path(), &[]).is_err());
    }
}
