//! `controller_mutation_rate` (KIP-599): partitions created or deleted per second by one
//! client. A client already over its rate has its CreateTopics, CreatePartitions and
//! DeleteTopics refused with THROTTLING_QUOTA_EXCEEDED and the time to wait (the versions
//! that know the error: CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+; older ones
//! are served and the connection muted instead). An accepted request counts its partitions
//! and mutes the connection for as long as that takes the client over its rate.

use std::sync::Arc;

use spate_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use spate_protocol::messages::create_topics_response::CreatableTopicResult;
use spate_protocol::messages::delete_topics_response::DeletableTopicResult;
use spate_protocol::messages::{
    CreatePartitionsResponse, CreateTopicsResponse, DeleteTopicsResponse, RequestHeader,
};
use spate_protocol::request::Request;
use spate_protocol::ResponseError;

use super::msg;
use crate::quotas::{Mute, QuotaKind, ANONYMOUS};
use crate::Broker;

/// What the gate decided for a topic-changing request.
pub enum Gate {
    /// Serve it (the mutations are counted).
    Pass,
    /// Answer with this refusal instead.
    Refuse(Refusal),
}

/// A refused request's answer: every topic THROTTLING_QUOTA_EXCEEDED.
pub enum Refusal {
    /// For CreateTopics.
    CreateTopics(CreateTopicsResponse),
    /// For CreatePartitions.
    CreatePartitions(CreatePartitionsResponse),
    /// For DeleteTopics.
    DeleteTopics(DeleteTopicsResponse),
}

/// Checks and counts a CreateTopics, CreatePartitions or DeleteTopics request against the
/// client's controller mutation rate; any other request passes untouched.
pub fn gate(b: &Broker, header: &RequestHeader, req: &Request, mute: Option<&Arc<Mute>>) -> Gate {
    if !b.quotas.is_active() {
        return Gate::Pass;
    }
    let version = header.request_api_version;
    let (partitions, knows_error) = match req {
        Request::CreateTopics(r) => (
            r.topics
                .iter()
                .map(|t| {
                    if t.num_partitions > 0 {
                        t.num_partitions
                    } else if !t.assignments.is_empty() {
                        t.assignments.len() as i32
                    } else {
                        b.config.default_partitions
                    }
                })
                .sum::<i32>(),
            version >= 6,
        ),
        Request::CreatePartitions(r) => (
            r.topics
                .iter()
                .map(|t| (t.count - current_partitions(b, t.name.as_str())).max(0))
                .sum(),
            version >= 3,
        ),
        Request::DeleteTopics(r) => {
            let names = r.topic_names.iter().map(|n| n.as_str().to_owned()).chain(
                r.topics
                    .iter()
                    .filter_map(|t| t.name.as_ref().map(|n| n.as_str().to_owned())),
            );
            (names.map(|n| current_partitions(b, &n)).sum(), version >= 5)
        }
        _ => return Gate::Pass,
    };
    let client_id = header.client_id.as_deref().unwrap_or("");
    let waiting = b
        .quotas
        .throttle_of(QuotaKind::ControllerMutation, ANONYMOUS, client_id);
    if waiting > 0 && knows_error {
        let throttle = i32::try_from(waiting).unwrap_or(i32::MAX);
        if let Some(r) = refusal(req, throttle) {
            return Gate::Refuse(r);
        }
    }
    let ms = b.quotas.record(
        QuotaKind::ControllerMutation,
        ANONYMOUS,
        client_id,
        f64::from(partitions.max(0)),
    );
    if let Some(m) = mute {
        m.mute_for(ms.max(waiting));
    }
    Gate::Pass
}

fn current_partitions(b: &Broker, topic: &str) -> i32 {
    b.topology().partition_count(b, topic)
}

const WHY: &str = "the controller mutation rate quota is exceeded; retry after throttle_time_ms";

fn refusal(req: &Request, throttle_ms: i32) -> Option<Refusal> {
    let code = ResponseError::ThrottlingQuotaExceeded.code();
    match req {
        Request::CreateTopics(r) => {
            let mut resp = CreateTopicsResponse::default();
            resp.throttle_time_ms = throttle_ms;
            resp.topics = r
                .topics
                .iter()
                .map(|t| {
                    let mut out = CreatableTopicResult::default();
                    out.name = t.name.clone();
                    out.error_code = code;
                    out.error_message = msg(WHY);
                    out.num_partitions = -1;
                    out.replication_factor = -1;
                    out
                })
                .collect();
            Some(Refusal::CreateTopics(resp))
        }
        Request::CreatePartitions(r) => {
            let mut resp = CreatePartitionsResponse::default();
            resp.throttle_time_ms = throttle_ms;
            resp.results = r
                .topics
                .iter()
                .map(|t| {
                    let mut out = CreatePartitionsTopicResult::default();
                    out.name = t.name.clone();
                    out.error_code = code;
                    out.error_message = msg(WHY);
                    out
                })
                .collect();
            Some(Refusal::CreatePartitions(resp))
        }
        Request::DeleteTopics(r) => {
            let mut resp = DeleteTopicsResponse::default();
            resp.throttle_time_ms = throttle_ms;
            let by_name = r
                .topic_names
                .iter()
                .map(|n| (Some(n.clone()), Default::default()));
            let by_state = r.topics.iter().map(|t| (t.name.clone(), t.topic_id));
            resp.responses = by_name
                .chain(by_state)
                .map(|(name, topic_id)| {
                    let mut out = DeletableTopicResult::default();
                    out.name = name;
                    out.topic_id = topic_id;
                    out.error_code = code;
                    out.error_message = msg(WHY);
                    out
                })
                .collect();
            Some(Refusal::DeleteTopics(resp))
        }
        _ => None,
    }
}
