//! Topic-level `compression.type`: batches arriving in another codec are stored in the
//! topic's (recompressed on append, as Kafka does), read back by a real client unchanged, and
//! the setting can change at runtime; a bad value is refused.

use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::consumer::Consumer;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use spate_protocol::batch::{codec_of, Batches};
use spate_protocol::records::Compression;

use crate::compaction::{records, send};
use crate::harness::{admin, consumer, producer, Raw, Spate};
use crate::produce_consume::create_topic;

/// The codec of every stored batch of partition 0, in offset order.
fn stored_codecs(raw: &mut Raw, topic: &str) -> Vec<Option<Compression>> {
    let mut p = FetchPartition::default();
    p.partition = 0;
    p.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = (-1).into();
    r.max_bytes = 1 << 20;
    r.topics = vec![t];
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &r);
    let pd = &resp.responses[0].partitions[0];
    assert_eq!(pd.error_code, 0);
    let bytes = pd.records.clone().unwrap_or_default();
    Batches::new(&bytes).map(|(_, h)| codec_of(&h)).collect()
}

/// Sends `n` records from librdkafka compressing with `codec`; returns their values.
async fn produce(addr: &str, topic: &str, codec: &str, from: usize, n: usize) -> Vec<String> {
    let p = producer(addr, &[("compression.type", codec), ("linger.ms", "20")]);
    let values: Vec<String> = (from..from + n)
        .map(|i| format!("value {i} ").repeat(30))
        .collect();
    let sends = values.iter().enumerate().map(|(i, v)| {
        let key = format!("k{}", from + i);
        let p = &p;
        async move {
            p.send(
                FutureRecord::to(topic).partition(0).key(&key).payload(v),
                Duration::from_secs(10),
            )
            .await
            .expect("delivered");
        }
    });
    futures::future::join_all(sends).await;
    values
}

/// Every value of partition 0 through librdkafka.
fn consume_all(addr: &str, topic: &str, n: usize) -> Vec<String> {
    let c = consumer(addr, topic, &[0], 0);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < n && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.expect("message");
            got.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap());
        }
    }
    c.unassign().ok();
    got
}

#[tokio::test]
async fn batches_are_stored_in_the_topics_codec_and_read_back_unchanged() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "z", 1, &[("compression.type", "zstd")]).await;
    let mut sent = produce(&spate.addr, "z", "lz4", 0, 200).await;
    sent.extend(produce(&spate.addr, "z", "none", 200, 100).await);
    let mut raw = Raw::connect(&spate.addr);
    // A raw batch in lz4 too, keyless records included.
    assert_eq!(
        send(&mut raw, "z", records(&[(None, Some("raw"))], true)),
        0
    );
    sent.push("raw".into());
    let codecs = stored_codecs(&mut raw, "z");
    assert!(!codecs.is_empty());
    assert!(
        codecs.iter().all(|c| *c == Some(Compression::Zstd)),
        "every batch stored as zstd: {codecs:?}"
    );
    assert_eq!(consume_all(&spate.addr, "z", sent.len()), sent);

    // Changed at runtime: later batches are stored uncompressed, earlier ones stay zstd.
    let cfg =
        AlterConfig::new(ResourceSpecifier::Topic("z")).set("compression.type", "uncompressed");
    let r = admin(&spate.addr)
        .alter_configs(&[cfg], &AdminOptions::new())
        .await
        .expect("alter_configs");
    assert!(r[0].is_ok(), "{r:?}");
    sent.extend(produce(&spate.addr, "z", "gzip", 301, 50).await);
    let codecs = stored_codecs(&mut raw, "z");
    let (first, last) = (codecs.first().copied(), codecs.last().copied());
    assert_eq!(first, Some(Some(Compression::Zstd)));
    assert_eq!(last, Some(Some(Compression::None)), "{codecs:?}");
    assert_eq!(consume_all(&spate.addr, "z", sent.len()), sent);
}

#[tokio::test]
async fn producer_keeps_each_batch_as_sent_and_a_bad_codec_is_refused() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "as-sent", 1, &[]).await;
    produce(&spate.addr, "as-sent", "lz4", 0, 50).await;
    produce(&spate.addr, "as-sent", "snappy", 50, 50).await;
    let mut raw = Raw::connect(&spate.addr);
    let codecs = stored_codecs(&mut raw, "as-sent");
    assert!(codecs.contains(&Some(Compression::Lz4)));
    assert!(codecs.contains(&Some(Compression::Snappy)));

    let t = rdkafka::admin::NewTopic::new("bad", 1, rdkafka::admin::TopicReplication::Fixed(1))
        .set("compression.type", "brotli");
    let r = admin(&spate.addr)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    match &r[0] {
        Err((_, code)) => assert_eq!(*code, rdkafka::types::RDKafkaErrorCode::InvalidConfig),
        Ok(_) => panic!("compression.type=brotli was accepted"),
    }
}
