//! ACLs on the requests that name topics and groups: what each needs (Kafka's table), and how
//! a refusal shows in its answer. Topics a client may not see are left out of listings and
//! marked TOPIC_AUTHORIZATION_FAILED where named; a group it may not use answers
//! GROUP_AUTHORIZATION_FAILED. Nothing here runs without `--authorizer acl`.

use spate_auth::acl::{Operation, ResourceType, CLUSTER_NAME};
use spate_protocol::messages::create_topics_response::CreatableTopicResult;
use spate_protocol::messages::delete_topics_response::DeletableTopicResult;
use spate_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use spate_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
use spate_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    ListGroupsResponse, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};
use spate_protocol::{ResponseError, StrBytes};

use super::Session;
use crate::Broker;

fn may(b: &Broker, who: Option<&Session>, op: Operation, rt: ResourceType, name: &str) -> bool {
    b.authorizer.allows(who, op, rt, name)
}

/// Whether `who` may `op` group `group`.
pub fn group(b: &Broker, who: Option<&Session>, op: Operation, group: &str) -> bool {
    may(b, who, op, ResourceType::Group, group)
}

/// Metadata: auto-creation needs Create on the cluster or on the topic; without it the
/// request creates nothing.
pub fn metadata_request(b: &Broker, who: Option<&Session>, req: &mut MetadataRequest) {
    if !b.authorizer.enabled() || !req.allow_auto_topic_creation {
        return;
    }
    if may(
        b,
        who,
        Operation::Create,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return;
    }
    let all_allowed = req.topics.iter().flatten().all(|t| {
        t.name
            .as_ref()
            .is_none_or(|n| may(b, who, Operation::Create, ResourceType::Topic, n))
    });
    if !all_allowed {
        req.allow_auto_topic_creation = false;
    }
}

/// The authorized-operations bitfield (Kafka's operation codes as bit positions) of `who`
/// on a resource, among `ops`.
pub fn authorized_operations(
    b: &Broker,
    who: Option<&Session>,
    rt: ResourceType,
    name: &str,
    ops: &[Operation],
) -> i32 {
    ops.iter()
        .filter(|op| may(b, who, **op, rt, name))
        .fold(0, |bits, op| bits | (1 << op.code()))
}

/// What a topic's authorized operations are made of.
const TOPIC_OPS: [Operation; 8] = [
    Operation::Read,
    Operation::Write,
    Operation::Create,
    Operation::Delete,
    Operation::Alter,
    Operation::Describe,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];
/// What the cluster's authorized operations are made of.
pub const CLUSTER_OPS: [Operation; 7] = [
    Operation::Create,
    Operation::Alter,
    Operation::Describe,
    Operation::ClusterAction,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
    Operation::IdempotentWrite,
];

/// Metadata: topics without Describe are left out of an all-topics answer and marked
/// TOPIC_AUTHORIZATION_FAILED where named; authorized operations, when asked, are the
/// client's.
pub fn metadata_response(
    b: &Broker,
    who: Option<&Session>,
    all: bool,
    resp: &mut MetadataResponse,
) {
    if !b.authorizer.enabled() {
        return;
    }
    let omitted = crate::handlers::OPERATIONS_OMITTED;
    if resp.cluster_authorized_operations != omitted {
        resp.cluster_authorized_operations =
            authorized_operations(b, who, ResourceType::Cluster, CLUSTER_NAME, &CLUSTER_OPS);
    }
    for t in &mut resp.topics {
        if t.topic_authorized_operations != omitted {
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    authorized_operations(b, who, ResourceType::Topic, name, &TOPIC_OPS);
            }
        }
    }
    let denied = |name: &str| !may(b, who, Operation::Describe, ResourceType::Topic, name);
    if all {
        resp.topics
            .retain(|t| t.name.as_ref().is_none_or(|n| !denied(n)));
        return;
    }
    for t in &mut resp.topics {
        if t.name.as_ref().is_some_and(|n| denied(n)) {
            t.error_code = ResponseError::TopicAuthorizationFailed.code();
            t.partitions.clear();
            t.is_internal = false;
            t.topic_id = Default::default();
        }
    }
}

/// ListOffsets: every partition of a topic without Describe is TOPIC_AUTHORIZATION_FAILED.
pub fn list_offsets_response(b: &Broker, who: Option<&Session>, resp: &mut ListOffsetsResponse) {
    if !b.authorizer.enabled() {
        return;
    }
    for t in &mut resp.topics {
        if !may(b, who, Operation::Describe, ResourceType::Topic, &t.name) {
            for p in &mut t.partitions {
                *p = spate_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(ResponseError::TopicAuthorizationFailed.code());
            }
        }
    }
}

/// CreateTopics: topics without Create (on the cluster or the topic) leave the request; their
/// results are added by [`create_topics_response`].
pub fn create_topics_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut CreateTopicsRequest,
) -> Vec<TopicName> {
    if !b.authorizer.enabled()
        || may(
            b,
            who,
            Operation::Create,
            ResourceType::Cluster,
            CLUSTER_NAME,
        )
    {
        return Vec::new();
    }
    let (ok, denied): (Vec<_>, Vec<_>) = req
        .topics
        .drain(..)
        .partition(|t| may(b, who, Operation::Create, ResourceType::Topic, &t.name));
    req.topics = ok;
    denied.into_iter().map(|t| t.name).collect()
}

/// Adds the refused topics of [`create_topics_request`] to the answer.
pub fn create_topics_response(denied: Vec<TopicName>, resp: &mut CreateTopicsResponse) {
    for name in denied {
        let mut r = CreatableTopicResult::default();
        r.name = name;
        r.error_code = ResponseError::TopicAuthorizationFailed.code();
        r.error_message = Some(StrBytes::from_static_str(
            "not authorized to create this topic",
        ));
        r.num_partitions = -1;
        r.replication_factor = -1;
        resp.topics.push(r);
    }
}

/// DeleteTopics: topics without Delete leave the request; [`delete_topics_response`] adds
/// their results.
pub fn delete_topics_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut DeleteTopicsRequest,
) -> Vec<DeletableTopicResult> {
    if !b.authorizer.enabled() {
        return Vec::new();
    }
    let deny = |name: Option<TopicName>, id| {
        let mut r = DeletableTopicResult::default();
        r.name = name;
        r.topic_id = id;
        r.error_code = ResponseError::TopicAuthorizationFailed.code();
        r.error_message = Some(StrBytes::from_static_str(
            "not authorized to delete this topic",
        ));
        r
    };
    let mut denied = Vec::new();
    req.topic_names.retain(|n| {
        let ok = may(b, who, Operation::Delete, ResourceType::Topic, n);
        if !ok {
            denied.push(deny(Some(n.clone()), Default::default()));
        }
        ok
    });
    req.topics.retain(|t| {
        let name = t
            .name
            .as_ref()
            .map(|n| n.to_string())
            .or_else(|| b.topics.get_by_id(&t.topic_id).map(|t| t.name.clone()));
        // A topic id nobody has is for the handler to answer (UNKNOWN_TOPIC_ID).
        let ok = name
            .as_deref()
            .is_none_or(|n| may(b, who, Operation::Delete, ResourceType::Topic, n));
        if !ok {
            denied.push(deny(t.name.clone(), t.topic_id));
        }
        ok
    });
    denied
}

/// Adds the refused topics of [`delete_topics_request`] to the answer.
pub fn delete_topics_response(denied: Vec<DeletableTopicResult>, resp: &mut DeleteTopicsResponse) {
    resp.responses.extend(denied);
}

/// OffsetCommit without Read on its group: every partition GROUP_AUTHORIZATION_FAILED.
pub fn offset_commit_refused(req: &OffsetCommitRequest) -> OffsetCommitResponse {
    let mut resp = OffsetCommitResponse::default();
    for t in &req.topics {
        let mut rt = OffsetCommitResponseTopic::default();
        rt.name = t.name.clone();
        rt.topic_id = t.topic_id;
        for p in &t.partitions {
            let mut rp = OffsetCommitResponsePartition::default();
            rp.partition_index = p.partition_index;
            rp.error_code = ResponseError::GroupAuthorizationFailed.code();
            rt.partitions.push(rp);
        }
        resp.topics.push(rt);
    }
    resp
}

/// OffsetFetch: groups without Describe leave the request (v8+; before, the one group is
/// refused whole by the caller); [`offset_fetch_response`] adds their refusals.
pub fn offset_fetch_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut OffsetFetchRequest,
) -> Vec<StrBytes> {
    let mut denied = Vec::new();
    req.groups.retain(|g| {
        let ok = group(b, who, Operation::Describe, &g.group_id);
        if !ok {
            denied.push(g.group_id.0.clone());
        }
        ok
    });
    denied
}

/// Adds the refused groups of [`offset_fetch_request`] to the answer.
pub fn offset_fetch_response(denied: Vec<StrBytes>, resp: &mut OffsetFetchResponse) {
    for id in denied {
        let mut g = OffsetFetchResponseGroup::default();
        g.group_id = id.into();
        g.error_code = ResponseError::GroupAuthorizationFailed.code();
        resp.groups.push(g);
    }
}

/// ListGroups: only the groups the client may describe.
pub fn list_groups_response(b: &Broker, who: Option<&Session>, resp: &mut ListGroupsResponse) {
    if b.authorizer.enabled() {
        resp.groups
            .retain(|g| group(b, who, Operation::Describe, &g.group_id));
    }
}

/// The ACL resource and refusal code of a config resource (Kafka's ConfigResource types:
/// 2 topic, 4 broker, 8 broker logger, 16 client metrics, 32 group).
fn config_resource(resource_type: i8, name: &str) -> (ResourceType, String, ResponseError) {
    match resource_type {
        2 => (
            ResourceType::Topic,
            name.to_string(),
            ResponseError::TopicAuthorizationFailed,
        ),
        32 => (
            ResourceType::Group,
            name.to_string(),
            ResponseError::GroupAuthorizationFailed,
        ),
        _ => (
            ResourceType::Cluster,
            CLUSTER_NAME.to_string(),
            ResponseError::ClusterAuthorizationFailed,
        ),
    }
}

/// Config resources `op` is refused on: removed from `resources` (so nothing of them is read
/// or changed), returned as (type, name, code) for the answer.
fn refuse_configs<R>(
    b: &Broker,
    who: Option<&Session>,
    op: Operation,
    resources: &mut Vec<R>,
    key: impl Fn(&R) -> (i8, String),
) -> Vec<(i8, String, ResponseError)> {
    if !b.authorizer.enabled() {
        return Vec::new();
    }
    let mut denied = Vec::new();
    resources.retain(|r| {
        let (t, name) = key(r);
        let (rt, acl_name, code) = config_resource(t, &name);
        let ok = may(b, who, op, rt, &acl_name);
        if !ok {
            denied.push((t, name, code));
        }
        ok
    });
    denied
}

/// A config request's ACL pair: `$request` removes the resources `$op` is refused on (so
/// nothing of them is read or changed) and returns them; `$response` adds their refusals to
/// the answer's `$field` as `$result`s.
macro_rules! config_acls {
    ($request:ident, $response:ident, $req:ty, $resp:ty, $result:ty, $field:ident, $op:expr, $words:expr) => {
        #[doc = concat!("`", stringify!($req), "`: resources without the operation leave the request.")]
        pub fn $request(
            b: &Broker,
            who: Option<&Session>,
            req: &mut $req,
        ) -> Vec<(i8, String, ResponseError)> {
            refuse_configs(b, who, $op, &mut req.resources, |r| {
                (r.resource_type, r.resource_name.to_string())
            })
        }

        #[doc = concat!("Adds the refusals of [`", stringify!($request), "`].")]
        pub fn $response(denied: Vec<(i8, String, ResponseError)>, resp: &mut $resp) {
            for (t, name, code) in denied {
                let mut r = <$result>::default();
                r.resource_type = t;
                r.resource_name = StrBytes::from_string(name);
                r.error_code = code.code();
                r.error_message = Some(StrBytes::from_static_str($words));
                resp.$field.push(r);
            }
        }
    };
}

config_acls!(
    describe_configs_request,
    describe_configs_response,
    spate_protocol::messages::DescribeConfigsRequest,
    spate_protocol::messages::DescribeConfigsResponse,
    spate_protocol::messages::describe_configs_response::DescribeConfigsResult,
    results,
    Operation::DescribeConfigs,
    "not authorized to describe these configs"
);
config_acls!(
    alter_configs_request,
    alter_configs_response,
    spate_protocol::messages::AlterConfigsRequest,
    spate_protocol::messages::AlterConfigsResponse,
    spate_protocol::messages::alter_configs_response::AlterConfigsResourceResponse,
    responses,
    Operation::AlterConfigs,
    "not authorized to alter these configs"
);
config_acls!(
    incremental_alter_configs_request,
    incremental_alter_configs_response,
    spate_protocol::messages::IncrementalAlterConfigsRequest,
    spate_protocol::messages::IncrementalAlterConfigsResponse,
    spate_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse,
    responses,
    Operation::AlterConfigs,
    "not authorized to alter these configs"
);

/// CreatePartitions: topics without Alter leave the request.
pub fn create_partitions_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut spate_protocol::messages::CreatePartitionsRequest,
) -> Vec<TopicName> {
    if !b.authorizer.enabled() {
        return Vec::new();
    }
    let (ok, denied): (Vec<_>, Vec<_>) = req
        .topics
        .drain(..)
        .partition(|t| may(b, who, Operation::Alter, ResourceType::Topic, &t.name));
    req.topics = ok;
    denied.into_iter().map(|t| t.name).collect()
}

/// Adds the refusals of [`create_partitions_request`].
pub fn create_partitions_response(
    denied: Vec<TopicName>,
    resp: &mut spate_protocol::messages::CreatePartitionsResponse,
) {
    for name in denied {
        let mut r = spate_protocol::messages::create_partitions_response::CreatePartitionsTopicResult::default();
        r.name = name;
        r.error_code = ResponseError::TopicAuthorizationFailed.code();
        r.error_message = Some(StrBytes::from_static_str(
            "not authorized to alter this topic",
        ));
        resp.results.push(r);
    }
}

/// DeleteRecords: topics without Delete leave the request.
pub fn delete_records_request(
    b: &Broker,
    who: Option<&Session>,
    req: &mut spate_protocol::messages::DeleteRecordsRequest,
) -> Vec<spate_protocol::messages::delete_records_request::DeleteRecordsTopic> {
    if !b.authorizer.enabled() {
        return Vec::new();
    }
    let (ok, denied): (Vec<_>, Vec<_>) = req
        .topics
        .drain(..)
        .partition(|t| may(b, who, Operation::Delete, ResourceType::Topic, &t.name));
    req.topics = ok;
    denied
}

/// Adds the refusals of [`delete_records_request`].
pub fn delete_records_response(
    denied: Vec<spate_protocol::messages::delete_records_request::DeleteRecordsTopic>,
    resp: &mut spate_protocol::messages::DeleteRecordsResponse,
) {
    use spate_protocol::messages::delete_records_response::{
        DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
    };
    for t in denied {
        let mut r = DeleteRecordsTopicResult::default();
        r.name = t.name;
        for p in t.partitions {
            let mut rp = DeleteRecordsPartitionResult::default();
            rp.partition_index = p.partition_index;
            rp.low_watermark = -1;
            rp.error_code = ResponseError::TopicAuthorizationFailed.code();
            r.partitions.push(rp);
        }
        resp.topics.push(r);
    }
}
