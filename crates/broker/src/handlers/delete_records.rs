//! DeleteRecords: moves a partition's log start forward (`kafka-delete-records.sh`,
//! `AdminClient.deleteRecords`). Records below the new start are no longer served, whole
//! segments below it are deleted, and the start survives a restart. In a cluster the leader
//! moves its start, its followers follow on their next fetch, and the answer waits (up to
//! timeout_ms) until every in-sync replica has moved: the low watermark Kafka reports.

use spate_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use std::sync::Arc;
use std::time::Duration;

use spate_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};
use spate_protocol::ResponseError;

use crate::partition::AppendError;
use crate::Broker;

/// Kafka's low watermark for a partition that could not answer.
const NO_LOW_WATERMARK: i64 = -1;

/// Answers DeleteRecords; runs on the blocking pool (the new start is fsynced).
pub fn handle(b: &Broker, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut resp = DeleteRecordsResponse::default();
    for t in req.topics {
        let topic = b.topics.get(&t.name);
        let mut tr = DeleteRecordsTopicResult::default();
        tr.name = t.name.clone();
        for p in t.partitions {
            let mut pr = DeleteRecordsPartitionResult::default();
            pr.partition_index = p.partition_index;
            let outcome = match &topic {
                None => Err(ResponseError::UnknownTopicOrPartition),
                // The group coordinator keeps it small itself.
                Some(t) if crate::groups::is_internal(&t.name) => {
                    Err(ResponseError::InvalidTopicException)
                }
                Some(topic) => topic.lookup(p.partition_index).and_then(|part| {
                    part.delete_records_before(p.offset).map_err(|e| match e {
                        AppendError::Refused(code) => code,
                        AppendError::Storage(e) => {
                            tracing::error!(topic = %topic.name, partition = p.partition_index, error = %e, "delete records failed");
                            ResponseError::KafkaStorageError
                        }
                    })
                }),
            };
            match outcome {
                Ok(low_watermark) => pr.low_watermark = low_watermark,
                Err(code) => {
                    b.metrics.error(ApiKey::DeleteRecords as i16, code.code());
                    pr.error_code = code.code();
                    pr.low_watermark = NO_LOW_WATERMARK;
                }
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    // Whole segments may have gone: produce refused for a full disk resumes now, not at the
    // next periodic sample (this runs on the blocking pool, where a statvfs may wait).
    b.disk.resample();
    resp
}

/// How often a replicated DeleteRecords looks at its followers' progress.
const POLL: Duration = Duration::from_millis(20);

/// Answers DeleteRecords in a cluster: moves the leaders' starts on the blocking pool, then
/// waits until every in-sync replica holds the new start (the low watermark reaches it), or
/// answers REQUEST_TIMED_OUT with the low watermark reached so far.
pub async fn handle_replicated(b: Arc<Broker>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0));
    let wanted: Vec<Vec<i64>> = req
        .topics
        .iter()
        .map(|t| t.partitions.iter().map(|p| p.offset).collect())
        .collect();
    let moved = {
        let b = b.clone();
        tokio::task::spawn_blocking(move || handle(&b, req)).await
    };
    let mut resp = match moved {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "delete records failed");
            return DeleteRecordsResponse::default();
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    for (ti, tr) in resp.topics.iter_mut().enumerate() {
        let topic = b.topics.get(&tr.name);
        for (pi, pr) in tr.partitions.iter_mut().enumerate() {
            if pr.error_code != 0 {
                continue;
            }
            let Some(part) = topic.as_ref().and_then(|t| t.partition(pr.partition_index)) else {
                continue;
            };
            // -1 asked for the high watermark: the start the leader moved to.
            let target = match wanted.get(ti).and_then(|w| w.get(pi)).copied() {
                Some(-1) | None => pr.low_watermark,
                Some(o) => o,
            };
            loop {
                let low = part.low_watermark();
                if low >= target {
                    pr.low_watermark = low;
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    b.metrics.error(
                        ApiKey::DeleteRecords as i16,
                        ResponseError::RequestTimedOut.code(),
                    );
                    pr.error_code = ResponseError::RequestTimedOut.code();
                    pr.low_watermark = low;
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
    resp
}
