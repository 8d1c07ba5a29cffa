//! KIP-848 consumer groups: ConsumerGroupHeartbeat and ConsumerGroupDescribe.

use std::sync::Arc;

use spate_groups::consumer_group::{HeartbeatRequest, TopicPartitions, TopicsView};
use spate_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member,
    TopicPartitions as DescribedPartitions,
};
use spate_protocol::messages::consumer_group_heartbeat_response::{
    Assignment, TopicPartitions as HeartbeatPartitions,
};
use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};

use super::{group_operations, msg};
use crate::Broker;

/// ConsumerGroupDescribe v1's member type of a member using the consumer protocol.
const MEMBER_TYPE_CONSUMER: i8 = 1;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The topics that exist now, as the coordinator sees them.
fn topics_view(b: &Broker) -> TopicsView {
    b.topics
        .list()
        .into_iter()
        .map(|t| (t.name.clone(), (t.id, t.partition_count())))
        .collect()
}

fn heartbeat_error(e: ResponseError, message: Option<String>) -> ConsumerGroupHeartbeatResponse {
    let mut resp = ConsumerGroupHeartbeatResponse::default();
    resp.error_code = e.code();
    resp.error_message = message.map(StrBytes::from_string);
    resp
}

/// Answers ConsumerGroupHeartbeat once the group's changes are as durable as commits.
pub fn heartbeat(
    b: &Arc<Broker>,
    version: i16,
    client_id: &str,
    client_host: &str,
    req: ConsumerGroupHeartbeatRequest,
) -> impl std::future::Future<Output = ConsumerGroupHeartbeatResponse> + Send + 'static {
    let owned = req.topic_partitions.map(|tps| {
        let mut out = TopicPartitions::new();
        for tp in tps {
            out.entry(tp.topic_id)
                .or_default()
                .extend(tp.partitions.iter().copied());
        }
        out
    });
    let request = HeartbeatRequest {
        version,
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|i| i.to_string()),
        rack_id: req.rack_id.map(|r| r.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .map(|ns| ns.iter().map(|n| n.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.map(|r| r.to_string()),
        server_assignor: req.server_assignor.map(|a| a.to_string()),
        owned,
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
    };
    let answered = b.groups.is_coordinator(&request.group_id).then(|| {
        let (answer, written) = b.groups.consumer_heartbeat(&topics_view(b), request);
        (answer, written.map(|w| b.groups.durable(&w)))
    });
    async move {
        let Some((answer, durable)) = answered else {
            return heartbeat_error(ResponseError::NotCoordinator, None);
        };
        if let Some(d) = durable {
            if let Err(e) = d.await {
                return heartbeat_error(e, None);
            }
        }
        let r = match answer {
            Ok(r) => r,
            Err(e) => return heartbeat_error(e.error, Some(e.message)),
        };
        let mut resp = ConsumerGroupHeartbeatResponse::default();
        resp.member_id = Some(s(&r.member_id));
        resp.member_epoch = r.member_epoch;
        resp.heartbeat_interval_ms = r.heartbeat_interval_ms;
        resp.assignment = r.assignment.map(|a| {
            let mut out = Assignment::default();
            out.topic_partitions = a
                .into_iter()
                .map(|(id, ps)| {
                    let mut tp = HeartbeatPartitions::default();
                    tp.topic_id = id;
                    tp.partitions = ps.into_iter().collect();
                    tp
                })
                .collect();
            out
        });
        resp
    }
}

fn described(b: &Broker, a: &TopicPartitions) -> DescribedAssignment {
    let mut out = DescribedAssignment::default();
    out.topic_partitions = a
        .iter()
        .map(|(id, ps)| {
            let mut tp = DescribedPartitions::default();
            tp.topic_id = *id;
            // A topic deleted since keeps its id; its name is gone.
            tp.topic_name = s(&b
                .topics
                .get_by_id(id)
                .map(|t| t.name.clone())
                .unwrap_or_default())
            .into();
            tp.partitions = ps.iter().copied().collect();
            tp
        })
        .collect();
    out
}

/// Answers ConsumerGroupDescribe: members, their assignments, targets and epochs.
pub fn describe(
    b: &Broker,
    version: i16,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut resp = ConsumerGroupDescribeResponse::default();
    for id in req.group_ids {
        let mut g = DescribedGroup::default();
        g.group_id = id.clone();
        g.authorized_operations = group_operations(req.include_authorized_operations);
        if !b.groups.is_coordinator(&id) {
            g.error_code = ResponseError::NotCoordinator.code();
            resp.groups.push(g);
            continue;
        }
        let Some(d) = b.groups.consumer(|c| c.describe(&id)) else {
            g.error_code = ResponseError::GroupIdNotFound.code();
            let classic = b.groups.coordinator(|c| c.describe(&id).is_some());
            g.error_message = msg(if classic {
                format!("Group {} is not a consumer group.", id.as_str())
            } else {
                format!("Group {} not found.", id.as_str())
            });
            g.group_state = s("Dead");
            resp.groups.push(g);
            continue;
        };
        g.group_state = s(d.state.name());
        g.group_epoch = d.epoch;
        g.assignment_epoch = d.assignment_epoch;
        g.assignor_name = s(d.assignor.name());
        g.members = d
            .members
            .into_iter()
            .map(|m| {
                let r = m.member;
                let mut out = Member::default();
                out.member_id = s(&r.member_id);
                out.instance_id = r.instance_id.as_deref().map(s);
                out.rack_id = r.rack_id.as_deref().map(s);
                out.member_epoch = r.epoch;
                out.client_id = s(&r.client_id);
                out.client_host = s(&r.client_host);
                out.subscribed_topic_names = r.topic_names.iter().map(|n| s(n).into()).collect();
                out.subscribed_topic_regex = r.topic_regex.as_deref().map(s);
                out.assignment = described(b, &r.assigned);
                out.target_assignment = described(b, &m.target);
                if version >= 1 {
                    out.member_type = MEMBER_TYPE_CONSUMER;
                }
                out
            })
            .collect();
        resp.groups.push(g);
    }
    resp
}
