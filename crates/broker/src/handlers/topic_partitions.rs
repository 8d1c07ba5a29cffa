//! DescribeTopicPartitions (KIP-966): topics and their partitions, sorted by name and paged
//! with a cursor, as Kafka 4's `kafka-topics.sh --describe` asks for them. The answer is the
//! Metadata view (standalone or the cluster's image) in this API's shape.

use std::sync::Arc;

use spate_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use spate_protocol::messages::metadata_request::MetadataRequestTopic;
use spate_protocol::messages::{
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, MetadataRequest,
    MetadataResponse, TopicName,
};

use crate::Broker;

/// Kafka's `max.request.partition.size.limit`: the most partitions one response carries.
const PARTITION_LIMIT_MAX: usize = 2000;

/// The Metadata version whose shape the view is taken in (topic ids, authorized operations).
const VIEW_VERSION: i16 = 12;

/// The Metadata answer for `topics` (`None`: every topic), never creating one.
pub(crate) fn metadata_view(b: &Arc<Broker>, topics: Option<Vec<TopicName>>) -> MetadataResponse {
    let mut req = MetadataRequest::default();
    req.allow_auto_topic_creation = false;
    req.include_topic_authorized_operations = true;
    req.topics = topics.map(|names| {
        names
            .into_iter()
            .map(|n| {
                let mut t = MetadataRequestTopic::default();
                t.name = Some(n);
                t
            })
            .collect()
    });
    b.topology().describe_topics(b, VIEW_VERSION, req)
}

/// Answers DescribeTopicPartitions.
pub fn handle(
    b: &Arc<Broker>,
    req: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let wanted = (!req.topics.is_empty()).then(|| req.topics.into_iter().map(|t| t.name).collect());
    let mut view = metadata_view(b, wanted);
    view.topics.sort_by(|x, y| {
        x.name
            .as_deref()
            .map(|n| n.as_str())
            .cmp(&y.name.as_deref().map(|n| n.as_str()))
    });
    let limit = usize::try_from(req.response_partition_limit)
        .unwrap_or(0)
        .clamp(1, PARTITION_LIMIT_MAX);
    let (cursor_topic, cursor_partition) = match &req.cursor {
        Some(c) => (
            Some(c.topic_name.as_str().to_owned()),
            c.partition_index.max(0),
        ),
        None => (None, 0),
    };
    let mut resp = DescribeTopicPartitionsResponse::default();
    let mut left = limit;
    for mut t in view.topics {
        let name = t
            .name
            .as_ref()
            .map(|n| n.as_str().to_owned())
            .unwrap_or_default();
        if cursor_topic.as_deref().is_some_and(|c| name.as_str() < c) {
            continue;
        }
        let first = if cursor_topic.as_deref() == Some(name.as_str()) {
            cursor_partition
        } else {
            0
        };
        if left == 0 {
            // The page is full: the next one starts with this topic.
            resp.next_cursor = Some(cursor(&name, first));
            break;
        }
        t.partitions.sort_by_key(|p| p.partition_index);
        let mut out = DescribeTopicPartitionsResponseTopic::default();
        out.error_code = t.error_code;
        out.name = t.name.clone();
        out.topic_id = t.topic_id;
        out.is_internal = t.is_internal;
        out.topic_authorized_operations = t.topic_authorized_operations;
        for p in t
            .partitions
            .into_iter()
            .filter(|p| p.partition_index >= first)
        {
            if left == 0 {
                resp.next_cursor = Some(cursor(&name, p.partition_index));
                break;
            }
            let mut q = DescribeTopicPartitionsResponsePartition::default();
            q.error_code = p.error_code;
            q.partition_index = p.partition_index;
            q.leader_id = p.leader_id;
            q.leader_epoch = p.leader_epoch;
            q.replica_nodes = p.replica_nodes;
            q.isr_nodes = p.isr_nodes;
            // spate has no eligible leader replicas (KIP-966's ELR is off, as in Kafka's
            // default): empty lists, not null.
            q.eligible_leader_replicas = Some(Vec::new());
            q.last_known_elr = Some(Vec::new());
            q.offline_replicas = p.offline_replicas;
            out.partitions.push(q);
            left -= 1;
        }
        resp.topics.push(out);
        if resp.next_cursor.is_some() {
            break;
        }
    }
    resp
}

fn cursor(topic: &str, partition: i32) -> Cursor {
    let mut c = Cursor::default();
    c.topic_name = TopicName(topic.to_owned().into());
    c.partition_index = partition;
    c
}
