//! Log compaction through the wire: a compacted topic keeps the latest record per key (and
//! tombstones until delete.retention.ms), refuses records without a key, and a reader during
//! cleaning never sees a key's older value after a newer one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use kafka_protocol::ResponseError;
use spate_protocol::batch::{build, NewRecord};

use crate::bad_input::produce;
use crate::harness::{Raw, Spate};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create_compacted(raw: &mut Raw, name: &str) {
    let mut t = CreatableTopic::default();
    t.name = TopicName(s(name));
    t.num_partitions = 1;
    t.replication_factor = 1;
    for (k, v) in [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "4096"),
        ("segment.ms", "500"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("delete.retention.ms", "1000"),
    ] {
        let mut c = CreatableTopicConfig::default();
        c.name = s(k);
        c.value = Some(s(v));
        t.configs.push(c);
    }
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 5, &r);
    assert_eq!(
        resp.topics[0].error_code, 0,
        "{:?}",
        resp.topics[0].error_message
    );
}

/// A batch of (key, value) records; a `None` value is a tombstone, a `None` key keyless.
fn records(recs: &[(Option<&str>, Option<&str>)], lz4: bool) -> Bytes {
    let rs: Vec<NewRecord> = recs
        .iter()
        .map(|(k, v)| NewRecord {
            key: k.map(|k| Bytes::from(k.to_string())),
            value: v.map(|v| Bytes::from(v.to_string())),
            timestamp: now_ms(),
        })
        .collect();
    let codec = if lz4 {
        Compression::Lz4
    } else {
        Compression::None
    };
    build(&rs, None, codec).unwrap()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn send(raw: &mut Raw, topic: &str, batch: Bytes) -> i16 {
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &produce(topic, batch, -1));
    resp.responses[0].partition_responses[0].error_code
}

/// Every (offset, key, value) of partition 0, read in fetches from the start.
fn read_all(raw: &mut Raw, topic: &str) -> Vec<(i64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let mut p = FetchPartition::default();
        p.partition = 0;
        p.fetch_offset = offset;
        p.partition_max_bytes = 64 << 10;
        let mut t = FetchTopic::default();
        t.topic = TopicName(s(topic));
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.replica_id = (-1).into();
        r.max_bytes = 1 << 20;
        r.topics = vec![t];
        let resp: FetchResponse = raw.call(ApiKey::Fetch, 11, &r);
        let pd = &resp.responses[0].partitions[0];
        assert_eq!(pd.error_code, 0);
        let mut bytes = pd.records.clone().unwrap_or_default();
        if bytes.is_empty() {
            return out;
        }
        for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
            for r in set.records {
                if r.offset < offset {
                    continue;
                }
                offset = r.offset + 1;
                out.push((
                    r.offset,
                    String::from_utf8(r.key.unwrap_or_default().to_vec()).unwrap(),
                    r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()),
                ));
            }
        }
        if offset >= pd.high_watermark {
            return out;
        }
    }
}

#[test]
fn a_compacted_topic_keeps_the_latest_value_per_key_and_refuses_keyless_records() {
    let spate = Spate::start(&["--log-cleaner-backoff-ms", "200"]);
    let topic = "compacted";
    let mut raw = Raw::connect(&spate.addr);
    create_compacted(&mut raw, topic);
    // A keyless record is refused, and nothing of its batch is written.
    assert_eq!(
        send(
            &mut raw,
            topic,
            records(&[(Some("a"), Some("x")), (None, Some("y"))], false)
        ),
        ResponseError::InvalidRecord.code()
    );
    // 40 rounds over 20 keys, plain and lz4 batches; keys 0-4 deleted at the end.
    let mut latest: HashMap<String, Option<String>> = HashMap::new();
    for round in 0..40 {
        let keys: Vec<String> = (0..20).map(|k| format!("k{k}")).collect();
        let values: Vec<String> = (0..20).map(|k| format!("v{round}-{k}")).collect();
        let recs: Vec<(Option<&str>, Option<&str>)> = keys
            .iter()
            .zip(&values)
            .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
            .collect();
        assert_eq!(send(&mut raw, topic, records(&recs, round % 2 == 1)), 0);
        for (k, v) in keys.iter().zip(&values) {
            latest.insert(k.clone(), Some(v.clone()));
        }
    }
    let deletes: Vec<String> = (0..5).map(|k| format!("k{k}")).collect();
    let tombstones: Vec<(Option<&str>, Option<&str>)> =
        deletes.iter().map(|k| (Some(k.as_str()), None)).collect();
    assert_eq!(send(&mut raw, topic, records(&tombstones, false)), 0);
    for k in &deletes {
        latest.insert(k.clone(), None);
    }
    let written = read_all(&mut raw, topic).len();
    // Readers while the cleaner works: per key, values only ever move forward.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_seen: HashMap<String, i64> = HashMap::new();
    let compacted = loop {
        let all = read_all(&mut raw, topic);
        for (offset, key, _) in &all {
            let prev = last_seen.insert(key.clone(), *offset);
            assert!(
                prev.is_none_or(|p| p <= *offset),
                "{key}: an older value after a newer one"
            );
        }
        last_seen.clear();
        // Done once every key has one record left and the tombstones are gone (the ticks
        // that roll segments keep coming, so one may still wait for the next pass).
        let keyed: Vec<_> = all.iter().filter(|r| r.1 != "tick").cloned().collect();
        if keyed.len() == 15 && keyed.iter().all(|r| r.2.is_some()) {
            break keyed;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted within 60 s: {} of {written} records left\n{}",
            all.len(),
            spate.log()
        );
        // A later record rolls the active segment, so the tombstones' segment can be cleaned.
        assert_eq!(
            send(
                &mut raw,
                topic,
                records(&[(Some("tick"), Some("t"))], false)
            ),
            0
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let got: HashMap<String, Option<String>> =
        compacted.into_iter().map(|(_, k, v)| (k, v)).collect();
    let want: HashMap<String, Option<String>> =
        latest.into_iter().filter(|(_, v)| v.is_some()).collect();
    assert_eq!(
        got, want,
        "the latest value of every live key, tombstones gone"
    );
}
