//! Fetch: read whole batches from the logs, long-polling until `min_bytes` are available or
//! `max_wait_ms` passes. Incremental fetch sessions are declined (session id 0), which every
//! client handles by sending full fetch requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::select_all;
use spate_log::LogError;
use spate_protocol::batch::Batches;
use spate_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use spate_protocol::messages::{ApiKey, FetchRequest, FetchResponse};
use spate_protocol::ResponseError;
use tokio::sync::watch;

use crate::partition::Partition;
use crate::registry::Topic;
use crate::Broker;

/// Upper bound on how long a fetch may wait, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(60);

/// A requested partition, resolved once.
struct Slot {
    topic: usize,
    partition: Option<Arc<Partition>>,
    index: i32,
    fetch_offset: i64,
    max_bytes: usize,
    current_leader_epoch: i32,
    /// Error found while resolving (unknown topic or partition).
    error: Option<ResponseError>,
}

/// Serves a fetch, waiting as the request allows.
pub async fn handle(
    b: Arc<Broker>,
    version: i16,
    throttle_ms: i32,
    req: FetchRequest,
) -> FetchResponse {
    let mut resp = serve(&b, version, req).await;
    resp.throttle_time_ms = throttle_ms;
    for p in resp.responses.iter().flat_map(|t| t.partitions.iter()) {
        b.metrics.error(ApiKey::Fetch as i16, p.error_code);
    }
    b.metrics.error(ApiKey::Fetch as i16, resp.error_code);
    resp
}

async fn serve(b: &Arc<Broker>, version: i16, req: FetchRequest) -> FetchResponse {
    if version >= 7 && req.session_id != 0 {
        // We never hand out session ids, so any the client presents is unknown.
        let mut resp = FetchResponse::default();
        resp.error_code = ResponseError::FetchSessionIdNotFound.code();
        return resp;
    }
    let mut topics = Vec::with_capacity(req.topics.len());
    let mut handles = Vec::with_capacity(req.topics.len());
    let mut slots = Vec::new();
    for (ti, ft) in req.topics.iter().enumerate() {
        let mut tr = FetchableTopicResponse::default();
        let topic = if version >= 13 {
            tr.topic_id = ft.topic_id;
            b.topics.get_by_id(&ft.topic_id)
        } else {
            tr.topic = ft.topic.clone();
            b.topics.get(&ft.topic)
        };
        topics.push(tr);
        handles.push(topic.clone());
        for fp in &ft.partitions {
            let partition = topic.as_ref().and_then(|t| t.partition(fp.partition));
            let error = match (&topic, &partition) {
                (None, _) if version >= 13 => Some(ResponseError::UnknownTopicId),
                (None, _) | (_, None) => Some(ResponseError::UnknownTopicOrPartition),
                _ => None,
            };
            slots.push(Slot {
                topic: ti,
                partition,
                index: fp.partition,
                fetch_offset: fp.fetch_offset,
                max_bytes: fp.partition_max_bytes.max(0) as usize,
                current_leader_epoch: fp.current_leader_epoch,
                error,
            });
        }
    }
    let min_bytes = req.min_bytes.max(0) as usize;
    let max_bytes = if req.max_bytes <= 0 {
        usize::MAX
    } else {
        req.max_bytes as usize
    };
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Subscribe before reading so an append between the read and the wait still wakes us.
        let mut watches: Vec<watch::Receiver<i64>> = slots
            .iter()
            .filter_map(|s| s.partition.as_ref().map(|p| p.watch_high_watermark()))
            .collect();
        let (parts, bytes, errors) = read_all(&slots, version, max_bytes);
        let now = tokio::time::Instant::now();
        if bytes >= min_bytes.max(1) || errors || now >= deadline || watches.is_empty() {
            return assemble(topics, &handles, parts);
        }
        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            let (parts, _, _) = read_all(&slots, version, max_bytes);
            return assemble(topics, &handles, parts);
        }
    }
}

fn assemble(
    mut topics: Vec<FetchableTopicResponse>,
    handles: &[Option<Arc<Topic>>],
    parts: Vec<(usize, PartitionData)>,
) -> FetchResponse {
    for (ti, pd) in parts {
        if let (Some(Some(t)), Some(records)) = (handles.get(ti), &pd.records) {
            if !records.is_empty() {
                t.metrics.bytes_out.add(records.len() as u64);
                let n: i64 = Batches::new(records)
                    .map(|(_, h)| h.records_count as i64)
                    .sum();
                t.metrics.records_out.add(n.max(0) as u64);
            }
        }
        topics[ti].partitions.push(pd);
    }
    let mut resp = FetchResponse::default();
    resp.responses = topics;
    resp
}

/// Reads every slot once; returns the partition data, bytes gathered and whether any
/// partition carries an error (which makes the fetch answer at once, as Kafka does).
fn read_all(
    slots: &[Slot],
    version: i16,
    max_bytes: usize,
) -> (Vec<(usize, PartitionData)>, usize, bool) {
    let mut out = Vec::with_capacity(slots.len());
    let mut total = 0usize;
    let mut errors = false;
    for s in slots {
        let mut pd = PartitionData::default();
        pd.partition_index = s.index;
        pd.high_watermark = -1;
        pd.last_stable_offset = -1;
        if version >= 5 {
            pd.log_start_offset = -1;
        }
        pd.records = Some(Bytes::new());
        let code = match (&s.error, &s.partition) {
            (Some(e), _) => Some(*e),
            (None, Some(p)) => {
                let hw = p.high_watermark();
                pd.high_watermark = hw;
                pd.last_stable_offset = hw;
                if version >= 5 {
                    pd.log_start_offset = p.log_start_offset();
                }
                if version >= 4 {
                    pd.aborted_transactions = Some(Vec::new());
                }
                let epoch = p.leader_epoch();
                if s.current_leader_epoch >= 0 && s.current_leader_epoch > epoch {
                    Some(ResponseError::UnknownLeaderEpoch)
                } else if s.current_leader_epoch >= 0 && s.current_leader_epoch < epoch {
                    Some(ResponseError::FencedLeaderEpoch)
                } else {
                    // KIP-74: the first partition with data may exceed the remaining budget by
                    // one batch so that progress is always possible.
                    let budget = s.max_bytes.min(max_bytes.saturating_sub(total));
                    match p.read(s.fetch_offset, budget, total == 0) {
                        Ok(r) => {
                            total += r.records.len();
                            pd.records = Some(r.records);
                            None
                        }
                        Err(LogError::OffsetOutOfRange { .. }) => {
                            Some(ResponseError::OffsetOutOfRange)
                        }
                        Err(e) => {
                            tracing::error!(partition = s.index, error = %e, "fetch read failed");
                            Some(ResponseError::KafkaStorageError)
                        }
                    }
                }
            }
            (None, None) => Some(ResponseError::UnknownTopicOrPartition),
        };
        if let Some(c) = code {
            pd.error_code = c.code();
            errors = true;
        }
        out.push((s.topic, pd));
    }
    (out, total, errors)
}
