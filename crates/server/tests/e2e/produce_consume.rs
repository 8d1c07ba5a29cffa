use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::{Timestamp, TopicPartitionList};

use crate::harness::{admin, consumer, producer, Spate};

/// What was sent, to compare against what comes back.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp: i64,
}

fn record(i: usize) -> Sent {
    // Sizes vary so batches mix tiny and multi-kilobyte records.
    let len = [0usize, 1, 17, 300, 4096][i % 5];
    Sent {
        key: format!("key-{i}").into_bytes(),
        value: (0..len).map(|j| (i * 31 + j) as u8).collect(),
        headers: vec![
            ("trace".into(), format!("t{i}").into_bytes()),
            ("empty".into(), Vec::new()),
        ],
        timestamp: 1_700_000_000_000 + i as i64,
    }
}

/// Consumes `count` records from partition 0 of `topic`, in order, within 30 s.
pub fn consume(c: &BaseConsumer, count: usize) -> Vec<(i64, Sent)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < count && Instant::now() < deadline {
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("consume error");
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| (x.key.to_string(), x.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        let timestamp = match m.timestamp() {
            Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) => t,
            Timestamp::NotAvailable => -1,
        };
        got.push((
            m.offset(),
            Sent {
                key: m.key().unwrap_or_default().to_vec(),
                value: m.payload().unwrap_or_default().to_vec(),
                headers,
                timestamp,
            },
        ));
    }
    got
}

pub async fn create_topic(addr: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let r = admin(addr)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(r[0].is_ok(), "{r:?}");
}

#[tokio::test]
async fn every_codec_round_trips_keys_headers_and_timestamps_byte_for_byte() {
    let spate = Spate::start(&[]);
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("codec-{codec}");
        create_topic(&spate.addr, &topic, 1, &[]).await;
        let p = producer(&spate.addr, &[("compression.type", codec)]);
        let sent: Vec<Sent> = (0..300).map(record).collect();
        let deliveries = futures::future::join_all(sent.iter().map(|s| {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &s.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            p.send(
                FutureRecord::to(&topic)
                    .partition(0)
                    .key(&s.key)
                    .payload(&s.value)
                    .headers(headers)
                    .timestamp(s.timestamp),
                Duration::from_secs(20),
            )
        }))
        .await;
        let mut offsets: Vec<i64> = deliveries
            .into_iter()
            .map(|d| d.expect("delivery").offset)
            .collect();
        offsets.sort_unstable();
        assert_eq!(
            offsets,
            (0..300).collect::<Vec<_>>(),
            "{codec}: acked offsets"
        );

        let c = consumer(&spate.addr, &topic, &[0], 0);
        let got = consume(&c, sent.len());
        assert_eq!(got.len(), sent.len(), "{codec}: consumed count");
        for (i, (offset, rec)) in got.iter().enumerate() {
            assert_eq!(*offset, i as i64, "{codec}: offsets are contiguous");
            assert_eq!(rec, &sent[i], "{codec}: record {i} differs");
        }
    }
}

#[tokio::test]
async fn log_append_time_topic_stamps_records_with_broker_time() {
    let spate = Spate::start(&[]);
    create_topic(
        &spate.addr,
        "lat",
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await;
    let p = producer(&spate.addr, &[("compression.type", "lz4")]);
    let before = rdkafka::util::current_time_millis();
    let d = p
        .send(
            FutureRecord::to("lat").key("k").payload("v").timestamp(42),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    assert_eq!(d.offset, 0);
    let c = consumer(&spate.addr, "lat", &[0], 0);
    let m = c
        .poll(Duration::from_secs(20))
        .expect("a record")
        .expect("no error");
    match m.timestamp() {
        Timestamp::LogAppendTime(t) => assert!(t >= before, "append time {t} before {before}"),
        other => panic!("expected LogAppendTime, got {other:?}"),
    }
}

#[tokio::test]
async fn offsets_for_times_finds_first_record_at_or_after_timestamp() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "times", 1, &[]).await;
    let p = producer(&spate.addr, &[("linger.ms", "0")]);
    for i in 0..50i64 {
        // Several batches so the lookup crosses batch boundaries.
        p.send(
            FutureRecord::to("times")
                .key("k")
                .payload("v")
                .timestamp(10_000 + i * 10),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
    let c = consumer(&spate.addr, "times", &[0], 0);
    let mut q = TopicPartitionList::new();
    q.add_partition_offset("times", 0, rdkafka::Offset::Offset(10_205))
        .unwrap();
    let r = c
        .offsets_for_times(q, Duration::from_secs(10))
        .expect("offsets_for_times");
    assert_eq!(
        r.find_partition("times", 0).unwrap().offset(),
        rdkafka::Offset::Offset(21)
    );
    let mut q = TopicPartitionList::new();
    q.add_partition_offset("times", 0, rdkafka::Offset::Offset(99_999))
        .unwrap();
    let r = c
        .offsets_for_times(q, Duration::from_secs(10))
        .expect("offsets_for_times");
    assert_eq!(
        r.find_partition("times", 0).unwrap().offset(),
        rdkafka::Offset::End
    );
    let (lo, hi) = c
        .fetch_watermarks("times", 0, Duration::from_secs(10))
        .unwrap();
    assert_eq!((lo, hi), (0, 50));
}
