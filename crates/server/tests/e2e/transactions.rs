//! Transactions through raw protocol requests: what librdkafka and the Java client never send
//! (refused with Kafka's error, nothing written), and a broker killed with a transaction
//! committed and another open.

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, FetchRequest, FetchResponse, GroupId, InitProducerIdRequest,
    InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest,
    ProduceResponse, TopicName, TransactionalId, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use kafka_protocol::ResponseError;
use spate_protocol::batch::{build, NewRecord, ProducerFields};

use crate::bad_input::produce;
use crate::harness::{bare_error, Raw, Spate};

/// Creates a one-partition topic.
fn create_topic(raw: &mut Raw, name: &str) {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
    let mut t = CreatableTopic::default();
    t.name = TopicName(s(name));
    t.num_partitions = 1;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 5, &r);
    assert_eq!(resp.topics[0].error_code, 0);
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// InitProducerId for `txn_id` (v4): (error, producer id, epoch).
fn init(raw: &mut Raw, txn_id: &str, timeout_ms: i32) -> (i16, i64, i16) {
    let mut r = InitProducerIdRequest::default();
    r.transactional_id = Some(TransactionalId(s(txn_id)));
    r.transaction_timeout_ms = timeout_ms;
    r.producer_id = (-1).into();
    r.producer_epoch = -1;
    // A fencing init answers CONCURRENT_TRANSACTIONS until the abort completes.
    for _ in 0..100 {
        let resp: InitProducerIdResponse = raw.call(ApiKey::InitProducerId, 4, &r);
        if resp.error_code != code(ResponseError::ConcurrentTransactions) {
            return (resp.error_code, resp.producer_id.0, resp.producer_epoch);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("InitProducerId kept answering CONCURRENT_TRANSACTIONS");
}

/// AddPartitionsToTxn v3 of (topic, partition)s: each partition's error.
fn add(raw: &mut Raw, txn_id: &str, pid: i64, epoch: i16, parts: &[(&str, i32)]) -> Vec<i16> {
    let mut r = AddPartitionsToTxnRequest::default();
    r.v3_and_below_transactional_id = TransactionalId(s(txn_id));
    r.v3_and_below_producer_id = pid.into();
    r.v3_and_below_producer_epoch = epoch;
    for (t, p) in parts {
        let mut topic = AddPartitionsToTxnTopic::default();
        topic.name = TopicName(s(t));
        topic.partitions = vec![*p];
        r.v3_and_below_topics.push(topic);
    }
    // Right after an EndTxn the previous transaction's markers may still be being written
    // (PrepareCommit/PrepareAbort): the answer is CONCURRENT_TRANSACTIONS and clients retry.
    let concurrent = code(ResponseError::ConcurrentTransactions);
    for _ in 0..100 {
        let resp: AddPartitionsToTxnResponse = raw.call(ApiKey::AddPartitionsToTxn, 3, &r);
        let codes: Vec<i16> = resp
            .results_by_topic_v3_and_below
            .iter()
            .flat_map(|t| {
                t.results_by_partition
                    .iter()
                    .map(|p| p.partition_error_code)
            })
            .collect();
        if !codes.contains(&concurrent) {
            return codes;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("AddPartitionsToTxn kept answering CONCURRENT_TRANSACTIONS");
}

fn end(raw: &mut Raw, version: i16, txn_id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let mut r = EndTxnRequest::default();
    r.transactional_id = TransactionalId(s(txn_id));
    r.producer_id = pid.into();
    r.producer_epoch = epoch;
    r.committed = commit;
    let resp: EndTxnResponse = raw.call(ApiKey::EndTxn, version, &r);
    resp.error_code
}

/// A transactional batch of `n` records from sequence `seq`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, n: i32) -> Bytes {
    let records: Vec<NewRecord> = (0..n)
        .map(|i| NewRecord {
            key: None,
            value: Some(Bytes::from(format!("txn-{}", seq + i))),
            timestamp: 1_000,
        })
        .collect();
    let producer = ProducerFields {
        id: pid,
        epoch,
        base_sequence: seq,
        transactional: true,
    };
    build(&records, Some(producer), Compression::None).unwrap()
}

fn produce_txn(raw: &mut Raw, txn_id: &str, topic: &str, batch: Bytes) -> i16 {
    produce_txn_v(raw, 9, txn_id, topic, batch)
}

fn produce_txn_v(raw: &mut Raw, version: i16, txn_id: &str, topic: &str, batch: Bytes) -> i16 {
    let mut req: ProduceRequest = produce(topic, batch, -1);
    req.transactional_id = Some(TransactionalId(s(txn_id)));
    let resp: ProduceResponse = raw.call(ApiKey::Produce, version, &req);
    resp.responses[0].partition_responses[0].error_code
}

fn end_v5(raw: &mut Raw, txn_id: &str, pid: i64, epoch: i16, commit: bool) -> (i16, i64, i16) {
    let mut r = EndTxnRequest::default();
    r.transactional_id = TransactionalId(s(txn_id));
    r.producer_id = pid.into();
    r.producer_epoch = epoch;
    r.committed = commit;
    let resp: EndTxnResponse = raw.call(ApiKey::EndTxn, 5, &r);
    (resp.error_code, resp.producer_id.0, resp.producer_epoch)
}

/// ListOffsets latest of partition 0 under `isolation` (0 uncommitted, 1 committed).
fn latest(raw: &mut Raw, topic: &str, isolation: i8) -> i64 {
    let mut p = ListOffsetsPartition::default();
    p.partition_index = 0;
    p.timestamp = -1;
    let mut t = ListOffsetsTopic::default();
    t.name = TopicName(s(topic));
    t.partitions = vec![p];
    let mut r = ListOffsetsRequest::default();
    r.replica_id = (-1).into();
    r.isolation_level = isolation;
    r.topics = vec![t];
    let resp: ListOffsetsResponse = raw.call(ApiKey::ListOffsets, 7, &r);
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

/// A read_committed fetch of partition 0 from offset 0: (last stable offset, aborted
/// transactions' (producer id, first offset), record bytes).
fn fetch_committed(raw: &mut Raw, topic: &str) -> (i64, Vec<(i64, i64)>, usize) {
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = 0;
    p.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    t.topic = TopicName(s(topic));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = (-1).into();
    r.max_wait_ms = 0;
    r.max_bytes = 1 << 20;
    r.isolation_level = 1;
    r.topics = vec![t];
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 11, &r);
    let pd = &resp.responses[0].partitions[0];
    assert_eq!(pd.error_code, 0);
    let aborted = pd
        .aborted_transactions
        .iter()
        .flatten()
        .map(|a| (a.producer_id.0, a.first_offset))
        .collect();
    (
        pd.last_stable_offset,
        aborted,
        pd.records.as_ref().map_or(0, Bytes::len),
    )
}

#[test]
fn malformed_transaction_requests_get_kafkas_errors_and_write_nothing() {
    let spate = Spate::start(&[]);
    let topic = "txn-bad";
    let mut raw = Raw::connect(&spate.addr);
    create_topic(&mut raw, topic);
    // A timeout over transaction.max.timeout.ms (15 min) and an id no record can hold.
    assert_eq!(
        init(&mut raw, "t", 900_001).0,
        code(ResponseError::InvalidTransactionTimeout)
    );
    assert_eq!(
        init(&mut raw, &"x".repeat(40_000), 10_000).0,
        code(ResponseError::InvalidRequest)
    );
    // EndTxn for an id the coordinator never gave out, then without a transaction open.
    assert_eq!(
        end(&mut raw, 3, "never", 7, 0, true),
        code(ResponseError::InvalidProducerIdMapping)
    );
    let (e, pid, epoch) = init(&mut raw, "t", 10_000);
    assert_eq!(e, 0);
    assert_eq!(
        end(&mut raw, 3, "t", pid, epoch, true),
        code(ResponseError::InvalidTxnState)
    );
    // A topic that does not exist: named, the rest not attempted, nothing added.
    assert_eq!(
        add(
            &mut raw,
            "t",
            pid,
            epoch,
            &[("no-such-topic", 0), (topic, 0)]
        ),
        vec![
            code(ResponseError::UnknownTopicOrPartition),
            code(ResponseError::OperationNotAttempted)
        ]
    );
    // A produce to a partition never added (KIP-890): refused, nothing written.
    assert_eq!(
        produce_txn(&mut raw, "t", topic, txn_batch(pid, epoch, 0, 3)),
        code(ResponseError::InvalidTxnState)
    );
    assert_eq!(latest(&mut raw, topic, 0), 0, "nothing was appended");
    // A transactional batch without the request's transactional id, and a control batch.
    let resp: ProduceResponse = raw.call(
        ApiKey::Produce,
        9,
        &produce(topic, txn_batch(pid, epoch, 0, 1), -1),
    );
    assert_eq!(
        resp.responses[0].partition_responses[0].error_code,
        code(ResponseError::InvalidRecord)
    );
    // TxnOffsetCommit without AddOffsetsToTxn.
    let mut tp = TxnOffsetCommitRequestPartition::default();
    tp.partition_index = 0;
    tp.committed_offset = 5;
    let mut tt = TxnOffsetCommitRequestTopic::default();
    tt.name = TopicName(s(topic));
    tt.partitions = vec![tp];
    let mut toc = TxnOffsetCommitRequest::default();
    toc.transactional_id = TransactionalId(s("t"));
    toc.group_id = GroupId(s("g"));
    toc.producer_id = pid.into();
    toc.producer_epoch = epoch;
    toc.generation_id = -1;
    toc.topics = vec![tt];
    let resp: TxnOffsetCommitResponse = raw.call(ApiKey::TxnOffsetCommit, 3, &toc);
    assert_eq!(
        resp.topics[0].partitions[0].error_code,
        code(ResponseError::InvalidTxnState)
    );
    // An old epoch after a newer producer initialized the id: fenced, as the version says.
    let (_, pid2, epoch2) = init(&mut raw, "t", 10_000);
    assert_eq!((pid2, epoch2), (pid, epoch + 1));
    assert_eq!(
        add(&mut raw, "t", pid, epoch, &[(topic, 0)]),
        vec![code(ResponseError::ProducerFenced)]
    );
    assert_eq!(
        end(&mut raw, 1, "t", pid, epoch, false),
        code(ResponseError::InvalidProducerEpoch),
        "EndTxn v1 predates PRODUCER_FENCED"
    );
    let mut ao = AddOffsetsToTxnRequest::default();
    ao.transactional_id = TransactionalId(s("t"));
    ao.producer_id = pid.into();
    ao.producer_epoch = epoch;
    ao.group_id = GroupId(s("g"));
    let resp: AddOffsetsToTxnResponse = raw.call(ApiKey::AddOffsetsToTxn, 3, &ao);
    assert_eq!(resp.error_code, code(ResponseError::ProducerFenced));
    // An API version past what is served: a bare UNSUPPORTED_VERSION, the connection lives.
    let header = kafka_protocol::messages::RequestHeader::default()
        .with_request_api_key(ApiKey::EndTxn as i16)
        .with_request_api_version(5)
        .with_correlation_id(777);
    let mut body = spate_protocol::codec::encode_request(&header, &EndTxnRequest::default())
        .unwrap()
        .to_vec();
    body[2..4].copy_from_slice(&9i16.to_be_bytes());
    let mut framed = (body.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&body);
    raw.send_bytes(&framed);
    let mut frame = raw.recv_frame().unwrap();
    assert_eq!(
        bare_error(&mut frame),
        (777, code(ResponseError::UnsupportedVersion))
    );
    assert_eq!(latest(&mut raw, topic, 0), 0, "still nothing written");
    let mut d = DescribeTransactionsRequest::default();
    d.transactional_ids = vec![TransactionalId(s("t")), TransactionalId(s("unknown"))];
    let resp: DescribeTransactionsResponse = raw.call(ApiKey::DescribeTransactions, 0, &d);
    let states: Vec<(i16, String)> = resp
        .transaction_states
        .iter()
        .map(|t| (t.error_code, t.transaction_state.to_string()))
        .collect();
    assert_eq!(
        states,
        vec![
            (0, "Empty".to_string()),
            (code(ResponseError::TransactionalIdNotFound), String::new())
        ]
    );
}

#[test]
fn after_kill9_a_committed_transaction_stays_visible_and_the_open_one_is_aborted_at_its_timeout() {
    let mut spate = Spate::start(&[]);
    let topic = "txn-restart";
    let mut raw = Raw::connect(&spate.addr);
    create_topic(&mut raw, topic);
    // Committed: 3 records and their marker (offsets 0-3).
    let (_, a, ae) = init(&mut raw, "committer", 60_000);
    assert_eq!(add(&mut raw, "committer", a, ae, &[(topic, 0)]), vec![0]);
    assert_eq!(
        produce_txn(&mut raw, "committer", topic, txn_batch(a, ae, 0, 3)),
        0
    );
    assert_eq!(end(&mut raw, 3, "committer", a, ae, true), 0);
    // Aborted: 2 records and their marker (offsets 4-6).
    assert_eq!(add(&mut raw, "committer", a, ae, &[(topic, 0)]), vec![0]);
    assert_eq!(
        produce_txn(&mut raw, "committer", topic, txn_batch(a, ae, 3, 2)),
        0
    );
    assert_eq!(end(&mut raw, 3, "committer", a, ae, false), 0);
    // Open, with a 3 s timeout: 2 records at 7-8, no marker.
    let (_, o, oe) = init(&mut raw, "stalled", 3_000);
    assert_eq!(add(&mut raw, "stalled", o, oe, &[(topic, 0)]), vec![0]);
    assert_eq!(
        produce_txn(&mut raw, "stalled", topic, txn_batch(o, oe, 0, 2)),
        0
    );
    // Markers are written after EndTxn answers: wait for the abort's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while latest(&mut raw, topic, 0) < 9 {
        assert!(std::time::Instant::now() < deadline, "markers not written");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        latest(&mut raw, topic, 1),
        7,
        "the open transaction holds the LSO"
    );
    spate.kill9();
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    let (lso, aborted, bytes) = fetch_committed(&mut raw, topic);
    assert_eq!(
        lso, 7,
        "the open transaction still bounds the LSO after the crash"
    );
    assert_eq!(
        aborted,
        vec![(a, 4)],
        "the aborted transaction is still known"
    );
    assert!(bytes > 0);
    // The coordinator rebuilt the open transaction from __transaction_state and aborts it
    // at its timeout; its producer is fenced.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while latest(&mut raw, topic, 1) < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "the open transaction was never aborted: {}",
            spate.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(latest(&mut raw, topic, 0), 10, "one abort marker, at 9");
    let (lso, aborted, _) = fetch_committed(&mut raw, topic);
    assert_eq!(lso, 10);
    assert_eq!(aborted, vec![(a, 4), (o, 7)]);
    assert_eq!(
        end(&mut raw, 3, "stalled", o, oe, true),
        code(ResponseError::ProducerFenced)
    );
}

#[test]
fn under_transaction_version_2_a_produce_enrols_its_partition_and_each_end_bumps_the_epoch() {
    let spate = Spate::start(&[]);
    let topic = "txn-v2";
    let mut raw = Raw::connect(&spate.addr);
    create_topic(&mut raw, topic);
    let (e, pid, epoch) = init(&mut raw, "v2", 10_000);
    assert_eq!(e, 0);
    // Produce v12 enrols the partition on the producer's behalf (no AddPartitionsToTxn)...
    assert_eq!(
        produce_txn_v(&mut raw, 12, "v2", topic, txn_batch(pid, epoch, 0, 2)),
        0
    );
    let mut d = DescribeTransactionsRequest::default();
    d.transactional_ids = vec![TransactionalId(s("v2"))];
    let resp: DescribeTransactionsResponse = raw.call(ApiKey::DescribeTransactions, 0, &d);
    let st = &resp.transaction_states[0];
    assert_eq!(st.transaction_state.as_str(), "Ongoing");
    assert_eq!(st.topics[0].partitions, vec![0]);
    // ...while v11 and older still need it (KIP-890 part 1).
    let (_, other, other_epoch) = init(&mut raw, "v1", 10_000);
    assert_eq!(
        produce_txn(&mut raw, "v1", topic, txn_batch(other, other_epoch, 0, 1)),
        code(ResponseError::InvalidTxnState)
    );
    // EndTxn v5 moves the producer to the next epoch; a retry gets the same answer.
    assert_eq!(
        end_v5(&mut raw, "v2", pid, epoch, true),
        (0, pid, epoch + 1)
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match end_v5(&mut raw, "v2", pid, epoch, true) {
            (0, p, e) => {
                assert_eq!((p, e), (pid, epoch + 1));
                break;
            }
            (c, ..) if c == code(ResponseError::ConcurrentTransactions) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "markers never written"
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => panic!("a retried EndTxn v5: {other:?}"),
        }
    }
    // The old epoch is fenced at the partition; the new one starts its sequence over.
    assert_eq!(
        produce_txn_v(&mut raw, 12, "v2", topic, txn_batch(pid, epoch, 2, 1)),
        code(ResponseError::InvalidProducerEpoch)
    );
    assert_eq!(
        produce_txn_v(&mut raw, 12, "v2", topic, txn_batch(pid, epoch + 1, 0, 1)),
        0
    );
    assert_eq!(
        end_v5(&mut raw, "v2", pid, epoch + 1, false),
        (0, pid, epoch + 2)
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while latest(&mut raw, topic, 1) != latest(&mut raw, topic, 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the abort marker never came"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, aborted, _) = fetch_committed(&mut raw, topic);
    assert_eq!(aborted, vec![(pid, 3)], "the second transaction aborted");
}
