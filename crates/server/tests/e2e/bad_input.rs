//! Inputs no well-behaved client sends: each gets a clear answer and the broker keeps serving.

use bytes::Bytes;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, InitProducerIdRequest, InitProducerIdResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use spate_protocol::batch::{build, NewRecord, ProducerFields};

use crate::harness::{bare_error, Raw, Spate};
use crate::produce_consume::create_topic;

/// A batch of `n` records (`value-<seq>`); idempotent when `producer_id` >= 0.
pub fn batch(producer_id: i64, first_seq: i32, n: i32) -> Bytes {
    let records: Vec<NewRecord> = (0..n)
        .map(|i| NewRecord {
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(format!("value-{}", first_seq + i))),
            timestamp: 1_000,
        })
        .collect();
    let producer = (producer_id >= 0).then_some(ProducerFields {
        id: producer_id,
        epoch: 0,
        base_sequence: first_seq,
        transactional: false,
    });
    build(&records, producer, Compression::None).unwrap()
}

/// A Produce request of `records` to partition 0 of `topic`.
pub fn produce(topic: &str, records: Bytes, acks: i16) -> ProduceRequest {
    let mut pd = PartitionProduceData::default();
    pd.index = 0;
    pd.records = Some(records);
    let mut td = TopicProduceData::default();
    td.name = TopicName(StrBytes::from_string(topic.to_string()));
    td.partition_data = vec![pd];
    let mut r = ProduceRequest::default();
    r.acks = acks;
    r.timeout_ms = 10_000;
    r.topic_data = vec![td];
    r
}

/// (error code, base offset) of the single partition answer.
fn produce_result(raw: &mut Raw, req: &ProduceRequest) -> (i16, i64) {
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, req);
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn broker_still_serves(addr: &str) {
    let mut raw = Raw::connect(addr);
    let resp: ApiVersionsResponse =
        raw.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
}

#[test]
fn oversized_and_negative_frames_close_only_that_connection() {
    let spate = Spate::start(&["--max-request-bytes", "1048576"]);
    let mut raw = Raw::connect(&spate.addr);
    raw.send_bytes(&(200 * 1024 * 1024i32).to_be_bytes());
    assert!(raw.is_closed());
    let mut raw = Raw::connect(&spate.addr);
    raw.send_bytes(&(-5i32).to_be_bytes());
    assert!(raw.is_closed());
    broker_still_serves(&spate.addr);
    assert!(spate.wait_for_log("exceeds the limit"), "{}", spate.log());
}

#[test]
fn truncated_frame_and_garbage_body_leave_the_broker_serving() {
    let spate = Spate::start(&[]);
    let mut raw = Raw::connect(&spate.addr);
    raw.send_bytes(&[0, 0, 0, 100, 0, 3, 0, 9]);
    drop(raw);
    let mut raw = Raw::connect(&spate.addr);
    // Metadata v12 header, then a body that claims a topic array of two billion entries.
    let mut frame = vec![0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0];
    frame.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    let mut framed = (frame.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&frame);
    raw.send_bytes(&framed);
    assert!(raw.is_closed());
    broker_still_serves(&spate.addr);
    assert!(spate.wait_for_log("malformed request"), "{}", spate.log());
}

#[test]
fn bytes_after_a_request_body_are_ignored_as_kafka_ignores_them() {
    let spate = Spate::start(&[]);
    let mut raw = Raw::connect(&spate.addr);
    // Metadata v1 with a null topic list (-1, all topics), then four bytes no field accounts
    // for; librdkafka itself sends Metadata v12 with three trailing zero bytes.
    let mut frame = vec![0, 3, 0, 1, 0, 0, 0, 1, 0, 0];
    frame.extend_from_slice(&(-1i32).to_be_bytes());
    frame.extend_from_slice(b"junk");
    let mut framed = (frame.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&frame);
    raw.send_bytes(&framed);
    let (id, resp): (i32, MetadataResponse) = raw.recv(ApiKey::Metadata, 1);
    assert_eq!((id, resp.brokers.len()), (1, 1));
    broker_still_serves(&spate.addr);
}

#[test]
fn unknown_api_keys_and_versions_get_unsupported_version() {
    let spate = Spate::start(&[]);
    let mut raw = Raw::connect(&spate.addr);
    // Unknown key 9999: a bare answer, and the connection stays usable.
    raw.send_bytes(&[0, 0, 0, 10, 0x27, 0x0f, 0, 0, 0, 0, 0, 42, 0, 0]);
    let mut frame = raw.recv_frame().expect("an answer");
    assert_eq!(bare_error(&mut frame), (42, 35));
    // A known API below its lowest version (Produce v2, message format v1 era).
    raw.send_bytes(&[0, 0, 0, 10, 0, 0, 0, 2, 0, 0, 0, 43, 0, 0]);
    let mut frame = raw.recv_frame().expect("an answer");
    assert_eq!(bare_error(&mut frame), (43, 35));
    // ApiVersions of a future version: a v0 answer listing what we support (KIP-511).
    let mut header = vec![0, 18, 0, 99, 0, 0, 0, 7, 0, 0, 0];
    header.extend_from_slice(&[0, 0]);
    let mut framed = (header.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&header);
    raw.send_bytes(&framed);
    let (id, resp): (i32, ApiVersionsResponse) = raw.recv(ApiKey::ApiVersions, 0);
    assert_eq!((id, resp.error_code), (7, 35));
    assert!(resp
        .api_keys
        .iter()
        .any(|k| k.api_key == 0 && k.max_version >= 9));
    // The KIP-848 consumer protocol is advertised at Kafka 4.3's range; share groups (KIP-932)
    // at v1 only (Kafka 4.0's early-access v0 is gone).
    assert!(resp
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::ConsumerGroupHeartbeat as i16
            && (k.min_version, k.max_version) == (0, 1)));
    assert!(resp
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::ShareGroupHeartbeat as i16
            && (k.min_version, k.max_version) == (1, 1)));
    // Transactions are advertised at Kafka 4.3's ranges.
    for (key, range) in [
        (ApiKey::AddPartitionsToTxn, (0, 5)),
        (ApiKey::EndTxn, (0, 5)),
    ] {
        assert!(resp
            .api_keys
            .iter()
            .any(|k| k.api_key == key as i16 && (k.min_version, k.max_version) == range));
    }
    let resp: ApiVersionsResponse =
        raw.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(resp.error_code, 0);
}

#[tokio::test]
async fn bad_batches_get_their_kafka_error_codes() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "strict", 1, &[("max.message.bytes", "200")]).await;
    let mut raw = Raw::connect(&spate.addr);
    let good = batch(-1, 0, 1);

    let mut corrupt = good.to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x55;
    assert_eq!(
        produce_result(&mut raw, &produce("strict", corrupt.into(), 1)).0,
        2
    );

    let mut legacy = good.to_vec();
    legacy[16] = 1;
    assert_eq!(
        produce_result(&mut raw, &produce("strict", legacy.into(), 1)).0,
        43
    );

    let big = batch(-1, 0, 40);
    assert_eq!(produce_result(&mut raw, &produce("strict", big, 1)).0, 10);

    assert_eq!(
        produce_result(&mut raw, &produce("strict", good.clone(), 7)).0,
        21
    );

    let mut two = good.to_vec();
    two.extend_from_slice(&good);
    assert_eq!(
        produce_result(&mut raw, &produce("strict", two.into(), 1)).0,
        87
    );

    let truncated = good.slice(..good.len() - 3);
    assert_eq!(
        produce_result(&mut raw, &produce("strict", truncated, 1)).0,
        2
    );

    // Nothing bad was stored: the next good batch lands at offset 0.
    assert_eq!(
        produce_result(&mut raw, &produce("strict", good, 1)),
        (0, 0)
    );
}

#[test]
fn unknown_and_invalid_topics_without_auto_create() {
    let spate = Spate::start(&["--auto-create-topics", "false"]);
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        produce_result(&mut raw, &produce("ghost", batch(-1, 0, 1), 1)).0,
        3
    );
    let mut req = MetadataRequest::default();
    let topic = |n: &str| {
        let mut t = MetadataRequestTopic::default();
        t.name = Some(TopicName(StrBytes::from_string(n.to_string())));
        t
    };
    req.topics = Some(vec![topic("ghost"), topic("bad name!")]);
    req.allow_auto_topic_creation = true;
    let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &req);
    let codes: Vec<i16> = resp.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![3, 17]);
}

#[tokio::test]
async fn idempotent_sequences_are_enforced_across_restart() {
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "idem", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let mut init = InitProducerIdRequest::default();
    init.transactional_id = None;
    init.transaction_timeout_ms = 60_000;
    init.producer_id = (-1).into();
    init.producer_epoch = -1;
    let ids: InitProducerIdResponse = raw.call(ApiKey::InitProducerId, 4, &init);
    assert_eq!(ids.error_code, 0);
    let pid = ids.producer_id.0;

    let first = batch(pid, 0, 5);
    assert_eq!(
        produce_result(&mut raw, &produce("idem", first.clone(), -1)),
        (0, 0)
    );
    // A retry answers with the original offset and stores nothing.
    assert_eq!(
        produce_result(&mut raw, &produce("idem", first.clone(), -1)),
        (0, 0)
    );

    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        produce_result(&mut raw, &produce("idem", first, -1)),
        (0, 0)
    );
    assert_eq!(
        produce_result(&mut raw, &produce("idem", batch(pid, 10, 1), -1)).0,
        45
    );
    assert_eq!(
        produce_result(&mut raw, &produce("idem", batch(pid, 5, 2), -1)),
        (0, 5)
    );
    let ids2: InitProducerIdResponse = raw.call(ApiKey::InitProducerId, 4, &init);
    assert!(
        ids2.producer_id.0 > pid,
        "producer ids are never reused after restart"
    );
}
