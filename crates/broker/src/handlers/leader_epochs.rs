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

use crate::partition::Partition;
use crate::replica;
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
            match topic
                .as_ref()
                .ok_or(ResponseError::UnknownTopicOrPartition)
                .and_then(|t| t.lookup(rp.partition))
            {
                Err(e) => out.error_code = e.code(),
                Ok(p) => match lookup(&p, replica_id, current, rp.leader_epoch) {
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
    p: &Partition,
    replica_id: i32,
    current_leader_epoch: i32,
    epoch: i32,
) -> Result<(i32, i64), ResponseError> {
    replica::epoch_end(
        p,
        replica_id != DEBUGGING_REPLICA_ID,
        current_leader_epoch,
        epoch,
    )
}

#[cfg(test)]
mod tests {
    use spate_protocol::batch::{build, validate, NewRecord};
    use spate_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    use spate_protocol::messages::{ApiKey, TopicName};
    use spate_protocol::records::Compression;
    use spate_protocol::StrBytes;

    use super::*;
    use crate::dispatch::tests::{broker, decode, frame, response};
    use crate::topic_config::TopicConfig;
    use crate::RequestContext;

    fn ask(partition: i32, current: i32, epoch: i32) -> OffsetForLeaderEpochRequest {
        let mut p = OffsetForLeaderPartition::default();
        p.partition = partition;
        p.current_leader_epoch = current;
        p.leader_epoch = epoch;
        let mut t = OffsetForLeaderTopic::default();
        t.topic = TopicName(StrBytes::from_static_str("epochs"));
        t.partitions = vec![p];
        let mut r = OffsetForLeaderEpochRequest::default();
        r.replica_id = (-1).into();
        r.topics = vec![t];
        r
    }

    #[tokio::test]
    async fn a_leader_answers_where_an_epoch_ends_and_fences_other_epochs() {
        let (b, _dir) = broker();
        let topic = b
            .topics
            .create("epochs", 1, TopicConfig::default(), false)
            .unwrap()
            .unwrap();
        let records: Vec<NewRecord> = (0..3)
            .map(|_| NewRecord {
                value: Some(bytes::Bytes::from_static(b"v")),
                ..NewRecord::default()
            })
            .collect();
        let batch = build(&records, None, Compression::None).unwrap();
        let p = topic.partition(0).unwrap();
        p.append(&batch, &validate(&batch).unwrap(), None).unwrap();

        let call = |req: OffsetForLeaderEpochRequest| {
            let b = b.clone();
            async move {
                let f = frame(ApiKey::OffsetForLeaderEpoch, 4, &req);
                let reply = b.handle(f, RequestContext::default()).unwrap();
                let resp: OffsetForLeaderEpochResponse =
                    decode(ApiKey::OffsetForLeaderEpoch, 4, response(reply).await);
                let r = &resp.topics[0].partitions[0];
                (r.error_code, r.leader_epoch, r.end_offset)
            }
        };
        // The latest epoch (and any later one asked for) ends at the log end.
        assert_eq!(call(ask(0, 0, 0)).await, (0, 0, 3));
        assert_eq!(call(ask(0, -1, 7)).await, (0, 0, 3));
        // A client that knows a newer leader epoch than this broker: UNKNOWN_LEADER_EPOCH.
        assert_eq!(
            call(ask(0, 1, 0)).await.0,
            ResponseError::UnknownLeaderEpoch.code()
        );
        assert_eq!(
            call(ask(9, -1, 0)).await.0,
            ResponseError::UnknownTopicOrPartition.code()
        );
        // This broker moved on to epoch 2: a client still at 1 is fenced.
        p.set_role(crate::partition::Role::Standalone, 2);
        assert_eq!(
            call(ask(0, 1, 0)).await.0,
            ResponseError::FencedLeaderEpoch.code()
        );
        assert_eq!(call(ask(0, 2, 0)).await, (0, 0, 3));
    }
}
