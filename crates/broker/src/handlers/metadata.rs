//! Metadata: brokers, topics and partition leadership; auto-creates topics when allowed.

use std::sync::Arc;

use spate_protocol::messages::metadata_request::MetadataRequestTopic;
use spate_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use spate_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use spate_protocol::{ResponseError, StrBytes};

use super::{CLUSTER_OPERATIONS, OPERATIONS_OMITTED, TOPIC_OPERATIONS};
use crate::registry::{validate_topic_name, Topic};
use crate::topic_config::TopicConfig;
use crate::Broker;

/// Answers a Metadata request.
pub fn handle(b: &Broker, version: i16, req: MetadataRequest) -> MetadataResponse {
    let mut resp = MetadataResponse::default();
    let mut node = MetadataResponseBroker::default();
    node.node_id = b.config.node_id.into();
    node.host = StrBytes::from_string(b.config.advertised_host.clone());
    node.port = b.config.advertised_port;
    resp.brokers = vec![node];
    let Shape { with_ops, all } =
        fill_cluster_fields(&mut resp, version, &req, &b.cluster_id, b.config.node_id);
    let auto_create = b.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    if all {
        resp.topics = b
            .topics
            .list()
            .iter()
            .map(|t| describe(b, version, t, with_ops))
            .collect();
        return resp;
    }
    for wanted in req.topics.unwrap_or_default() {
        let topic = match &wanted.name {
            Some(name) => lookup_or_create(b, name, auto_create),
            None => b
                .topics
                .get_by_id(&wanted.topic_id)
                .ok_or(ResponseError::UnknownTopicId),
        };
        match topic {
            Ok(t) => resp.topics.push(describe(b, version, &t, with_ops)),
            Err(code) => resp.topics.push(missing_topic(version, &wanted, code)),
        }
    }
    resp
}

/// What a Metadata request asks for besides its topic names.
pub(crate) struct Shape {
    /// Topic authorized operations wanted.
    pub with_ops: bool,
    /// Every topic wanted.
    pub all: bool,
}

/// Fills the cluster id, controller and cluster operations a version carries; returns the
/// request's shape.
pub(crate) fn fill_cluster_fields(
    resp: &mut MetadataResponse,
    version: i16,
    req: &MetadataRequest,
    cluster_id: &str,
    controller_id: i32,
) -> Shape {
    if version >= 2 {
        resp.cluster_id = Some(StrBytes::from_string(cluster_id.to_owned()));
    }
    if version >= 1 {
        resp.controller_id = controller_id.into();
    }
    if (8..=10).contains(&version) {
        resp.cluster_authorized_operations = if req.include_cluster_authorized_operations {
            CLUSTER_OPERATIONS
        } else {
            OPERATIONS_OMITTED
        };
    }
    Shape {
        with_ops: version >= 8 && req.include_topic_authorized_operations,
        // v0 asks for all topics with an empty list; v1+ with null.
        all: match &req.topics {
            None => true,
            Some(t) => version == 0 && t.is_empty(),
        },
    }
}

/// The answer for a requested topic that cannot be described.
pub(crate) fn missing_topic(
    version: i16,
    wanted: &MetadataRequestTopic,
    code: ResponseError,
) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.error_code = code.code();
    t.name = wanted.name.clone();
    if version >= 10 {
        t.topic_id = wanted.topic_id;
    }
    if version >= 8 {
        t.topic_authorized_operations = OPERATIONS_OMITTED;
    }
    t
}

fn lookup_or_create(
    b: &Broker,
    name: &TopicName,
    auto_create: bool,
) -> Result<Arc<Topic>, ResponseError> {
    if let Some(t) = b.topics.get(name) {
        return Ok(t);
    }
    if validate_topic_name(name).is_err() {
        return Err(ResponseError::InvalidTopicException);
    }
    if !auto_create {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    match b.topics.create(
        name,
        b.config.default_partitions,
        TopicConfig::default(),
        false,
    ) {
        Ok(Some(t)) => {
            tracing::info!(topic = %name.as_str(), partitions = b.config.default_partitions, "auto-created topic");
            Ok(t)
        }
        // Lost a race with another creator: use theirs.
        Ok(None) | Err(_) => b
            .topics
            .get(name)
            .ok_or(ResponseError::UnknownTopicOrPartition),
    }
}

fn describe(b: &Broker, version: i16, t: &Topic, with_ops: bool) -> MetadataResponseTopic {
    let node = b.config.node_id;
    let mut out = MetadataResponseTopic::default();
    out.name = Some(StrBytes::from_string(t.name.clone()).into());
    out.is_internal = crate::groups::is_internal(&t.name);
    if version >= 10 {
        out.topic_id = t.id;
    }
    if version >= 8 {
        out.topic_authorized_operations = if with_ops {
            TOPIC_OPERATIONS
        } else {
            OPERATIONS_OMITTED
        };
    }
    out.partitions = t
        .partitions()
        .iter()
        .map(|p| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = p.index;
            mp.leader_id = node.into();
            if version >= 7 {
                mp.leader_epoch = p.leader_epoch();
            }
            mp.replica_nodes = vec![node.into()];
            mp.isr_nodes = vec![node.into()];
            if p.is_offline() {
                // As Kafka reports a replica on a failed log dir: clients back off and retry.
                mp.error_code = ResponseError::KafkaStorageError.code();
                if version >= 5 {
                    mp.offline_replicas = vec![node.into()];
                }
            }
            mp
        })
        .collect();
    out
}
