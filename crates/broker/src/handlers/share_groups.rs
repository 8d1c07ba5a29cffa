//! KIP-932 share groups: ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and
//! ShareAcknowledge, translated between the wire and [`crate::share::ShareService`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use spate_protocol::messages::share_fetch_response::{
    AcquiredRecords, LeaderIdAndEpoch, PartitionData, ShareFetchableTopicResponse,
};
use spate_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member,
    TopicPartitions as DescribedPartitions,
};
use spate_protocol::messages::share_group_heartbeat_response::{
    Assignment, TopicPartitions as HeartbeatPartitions,
};
use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};
use spate_share::{AckBatch, AckType, HeartbeatRequest};
use uuid::Uuid;

use super::{group_operations, msg};
use crate::groups::Written;
use crate::share::{Checked, SpKey, TopicPartition};
use crate::Broker;

/// Upper bound on how long a ShareFetch may wait, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(60);
/// Records per ShareFetch when the request does not say (the client's `max.poll.records`).
const DEFAULT_MAX_RECORDS: u32 = 500;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Share groups are served by a standalone broker only: in a cluster the share state would
/// have to follow partition leadership, which is not built yet. True in a cluster.
pub(crate) fn clustered(b: &Broker) -> bool {
    b.cluster.get().is_some() || b.config.cluster_mode
}

/// True when a classic or consumer group uses this id.
fn other_group_type(b: &Broker, group: &str) -> bool {
    b.groups
        .coordinator(|c| c.list())
        .iter()
        .any(|g| g.0 == group)
        || b.groups.consumer(|c| c.list()).iter().any(|g| g.0 == group)
}

/// Waits for every write; the first failure wins.
async fn all_durable(b: &Arc<Broker>, written: Vec<Written>) -> Result<(), ResponseError> {
    let waits: Vec<_> = written.iter().map(|w| b.shares.durable(w)).collect();
    for w in waits {
        w.await?;
    }
    Ok(())
}

fn heartbeat_error(e: ResponseError, message: Option<String>) -> ShareGroupHeartbeatResponse {
    let mut resp = ShareGroupHeartbeatResponse::default();
    resp.error_code = e.code();
    resp.error_message = message.map(StrBytes::from_string);
    resp
}

/// Answers ShareGroupHeartbeat once the share-partition state it wrote is durable.
pub fn heartbeat(
    b: &Arc<Broker>,
    client_id: &str,
    client_host: &str,
    req: ShareGroupHeartbeatRequest,
) -> impl std::future::Future<Output = ShareGroupHeartbeatResponse> + Send + 'static {
    let group = req.group_id.to_string();
    let answered = if clustered(b) {
        Err(heartbeat_error(
            ResponseError::UnsupportedVersion,
            Some("share groups are served by standalone spate brokers only".into()),
        ))
    } else if group.is_empty() {
        Err(heartbeat_error(
            ResponseError::InvalidRequest,
            Some("GroupId can't be empty.".into()),
        ))
    } else if other_group_type(b, &group) {
        Err(heartbeat_error(
            ResponseError::GroupIdNotFound,
            Some(format!("Group {group} is not a share group.")),
        ))
    } else {
        let request = HeartbeatRequest {
            member_id: req.member_id.to_string(),
            member_epoch: req.member_epoch,
            rack_id: req.rack_id.map(|r| r.to_string()),
            subscribed_topic_names: req
                .subscribed_topic_names
                .map(|ns| ns.iter().map(|n| n.to_string()).collect()),
            client_id: client_id.to_string(),
            client_host: client_host.to_string(),
        };
        Ok(b.shares.heartbeat(&b.topics, &group, &request))
    };
    let b = b.clone();
    async move {
        let (answer, written) = match answered {
            Ok(a) => a,
            Err(resp) => return resp,
        };
        if let Err(e) = all_durable(&b, written).await {
            return heartbeat_error(e, None);
        }
        let r = match answer {
            Ok(r) => r,
            Err(e) => return heartbeat_error(e.error, Some(e.message)),
        };
        let mut resp = ShareGroupHeartbeatResponse::default();
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

/// Answers ShareGroupDescribe: members, their subscriptions and assignments, epochs.
pub fn describe(b: &Broker, req: ShareGroupDescribeRequest) -> ShareGroupDescribeResponse {
    let mut resp = ShareGroupDescribeResponse::default();
    for id in req.group_ids {
        let mut g = DescribedGroup::default();
        g.group_id = id.clone();
        g.authorized_operations = group_operations(req.include_authorized_operations);
        match b.shares.describe(&id) {
            Some(d) => {
                g.group_state = s(d.state.name());
                g.group_epoch = d.group_epoch;
                g.assignment_epoch = d.assignment_epoch;
                g.assignor_name = s(d.assignor_name);
                g.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut out = Member::default();
                        out.member_id = s(&m.member_id);
                        out.rack_id = m.rack_id.as_deref().map(s);
                        out.member_epoch = m.member_epoch;
                        out.client_id = s(&m.client_id);
                        out.client_host = s(&m.client_host);
                        out.subscribed_topic_names = m
                            .subscribed_topic_names
                            .iter()
                            .map(|t| s(t).into())
                            .collect();
                        let mut a = DescribedAssignment::default();
                        a.topic_partitions = m
                            .assignment
                            .iter()
                            .map(|(tid, ps)| {
                                let mut tp = DescribedPartitions::default();
                                tp.topic_id = *tid;
                                tp.topic_name = s(&b
                                    .topics
                                    .get_by_id(tid)
                                    .map(|t| t.name.clone())
                                    .unwrap_or_default())
                                .into();
                                tp.partitions = ps.iter().copied().collect();
                                tp
                            })
                            .collect();
                        out.assignment = a;
                        out
                    })
                    .collect();
            }
            None if other_group_type(b, &id) => {
                g.error_code = ResponseError::GroupIdNotFound.code();
                g.error_message = msg(format!("Group {} is not a share group.", &*id));
            }
            None => {
                g.error_code = ResponseError::GroupIdNotFound.code();
                g.error_message = msg(format!("Group {} not found.", &*id));
            }
        }
        resp.groups.push(g);
    }
    resp
}

/// Acknowledgement batches from the wire; `None` when a type code is unknown.
fn ack_batches<'a>(wire: impl Iterator<Item = (i64, i64, &'a [i8])>) -> Option<Vec<AckBatch>> {
    wire.map(|(first, last, types)| {
        let types = types
            .iter()
            .map(|t| AckType::from_code(*t))
            .collect::<Option<Vec<_>>>()?;
        Some(AckBatch { first, last, types })
    })
    .collect()
}

/// Applies one partition's acknowledgements; the error code to answer and the write.
fn apply_acks(
    b: &Broker,
    key: &SpKey,
    member: &str,
    batches: Option<Vec<AckBatch>>,
    written: &mut Vec<Written>,
) -> i16 {
    let Some(batches) = batches else {
        return ResponseError::InvalidRequest.code();
    };
    match b.shares.acknowledge(&b.topics, key, member, &batches) {
        Ok(w) => {
            written.extend(w);
            0
        }
        Err(e) => e.code(),
    }
}

fn leader(b: &Broker, key: &SpKey) -> LeaderIdAndEpoch {
    let mut l = LeaderIdAndEpoch::default();
    l.leader_id = b.config.node_id;
    l.leader_epoch = b
        .topics
        .get_by_id(&key.1)
        .and_then(|t| t.partition(key.2))
        .map_or(-1, |p| p.leader_epoch());
    l
}

fn fetch_error(e: ResponseError) -> ShareFetchResponse {
    let mut resp = ShareFetchResponse::default();
    resp.error_code = e.code();
    resp
}

/// One partition of a ShareFetch answer being put together.
struct Slot {
    key: SpKey,
    data: PartitionData,
    /// Not fetched: it carries an error, or the session is closing.
    done: bool,
}

/// Answers ShareFetch: acknowledgements first, then records acquired for the member from
/// every partition of its share session, waiting up to `max_wait_ms` for some.
pub fn fetch(
    b: &Arc<Broker>,
    req: ShareFetchRequest,
) -> impl std::future::Future<Output = ShareFetchResponse> + Send + 'static {
    let prepared = prepare_fetch(b, &req);
    let b = b.clone();
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP);
    let max_records = u32::try_from(req.max_records)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_RECORDS);
    let max_bytes = usize::try_from(req.max_bytes)
        .unwrap_or(0)
        .min(b.config.fetch_max_bytes)
        .max(1);
    async move {
        let (member, mut slots, written) = match prepared {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        if let Err(e) = all_durable(&b, written).await {
            return fetch_error(e);
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut written = Vec::new();
        loop {
            // Subscribe before acquiring so a change between the two still wakes us.
            let mut watches: Vec<tokio::sync::watch::Receiver<i64>> = slots
                .iter()
                .filter(|s| !s.done)
                .filter_map(|s| b.topics.get_by_id(&s.key.1)?.partition(s.key.2))
                .map(|p| p.watch_high_watermark())
                .collect();
            let mut released = b.shares.watch_released();
            released.borrow_and_update();
            let (mut records_left, mut bytes_left) = (max_records, max_bytes);
            let mut got = false;
            for slot in slots.iter_mut().filter(|s| !s.done) {
                if records_left == 0 || bytes_left == 0 {
                    break;
                }
                match b
                    .shares
                    .acquire(&b.topics, &slot.key, &member, records_left, bytes_left)
                {
                    Ok((acquired, w)) => {
                        written.extend(w);
                        if acquired.ranges.is_empty() {
                            continue;
                        }
                        got = true;
                        let n: i64 = acquired.ranges.iter().map(|r| r.last - r.first + 1).sum();
                        records_left = records_left.saturating_sub(n.max(0) as u32);
                        bytes_left = bytes_left.saturating_sub(acquired.records.len());
                        slot.data.records = Some(acquired.records);
                        slot.data.acquired_records = acquired
                            .ranges
                            .iter()
                            .map(|r| {
                                let mut a = AcquiredRecords::default();
                                a.first_offset = r.first;
                                a.last_offset = r.last;
                                a.delivery_count = r.delivery_count;
                                a
                            })
                            .collect();
                    }
                    Err(e) => {
                        slot.data.error_code = e.code();
                        slot.done = true;
                        got = true;
                    }
                }
            }
            let now = tokio::time::Instant::now();
            if got || now >= deadline || watches.is_empty() {
                break;
            }
            let appended = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
            let _ = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    _ = appended => {}
                    _ = released.changed() => {}
                }
            })
            .await;
        }
        if let Err(e) = all_durable(&b, written).await {
            return fetch_error(e);
        }
        let mut resp = ShareFetchResponse::default();
        resp.acquisition_lock_timeout_ms =
            i32::try_from(b.shares.settings().lock_duration_ms).unwrap_or(i32::MAX);
        let mut by_topic: BTreeMap<Uuid, Vec<PartitionData>> = BTreeMap::new();
        for slot in slots {
            by_topic.entry(slot.key.1).or_default().push(slot.data);
        }
        resp.responses = by_topic
            .into_iter()
            .map(|(topic_id, partitions)| {
                let mut t = ShareFetchableTopicResponse::default();
                t.topic_id = topic_id;
                t.partitions = partitions;
                t
            })
            .collect();
        resp
    }
}

type PreparedFetch = Result<(String, Vec<Slot>, Vec<Written>), ShareFetchResponse>;

/// The synchronous part of a ShareFetch: session, acknowledgements, which partitions.
fn prepare_fetch(b: &Broker, req: &ShareFetchRequest) -> PreparedFetch {
    if clustered(b) {
        return Err(fetch_error(ResponseError::UnsupportedVersion));
    }
    let (Some(group), Some(member)) = (req.group_id.as_deref(), req.member_id.as_deref()) else {
        return Err(fetch_error(ResponseError::InvalidRequest));
    };
    let (group, member) = (group.to_string(), member.to_string());
    if member.is_empty() || group.is_empty() {
        return Err(fetch_error(ResponseError::InvalidRequest));
    }
    let added: Vec<TopicPartition> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, p.partition_index)))
        .collect();
    let forgotten: Vec<TopicPartition> = req
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, *p)))
        .collect();
    let (checked, session) = b
        .shares
        .session(
            &group,
            &member,
            req.share_session_epoch,
            false,
            added,
            forgotten,
        )
        .map_err(fetch_error)?;
    let mut slots: BTreeMap<TopicPartition, Slot> = BTreeMap::new();
    let mut written = Vec::new();
    let slot = |b: &Broker, tp: TopicPartition| {
        let key = (group.clone(), tp.0, tp.1);
        let mut data = PartitionData::default();
        data.partition_index = tp.1;
        data.current_leader = leader(b, &key);
        data.records = Some(Default::default());
        Slot {
            key,
            data,
            done: false,
        }
    };
    // Acknowledgements piggybacked on the fetch.
    for t in &req.topics {
        for p in &t.partitions {
            if p.acknowledgement_batches.is_empty() {
                continue;
            }
            let tp = (t.topic_id, p.partition_index);
            let s = slots.entry(tp).or_insert_with(|| slot(b, tp));
            let batches = ack_batches(p.acknowledgement_batches.iter().map(|a| {
                (
                    a.first_offset,
                    a.last_offset,
                    a.acknowledge_types.as_slice(),
                )
            }));
            s.data.acknowledge_error_code = apply_acks(b, &s.key, &member, batches, &mut written);
        }
    }
    if checked == Checked::Close {
        written.extend(b.shares.close_session(&b.topics, &group, &member));
        for s in slots.values_mut() {
            s.done = true;
        }
    }
    for tp in session {
        let s = slots.entry(tp).or_insert_with(|| slot(b, tp));
        if !b.shares.subscribed(&b.topics, &group, &member, &tp.0) {
            s.data.error_code = if b.topics.get_by_id(&tp.0).is_none() {
                ResponseError::UnknownTopicId.code()
            } else {
                ResponseError::InvalidRequest.code()
            };
            s.data.error_message = msg("the member does not subscribe to this topic");
            s.done = true;
        }
    }
    Ok((member, slots.into_values().collect(), written))
}

/// Answers ShareAcknowledge once the acknowledgements are durable.
pub fn acknowledge(
    b: &Arc<Broker>,
    req: ShareAcknowledgeRequest,
) -> impl std::future::Future<Output = ShareAcknowledgeResponse> + Send + 'static {
    use spate_protocol::messages::share_acknowledge_response::{
        LeaderIdAndEpoch as AckLeader, PartitionData as AckPartition, ShareAcknowledgeTopicResponse,
    };
    let error = |e: ResponseError| {
        let mut resp = ShareAcknowledgeResponse::default();
        resp.error_code = e.code();
        resp
    };
    let prepared = (|| {
        if clustered(b) {
            return Err(error(ResponseError::UnsupportedVersion));
        }
        let (Some(group), Some(member)) = (req.group_id.as_deref(), req.member_id.as_deref())
        else {
            return Err(error(ResponseError::InvalidRequest));
        };
        let (checked, _) = b
            .shares
            .session(group, member, req.share_session_epoch, true, vec![], vec![])
            .map_err(error)?;
        let mut written = Vec::new();
        let mut resp = ShareAcknowledgeResponse::default();
        for t in &req.topics {
            let mut rt = ShareAcknowledgeTopicResponse::default();
            rt.topic_id = t.topic_id;
            for p in &t.partitions {
                let key = (group.to_string(), t.topic_id, p.partition_index);
                let batches = ack_batches(p.acknowledgement_batches.iter().map(|a| {
                    (
                        a.first_offset,
                        a.last_offset,
                        a.acknowledge_types.as_slice(),
                    )
                }));
                let mut rp = AckPartition::default();
                rp.partition_index = p.partition_index;
                rp.error_code = apply_acks(b, &key, member, batches, &mut written);
                let l = leader(b, &key);
                let mut al = AckLeader::default();
                al.leader_id = l.leader_id;
                al.leader_epoch = l.leader_epoch;
                rp.current_leader = al;
                rt.partitions.push(rp);
            }
            resp.responses.push(rt);
        }
        if checked == Checked::Close {
            written.extend(b.shares.close_session(&b.topics, group, member));
        }
        Ok((resp, written))
    })();
    let b = b.clone();
    async move {
        let (resp, written) = match prepared {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        if let Err(e) = all_durable(&b, written).await {
            return error(e);
        }
        resp
    }
}

/// Answers DescribeShareGroupOffsets: each share-partition's start offset (-1 for a partition
/// without share state).
pub fn describe_offsets(
    b: &Broker,
    req: DescribeShareGroupOffsetsRequest,
) -> DescribeShareGroupOffsetsResponse {
    use spate_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup as Group,
        DescribeShareGroupOffsetsResponsePartition as Partition,
        DescribeShareGroupOffsetsResponseTopic as Topic,
    };
    let mut resp = DescribeShareGroupOffsetsResponse::default();
    for g in req.groups {
        let mut out = Group::default();
        out.group_id = g.group_id.clone();
        let Some(known) = b.shares.start_offsets(&g.group_id) else {
            out.error_code = ResponseError::GroupIdNotFound.code();
            out.error_message = msg(format!("Group {} not found.", &*g.group_id));
            resp.groups.push(out);
            continue;
        };
        let partition = |index: i32, start: Option<(i64, i32)>| {
            let mut p = Partition::default();
            p.partition_index = index;
            (p.start_offset, p.leader_epoch) = start.unwrap_or((-1, -1));
            p
        };
        let mut topics: BTreeMap<String, Topic> = BTreeMap::new();
        match g.topics {
            // Every share-partition with state.
            None => {
                for (key, start, epoch) in &known {
                    let Some(t) = b.topics.get_by_id(&key.1) else {
                        continue;
                    };
                    let entry = topics.entry(t.name.clone()).or_insert_with(|| {
                        let mut rt = Topic::default();
                        rt.topic_name = s(&t.name).into();
                        rt.topic_id = t.id;
                        rt
                    });
                    entry
                        .partitions
                        .push(partition(key.2, Some((*start, *epoch))));
                }
            }
            Some(asked) => {
                for t in asked {
                    let mut rt = Topic::default();
                    rt.topic_name = t.topic_name.clone();
                    let handle = b.topics.get(&t.topic_name);
                    rt.topic_id = handle.as_ref().map(|h| h.id).unwrap_or_default();
                    for index in t.partitions {
                        let start = known
                            .iter()
                            .find(|(k, ..)| {
                                Some(k.1) == handle.as_ref().map(|h| h.id) && k.2 == index
                            })
                            .map(|(_, st, ep)| (*st, *ep));
                        let mut p = partition(index, start);
                        if handle.is_none() {
                            p.error_code = ResponseError::UnknownTopicOrPartition.code();
                        }
                        rt.partitions.push(p);
                    }
                    topics.insert(t.topic_name.to_string(), rt);
                }
            }
        }
        out.topics = topics.into_values().collect();
        resp.groups.push(out);
    }
    resp
}

/// Answers AlterShareGroupOffsets once the new start offsets are durable: the group must be
/// Empty (NON_EMPTY_GROUP otherwise).
pub fn alter_offsets(
    b: &Arc<Broker>,
    req: AlterShareGroupOffsetsRequest,
) -> impl std::future::Future<Output = AlterShareGroupOffsetsResponse> + Send + 'static {
    use spate_protocol::messages::alter_share_group_offsets_response::{
        AlterShareGroupOffsetsResponsePartition as Partition,
        AlterShareGroupOffsetsResponseTopic as Topic,
    };
    let mut resp = AlterShareGroupOffsetsResponse::default();
    let mut written = Vec::new();
    let group = req.group_id.to_string();
    if clustered(b) {
        resp.error_code = ResponseError::UnsupportedVersion.code();
    } else if other_group_type(b, &group) {
        resp.error_code = ResponseError::GroupIdNotFound.code();
        resp.error_message = msg(format!("Group {group} is not a share group."));
    } else if b.shares.has_members(&group) == Some(true) {
        resp.error_code = ResponseError::NonEmptyGroup.code();
        resp.error_message = msg(format!("Share group {group} is not empty."));
    } else {
        for t in req.topics {
            let mut rt = Topic::default();
            rt.topic_name = t.topic_name.clone();
            let handle = b.topics.get(&t.topic_name);
            rt.topic_id = handle.as_ref().map(|h| h.id).unwrap_or_default();
            for p in t.partitions {
                let mut rp = Partition::default();
                rp.partition_index = p.partition_index;
                let outcome = match &handle {
                    None => Err(ResponseError::UnknownTopicOrPartition),
                    Some(h) => b.shares.alter_start_offset(
                        &b.topics,
                        &(group.clone(), h.id, p.partition_index),
                        p.start_offset,
                    ),
                };
                match outcome {
                    Ok(w) => written.extend(w),
                    Err(e) => rp.error_code = e.code(),
                }
                rt.partitions.push(rp);
            }
            resp.responses.push(rt);
        }
    }
    let b = b.clone();
    async move {
        if let Err(e) = all_durable(&b, written).await {
            resp.error_code = e.code();
        }
        resp
    }
}

/// Answers DeleteShareGroupOffsets: an Empty group forgets the share-partition state of the
/// topics named.
pub fn delete_offsets(
    b: &Broker,
    req: DeleteShareGroupOffsetsRequest,
) -> DeleteShareGroupOffsetsResponse {
    use spate_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic as Topic;
    let mut resp = DeleteShareGroupOffsetsResponse::default();
    let group = req.group_id.to_string();
    match b.shares.has_members(&group) {
        None => {
            resp.error_code = ResponseError::GroupIdNotFound.code();
            resp.error_message = msg(format!("Group {group} not found."));
            return resp;
        }
        Some(true) => {
            resp.error_code = ResponseError::NonEmptyGroup.code();
            resp.error_message = msg(format!("Share group {group} is not empty."));
            return resp;
        }
        Some(false) => {}
    }
    for t in req.topics {
        let mut rt = Topic::default();
        rt.topic_name = t.topic_name.clone();
        match b.topics.get(&t.topic_name) {
            None => rt.error_code = ResponseError::UnknownTopicOrPartition.code(),
            Some(h) => {
                rt.topic_id = h.id;
                if let Err(e) = b.shares.delete_topic_state(&b.topics, &group, &h.id) {
                    rt.error_code = e.code();
                }
            }
        }
        resp.responses.push(rt);
    }
    resp
}
