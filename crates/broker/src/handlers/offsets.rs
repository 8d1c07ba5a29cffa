//! OffsetCommit, OffsetFetch and OffsetDelete.

use std::sync::Arc;

use spate_groups::consumer_group::OffsetCheck;
use spate_groups::{CommitCheck, Committed};
use spate_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use spate_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use spate_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};

use crate::Broker;

/// Commits offsets for a group member (or a consumer without group management) and answers
/// once they are as durable as the fsync policy promises.
pub fn commit(
    b: &Arc<Broker>,
    version: i16,
    req: OffsetCommitRequest,
) -> impl std::future::Future<Output = OffsetCommitResponse> + Send + 'static {
    let group = req.group_id.to_string();
    let instance = req.group_instance_id.as_deref();
    let check = if group.is_empty() {
        CommitCheck::Reject(ResponseError::InvalidGroupId)
    } else if !b.groups.is_coordinator(&group) {
        CommitCheck::Reject(ResponseError::NotCoordinator)
    } else if b.groups.consumer(|c| c.contains(&group)) {
        // A KIP-848 group: the member epoch must be the member's current one.
        match b.groups.consumer(|c| {
            c.check_commit(
                &group,
                &req.member_id,
                req.generation_id_or_member_epoch,
                version,
            )
        }) {
            OffsetCheck::Accept => CommitCheck::Accept,
            OffsetCheck::Reject(e) => CommitCheck::Reject(e),
        }
    } else {
        b.groups.with(|c, now| {
            (
                c.check_commit(
                    now,
                    &group,
                    req.generation_id_or_member_epoch,
                    &req.member_id,
                    instance,
                ),
                Vec::new(),
            )
        })
    };
    // Commit timestamps are wall time: Kafka reports them, and retention counts from them.
    let now = b.clock.now_ms();
    let max_meta = b.groups.settings().max_metadata_bytes;
    let mut resp = OffsetCommitResponse::default();
    let mut entries = Vec::new();
    for t in &req.topics {
        let mut tr = OffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        let topic = b.topics.get(&t.name);
        for p in &t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            let error = match check {
                CommitCheck::Reject(e) => Some(e),
                CommitCheck::Accept
                    if topic
                        .as_ref()
                        .is_none_or(|t| !t.has_partition(p.partition_index)) =>
                {
                    Some(ResponseError::UnknownTopicOrPartition)
                }
                CommitCheck::Accept
                    if p.committed_metadata
                        .as_ref()
                        .is_some_and(|m| m.len() > max_meta) =>
                {
                    Some(ResponseError::OffsetMetadataTooLarge)
                }
                CommitCheck::Accept => {
                    entries.push((
                        t.name.to_string(),
                        p.partition_index,
                        Some(Committed {
                            offset: p.committed_offset,
                            leader_epoch: if version >= 6 {
                                p.committed_leader_epoch
                            } else {
                                -1
                            },
                            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                            commit_timestamp_ms: now,
                        }),
                    ));
                    None
                }
            };
            pr.error_code = error.map_or(0, |e| e.code());
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    let written = b.groups.write(&group, &entries);
    let durable = written.as_ref().ok().map(|w| b.groups.durable(w));
    async move {
        let failure = match (written, durable) {
            (Err(e), _) => Some(e),
            (Ok(_), Some(d)) => d.await.err(),
            (Ok(_), None) => None,
        };
        if let Some(e) = failure {
            for p in resp.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                if p.error_code == 0 {
                    p.error_code = e.code();
                }
            }
        }
        resp
    }
}

fn committed(b: &Broker, group: &str, topic: &str, partition: i32) -> (i64, i32, Option<StrBytes>) {
    b.groups.offsets(|o| match o.get(group, topic, partition) {
        Some(c) => (
            c.offset,
            c.leader_epoch,
            Some(StrBytes::from_string(
                c.metadata.clone().unwrap_or_default(),
            )),
        ),
        None => (-1, -1, Some(StrBytes::default())),
    })
}

/// (topic, partitions) a fetch asks about; `None` means every committed partition.
fn wanted(
    b: &Broker,
    group: &str,
    topics: Option<Vec<(TopicName, Vec<i32>)>>,
) -> Vec<(TopicName, Vec<i32>)> {
    match topics {
        Some(t) => t,
        None => {
            let mut all: Vec<(TopicName, Vec<i32>)> = Vec::new();
            for (t, p, _) in b.groups.offsets(|o| {
                o.group(group)
                    .into_iter()
                    .map(|(t, p, c)| (t.to_string(), p, c.clone()))
                    .collect::<Vec<_>>()
            }) {
                match all.last_mut() {
                    Some((name, parts)) if name.as_str() == t => parts.push(p),
                    _ => all.push((StrBytes::from_string(t).into(), vec![p])),
                }
            }
            all
        }
    }
}

/// Answers OffsetFetch: one group before v8, several from v8.
pub fn fetch(b: &Broker, version: i16, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version < 8 && !b.groups.is_coordinator(&req.group_id) {
        // The client looks the coordinator up again and asks there.
        let e = ResponseError::NotCoordinator.code();
        if version >= 2 {
            resp.error_code = e;
        } else {
            for t in req.topics.into_iter().flatten() {
                let mut rt = OffsetFetchResponseTopic::default();
                rt.name = t.name;
                for p in t.partition_indexes {
                    let mut pr = OffsetFetchResponsePartition::default();
                    pr.partition_index = p;
                    pr.committed_offset = -1;
                    pr.error_code = e;
                    rt.partitions.push(pr);
                }
                resp.topics.push(rt);
            }
        }
        return resp;
    }
    if version >= 8 {
        for g in req.groups {
            let mut out = OffsetFetchResponseGroup::default();
            out.group_id = g.group_id.clone();
            if !b.groups.is_coordinator(&g.group_id) {
                // The client looks this group's coordinator up again and asks there.
                out.error_code = ResponseError::NotCoordinator.code();
                resp.groups.push(out);
                continue;
            }
            let member = g.member_id.as_deref();
            if let OffsetCheck::Reject(e) = b
                .groups
                .consumer(|c| c.check_fetch(&g.group_id, member, g.member_epoch))
            {
                out.error_code = e.code();
                resp.groups.push(out);
                continue;
            }
            let topics = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name, t.partition_indexes))
                    .collect()
            });
            for (name, parts) in wanted(b, &g.group_id, topics) {
                let mut t = OffsetFetchResponseTopics::default();
                t.name = name.clone();
                for p in parts {
                    let mut pr = OffsetFetchResponsePartitions::default();
                    pr.partition_index = p;
                    if req.require_stable && b.groups.has_pending_txn_offset(&g.group_id, &name, p)
                    {
                        pr.committed_offset = -1;
                        pr.committed_leader_epoch = -1;
                        pr.error_code = ResponseError::UnstableOffsetCommit.code();
                        t.partitions.push(pr);
                        continue;
                    }
                    let (offset, epoch, metadata) = committed(b, &g.group_id, &name, p);
                    pr.committed_offset = offset;
                    pr.committed_leader_epoch = epoch;
                    pr.metadata = metadata;
                    t.partitions.push(pr);
                }
                out.topics.push(t);
            }
            resp.groups.push(out);
        }
        return resp;
    }
    let group = req.group_id.to_string();
    let topics = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    for (name, parts) in wanted(b, &group, topics) {
        let mut t = OffsetFetchResponseTopic::default();
        t.name = name.clone();
        for p in parts {
            let mut pr = OffsetFetchResponsePartition::default();
            pr.partition_index = p;
            // v7 asks for stable offsets: one still settling in a transaction is retried.
            if version >= 7
                && req.require_stable
                && b.groups.has_pending_txn_offset(&group, &name, p)
            {
                pr.committed_offset = -1;
                pr.error_code = ResponseError::UnstableOffsetCommit.code();
                t.partitions.push(pr);
                continue;
            }
            let (offset, epoch, metadata) = committed(b, &group, &name, p);
            pr.committed_offset = offset;
            if version >= 5 {
                pr.committed_leader_epoch = epoch;
            }
            pr.metadata = metadata;
            t.partitions.push(pr);
        }
        resp.topics.push(t);
    }
    resp
}

/// Answers OffsetDelete: refused for topics the group's live members subscribe to.
pub fn delete(b: &Broker, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let mut resp = OffsetDeleteResponse::default();
    if !b.groups.is_coordinator(&req.group_id) {
        resp.error_code = ResponseError::NotCoordinator.code();
        return resp;
    }
    let group = req.group_id.to_string();
    let (described, mut subscribed) = b
        .groups
        .coordinator(|c| (c.describe(&group), c.subscribed_topics(&group)));
    let consumer = b.groups.consumer(|c| {
        c.contains(&group)
            .then(|| (c.has_members(&group), c.subscribed_topics(&group)))
    });
    if described.is_none() && consumer.is_none() && !b.groups.offsets(|o| o.has_group(&group)) {
        resp.error_code = ResponseError::GroupIdNotFound.code();
        return resp;
    }
    let mut has_members = described.as_ref().is_some_and(|d| !d.members.is_empty());
    let mut protocol_type = described.as_ref().map(|d| d.protocol_type.as_str());
    if let Some((members, topics)) = consumer {
        has_members = members;
        protocol_type = Some("consumer");
        subscribed = topics;
    }
    if has_members && protocol_type != Some("consumer") {
        resp.error_code = ResponseError::NonEmptyGroup.code();
        return resp;
    }
    let mut tombstones = Vec::new();
    for t in req.topics {
        let mut tr = OffsetDeleteResponseTopic::default();
        tr.name = t.name.clone();
        let busy = has_members && subscribed.iter().any(|s| s.as_str() == t.name.as_str());
        for p in t.partitions {
            let mut pr = OffsetDeleteResponsePartition::default();
            pr.partition_index = p.partition_index;
            if busy {
                pr.error_code = ResponseError::GroupSubscribedToTopic.code();
            } else if b
                .topics
                .get(&t.name)
                .is_none_or(|x| !x.has_partition(p.partition_index))
            {
                pr.error_code = ResponseError::UnknownTopicOrPartition.code();
            } else {
                tombstones.push((t.name.to_string(), p.partition_index, None));
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    if let Err(e) = b.groups.write(&group, &tombstones) {
        resp.error_code = e.code();
    }
    resp
}
