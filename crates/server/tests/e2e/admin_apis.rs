//! The admin calls Kafka 4's tools and admin clients make besides topics and configs:
//! DeleteRecords, DescribeTopicPartitions, ListConfigResources and AlterReplicaLogDirs.

use std::time::Duration;

use kafka_protocol::messages::alter_replica_log_dirs_request::{
    AlterReplicaLogDir, AlterReplicaLogDirTopic,
};
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ApiKey, DeleteRecordsRequest,
    DeleteRecordsResponse, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse,
    FetchRequest, FetchResponse, ListConfigResourcesRequest, ListConfigResourcesResponse,
    ListOffsetsRequest, ListOffsetsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::AdminOptions;
use rdkafka::producer::FutureRecord;
use rdkafka::TopicPartitionList;

use crate::harness::{admin, producer, Raw, Spate};
use crate::produce_consume::create_topic;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn produce_n(addr: &str, topic: &str, partition: i32, n: usize) {
    let p = producer(addr, &[]);
    for i in 0..n {
        p.send(
            FutureRecord::to(topic)
                .partition(partition)
                .key("k")
                .payload(&format!("record {i}")),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
}

fn delete_records(topic: &str, partition: i32, offset: i64) -> DeleteRecordsRequest {
    let mut p = DeleteRecordsPartition::default();
    p.partition_index = partition;
    p.offset = offset;
    let mut t = DeleteRecordsTopic::default();
    t.name = name(topic);
    t.partitions = vec![p];
    let mut r = DeleteRecordsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 10_000;
    r
}

/// The earliest offset ListOffsets reports, and the fetch error for `offset`.
fn earliest_and_fetch(raw: &mut Raw, topic: &str, offset: i64) -> (i64, i16, i64) {
    let mut lp = ListOffsetsPartition::default();
    lp.partition_index = 0;
    lp.timestamp = -2;
    let mut lt = ListOffsetsTopic::default();
    lt.name = name(topic);
    lt.partitions = vec![lp];
    let mut lo = ListOffsetsRequest::default();
    lo.replica_id = (-1).into();
    lo.topics = vec![lt];
    let resp: ListOffsetsResponse = raw.call(ApiKey::ListOffsets, 7, &lo);
    let earliest = resp.topics[0].partitions[0].offset;
    let mut fp = FetchPartition::default();
    fp.partition = 0;
    fp.fetch_offset = offset;
    fp.partition_max_bytes = 1 << 20;
    let mut ft = FetchTopic::default();
    ft.topic = name(topic);
    ft.partitions = vec![fp];
    let mut f = FetchRequest::default();
    f.replica_id = (-1).into();
    f.max_bytes = 1 << 20;
    f.session_epoch = -1;
    f.topics = vec![ft];
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &f);
    let pd = &resp.responses[0].partitions[0];
    (earliest, pd.error_code, pd.log_start_offset)
}

#[tokio::test]
async fn delete_records_moves_the_log_start_for_list_offsets_and_fetch_and_survives_kill_9() {
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "trim", 1, &[("segment.bytes", "1024")]).await;
    produce_n(&spate.addr, "trim", 0, 60).await;
    // librdkafka's admin client, as an application would call it.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("trim", 0, rdkafka::Offset::Offset(25))
        .unwrap();
    let done = admin(&spate.addr)
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("delete_records");
    let el = done.elements();
    assert_eq!(el.len(), 1);
    assert!(el[0].error().is_ok(), "{:?}", el[0].error());
    assert_eq!(el[0].offset(), rdkafka::Offset::Offset(25));
    let mut raw = Raw::connect(&spate.addr);
    let (earliest, below, start) = earliest_and_fetch(&mut raw, "trim", 24);
    assert_eq!((earliest, start), (25, 25));
    assert_eq!(below, 1, "a fetch below the start is OFFSET_OUT_OF_RANGE");
    let (_, at, _) = earliest_and_fetch(&mut raw, "trim", 25);
    assert_eq!(at, 0);
    drop(raw);
    spate.kill9();
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    let (earliest, below, _) = earliest_and_fetch(&mut raw, "trim", 0);
    assert_eq!(
        earliest, 25,
        "the new start is on disk before DeleteRecords answers"
    );
    assert_eq!(below, 1);
}

#[tokio::test]
async fn delete_records_refuses_offsets_past_the_high_watermark_and_unknown_partitions() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "bounds", 1, &[]).await;
    produce_n(&spate.addr, "bounds", 0, 5).await;
    let mut raw = Raw::connect(&spate.addr);
    let answer = |raw: &mut Raw, topic: &str, partition: i32, offset: i64| {
        let r: DeleteRecordsResponse = raw.call(
            ApiKey::DeleteRecords,
            2,
            &delete_records(topic, partition, offset),
        );
        let p = &r.topics[0].partitions[0];
        (p.error_code, p.low_watermark)
    };
    assert_eq!(
        answer(&mut raw, "bounds", 0, 6),
        (1, -1),
        "past the high watermark"
    );
    assert_eq!(
        answer(&mut raw, "bounds", 0, -7),
        (1, -1),
        "negative, not -1"
    );
    assert_eq!(
        answer(&mut raw, "bounds", 3, 1),
        (3, -1),
        "no such partition"
    );
    assert_eq!(answer(&mut raw, "nope", 0, 1), (3, -1), "no such topic");
    // Nothing moved.
    let (earliest, _, _) = earliest_and_fetch(&mut raw, "bounds", 0);
    assert_eq!(earliest, 0);
    // -1 means the high watermark; going back is a no-op answering the current start.
    assert_eq!(answer(&mut raw, "bounds", 0, -1), (0, 5));
    assert_eq!(answer(&mut raw, "bounds", 0, 2), (0, 5));
}

#[tokio::test]
async fn describe_topic_partitions_pages_with_a_cursor_in_name_order() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "b-topic", 3, &[]).await;
    create_topic(&spate.addr, "a-topic", 2, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let mut seen = Vec::new();
    let mut internal = Vec::new();
    let mut cursor: Option<Cursor> = None;
    // 50 internal partitions and 5 others, two a page.
    for _ in 0..40 {
        let mut req = DescribeTopicPartitionsRequest::default();
        req.response_partition_limit = 2;
        req.cursor = cursor.take();
        let resp: DescribeTopicPartitionsResponse =
            raw.call(ApiKey::DescribeTopicPartitions, 0, &req);
        for t in &resp.topics {
            assert_eq!(t.error_code, 0);
            let name = t.name.as_ref().unwrap().to_string();
            assert_eq!(t.is_internal, name == "__consumer_offsets", "{name}");
            if t.is_internal {
                internal.extend(t.partitions.iter().map(|p| p.partition_index));
                continue;
            }
            for p in &t.partitions {
                assert_eq!(p.leader_id.0, 0, "the standalone broker (node 0) leads");
                assert_eq!(p.isr_nodes.len(), 1);
                seen.push((t.name.as_ref().unwrap().to_string(), p.partition_index));
            }
        }
        match resp.next_cursor {
            Some(c) => {
                let mut next = Cursor::default();
                next.topic_name = c.topic_name;
                next.partition_index = c.partition_index;
                cursor = Some(next);
            }
            None => break,
        }
    }
    let want: Vec<(String, i32)> = [
        ("a-topic", 0),
        ("a-topic", 1),
        ("b-topic", 0),
        ("b-topic", 1),
        ("b-topic", 2),
    ]
    .iter()
    .map(|(t, p)| (t.to_string(), *p))
    .collect();
    assert_eq!(seen, want);
    assert_eq!(
        internal,
        (0..50).collect::<Vec<_>>(),
        "__consumer_offsets is listed, internal, with Kafka's 50 partitions"
    );
    // An explicit unknown topic is answered with its error, not left out.
    let mut req = DescribeTopicPartitionsRequest::default();
    req.response_partition_limit = 100;
    let mut t = TopicRequest::default();
    t.name = name("missing");
    req.topics = vec![t];
    let resp: DescribeTopicPartitionsResponse = raw.call(ApiKey::DescribeTopicPartitions, 0, &req);
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(resp.topics[0].error_code, 3);
}

#[tokio::test]
async fn list_config_resources_lists_topics_and_brokers_and_refuses_unknown_types() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "cfg", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let resp: ListConfigResourcesResponse = raw.call(
        ApiKey::ListConfigResources,
        1,
        &ListConfigResourcesRequest::default(),
    );
    assert_eq!(resp.error_code, 0);
    let listed: Vec<(i8, String)> = resp
        .config_resources
        .iter()
        .map(|r| (r.resource_type, r.resource_name.to_string()))
        .collect();
    assert!(listed.contains(&(2, "cfg".into())), "{listed:?}");
    assert!(listed.contains(&(4, "0".into())), "{listed:?}");
    let mut req = ListConfigResourcesRequest::default();
    req.resource_types = vec![99];
    let resp: ListConfigResourcesResponse = raw.call(ApiKey::ListConfigResources, 1, &req);
    assert_eq!(resp.error_code, 42, "INVALID_REQUEST");
}

#[tokio::test]
async fn alter_replica_log_dirs_accepts_the_data_dir_and_refuses_any_other() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "dirs", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let ask = |raw: &mut Raw, path: String, partition: i32| {
        let mut t = AlterReplicaLogDirTopic::default();
        t.name = name("dirs");
        t.partitions = vec![partition];
        let mut d = AlterReplicaLogDir::default();
        d.path = StrBytes::from_string(path);
        d.topics = vec![t];
        let mut r = AlterReplicaLogDirsRequest::default();
        r.dirs = vec![d];
        let resp: AlterReplicaLogDirsResponse = raw.call(ApiKey::AlterReplicaLogDirs, 2, &r);
        resp.results[0].partitions[0].error_code
    };
    let here = spate.data_dir().display().to_string();
    assert_eq!(ask(&mut raw, here.clone(), 0), 0);
    assert_eq!(
        ask(&mut raw, "/elsewhere".into(), 0),
        57,
        "LOG_DIR_NOT_FOUND"
    );
    assert_eq!(ask(&mut raw, here, 5), 3, "UNKNOWN_TOPIC_OR_PARTITION");
}

#[tokio::test]
async fn clients_cannot_produce_to_delete_or_resize_the_internal_offsets_topic() {
    use rdkafka::admin::NewPartitions;
    use rdkafka::types::RDKafkaErrorCode;
    let spate = Spate::start(&[]);
    let prod = producer(&spate.addr, &[("message.timeout.ms", "10000")]);
    let refused = prod
        .send(
            FutureRecord::<(), _>::to("__consumer_offsets")
                .payload("x")
                .partition(0),
            Duration::from_secs(15),
        )
        .await
        .expect_err("a produce to __consumer_offsets is refused");
    assert_eq!(
        refused.0.rdkafka_error_code(),
        Some(RDKafkaErrorCode::InvalidTopic)
    );
    let a = admin(&spate.addr);
    let deleted = a
        .delete_topics(&["__consumer_offsets"], &AdminOptions::new())
        .await
        .expect("DeleteTopics answered");
    assert!(
        matches!(deleted[0], Err((_, RDKafkaErrorCode::InvalidTopic))),
        "{deleted:?}"
    );
    let resized = a
        .create_partitions(
            &[NewPartitions::new("__consumer_offsets", 60)],
            &AdminOptions::new(),
        )
        .await
        .expect("CreatePartitions answered");
    assert!(
        matches!(resized[0], Err((_, RDKafkaErrorCode::InvalidTopic))),
        "{resized:?}"
    );
    // Still there, with its 50 partitions, and listed as internal.
    let md = rdkafka::producer::Producer::client(&prod)
        .fetch_metadata(Some("__consumer_offsets"), Duration::from_secs(10))
        .expect("metadata");
    assert_eq!(md.topics()[0].partitions().len(), 50);
}
