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
use crate::share::{Checked, Members, Persisted, SpKey, TopicPartition};
use crate::Broker;

/// Upper bound on how long a ShareFetch may wait, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(60);
/// Records per ShareFetch when the request does not say (the client's `max.poll.records`).
const DEFAULT_MAX_RECORDS: u32 = 500;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// True in a cluster: membership, share-partitions and their durable state may each be on
/// another node (see [`crate::share`]).
pub(crate) fn clustered(b: &Broker) -> bool {
    b.cluster.get().is_some() || b.config.cluster_mode
}

/// Every share-partition of `topics` (all client topics when `None`) in the cluster's
/// metadata, for group `group`.
pub(crate) fn cluster_keys(b: &Broker, group: &str, topics: Option<&[uuid::Uuid]>) -> Vec<SpKey> {
    let Some(c) = b.cluster.get() else {
        return Vec::new();
    };
    let image = c.image();
    image
        .topics()
        .values()
        .filter(|t| !crate::groups::is_internal(&t.name))
        .filter(|t| topics.is_none_or(|ids| ids.contains(&t.id)))
        .flat_map(|t| (0..t.partitions.len() as i32).map(move |p| (group.to_string(), t.id, p)))
        .collect()
}

/// A topic's id and partition count: from the cluster's metadata in a cluster (what this
/// node's topics follow), from this broker's topics otherwise.
fn topic_named(b: &Broker, name: &str) -> Option<(uuid::Uuid, i32)> {
    match b.cluster.get() {
        Some(c) => c
            .image()
            .topic(name)
            .map(|t| (t.id, t.partitions.len() as i32)),
        None => b.topics.get(name).map(|t| (t.id, t.partition_count())),
    }
}

/// The name of a topic by id (see [`topic_named`]).
fn topic_name(b: &Broker, id: &uuid::Uuid) -> Option<String> {
    match b.cluster.get() {
        Some(c) => c.image().topic_by_id(*id).map(|t| t.name.clone()),
        None => b.topics.get_by_id(id).map(|t| t.name.clone()),
    }
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
async fn all_durable(b: &Arc<Broker>, written: Vec<Persisted>) -> Result<(), ResponseError> {
    let waits: Vec<_> = written.into_iter().map(|w| b.shares.durable(w)).collect();
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
    let answered = if group.is_empty() {
        Err(heartbeat_error(
            ResponseError::InvalidRequest,
            Some("GroupId can't be empty.".into()),
        ))
    } else if !b.groups.is_coordinator(&group) {
        Err(heartbeat_error(ResponseError::NotCoordinator, None))
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
                                tp.topic_name = s(&topic_name(b, tid).unwrap_or_default()).into();
                                tp.partitions = ps.iter().copied().collect();
                                tp
                            })
                            .collect();
                        out.assignment = a;
                        out
                    })
                    .collect();
            }
            None if !b.groups.is_coordinator(&id) => {
                g.error_code = ResponseError::NotCoordinator.code();
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
    written: &mut Vec<Persisted>,
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
    // Standalone the session and acknowledgements are handled now, in request order; a
    // cluster node may first have to ask other nodes (membership, share-partition state).
    let prepared = (!clustered(b)).then(|| prepare_fetch(b, &req, None));
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
        let prepared = match prepared {
            Some(p) => p,
            None => prepare_clustered(&b, &req).await,
        };
        let (member, mut slots, written) = match prepared {
            Ok(p) => p,
            Err(resp) => return resp,
        };
        if clustered(&b) {
            for slot in slots.iter_mut().filter(|s| !s.done) {
                if let Err(e) = b.shares.take_on(&b.topics, &slot.key).await {
                    slot.data.error_code = e.code();
                    slot.done = true;
                }
            }
        }
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

type PreparedFetch = Result<(String, Vec<Slot>, Vec<Persisted>), ShareFetchResponse>;

/// The members of a group whose coordinator is another node, as it knows them; `Ok(None)`
/// when this node coordinates the group (or there is no cluster). A group it does not know
/// has no members.
async fn members_for(
    b: &Broker,
    group: &str,
    member: &str,
) -> Result<Option<Arc<Members>>, ResponseError> {
    match b
        .shares
        .remote_members(group, member, b.groups.is_coordinator(group))
        .await
    {
        Err(ResponseError::GroupIdNotFound) => Ok(Some(Arc::new(Members::new()))),
        other => other,
    }
}

/// A cluster node's ShareFetch preparation: the membership from the group's coordinator,
/// the share-partitions acknowledged taken on, then as standalone.
async fn prepare_clustered(b: &Arc<Broker>, req: &ShareFetchRequest) -> PreparedFetch {
    let (Some(group), Some(member)) = (req.group_id.as_deref(), req.member_id.as_deref()) else {
        return Err(fetch_error(ResponseError::InvalidRequest));
    };
    let members = members_for(b, group, member).await.map_err(fetch_error)?;
    for t in &req.topics {
        for p in t
            .partitions
            .iter()
            .filter(|p| !p.acknowledgement_batches.is_empty())
        {
            // A failure shows as the acknowledgement's error.
            let _ = b
                .shares
                .take_on(
                    &b.topics,
                    &(group.to_string(), t.topic_id, p.partition_index),
                )
                .await;
        }
    }
    prepare_fetch(b, req, members.as_deref())
}

/// The synchronous part of a ShareFetch: session, acknowledgements, which partitions.
fn prepare_fetch(b: &Broker, req: &ShareFetchRequest, members: Option<&Members>) -> PreparedFetch {
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
            (&group, &member, req.share_session_epoch),
            false,
            (added, forgotten),
            members,
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
        if !b
            .shares
            .subscribed(&b.topics, &group, &member, &tp.0, members)
        {
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
    let ack_group = req.group_id.as_ref().map(|g| g.to_string());
    let ack_member = req.member_id.as_ref().map(|m| m.to_string());
    let ack_partitions: Vec<(Uuid, i32)> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, p.partition_index)))
        .collect();
    let prepare = move |b: &Broker, members: Option<&Members>| {
        let (Some(group), Some(member)) = (req.group_id.as_deref(), req.member_id.as_deref())
        else {
            return Err(error(ResponseError::InvalidRequest));
        };
        let (checked, _) = b
            .shares
            .session(
                (group, member, req.share_session_epoch),
                true,
                (vec![], vec![]),
                members,
            )
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
    };
    // Standalone now, in request order; a cluster node asks other nodes first.
    let (prepared, prepare) = if clustered(b) {
        (None, Some(prepare))
    } else {
        (Some(prepare(b, None)), None)
    };
    let b = b.clone();
    async move {
        let prepared = match (prepared, prepare) {
            (Some(p), _) => p,
            (None, Some(prepare)) => {
                let (group, member) = (ack_group.as_deref(), ack_member.as_deref());
                let members = match (group, member) {
                    (Some(g), Some(m)) => match members_for(&b, g, m).await {
                        Ok(members) => {
                            for (topic, partition) in &ack_partitions {
                                let _ = b
                                    .shares
                                    .take_on(&b.topics, &(g.to_string(), *topic, *partition))
                                    .await;
                            }
                            members
                        }
                        Err(e) => return error(e),
                    },
                    _ => None,
                };
                prepare(&b, members.as_deref())
            }
            (None, None) => return error(ResponseError::UnknownServerError),
        };
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

/// A share group's known start offsets: (share-partition, start offset, state epoch).
type Known = Vec<(SpKey, i64, i32)>;

/// The start offsets a cluster's share coordinators hold for `group` (of `topics`, or of
/// every topic); `None` when the group is neither known here nor has state anywhere.
pub(crate) async fn cluster_start_offsets(
    b: &Broker,
    group: &str,
    topics: Option<&[Uuid]>,
) -> Result<Option<Known>, ResponseError> {
    let Some(route) = b.shares.route() else {
        return Ok(b.shares.start_offsets(group));
    };
    let keys = cluster_keys(b, group, topics);
    let found = route.summaries(group.to_string(), keys).await?;
    if found.is_empty() && !b.shares.has_group(group) {
        return Ok(None);
    }
    let mut known: Known = found
        .into_iter()
        .map(|(k, s)| (k, s.start_offset, s.state_epoch))
        .collect();
    known.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(known))
}

/// Answers DescribeShareGroupOffsets: each share-partition's start offset (-1 for a partition
/// without share state).
pub fn describe_offsets(
    b: &Arc<Broker>,
    req: DescribeShareGroupOffsetsRequest,
) -> impl std::future::Future<Output = DescribeShareGroupOffsetsResponse> + Send + 'static {
    use spate_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup as Group;
    let b = b.clone();
    async move {
        let mut resp = DescribeShareGroupOffsetsResponse::default();
        for g in req.groups {
            let known = if !b.groups.is_coordinator(&g.group_id) {
                Err(ResponseError::NotCoordinator)
            } else if clustered(&b) {
                let ids: Option<Vec<Uuid>> = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .filter_map(|t| topic_named(&b, &t.topic_name).map(|(id, _)| id))
                        .collect()
                });
                cluster_start_offsets(&b, &g.group_id, ids.as_deref()).await
            } else {
                Ok(b.shares.start_offsets(&g.group_id))
            };
            match known {
                Ok(Some(known)) => resp.groups.push(group_offsets(&b, g, &known)),
                Ok(None) => {
                    let mut out = Group::default();
                    out.group_id = g.group_id.clone();
                    out.error_code = ResponseError::GroupIdNotFound.code();
                    out.error_message = msg(format!("Group {} not found.", &*g.group_id));
                    resp.groups.push(out);
                }
                Err(e) => {
                    let mut out = Group::default();
                    out.group_id = g.group_id.clone();
                    out.error_code = e.code();
                    resp.groups.push(out);
                }
            }
        }
        resp
    }
}

/// One group's part of a DescribeShareGroupOffsets answer, from its known start offsets.
fn group_offsets(
    b: &Broker,
    g: spate_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup,
    known: &Known,
) -> spate_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseGroup{
    use spate_protocol::messages::describe_share_group_offsets_response::{
        DescribeShareGroupOffsetsResponseGroup as Group,
        DescribeShareGroupOffsetsResponsePartition as Partition,
        DescribeShareGroupOffsetsResponseTopic as Topic,
    };
    let mut out = Group::default();
    out.group_id = g.group_id.clone();
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
            for (key, start, epoch) in known {
                let Some(name) = topic_name(b, &key.1) else {
                    continue;
                };
                let entry = topics.entry(name.clone()).or_insert_with(|| {
                    let mut rt = Topic::default();
                    rt.topic_name = s(&name).into();
                    rt.topic_id = key.1;
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
                let id = topic_named(b, &t.topic_name).map(|(id, _)| id);
                rt.topic_id = id.unwrap_or_default();
                for index in t.partitions {
                    let start = known
                        .iter()
                        .find(|(k, ..)| Some(k.1) == id && k.2 == index)
                        .map(|(_, st, ep)| (*st, *ep));
                    let mut p = partition(index, start);
                    if id.is_none() {
                        p.error_code = ResponseError::UnknownTopicOrPartition.code();
                    }
                    rt.partitions.push(p);
                }
                topics.insert(t.topic_name.to_string(), rt);
            }
        }
    }
    out.topics = topics.into_values().collect();
    out
}

/// Answers AlterShareGroupOffsets once the new start offsets are durable: the group must be
/// Empty (NON_EMPTY_GROUP otherwise). In a cluster each share-partition's state starts again
/// at the new offset under a newer state epoch, which fences what its leader holds.
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
    let mut cluster_work = Vec::new();
    let group = req.group_id.to_string();
    if !b.groups.is_coordinator(&group) {
        resp.error_code = ResponseError::NotCoordinator.code();
    } else if other_group_type(b, &group) {
        resp.error_code = ResponseError::GroupIdNotFound.code();
        resp.error_message = msg(format!("Group {group} is not a share group."));
    } else if b.shares.has_members(&group) == Some(true) {
        resp.error_code = ResponseError::NonEmptyGroup.code();
        resp.error_message = msg(format!("Share group {group} is not empty."));
    } else {
        for (ti, t) in req.topics.into_iter().enumerate() {
            let mut rt = Topic::default();
            rt.topic_name = t.topic_name.clone();
            let handle = topic_named(b, &t.topic_name);
            rt.topic_id = handle.map(|h| h.0).unwrap_or_default();
            for (pi, p) in t.partitions.into_iter().enumerate() {
                let mut rp = Partition::default();
                rp.partition_index = p.partition_index;
                let key = handle.map(|h| (group.clone(), h.0, p.partition_index));
                let outcome = match key {
                    Some(_) if p.partition_index < 0 || p.start_offset < 0 => {
                        Err(ResponseError::InvalidRequest)
                    }
                    Some(k) if clustered(b) => {
                        if handle.is_some_and(|h| p.partition_index < h.1) {
                            cluster_work.push((ti, pi, k, p.start_offset));
                            Ok(None)
                        } else {
                            Err(ResponseError::UnknownTopicOrPartition)
                        }
                    }
                    Some(k) => b.shares.alter_start_offset(&b.topics, &k, p.start_offset),
                    None => Err(ResponseError::UnknownTopicOrPartition),
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
        if let Some(route) = b.shares.route() {
            for (ti, pi, key, offset) in cluster_work {
                let outcome = async {
                    let now = route
                        .summaries(key.0.clone(), vec![key.clone()])
                        .await?
                        .into_iter()
                        .next()
                        .map_or(0, |(_, s)| s.state_epoch.saturating_add(1));
                    route.initialize(key.clone(), now, offset).await
                }
                .await;
                if let Err(e) = outcome {
                    resp.responses[ti].partitions[pi].error_code = e.code();
                }
            }
        }
        if let Err(e) = all_durable(&b, written).await {
            resp.error_code = e.code();
        }
        resp
    }
}

/// Answers DeleteShareGroupOffsets: an Empty group forgets the share-partition state of the
/// topics named.
pub fn delete_offsets(
    b: &Arc<Broker>,
    req: DeleteShareGroupOffsetsRequest,
) -> impl std::future::Future<Output = DeleteShareGroupOffsetsResponse> + Send + 'static {
    use spate_protocol::messages::delete_share_group_offsets_response::DeleteShareGroupOffsetsResponseTopic as Topic;
    let b = b.clone();
    async move {
        let mut resp = DeleteShareGroupOffsetsResponse::default();
        let group = req.group_id.to_string();
        if !b.groups.is_coordinator(&group) {
            resp.error_code = ResponseError::NotCoordinator.code();
            return resp;
        }
        let ids: Vec<Uuid> = req
            .topics
            .iter()
            .filter_map(|t| topic_named(&b, &t.topic_name).map(|h| h.0))
            .collect();
        let known = match b.shares.has_members(&group) {
            Some(true) => {
                resp.error_code = ResponseError::NonEmptyGroup.code();
                resp.error_message = msg(format!("Share group {group} is not empty."));
                return resp;
            }
            Some(false) => None,
            None if clustered(&b) => match cluster_start_offsets(&b, &group, Some(&ids)).await {
                Ok(Some(k)) => Some(k),
                Ok(None) => Some(Vec::new()),
                Err(e) => {
                    resp.error_code = e.code();
                    return resp;
                }
            },
            None => Some(Vec::new()),
        };
        if known.as_ref().is_some_and(Vec::is_empty) && !b.shares.has_group(&group) {
            resp.error_code = ResponseError::GroupIdNotFound.code();
            resp.error_message = msg(format!("Group {group} not found."));
            return resp;
        }
        for t in req.topics {
            let mut rt = Topic::default();
            rt.topic_name = t.topic_name.clone();
            match topic_named(&b, &t.topic_name) {
                None => rt.error_code = ResponseError::UnknownTopicOrPartition.code(),
                Some((id, _)) => {
                    rt.topic_id = id;
                    let outcome = match b.shares.route() {
                        Some(route) => {
                            let keys = cluster_keys(&b, &group, Some(&[id]));
                            let mut result = Ok(());
                            for k in keys {
                                if let Err(e) = route.delete(k).await {
                                    result = Err(e);
                                }
                            }
                            result
                        }
                        None => b.shares.delete_topic_state(&b.topics, &group, &id),
                    };
                    if let Err(e) = outcome {
                        rt.error_code = e.code();
                    }
                }
            }
            resp.responses.push(rt);
        }
        resp
    }
}
