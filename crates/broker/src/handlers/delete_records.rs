//! DeleteRecords: moves a partition's log start forward (`kafka-delete-records.sh`,
//! `AdminClient.deleteRecords`). Records below the new start are no longer served, whole
//! segments below it are deleted, and the start survives a restart. In a cluster the leader
//! moves its start and its followers follow on their next fetch.

use spate_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
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
    resp
}
