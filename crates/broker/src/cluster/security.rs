//! SCRAM credentials and ACLs of a cluster: they live in the replicated metadata, so every
//! node authenticates and authorizes alike. A change is proposed to the quorum and answered
//! once this node's image shows it (a client that adds an ACL and lists them at once sees
//! it); every node copies the tables into its [`CredentialStore`] and [`Authorizer`] as
//! images arrive.

use std::sync::{Arc, Weak};
use std::time::Duration;

use spate_auth::acl::{AclBinding, AclFilter, InvalidBinding};
use spate_auth::{CredentialRecord, ScramAlgorithm, ScramCredential};
use spate_cluster::metadata::{CommandOutcome, MetadataCommand, MetadataImage};

use super::Cluster;
use crate::error::BrokerError;
use crate::security::{Authorizer, Change, CredentialStore};

/// How long a change waits for this node's image to show it before answering anyway (it
/// is committed; the node is only behind).
const VISIBLE_WITHIN: Duration = Duration::from_secs(5);
/// Pause between attempts to propose the bootstrap users while no quorum is reachable.
const BOOTSTRAP_RETRY: Duration = Duration::from_secs(1);

/// What the security tables are copied into on this node.
pub(crate) struct SecurityTables {
    /// The credential store SASL and HTTP Basic check.
    pub(crate) credentials: Arc<CredentialStore>,
    /// The authorizer every request asks.
    pub(crate) authorizer: Arc<Authorizer>,
    /// `SPATE_BOOTSTRAP_USERS`, proposed once the quorum answers.
    pub(crate) bootstrap_users: Vec<(String, String)>,
}

/// Copies the credentials and ACLs of each new image into this node's stores (only when
/// they changed: the tables are shared `Arc`s), and proposes the bootstrap users once.
pub(super) async fn sync_loop(cluster: Weak<Cluster>) {
    let Some(c) = cluster.upgrade() else {
        return;
    };
    let mut images = c.node.subscribe();
    let bootstrap = c.local.security.bootstrap_users.clone();
    drop(c);
    if !bootstrap.is_empty() {
        let weak = cluster.clone();
        tokio::spawn(async move { propose_bootstrap_users(weak, bootstrap).await });
    }
    let mut seen: Option<Arc<MetadataImage>> = None;
    loop {
        let image = images.borrow_and_update().clone();
        let Some(c) = cluster.upgrade() else {
            return;
        };
        apply_tables(&c, &image, seen.as_deref());
        seen = Some(image);
        drop(c);
        if images.changed().await.is_err() {
            return;
        }
    }
}

/// Puts `image`'s tables into the stores, unless they are those of `before`.
fn apply_tables(c: &Cluster, image: &MetadataImage, before: Option<&MetadataImage>) {
    let tables = &c.local.security;
    if before.is_none_or(|b| !Arc::ptr_eq(b.scram_credentials(), image.scram_credentials())) {
        if let Err(e) = tables.credentials.replace(image.scram_credentials()) {
            tracing::error!(error = %e, "the cluster's SCRAM credentials cannot be used");
        }
    }
    if before.is_none_or(|b| !Arc::ptr_eq(b.acls(), image.acls())) {
        tables.authorizer.replace_replicated(image.acls().clone());
    }
}

/// Proposes credentials for the bootstrap users that have none in the cluster, until the
/// quorum takes them. Every node does it at every start; the command leaves users that
/// already have credentials alone, so a changed password is never reset.
async fn propose_bootstrap_users(cluster: Weak<Cluster>, users: Vec<(String, String)>) {
    let mut warned = false;
    loop {
        let Some(c) = cluster.upgrade() else {
            return;
        };
        if c.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let image = c.image();
        let missing: Vec<&(String, String)> = users
            .iter()
            .filter(|(u, _)| !image.scram_credentials().iter().any(|r| r.user == *u))
            .collect();
        if missing.is_empty() {
            return;
        }
        let mut records = Vec::new();
        for (user, password) in missing {
            for alg in ScramAlgorithm::ALL {
                match ScramCredential::generate(
                    alg,
                    password.as_bytes(),
                    crate::security::BOOTSTRAP_ITERATIONS,
                ) {
                    Ok(cred) => records.push(CredentialRecord::new(user, alg, &cred)),
                    Err(e) => {
                        tracing::error!(user = %user, error = %e, "cannot make a bootstrap credential");
                        return;
                    }
                }
            }
        }
        let users: Vec<String> = records.iter().map(|r| r.user.clone()).collect();
        match c
            .propose(MetadataCommand::BootstrapScramUsers { records })
            .await
        {
            Ok(_) => {
                tracing::info!(users = ?users, "bootstrap users have SCRAM-SHA-256 and SCRAM-SHA-512 credentials in the cluster");
                return;
            }
            Err(e) => {
                if !warned {
                    tracing::info!(error = %e, "bootstrap users not proposed yet; retrying until the quorum answers");
                    warned = true;
                }
            }
        }
        drop(c);
        tokio::time::sleep(BOOTSTRAP_RETRY).await;
    }
}

fn propose_failed(e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Cluster(e.to_string())
}

impl Cluster {
    /// Proposes `changes` (already checked per user) and waits until this node shows them.
    /// Runs on the blocking pool.
    pub(crate) fn alter_scram_credentials(&self, changes: Vec<Change>) -> Result<(), BrokerError> {
        let mut upserts = Vec::new();
        let mut deletions = Vec::new();
        for change in changes {
            match change {
                Change::Upsert {
                    user,
                    alg,
                    credential,
                } => upserts.push(CredentialRecord::new(&user, alg, &credential)),
                Change::Delete { user, alg } => {
                    deletions.push((user, alg.mechanism().name().to_string()))
                }
            }
        }
        if upserts.is_empty() && deletions.is_empty() {
            return Ok(());
        }
        let cmd = MetadataCommand::AlterScramCredentials {
            upserts: upserts.clone(),
            deletions: deletions.clone(),
        };
        self.propose_and_show(cmd, move |img| {
            let c = img.scram_credentials();
            upserts.iter().all(|u| c.contains(u))
                && deletions
                    .iter()
                    .all(|(user, m)| !c.iter().any(|r| r.user == *user && r.mechanism == *m))
        })
        .map(|_| ())
    }

    /// Proposes the valid ones of `new` and waits until this node shows them; each one's
    /// outcome in order. Runs on the blocking pool.
    pub(crate) fn create_acls(
        &self,
        new: Vec<AclBinding>,
    ) -> Result<Vec<Result<(), InvalidBinding>>, BrokerError> {
        let outcomes: Vec<Result<(), InvalidBinding>> = new.iter().map(|b| b.validate()).collect();
        let valid: Vec<AclBinding> = new
            .into_iter()
            .zip(&outcomes)
            .filter(|(_, o)| o.is_ok())
            .map(|(b, _)| b)
            .collect();
        if !valid.is_empty() {
            let want = valid.clone();
            self.propose_and_show(
                MetadataCommand::CreateAcls { bindings: valid },
                move |img| want.iter().all(|b| img.acls().contains(b)),
            )?;
        }
        Ok(outcomes)
    }

    /// Proposes the removal of what each filter matches and waits until this node shows it;
    /// what each filter removed. Runs on the blocking pool.
    pub(crate) fn delete_acls(
        &self,
        filters: &[AclFilter],
    ) -> Result<Vec<Vec<AclBinding>>, BrokerError> {
        let cmd = MetadataCommand::DeleteAcls {
            filters: filters.to_vec(),
        };
        let filters = filters.to_vec();
        match self.propose_and_show(cmd, move |img| {
            !img.acls()
                .iter()
                .any(|b| filters.iter().any(|f| f.matches(b)))
        })? {
            CommandOutcome::AclsDeleted(removed) => Ok(removed),
            other => Err(propose_failed(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Proposes `cmd`, then waits (at most [`VISIBLE_WITHIN`]) until this node's image
    /// satisfies `shown`, and copies the security tables of that image into the stores.
    fn propose_and_show(
        &self,
        cmd: MetadataCommand,
        shown: impl Fn(&MetadataImage) -> bool,
    ) -> Result<CommandOutcome, BrokerError> {
        let handle = tokio::runtime::Handle::current();
        let outcome = handle.block_on(self.propose(cmd)).map_err(propose_failed)?;
        let mut images = self.node.subscribe();
        let visible = handle.block_on(async {
            tokio::time::timeout(VISIBLE_WITHIN, async {
                loop {
                    if shown(&images.borrow_and_update()) {
                        return true;
                    }
                    if images.changed().await.is_err() {
                        return false;
                    }
                }
            })
            .await
            .unwrap_or(false)
        });
        if visible {
            apply_tables(self, &self.image(), None);
        } else {
            tracing::warn!("a committed security change is not on this node yet");
        }
        Ok(outcome)
    }
}
