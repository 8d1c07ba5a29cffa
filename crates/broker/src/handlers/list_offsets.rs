//! ListOffsets: earliest, latest, max timestamp, or the first offset at a timestamp.

use spate_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use spate_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use spate_protocol::ResponseError;

use crate::partition::{Partition, Role};
use crate::Broker;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
/// The last offset copied to tiered storage (KIP-1005, v9+).
const LATEST_TIERED: i64 = -5;
/// The first offset not yet copied to tiered storage (KIP-1023, v11+).
const EARLIEST_PENDING_UPLOAD: i64 = -6;

/// Answers ListOffsets.
pub fn handle(b: &Broker, version: i16, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut resp = ListOffsetsResponse::default();
    // read_committed (v2+) sees up to the last stable offset, as its fetches do.
    let committed = version >= 2 && req.isolation_level == 1;
    for t in req.topics {
        let topic = b.topics.get(&t.name);
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = t.name.clone();
        for rp in t.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = rp.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            let partition = topic
                .as_ref()
                .ok_or(ResponseError::UnknownTopicOrPartition)
                .and_then(|t| t.lookup(rp.partition_index));
            let result = match partition {
                Err(e) => Err(e),
                // In a cluster only the leader knows the high watermark consumers may see.
                Ok(p) if p.role() == Role::Follower => Err(ResponseError::NotLeaderOrFollower),
                Ok(p) => lookup(
                    &p,
                    version,
                    rp.current_leader_epoch,
                    rp.timestamp,
                    committed,
                ),
            };
            match result {
                Ok((offset, timestamp, epoch)) => {
                    pr.offset = offset;
                    pr.timestamp = timestamp;
                    if version >= 4 {
                        pr.leader_epoch = epoch;
                    }
                }
                Err(e) => pr.error_code = e.code(),
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

fn lookup(
    p: &Partition,
    version: i16,
    current_epoch: i32,
    ts: i64,
    committed: bool,
) -> Result<(i64, i64, i32), ResponseError> {
    let epoch = p.leader_epoch();
    if version >= 4 && current_epoch >= 0 {
        if current_epoch > epoch {
            return Err(ResponseError::UnknownLeaderEpoch);
        }
        if current_epoch < epoch {
            return Err(ResponseError::FencedLeaderEpoch);
        }
    }
    let storage = |e: spate_log::LogError| {
        tracing::error!(partition = p.index, error = %e, "ListOffsets read failed");
        ResponseError::KafkaStorageError
    };
    // A leader that took over recently answers only once its high watermark has reached
    // the epoch start: before that it may be below what the previous leader said, and a
    // consumer would see offsets go backwards (KIP-207).
    let high_watermark = || {
        let hw = p
            .known_high_watermark()
            .ok_or(ResponseError::OffsetNotAvailable)?;
        Ok(if committed {
            p.last_stable_offset().min(hw)
        } else {
            hw
        })
    };
    match ts {
        LATEST => Ok((high_watermark()?, -1, epoch)),
        EARLIEST | EARLIEST_LOCAL if ts == EARLIEST || version >= 8 => {
            Ok((p.log_start_offset(), -1, epoch))
        }
        // Nothing is ever tiered: Kafka's answer for a topic without remote storage.
        LATEST_TIERED if version >= 9 => Ok((-1, -1, -1)),
        EARLIEST_PENDING_UPLOAD if version >= 11 => Ok((-1, -1, -1)),
        MAX_TIMESTAMP if version >= 7 => Ok(match p.max_timestamp().map_err(storage)? {
            Some(hit) => (hit.offset, hit.timestamp, epoch),
            None => (-1, -1, -1),
        }),
        t if t >= 0 => Ok(match p.offset_for_timestamp(t).map_err(storage)? {
            Some(hit) if hit.offset < high_watermark()? => (hit.offset, hit.timestamp, epoch),
            _ => (-1, -1, -1),
        }),
        _ => Err(ResponseError::InvalidRequest),
    }
}
