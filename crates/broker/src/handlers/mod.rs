//! One module per Kafka API family.

pub mod acls;
pub mod api_versions;
pub mod client_quotas;
pub mod cluster;
pub mod config_resources;
pub mod configs;
pub mod consumer_groups;
pub mod delete_records;
pub mod fetch;
pub mod groups;
pub mod leader_epochs;
pub mod list_offsets;
pub mod log_dirs;
pub mod metadata;
pub mod mutation_quota;
pub mod offsets;
pub mod produce;
pub mod producer_ids;
pub mod quorum;
pub mod sasl;
pub mod scram_credentials;
pub mod share_groups;
pub mod share_state;
pub mod telemetry;
pub mod topic_partitions;
pub mod topics;
pub mod transactions;

use spate_protocol::StrBytes;

/// An owned message for an optional error_message field.
pub(crate) fn msg(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// Authorized-operations bitfield for a resource when there are no ACLs: everything a topic
/// or cluster supports (Kafka's AclOperation codes as bit positions).
pub(crate) const TOPIC_OPERATIONS: i32 =
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
/// Cluster-level operations: create, alter, describe, cluster action, describe/alter configs,
/// idempotent write.
pub(crate) const CLUSTER_OPERATIONS: i32 =
    (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12);
/// "Not requested" in authorized-operations fields.
pub(crate) const OPERATIONS_OMITTED: i32 = i32::MIN;
/// READ, DELETE and DESCRIBE on a group (Kafka's AclOperation codes as bits).
const GROUP_OPERATIONS: i32 = (1 << 3) | (1 << 6) | (1 << 8);

/// A described group's authorized operations: everything a group supports when the request
/// asks for them, "omitted" otherwise.
pub(crate) fn group_operations(requested: bool) -> i32 {
    if requested {
        GROUP_OPERATIONS
    } else {
        OPERATIONS_OMITTED
    }
}
