//! KIP-932's share-group state APIs (InitializeShareGroupState, ReadShareGroupState,
//! WriteShareGroupState, DeleteShareGroupState, ReadShareGroupStateSummary), answered by this
//! broker's share coordinator ([`crate::share::ShareCoordinator`]). Kafka's brokers send them
//! to one another (the share-partition leader to the share coordinator); they need
//! ClusterAction on the cluster, checked in dispatch.
//!
//! A change made through them is the truth: this broker's own share-partition leader drops
//! what it holds in memory of that share-partition and reads the coordinator's state again
//! at its next use.

use std::sync::Arc;

use spate_protocol::messages::*;
use spate_protocol::{ResponseError, StrBytes};
use spate_share::state::StateBatch;
use uuid::Uuid;

use super::msg;
use super::share_groups::clustered;
use crate::groups::Written;
use crate::share::{SpKey, StateWrite};
use crate::Broker;

/// The share-partition a request names, or why it cannot be served here.
fn share_partition(
    b: &Broker,
    allowed: bool,
    group: &StrBytes,
    topic: Uuid,
    partition: i32,
) -> Result<SpKey, ResponseError> {
    if !allowed {
        return Err(ResponseError::ClusterAuthorizationFailed);
    }
    if group.is_empty() || partition < 0 {
        return Err(ResponseError::InvalidRequest);
    }
    // A cluster node keeps the state of share-partitions whose data it may not replicate:
    // the cluster's metadata says which exist.
    let known = match b.cluster.get() {
        Some(c) => c
            .image()
            .topic_by_id(topic)
            .is_some_and(|t| (partition as usize) < t.partitions.len()),
        None => b
            .topics
            .get_by_id(&topic)
            .is_some_and(|t| partition < t.partition_count()),
    };
    if !known {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    let key = (group.to_string(), topic, partition);
    if clustered(b) && !b.shares.coordinator().owns(&key) {
        return Err(ResponseError::NotCoordinator);
    }
    Ok(key)
}

/// Refuses a leader epoch newer than the data partition's own (UNKNOWN_LEADER_EPOCH): the
/// share coordinator would remember it and fence the real leader for good.
fn check_leader_epoch(b: &Broker, key: &SpKey, leader_epoch: i32) -> Result<(), ResponseError> {
    let current = match b.cluster.get() {
        Some(c) => c
            .image()
            .topic_by_id(key.1)
            .and_then(|t| t.partition(key.2))
            .map(|p| p.leader_epoch),
        None => b
            .topics
            .get_by_id(&key.1)
            .and_then(|t| t.partition(key.2))
            .map(|p| p.leader_epoch()),
    }
    .ok_or(ResponseError::UnknownTopicOrPartition)?;
    if leader_epoch > current {
        return Err(ResponseError::UnknownLeaderEpoch);
    }
    Ok(())
}

fn error_message(e: ResponseError) -> Option<StrBytes> {
    let text = match e {
        ResponseError::FencedLeaderEpoch => {
            "the leader epoch is older than one the share coordinator has seen"
        }
        ResponseError::FencedStateEpoch => {
            "the state epoch is older than the share-partition's (its state was reset)"
        }
        ResponseError::NotCoordinator => {
            "this node is not the share coordinator of the share-partition (it leads another part of __share_group_state)"
        }
        ResponseError::InvalidRequest => {
            "an empty group id, a negative partition or offset, or a batch whose first offset is after its last"
        }
        ResponseError::UnknownLeaderEpoch => {
            "the leader epoch is newer than the partition's on this broker"
        }
        _ => return None,
    };
    msg(text)
}

/// Waits until every write is as durable as a produce acknowledgement; the failures, by
/// topic and partition position in the answer.
async fn durable(
    b: &Arc<Broker>,
    written: Vec<(usize, usize, Written)>,
) -> Vec<(usize, usize, ResponseError)> {
    let mut failed = Vec::new();
    for (t, p, w) in written {
        if let Err(e) = b.shares.written_durable(&w).await {
            failed.push((t, p, e));
        }
    }
    failed
}

/// Answers InitializeShareGroupState once every new state is durable.
pub fn initialize(
    b: &Arc<Broker>,
    allowed: bool,
    req: InitializeShareGroupStateRequest,
) -> impl std::future::Future<Output = InitializeShareGroupStateResponse> + Send + 'static {
    use initialize_share_group_state_response::{InitializeStateResult, PartitionResult};
    let now = b.shares.now_ms();
    let mut resp = InitializeShareGroupStateResponse::default();
    let mut written = Vec::new();
    for (ti, t) in req.topics.into_iter().enumerate() {
        let mut rt = InitializeStateResult::default();
        rt.topic_id = t.topic_id;
        for (pi, p) in t.partitions.into_iter().enumerate() {
            let mut rp = PartitionResult::default();
            rp.partition = p.partition;
            let outcome = share_partition(b, allowed, &req.group_id, t.topic_id, p.partition)
                .and_then(|key| {
                    let w = b.shares.coordinator().initialize(
                        &b.topics,
                        &key,
                        p.state_epoch,
                        p.start_offset,
                        now,
                    )?;
                    b.shares.forget_tracked(&key);
                    Ok(w)
                });
            match outcome {
                Ok(w) => written.push((ti, pi, w)),
                Err(e) => {
                    rp.error_code = e.code();
                    rp.error_message = error_message(e);
                }
            }
            rt.partitions.push(rp);
        }
        resp.results.push(rt);
    }
    let b = b.clone();
    async move {
        for (t, p, e) in durable(&b, written).await {
            resp.results[t].partitions[p].error_code = e.code();
        }
        resp
    }
}

/// Answers ReadShareGroupState: the state of each share-partition for its leader at the
/// given leader epoch (a start offset of -1 and no batches when it was never initialized).
pub fn read(
    b: &Broker,
    allowed: bool,
    req: ReadShareGroupStateRequest,
) -> ReadShareGroupStateResponse {
    use read_share_group_state_response::{PartitionResult, ReadStateResult};
    let mut resp = ReadShareGroupStateResponse::default();
    for t in req.topics {
        let mut rt = ReadStateResult::default();
        rt.topic_id = t.topic_id;
        for p in t.partitions {
            let mut rp = PartitionResult::default();
            rp.partition = p.partition;
            rp.start_offset = -1;
            let outcome = share_partition(b, allowed, &req.group_id, t.topic_id, p.partition)
                .and_then(|key| {
                    check_leader_epoch(b, &key, p.leader_epoch)?;
                    b.shares.coordinator().read(&key, p.leader_epoch)
                });
            match outcome {
                Ok(Some(s)) => {
                    rp.state_epoch = s.state_epoch;
                    rp.start_offset = s.start_offset;
                    rp.state_batches = s
                        .state_batches
                        .iter()
                        .map(|sb| {
                            let mut out = read_share_group_state_response::StateBatch::default();
                            out.first_offset = sb.first_offset;
                            out.last_offset = sb.last_offset;
                            out.delivery_state = sb.delivery_state;
                            out.delivery_count = sb.delivery_count;
                            out
                        })
                        .collect();
                }
                Ok(None) => {}
                Err(e) => {
                    rp.error_code = e.code();
                    rp.error_message = error_message(e);
                }
            }
            rt.partitions.push(rp);
        }
        resp.results.push(rt);
    }
    resp
}

/// Answers WriteShareGroupState once every write is durable.
pub fn write(
    b: &Arc<Broker>,
    allowed: bool,
    req: WriteShareGroupStateRequest,
) -> impl std::future::Future<Output = WriteShareGroupStateResponse> + Send + 'static {
    use write_share_group_state_response::{PartitionResult, WriteStateResult};
    let now = b.shares.now_ms();
    let mut resp = WriteShareGroupStateResponse::default();
    let mut written = Vec::new();
    for (ti, t) in req.topics.into_iter().enumerate() {
        let mut rt = WriteStateResult::default();
        rt.topic_id = t.topic_id;
        for (pi, p) in t.partitions.into_iter().enumerate() {
            let mut rp = PartitionResult::default();
            rp.partition = p.partition;
            let change = StateWrite {
                state_epoch: p.state_epoch,
                leader_epoch: p.leader_epoch,
                start_offset: p.start_offset,
                batches: p
                    .state_batches
                    .iter()
                    .map(|sb| StateBatch {
                        first_offset: sb.first_offset,
                        last_offset: sb.last_offset,
                        delivery_state: sb.delivery_state,
                        delivery_count: sb.delivery_count,
                    })
                    .collect(),
            };
            let outcome = share_partition(b, allowed, &req.group_id, t.topic_id, p.partition)
                .and_then(|key| {
                    check_leader_epoch(b, &key, p.leader_epoch)?;
                    let w = b
                        .shares
                        .coordinator()
                        .write(&b.topics, &key, &change, now)?;
                    b.shares.forget_tracked(&key);
                    Ok(w)
                });
            match outcome {
                Ok(w) => written.push((ti, pi, w)),
                Err(e) => {
                    rp.error_code = e.code();
                    rp.error_message = error_message(e);
                }
            }
            rt.partitions.push(rp);
        }
        resp.results.push(rt);
    }
    let b = b.clone();
    async move {
        for (t, p, e) in durable(&b, written).await {
            resp.results[t].partitions[p].error_code = e.code();
        }
        resp
    }
}

/// Answers DeleteShareGroupState once every tombstone is durable.
pub fn delete(
    b: &Arc<Broker>,
    allowed: bool,
    req: DeleteShareGroupStateRequest,
) -> impl std::future::Future<Output = DeleteShareGroupStateResponse> + Send + 'static {
    use delete_share_group_state_response::{DeleteStateResult, PartitionResult};
    let now = b.shares.now_ms();
    let mut resp = DeleteShareGroupStateResponse::default();
    let mut written = Vec::new();
    for (ti, t) in req.topics.into_iter().enumerate() {
        let mut rt = DeleteStateResult::default();
        rt.topic_id = t.topic_id;
        for (pi, p) in t.partitions.into_iter().enumerate() {
            let mut rp = PartitionResult::default();
            rp.partition = p.partition;
            let outcome = share_partition(b, allowed, &req.group_id, t.topic_id, p.partition)
                .and_then(|key| {
                    let w = b.shares.coordinator().delete(&b.topics, &key, now)?;
                    b.shares.forget_tracked(&key);
                    Ok(w)
                });
            match outcome {
                Ok(Some(w)) => written.push((ti, pi, w)),
                Ok(None) => {}
                Err(e) => {
                    rp.error_code = e.code();
                    rp.error_message = error_message(e);
                }
            }
            rt.partitions.push(rp);
        }
        resp.results.push(rt);
    }
    let b = b.clone();
    async move {
        for (t, p, e) in durable(&b, written).await {
            resp.results[t].partitions[p].error_code = e.code();
        }
        resp
    }
}

/// Answers ReadShareGroupStateSummary: each share-partition's start offset and epochs
/// (a start offset of -1 when it was never initialized).
pub fn summary(
    b: &Broker,
    allowed: bool,
    req: ReadShareGroupStateSummaryRequest,
) -> ReadShareGroupStateSummaryResponse {
    use read_share_group_state_summary_response::{PartitionResult, ReadStateSummaryResult};
    let mut resp = ReadShareGroupStateSummaryResponse::default();
    for t in req.topics {
        let mut rt = ReadStateSummaryResult::default();
        rt.topic_id = t.topic_id;
        for p in t.partitions {
            let mut rp = PartitionResult::default();
            rp.partition = p.partition;
            rp.start_offset = -1;
            match share_partition(b, allowed, &req.group_id, t.topic_id, p.partition) {
                Ok(key) => {
                    if let Some(s) = b.shares.coordinator().summary(&key) {
                        rp.state_epoch = s.state_epoch;
                        rp.leader_epoch = s.leader_epoch;
                        rp.start_offset = s.start_offset;
                    }
                }
                Err(e) => {
                    rp.error_code = e.code();
                    rp.error_message = error_message(e);
                }
            }
            rt.partitions.push(rp);
        }
        resp.results.push(rt);
    }
    resp
}
