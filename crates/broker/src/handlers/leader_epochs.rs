//! OffsetForLeaderEpoch: where a leader epoch ends in this broker's log.
//!
//! Followers ask it after a leader change to find where their log leaves the leader's
//! (KIP-101, KIP-279); consumers ask it to check that what they read was not truncated since
//! (KIP-320).

use spate_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use spate_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use spate_protocol::ResponseError;

use crate::partition::{Partition, Role};
use crate::Broker;

/// Kafka's replica id for tools that may ask any replica, not only the leader.
const DEBUGGING_REPLICA_ID: i32 = -2;
/// The answer for an epoch this log has nothing of (or before).
const UNDEFINED_EPOCH: i32 = -1;
const UNDEFINED_OFFSET: i64 = -1;

/// Answers OffsetForLeaderEpoch.
pub fn handle(
    b: &Broker,
    version: i16,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let replica_id = if version >= 3 { req.replica_id.0 } else { -1 };
    let mut resp = OffsetForLeaderEpochResponse::default();
    for t in req.topics {
        let topic = b.topics.get(&t.topic);
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        for rp in t.partitions {
            let mut out = EpochEndOffset::default();
            out.partition = rp.partition;
            out.leader_epoch = UNDEFINED_EPOCH;
            out.end_offset = UNDEFINED_OFFSET;
            let current = rp.current_leader_epoch;
            match topic.as_ref().and_then(|t| t.partition(rp.partition)) {
                None => out.error_code = ResponseError::UnknownTopicOrPartition.code(),
                Some(p) => match lookup(b, &p, replica_id, current, rp.leader_epoch) {
                    Ok((epoch, end)) => {
                        out.leader_epoch = epoch;
                        out.end_offset = end;
                    }
                    Err(e) => out.error_code = e.code(),
                },
            }
            tr.partitions.push(out);
        }
        resp.topics.push(tr);
    }
    resp
}

fn lookup(
    b: &Broker,
    p: &Partition,
    replica_id: i32,
    current_leader_epoch: i32,
    epoch: i32,
) -> Result<(i32, i64), ResponseError> {
    if b.cluster().is_some() && p.role() != Role::Leader && replica_id != DEBUGGING_REPLICA_ID {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    if p.is_offline() {
        return Err(ResponseError::KafkaStorageError);
    }
    let mine = p.leader_epoch();
    if current_leader_epoch >= 0 && current_leader_epoch < mine {
        return Err(ResponseError::FencedLeaderEpoch);
    }
    if current_leader_epoch > mine {
        return Err(ResponseError::UnknownLeaderEpoch);
    }
    Ok(p.end_offset_for_epoch(epoch)
        .unwrap_or((UNDEFINED_EPOCH, UNDEFINED_OFFSET)))
}
