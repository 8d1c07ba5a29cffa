//! Kafka's ACL model and its authorizer, free of I/O: bindings of (resource pattern, principal,
//! host, operation, permission), the filters DescribeAcls and DeleteAcls match them with, and
//! the decision for one request (deny wins; Describe is implied by Read, Write, Delete and
//! Alter, DescribeConfigs by AlterConfigs; super users pass; a resource without any binding
//! is allowed only when `allow.everyone.if.no.acl.found`).

use serde::{Deserialize, Serialize};

/// Kafka's name of the one cluster resource.
pub const CLUSTER_NAME: &str = "kafka-cluster";

macro_rules! kafka_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $code:expr, $text:expr;)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Kafka's code.
            pub fn code(self) -> i8 {
                match self { $(Self::$variant => $code,)* }
            }

            /// The value of Kafka's code (`None` for codes Kafka does not define).
            pub fn from_code(code: i8) -> Option<Self> {
                match code { $($code => Some(Self::$variant),)* _ => None }
            }

            /// Kafka's name, as kafka-acls prints it.
            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $text,)* }
            }
        }
    };
}

kafka_enum!(
    /// What kind of thing a binding is about.
    ResourceType {
        /// Any type (filters only).
        Any = 1, "Any";
        /// A topic.
        Topic = 2, "Topic";
        /// A consumer group.
        Group = 3, "Group";
        /// The cluster (`kafka-cluster`).
        Cluster = 4, "Cluster";
        /// A transactional id.
        TransactionalId = 5, "TransactionalId";
        /// A delegation token.
        DelegationToken = 6, "DelegationToken";
        /// A user (quotas, SCRAM credentials).
        User = 7, "User";
    }
);

kafka_enum!(
    /// How a binding's name matches resource names.
    PatternType {
        /// Any pattern type (filters only).
        Any = 1, "ANY";
        /// Every binding that would match the filter's name (filters only).
        Match = 2, "MATCH";
        /// The name itself, or `*` for every name.
        Literal = 3, "LITERAL";
        /// Every name starting with it.
        Prefixed = 4, "PREFIXED";
    }
);

kafka_enum!(
    /// What a request does to a resource.
    Operation {
        /// Any operation (filters only).
        Any = 1, "Any";
        /// Every operation.
        All = 2, "All";
        /// Read.
        Read = 3, "Read";
        /// Write.
        Write = 4, "Write";
        /// Create.
        Create = 5, "Create";
        /// Delete.
        Delete = 6, "Delete";
        /// Alter.
        Alter = 7, "Alter";
        /// Describe.
        Describe = 8, "Describe";
        /// Inter-broker actions.
        ClusterAction = 9, "ClusterAction";
        /// Describe configs.
        DescribeConfigs = 10, "DescribeConfigs";
        /// Alter configs.
        AlterConfigs = 11, "AlterConfigs";
        /// Idempotent produce.
        IdempotentWrite = 12, "IdempotentWrite";
        /// Create delegation tokens.
        CreateTokens = 13, "CreateTokens";
        /// Describe delegation tokens.
        DescribeTokens = 14, "DescribeTokens";
    }
);

kafka_enum!(
    /// Whether a binding allows or denies.
    Permission {
        /// Any permission (filters only).
        Any = 1, "ANY";
        /// Denies; wins over any allow.
        Deny = 2, "DENY";
        /// Allows.
        Allow = 3, "ALLOW";
    }
);

impl Operation {
    /// Whether a binding for `self` covers a request for `wanted`.
    fn covers(self, wanted: Operation, permission: Permission) -> bool {
        if self == Operation::All || self == wanted {
            return true;
        }
        // Kafka's implied operations, for allows only: a deny of Read does not deny Describe.
        permission == Permission::Allow
            && match wanted {
                Operation::Describe => matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ),
                Operation::DescribeConfigs => self == Operation::AlterConfigs,
                _ => false,
            }
    }
}

/// One ACL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclBinding {
    /// The kind of resource.
    pub resource_type: ResourceType,
    /// The resource name, `*` (literal: every name) or a prefix.
    pub name: String,
    /// Literal or prefixed.
    pub pattern: PatternType,
    /// `User:alice`, or `User:*` for everyone.
    pub principal: String,
    /// A client address, or `*`.
    pub host: String,
    /// The operation.
    pub operation: Operation,
    /// Allow or deny.
    pub permission: Permission,
}

/// Why a binding cannot be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidBinding(pub String);

impl AclBinding {
    /// Checks what CreateAcls must refuse.
    pub fn validate(&self) -> Result<(), InvalidBinding> {
        let bad = |s: &str| Err(InvalidBinding(s.to_string()));
        if self.resource_type == ResourceType::Any {
            return bad("the resource type must be specific, not Any");
        }
        if !matches!(self.pattern, PatternType::Literal | PatternType::Prefixed) {
            return bad("the pattern type must be LITERAL or PREFIXED");
        }
        if matches!(self.operation, Operation::Any) {
            return bad("the operation must be specific, not Any");
        }
        if self.permission == Permission::Any {
            return bad("the permission must be ALLOW or DENY");
        }
        if self.name.is_empty() {
            return bad("the resource name must not be empty");
        }
        if self.resource_type == ResourceType::Cluster && self.name != CLUSTER_NAME {
            return bad("the cluster resource is named kafka-cluster");
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => return bad("the principal must be Type:name, e.g. User:alice or User:*"),
        }
        if self.host.is_empty() {
            return bad("the host must be an address or *");
        }
        Ok(())
    }

    /// Whether this binding's pattern covers resource `name` of `resource_type`.
    fn matches_resource(&self, resource_type: ResourceType, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern {
                PatternType::Literal => self.name == name || self.name == "*",
                PatternType::Prefixed => name.starts_with(&self.name),
                _ => false,
            }
    }
}

/// A filter of DescribeAcls and DeleteAcls (`None` fields match anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    /// Resource type, or Any.
    pub resource_type: ResourceType,
    /// Resource name.
    pub name: Option<String>,
    /// Any, Match, Literal or Prefixed.
    pub pattern: PatternType,
    /// Principal.
    pub principal: Option<String>,
    /// Host.
    pub host: Option<String>,
    /// Operation, or Any.
    pub operation: Operation,
    /// Permission, or Any.
    pub permission: Permission,
}

impl AclFilter {
    /// Whether `b` passes the filter.
    pub fn matches(&self, b: &AclBinding) -> bool {
        let resource = match (self.pattern, &self.name) {
            (PatternType::Match, Some(name)) => {
                (self.resource_type == ResourceType::Any || self.resource_type == b.resource_type)
                    && b.matches_resource(b.resource_type, name)
            }
            (PatternType::Any | PatternType::Match, name) => {
                (self.resource_type == ResourceType::Any || self.resource_type == b.resource_type)
                    && name.as_ref().is_none_or(|n| *n == b.name)
            }
            (pattern, name) => {
                (self.resource_type == ResourceType::Any || self.resource_type == b.resource_type)
                    && pattern == b.pattern
                    && name.as_ref().is_none_or(|n| *n == b.name)
            }
        };
        resource
            && self.principal.as_ref().is_none_or(|p| *p == b.principal)
            && self.host.as_ref().is_none_or(|h| *h == b.host)
            && (self.operation == Operation::Any || self.operation == b.operation)
            && (self.permission == Permission::Any || self.permission == b.permission)
    }
}

/// How the authorizer decides where no rule speaks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// Principals (`User:admin`) allowed everything.
    pub super_users: Vec<String>,
    /// Whether a resource without any binding is open to everyone.
    pub allow_everyone_if_no_acl_found: bool,
}

/// Decides whether `principal` from `host` may do `operation` on resource `name` of
/// `resource_type`, given every binding.
pub fn authorize(
    config: &AuthorizerConfig,
    bindings: &[AclBinding],
    principal: &str,
    host: &str,
    operation: Operation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    if config.super_users.iter().any(|s| s == principal) {
        return true;
    }
    let wildcard = principal
        .split_once(':')
        .map(|(kind, _)| format!("{kind}:*"))
        .unwrap_or_default();
    let mut any_for_resource = false;
    let mut allowed = false;
    for b in bindings
        .iter()
        .filter(|b| b.matches_resource(resource_type, name))
    {
        any_for_resource = true;
        if !(b.principal == principal || b.principal == wildcard) {
            continue;
        }
        if !(b.host == "*" || b.host == host) {
            continue;
        }
        if !b.operation.covers(operation, b.permission) {
            continue;
        }
        match b.permission {
            Permission::Deny => return false,
            Permission::Allow => allowed = true,
            Permission::Any => {}
        }
    }
    allowed || (!any_for_resource && config.allow_everyone_if_no_acl_found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(
        rt: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        perm: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            name: name.into(),
            pattern,
            principal: principal.into(),
            host: "*".into(),
            operation: op,
            permission: perm,
        }
    }

    fn can(bs: &[AclBinding], who: &str, op: Operation, rt: ResourceType, name: &str) -> bool {
        authorize(
            &AuthorizerConfig::default(),
            bs,
            who,
            "10.0.0.1",
            op,
            rt,
            name,
        )
    }

    #[test]
    fn literal_prefixed_and_wildcard_bindings_allow_what_they_name() {
        use Operation::*;
        use ResourceType::Topic;
        let bs = vec![
            bind(
                Topic,
                "orders",
                PatternType::Literal,
                "User:alice",
                Read,
                Permission::Allow,
            ),
            bind(
                Topic,
                "logs-",
                PatternType::Prefixed,
                "User:bob",
                Write,
                Permission::Allow,
            ),
            bind(
                Topic,
                "*",
                PatternType::Literal,
                "User:*",
                Describe,
                Permission::Allow,
            ),
        ];
        assert!(can(&bs, "User:alice", Read, Topic, "orders"));
        assert!(!can(&bs, "User:alice", Write, Topic, "orders"));
        assert!(!can(&bs, "User:alice", Read, Topic, "orders2"));
        assert!(can(&bs, "User:bob", Write, Topic, "logs-app"));
        assert!(!can(&bs, "User:bob", Write, Topic, "log"));
        assert!(
            can(&bs, "User:carol", Describe, Topic, "anything"),
            "User:* and *"
        );
        assert!(
            can(&bs, "User:bob", Describe, Topic, "logs-x"),
            "Write implies Describe"
        );
        assert!(!can(&bs, "User:carol", Read, Topic, "anything"));
    }

    #[test]
    fn deny_wins_all_covers_everything_and_hosts_must_match() {
        use Operation::*;
        use ResourceType::Group;
        let mut bs = vec![
            bind(
                Group,
                "g",
                PatternType::Literal,
                "User:alice",
                All,
                Permission::Allow,
            ),
            bind(
                Group,
                "g",
                PatternType::Literal,
                "User:alice",
                Delete,
                Permission::Deny,
            ),
        ];
        assert!(can(&bs, "User:alice", Read, Group, "g"));
        assert!(!can(&bs, "User:alice", Delete, Group, "g"));
        bs.push(AclBinding {
            host: "10.0.0.9".into(),
            ..bind(
                Group,
                "h",
                PatternType::Literal,
                "User:alice",
                Read,
                Permission::Allow,
            )
        });
        assert!(
            !can(&bs, "User:alice", Read, Group, "h"),
            "only from 10.0.0.9"
        );
        // A deny of Read does not deny Describe (implication is for allows only).
        let bs = vec![
            bind(
                Group,
                "k",
                PatternType::Literal,
                "User:alice",
                Describe,
                Permission::Allow,
            ),
            bind(
                Group,
                "k",
                PatternType::Literal,
                "User:alice",
                Read,
                Permission::Deny,
            ),
        ];
        assert!(can(&bs, "User:alice", Describe, Group, "k"));
    }

    #[test]
    fn super_users_pass_and_unbound_resources_follow_the_default() {
        let bs = vec![bind(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            "User:alice",
            Operation::Read,
            Permission::Allow,
        )];
        let open = AuthorizerConfig {
            super_users: vec!["User:admin".into()],
            allow_everyone_if_no_acl_found: true,
        };
        let az = |c: &AuthorizerConfig, who: &str, name: &str| {
            authorize(c, &bs, who, "h", Operation::Read, ResourceType::Topic, name)
        };
        assert!(az(&open, "User:admin", "t"));
        assert!(az(&open, "User:bob", "free"), "no binding: open");
        assert!(!az(&open, "User:bob", "t"), "t has bindings, none for bob");
        let closed = AuthorizerConfig::default();
        assert!(!az(&closed, "User:bob", "free"));
        assert!(az(&closed, "User:alice", "t"));
    }

    #[test]
    fn filters_match_as_describe_and_delete_acls_do() {
        let lit = bind(
            ResourceType::Topic,
            "orders",
            PatternType::Literal,
            "User:a",
            Operation::Read,
            Permission::Allow,
        );
        let pre = bind(
            ResourceType::Topic,
            "ord",
            PatternType::Prefixed,
            "User:b",
            Operation::Write,
            Permission::Deny,
        );
        let star = bind(
            ResourceType::Topic,
            "*",
            PatternType::Literal,
            "User:c",
            Operation::Read,
            Permission::Allow,
        );
        let f = |rt, name: Option<&str>, pattern, principal: Option<&str>| AclFilter {
            resource_type: rt,
            name: name.map(str::to_string),
            pattern,
            principal: principal.map(str::to_string),
            host: None,
            operation: Operation::Any,
            permission: Permission::Any,
        };
        let all = f(ResourceType::Any, None, PatternType::Any, None);
        assert!([&lit, &pre, &star].iter().all(|b| all.matches(b)));
        let m = f(
            ResourceType::Topic,
            Some("orders"),
            PatternType::Match,
            None,
        );
        assert!(m.matches(&lit) && m.matches(&pre) && m.matches(&star));
        let exact = f(
            ResourceType::Topic,
            Some("ord"),
            PatternType::Prefixed,
            None,
        );
        assert!(exact.matches(&pre) && !exact.matches(&lit));
        let any_name = f(
            ResourceType::Topic,
            Some("orders"),
            PatternType::Any,
            Some("User:a"),
        );
        assert!(any_name.matches(&lit) && !any_name.matches(&pre));
    }

    #[test]
    fn invalid_bindings_are_refused_with_a_reason() {
        let ok = bind(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            "User:a",
            Operation::Read,
            Permission::Allow,
        );
        assert!(ok.validate().is_ok());
        for bad in [
            AclBinding {
                resource_type: ResourceType::Any,
                ..ok.clone()
            },
            AclBinding {
                pattern: PatternType::Match,
                ..ok.clone()
            },
            AclBinding {
                operation: Operation::Any,
                ..ok.clone()
            },
            AclBinding {
                permission: Permission::Any,
                ..ok.clone()
            },
            AclBinding {
                name: String::new(),
                ..ok.clone()
            },
            AclBinding {
                principal: "alice".into(),
                ..ok.clone()
            },
            AclBinding {
                resource_type: ResourceType::Cluster,
                name: "c".into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        assert_eq!(Operation::from_code(12), Some(Operation::IdempotentWrite));
        assert_eq!(Operation::from_code(0), None);
        assert_eq!(ResourceType::from_code(7), Some(ResourceType::User));
    }
}
