//! Who may call the registry's API when spate runs with security (`--http-auth basic`, and
//! `--authorizer acl` for ACLs).
//!
//! Callers show HTTP Basic credentials of a SASL user (or the admin token), checked by the
//! binary through the same code as the other HTTP endpoints ([`Access`]). Kafka's ACLs have no
//! resource type for subjects, so a subject is checked as the topic it belongs to
//! ([`subject_topic`]: `orders-value` and `orders-key` are topic `orders`'s; any other subject
//! is the topic of its own name):
//!
//! | request | needs |
//! |---|---|
//! | reading a subject, looking a schema up in it, testing compatibility against it, its config or mode | Describe on the topic (Read, Write, Delete and Alter imply it) |
//! | registering a schema under a subject | Write on the topic |
//! | a schema with references (registering, looking up, testing compatibility) | also Describe on each referenced subject's topic |
//! | deleting a subject or a version | Delete on the topic |
//! | changing or removing a subject's config or mode | AlterConfigs on the topic |
//! | changing or removing the global config or mode | AlterConfigs on the cluster |
//! | `/subjects`, `/schemas` | answered with the subjects the caller may describe |
//! | `/schemas/ids/{id}...` | Describe on a topic of a subject using the id |
//! | `/`, `/schemas/types`, `/contexts`, global config and mode | any authenticated caller |

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use spate_auth::acl::{Operation, ResourceType, CLUSTER_NAME};
use spate_broker::security::Session;

/// Who called: a user's session when ACLs apply to them, `None` when nothing is checked
/// (ACLs off, or the admin token, a super user).
#[derive(Clone, Default)]
pub struct Caller(pub Option<Arc<Session>>);

impl Caller {
    /// The caller's principal, for messages.
    pub fn name(&self) -> String {
        self.0
            .as_ref()
            .map_or_else(|| "the caller".to_string(), |s| s.principal().to_string())
    }
}

/// Authentication and ACL decisions, supplied by the binary (the same users, token and ACLs
/// as the other HTTP endpoints).
pub trait Access: Send + Sync + 'static {
    /// The caller of a request with these headers, or why it is not let in (answered 401).
    fn authenticate(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<Caller, String>;
    /// Whether `caller` may do `operation` on the resource.
    fn allows(
        &self,
        caller: &Caller,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool;
}

/// What one request needs (see the module's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Any authenticated caller.
    Anyone,
    /// An operation on the topic of a subject.
    Subject(Operation, String),
    /// An operation on the cluster.
    Cluster(Operation),
    /// Decided by the handler item by item (lists filtered, ids by the subjects using them).
    PerSubject,
}

/// The topic whose ACLs guard `subject`: Confluent's default subject names are
/// `<topic>-key` and `<topic>-value`; any other subject stands for the topic of its own name.
pub fn subject_topic(subject: &str) -> &str {
    subject
        .strip_suffix("-value")
        .or_else(|| subject.strip_suffix("-key"))
        .filter(|t| !t.is_empty())
        .unwrap_or(subject)
}

/// What a request with this method and (percent-encoded) path needs.
pub fn need(method: &Method, path: &str) -> Need {
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let read = matches!(*method, Method::GET | Method::HEAD);
    let subject = |op, s: &str| Need::Subject(op, s.to_string());
    match parts.as_slice() {
        ["subjects"] | ["schemas"] | ["schemas", "ids", ..] => Need::PerSubject,
        ["subjects", s] if *method == Method::DELETE => subject(Operation::Delete, s),
        ["subjects", s] => subject(Operation::Describe, s),
        ["subjects", s, "versions"] if *method == Method::POST => subject(Operation::Write, s),
        ["subjects", s, "versions", _] if *method == Method::DELETE => {
            subject(Operation::Delete, s)
        }
        ["subjects", s, ..] => subject(Operation::Describe, s),
        ["compatibility", "subjects", s, ..] => subject(Operation::Describe, s),
        ["config" | "mode"] if read => Need::Anyone,
        ["config" | "mode"] => Need::Cluster(Operation::AlterConfigs),
        ["config" | "mode", s] if read => subject(Operation::Describe, s),
        ["config" | "mode", s] => subject(Operation::AlterConfigs, s),
        _ => Need::Anyone,
    }
}

/// A request's caller with the decisions handlers make item by item.
#[derive(Clone)]
pub struct Guard {
    access: Arc<dyn Access>,
    caller: Caller,
}

impl Guard {
    /// The guard of `caller`'s request.
    pub fn new(access: Arc<dyn Access>, caller: Caller) -> Self {
        Self { access, caller }
    }

    /// Who called.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Whether the caller may do `operation` on the topic of `subject`.
    pub fn may(&self, operation: Operation, subject: &str) -> bool {
        self.access.allows(
            &self.caller,
            operation,
            ResourceType::Topic,
            subject_topic(subject),
        )
    }

    /// Whether the caller may do what `need` says (a per-item need passes here).
    pub fn meets(&self, need: &Need) -> bool {
        match need {
            Need::Anyone | Need::PerSubject => true,
            Need::Subject(op, s) => self.may(*op, s),
            Need::Cluster(op) => {
                self.access
                    .allows(&self.caller, *op, ResourceType::Cluster, CLUSTER_NAME)
            }
        }
    }

    /// What `need` asks for, in words, for a refusal.
    pub fn refusal(&self, need: &Need) -> String {
        let who = self.caller.name();
        match need {
            Need::Subject(op, s) => format!(
                "{who} may not {op:?} topic '{}' (subject '{s}' belongs to it)",
                subject_topic(s)
            ),
            Need::Cluster(op) => format!("{who} may not {op:?} the cluster"),
            Need::Anyone | Need::PerSubject => format!("{who} may not do this"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(op: Operation, s: &str) -> Need {
        Need::Subject(op, s.to_string())
    }

    #[test]
    fn a_subject_is_guarded_by_the_topic_its_name_comes_from() {
        assert_eq!(subject_topic("orders-value"), "orders");
        assert_eq!(subject_topic("orders-key"), "orders");
        assert_eq!(subject_topic("com.example.Order"), "com.example.Order");
        assert_eq!(subject_topic("-value"), "-value");
    }

    #[test]
    fn reads_need_describe_registration_write_deletes_delete_and_settings_alter_configs() {
        let d = Operation::Describe;
        assert_eq!(
            need(&Method::GET, "/subjects/orders-value/versions/latest"),
            subject(d, "orders-value")
        );
        assert_eq!(
            need(&Method::POST, "/subjects/orders-value"),
            subject(d, "orders-value")
        );
        assert_eq!(
            need(&Method::POST, "/compatibility/subjects/o-value/versions/1"),
            subject(d, "o-value")
        );
        assert_eq!(
            need(&Method::POST, "/subjects/orders-value/versions"),
            subject(Operation::Write, "orders-value")
        );
        assert_eq!(
            need(&Method::DELETE, "/subjects/orders-value"),
            subject(Operation::Delete, "orders-value")
        );
        assert_eq!(
            need(&Method::DELETE, "/subjects/orders-value/versions/2"),
            subject(Operation::Delete, "orders-value")
        );
        assert_eq!(
            need(&Method::PUT, "/config/orders-value"),
            subject(Operation::AlterConfigs, "orders-value")
        );
        assert_eq!(
            need(&Method::GET, "/mode/orders-value"),
            subject(d, "orders-value")
        );
        assert_eq!(
            need(&Method::PUT, "/config"),
            Need::Cluster(Operation::AlterConfigs)
        );
        assert_eq!(
            need(&Method::PUT, "/mode"),
            Need::Cluster(Operation::AlterConfigs)
        );
        assert_eq!(need(&Method::GET, "/config"), Need::Anyone);
        assert_eq!(need(&Method::GET, "/schemas/types"), Need::Anyone);
        assert_eq!(need(&Method::GET, "/subjects"), Need::PerSubject);
        assert_eq!(
            need(&Method::GET, "/schemas/ids/3/schema"),
            Need::PerSubject
        );
    }

    #[test]
    fn subjects_in_paths_are_percent_decoded() {
        assert_eq!(
            need(&Method::GET, "/subjects/a%2Fb-value/versions"),
            subject(Operation::Describe, "a/b-value")
        );
    }
}
