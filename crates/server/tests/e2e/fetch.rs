use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;

use crate::harness::{producer, Raw, Spate};
use crate::produce_consume::create_topic;

fn fetch(topic: &str, offset: i64, max_wait_ms: i32, min_bytes: i32) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = (-1).into();
    r.max_wait_ms = max_wait_ms;
    r.min_bytes = min_bytes;
    r.max_bytes = 50 << 20;
    r.session_epoch = -1;
    r.topics = vec![t];
    r
}

#[tokio::test]
async fn long_poll_fetch_returns_when_data_arrives() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "poll", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    // Far longer than the test runs: only an append can end this wait.
    raw.send(ApiKey::Fetch, 12, &fetch("poll", 0, 60_000, 1));
    let started = Instant::now();
    let p = producer(&spate.addr, &[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.send(
        FutureRecord::to("poll").key("k").payload("hello"),
        Duration::from_secs(20),
    )
    .await
    .expect("delivery");
    let (_, resp): (i32, FetchResponse) =
        tokio::task::spawn_blocking(move || raw.recv(ApiKey::Fetch, 12))
            .await
            .unwrap();
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    assert_eq!(part.high_watermark, 1);
    assert!(!part.records.as_ref().unwrap().is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "answered by the append, not the timeout"
    );
}

#[tokio::test]
async fn fetch_with_unmet_min_bytes_answers_after_max_wait() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "minb", 1, &[]).await;
    let p = producer(&spate.addr, &[]);
    p.send(
        FutureRecord::to("minb").key("k").payload("x"),
        Duration::from_secs(20),
    )
    .await
    .expect("delivery");
    let mut raw = Raw::connect(&spate.addr);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 11, &fetch("minb", 0, 200, 1 << 20));
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    assert!(
        !part.records.as_ref().unwrap().is_empty(),
        "returns what it has at max_wait"
    );
}

#[tokio::test]
async fn fetch_past_the_end_is_offset_out_of_range() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "oor", 1, &[]).await;
    let mut raw = Raw::connect(&spate.addr);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch("oor", 5, 0, 1));
    assert_eq!(resp.responses[0].partitions[0].error_code, 1);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch("oor", -3, 0, 1));
    assert_eq!(resp.responses[0].partitions[0].error_code, 1);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &fetch("no-such-topic", 0, 0, 1));
    assert_eq!(resp.responses[0].partitions[0].error_code, 3);
}
