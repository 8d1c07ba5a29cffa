//! The broker's ACLs: the bindings (standalone in `<data>/security/acls.json`), the
//! authorizer's settings, and the decision for a connection's principal. Denials are counted
//! per principal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use spate_auth::acl::{
    authorize, AclBinding, AclFilter, AuthorizerConfig, InvalidBinding, Operation, ResourceType,
};

use super::Session;
use crate::error::BrokerError;

/// The ACL store and authorizer of a broker.
pub struct Authorizer {
    /// `--authorizer acl`: without it every request is allowed and the ACL APIs answer
    /// SECURITY_DISABLED, as a Kafka broker without an authorizer does.
    enabled: bool,
    config: AuthorizerConfig,
    bindings: RwLock<Arc<Vec<AclBinding>>>,
    path: Option<PathBuf>,
    denials: Mutex<BTreeMap<String, u64>>,
    /// Serialises changes and their saves.
    changes: Mutex<()>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    /// Opens the ACLs under `data_dir` (none when the file does not exist yet).
    pub fn open(
        data_dir: &Path,
        enabled: bool,
        config: AuthorizerConfig,
    ) -> Result<Self, BrokerError> {
        let path = data_dir.join("security").join("acls.json");
        let bindings: Vec<AclBinding> = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| BrokerError::CorruptMetadata {
                    path: path.clone(),
                    reason: e.to_string(),
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(crate::error::io("read", &path)(e)),
        };
        Ok(Self {
            enabled,
            config,
            bindings: RwLock::new(Arc::new(bindings)),
            path: Some(path),
            denials: Mutex::new(BTreeMap::new()),
            changes: Mutex::new(()),
        })
    }

    /// An authorizer whose bindings come from the cluster's metadata
    /// ([`Authorizer::replace_replicated`]), nothing on this node's disk.
    pub fn replicated(data_dir: &Path, enabled: bool, config: AuthorizerConfig) -> Self {
        let old = data_dir.join("security").join("acls.json");
        if old.exists() {
            tracing::warn!(path = %old.display(), "this node is in a cluster: its ACLs are the cluster's, the local file is not used");
        }
        Self {
            enabled,
            config,
            ..Self::disabled()
        }
    }

    /// Replaces every binding with the cluster's.
    pub fn replace_replicated(&self, bindings: Arc<Vec<AclBinding>>) {
        *self.bindings.write() = bindings;
    }

    /// An authorizer that allows everything and stores nothing (tests).
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            config: AuthorizerConfig::default(),
            bindings: RwLock::new(Arc::new(Vec::new())),
            path: None,
            denials: Mutex::new(BTreeMap::new()),
            changes: Mutex::new(()),
        }
    }

    /// Whether ACLs are enforced.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether the connection's principal may do `operation` on `name` of `resource_type`
    /// (`None`: a caller inside the broker, always allowed). A denial is counted.
    pub fn allows(
        &self,
        session: Option<&Session>,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let Some(s) = session.filter(|s| !s.is_internal()) else {
            return true;
        };
        let principal = s.principal().to_string();
        let bindings = self.bindings.read().clone();
        let ok = authorize(
            &self.config,
            &bindings,
            &principal,
            &s.host(),
            operation,
            resource_type,
            name,
        );
        if !ok {
            *self.denials.lock().entry(principal).or_insert(0) += 1;
        }
        ok
    }

    /// Whether the connection may use idempotence (InitProducerId without a transactional
    /// id): IdempotentWrite on the cluster, or Write on any topic (KIP-679).
    pub fn allows_idempotence(&self, session: Option<&Session>) -> bool {
        if self.allows(
            session,
            Operation::IdempotentWrite,
            ResourceType::Cluster,
            spate_auth::acl::CLUSTER_NAME,
        ) {
            return true;
        }
        let Some(s) = session else {
            return true;
        };
        let principal = s.principal().to_string();
        let wildcard = format!("{}:*", s.principal().kind);
        self.bindings.read().iter().any(|b| {
            b.resource_type == ResourceType::Topic
                && b.permission == spate_auth::acl::Permission::Allow
                && matches!(b.operation, Operation::Write | Operation::All)
                && (b.principal == principal || b.principal == wildcard)
        })
    }

    /// Denials so far, by principal.
    pub fn denials(&self) -> Vec<(String, u64)> {
        self.denials
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Every binding that passes `filter`.
    pub fn describe(&self, filter: &AclFilter) -> Vec<AclBinding> {
        self.bindings
            .read()
            .iter()
            .filter(|b| filter.matches(b))
            .cloned()
            .collect()
    }

    /// Adds bindings (one already there is not added twice); each one's outcome in order.
    pub fn create(
        &self,
        new: Vec<AclBinding>,
    ) -> Result<Vec<Result<(), InvalidBinding>>, BrokerError> {
        let _guard = self.changes.lock();
        let mut all = (**self.bindings.read()).clone();
        let outcomes = new
            .into_iter()
            .map(|b| {
                b.validate()?;
                if !all.contains(&b) {
                    all.push(b);
                }
                Ok(())
            })
            .collect();
        self.replace(all)?;
        Ok(outcomes)
    }

    /// Removes the bindings each filter matches; what each filter removed.
    pub fn delete(&self, filters: &[AclFilter]) -> Result<Vec<Vec<AclBinding>>, BrokerError> {
        let _guard = self.changes.lock();
        let mut all = (**self.bindings.read()).clone();
        let removed = filters
            .iter()
            .map(|f| {
                let (gone, kept): (Vec<_>, Vec<_>) = all.drain(..).partition(|b| f.matches(b));
                all = kept;
                gone
            })
            .collect();
        self.replace(all)?;
        Ok(removed)
    }

    fn replace(&self, all: Vec<AclBinding>) -> Result<(), BrokerError> {
        if let Some(path) = &self.path {
            let bytes =
                serde_json::to_vec_pretty(&all).map_err(|e| BrokerError::CorruptMetadata {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(crate::error::io("create", dir))?;
            }
            crate::registry::write_atomically(path, &bytes)?;
        }
        *self.bindings.write() = Arc::new(all);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_auth::acl::{PatternType, Permission};
    use spate_auth::Principal;

    #[test]
    fn bindings_survive_a_reopen_and_decide_for_a_session() {
        let dir = tempfile::tempdir().unwrap();
        let open = || Authorizer::open(dir.path(), true, AuthorizerConfig::default()).unwrap();
        let a = open();
        let read = AclBinding {
            resource_type: ResourceType::Topic,
            name: "t".into(),
            pattern: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let out = a
            .create(vec![
                read.clone(),
                AclBinding {
                    principal: "nobody".into(),
                    ..read.clone()
                },
            ])
            .unwrap();
        assert!(out[0].is_ok() && out[1].is_err());
        let a = open();
        let alice = Session::new(
            super::super::SecurityProtocol::Ssl,
            None,
            Some(Principal::user("alice")),
        );
        let bob = Session::new(
            super::super::SecurityProtocol::Ssl,
            None,
            Some(Principal::user("bob")),
        );
        assert!(a.allows(Some(&alice), Operation::Read, ResourceType::Topic, "t"));
        assert!(!a.allows(Some(&bob), Operation::Read, ResourceType::Topic, "t"));
        assert_eq!(a.denials(), vec![("User:bob".to_string(), 1)]);
        let gone = a
            .delete(&[AclFilter {
                resource_type: ResourceType::Any,
                name: None,
                pattern: PatternType::Any,
                principal: Some("User:alice".into()),
                host: None,
                operation: Operation::Any,
                permission: Permission::Any,
            }])
            .unwrap();
        assert_eq!(gone, vec![vec![read]]);
        assert!(!open().allows(Some(&alice), Operation::Read, ResourceType::Topic, "t"));
    }
}
