//! Log compaction through the wire: a compacted topic keeps the latest record per key (and
//! tombstones until delete.retention.ms), refuses records without a key, and a reader during
//! cleaning never sees a key's older value after a newer one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, FetchRequest, FetchResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use kafka_protocol::ResponseError;
use spate_protocol::batch::{build, NewRecord};

use crate::bad_input::produce;
use crate::harness::{http, Raw, Spate};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn create_compacted(raw: &mut Raw, name: &str) {
    create(
        raw,
        name,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.bytes", "4096"),
            ("segment.ms", "500"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "1000"),
        ],
    );
}

pub(crate) fn create(raw: &mut Raw, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut t = CreatableTopic::default();
    t.name = TopicName(s(name));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    for (k, v) in configs {
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
pub(crate) fn records(recs: &[(Option<&str>, Option<&str>)], lz4: bool) -> Bytes {
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

pub(crate) fn send(raw: &mut Raw, topic: &str, batch: Bytes) -> i16 {
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &produce(topic, batch, -1));
    resp.responses[0].partition_responses[0].error_code
}

/// Every (offset, key, value) of partition 0, read in fetches from the start.
fn read_all(raw: &mut Raw, topic: &str) -> Vec<(i64, String, Option<String>)> {
    read_raw(raw, topic)
        .into_iter()
        .map(|(o, k, v)| {
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            (o, text(k), v.map(text))
        })
        .collect()
}

/// Every (offset, key, value) of partition 0 as bytes, read in fetches from the log start.
fn read_raw(raw: &mut Raw, topic: &str) -> Vec<(i64, Vec<u8>, Option<Vec<u8>>)> {
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
        if pd.error_code == ResponseError::OffsetOutOfRange.code() && offset < pd.log_start_offset {
            // Retention moved the log start: read from there.
            offset = pd.log_start_offset;
            continue;
        }
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
                    r.key.unwrap_or_default().to_vec(),
                    r.value.map(|v| v.to_vec()),
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
    // The admin API shows the partition's clean and dirty sizes and its last clean.
    let (status, body) = http(&spate.http, "GET", "/admin/topics/compacted", &[], "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let c = &v["partition_details"][0]["cleaner"];
    assert!(c["clean_bytes"].as_u64().unwrap() > 0, "{c}");
    assert!(c["clean_point"].as_i64().unwrap() > 0, "{c}");
    assert!(c["dirty_ratio"].as_f64().is_some(), "{c}");
    // (A later pass may have found nothing left to remove: only that it ran is certain.)
    assert!(c["last_clean"]["at_ms"].as_i64().unwrap() > 0, "{c}");
    assert!(c["last_clean"]["bytes_read"].as_u64().unwrap() > 0, "{c}");
    // A topic that is not compacted has no cleaner.
    create(&mut raw, "plain", 1, &[]);
    let (_, body) = http(&spate.http, "GET", "/admin/topics/plain", &[], "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["partition_details"][0].get("cleaner").is_none(), "{body}");
}

/// Commits `offset` for partitions 0..4 of topic `t` as group `g` (a simple commit: no
/// member, generation -1).
fn commit(raw: &mut Raw, offset: i64) {
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(s("t"));
    t.partitions = (0..4)
        .map(|p| {
            let mut c = OffsetCommitRequestPartition::default();
            c.partition_index = p;
            c.committed_offset = offset + i64::from(p);
            c
        })
        .collect();
    let mut r = OffsetCommitRequest::default();
    r.group_id = s("g").into();
    r.generation_id_or_member_epoch = -1;
    r.topics = vec![t];
    let resp: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &r);
    for p in &resp.topics[0].partitions {
        assert_eq!(
            p.error_code, 0,
            "commit {offset} to partition {}",
            p.partition_index
        );
    }
}

fn fetch_committed(raw: &mut Raw) -> Vec<i64> {
    let mut t = OffsetFetchRequestTopic::default();
    t.name = TopicName(s("t"));
    t.partition_indexes = (0..4).collect();
    let mut f = OffsetFetchRequest::default();
    f.group_id = s("g").into();
    f.topics = Some(vec![t]);
    let r: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 6, &f);
    assert_eq!(r.error_code, 0);
    r.topics[0]
        .partitions
        .iter()
        .map(|p| p.committed_offset)
        .collect()
}

#[test]
fn committed_offsets_survive_the_cleaner_compacting_the_offsets_topic_and_a_restart() {
    let mut spate = Spate::start(&[
        "--log-cleaner-backoff-ms",
        "200",
        "--offsets-topic-num-partitions",
        "1",
        "--offsets-topic-segment-bytes",
        "4096",
    ]);
    let mut raw = Raw::connect(&spate.addr);
    create(&mut raw, "t", 4, &[]);
    for round in 0..300 {
        commit(&mut raw, round * 10);
    }
    // One record per committed partition was written; the cleaner (backoff 200 ms) may have
    // compacted some already, but never below the latest of each partition.
    let written = read_raw(&mut raw, "__consumer_offsets").len();
    assert!(
        (4..=1200).contains(&written),
        "{written} records for 1,200 commits of 4 partitions"
    );
    // The cleaner keeps one record per (group, topic, partition): four.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = read_raw(&mut raw, "__consumer_offsets");
        // The active segment is never cleaned: a few of the last commits stay beside the
        // four latest.
        if left.len() < 100 {
            let keys: std::collections::HashSet<_> = left.iter().map(|r| &r.1).collect();
            assert_eq!(keys.len(), 4, "every key still has a record");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not cleaned within 60 s: {} of {written} records left\n{}",
            left.len(),
            spate.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(fetch_committed(&mut raw), vec![2990, 2991, 2992, 2993]);
    // Rebuilt from the cleaned log after a kill -9, the same offsets.
    spate.restart();
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(fetch_committed(&mut raw), vec![2990, 2991, 2992, 2993]);
    commit(&mut raw, 5000);
    assert_eq!(fetch_committed(&mut raw), vec![5000, 5001, 5002, 5003]);
}

#[test]
fn a_topic_switched_from_delete_to_compact_and_back_while_producing_loses_no_latest_value() {
    use crate::harness::alter_config;
    let spate = Spate::start(&["--log-cleaner-backoff-ms", "200"]);
    let mut raw = Raw::connect(&spate.addr);
    let topic = "switch";
    create(
        &mut raw,
        topic,
        1,
        &[
            ("cleanup.policy", "delete"),
            ("retention.ms", "-1"),
            ("segment.bytes", "4096"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    );
    let set = |raw: &mut Raw, value: &str| {
        let (code, message) = alter_config(raw, 2, topic, "cleanup.policy", value);
        assert_eq!(code, 0, "cleanup.policy={value}: {message}");
    };
    // A producer on its own connection: 240 rounds over 20 keys, every send acknowledged.
    let addr = spate.addr.clone();
    let producing = std::thread::spawn(move || {
        let mut raw = Raw::connect(&addr);
        for round in 0..240 {
            let values: Vec<String> = (0..20).map(|k| format!("{round}-{k}")).collect();
            let keys: Vec<String> = (0..20).map(|k| format!("k{k}")).collect();
            let recs: Vec<(Option<&str>, Option<&str>)> = keys
                .iter()
                .zip(&values)
                .map(|(k, v)| (Some(k.as_str()), Some(v.as_str())))
                .collect();
            assert_eq!(send(&mut raw, topic, records(&recs, round % 3 == 0)), 0);
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    // A keyless record is fine while the topic is not compacted.
    assert_eq!(
        send(&mut raw, topic, records(&[(None, Some("x"))], false)),
        0
    );
    std::thread::sleep(Duration::from_millis(300));
    set(&mut raw, "compact");
    assert_eq!(
        send(&mut raw, topic, records(&[(None, Some("y"))], false)),
        ResponseError::InvalidRecord.code(),
        "compacted now: a keyless record is refused"
    );
    // The cleaner starts on the segments written before and after the switch.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = http(&spate.http, "GET", "/admin/topics/switch", &[], "");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["partition_details"][0]["cleaner"]["last_clean"]["bytes_removed"]
            .as_u64()
            .is_some_and(|b| b > 0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "no clean within 60 s: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Bad values are refused through the wire and change nothing.
    for (key, bad) in [
        ("cleanup.policy", "bogus"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "-0.1"),
        ("delete.retention.ms", "soon"),
        ("compression.type", "brotli"),
    ] {
        let (code, message) = alter_config(&mut raw, 2, topic, key, bad);
        assert_eq!(
            code,
            ResponseError::InvalidConfig.code(),
            "{key}={bad}: {message}"
        );
        assert!(message.contains(key) || message.contains(bad), "{message}");
    }
    assert_eq!(
        send(&mut raw, topic, records(&[(None, Some("y"))], false)),
        ResponseError::InvalidRecord.code(),
        "still compacted"
    );
    set(&mut raw, "delete");
    assert_eq!(
        send(&mut raw, topic, records(&[(None, Some("z"))], false)),
        0,
        "delete again: keyless records are accepted"
    );
    producing.join().expect("every send was acknowledged");
    // Per key, values only move forward, and the last round is there for every key.
    let all = read_all(&mut raw, topic);
    let mut last: HashMap<String, (i64, String)> = HashMap::new();
    for (offset, key, value) in all {
        if key.is_empty() {
            continue;
        }
        let value = value.expect("no tombstones were written");
        let round: i64 = value.split('-').next().unwrap().parse().unwrap();
        if let Some((prev, _)) = last.get(&key) {
            assert!(
                *prev < round,
                "{key}: round {round} after {prev} (offset {offset})"
            );
        }
        last.insert(key, (round, value));
    }
    assert_eq!(last.len(), 20);
    assert!(last.values().all(|(round, _)| *round == 239), "{last:?}");
    // No cleaner state once the topic is not compacted.
    let (_, body) = http(&spate.http, "GET", "/admin/topics/switch", &[], "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["partition_details"][0].get("cleaner").is_none(), "{body}");
}

/// The latest value of each key in the log of a stopped node's partition, read from its
/// files: (key -> value, None for a tombstone), checking that per key offsets only grow.
fn latest_on_disk(partition_dir: &std::path::Path) -> HashMap<String, Option<String>> {
    let flusher = spate_log::Flusher::start(spate_log::FsyncPolicy::Never).unwrap();
    let (log, _) = spate_log::Log::open(
        partition_dir,
        spate_log::LogConfig::default(),
        flusher,
        now_ms(),
    )
    .unwrap();
    let mut latest = HashMap::new();
    let (mut offset, end) = (log.start_offset(), log.end_offset());
    while offset < end {
        let chunk = log.read(offset, 1 << 20, end, true).unwrap();
        let mut bytes = chunk.records;
        if bytes.is_empty() {
            break;
        }
        for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
            for r in set.records {
                if r.control || r.offset < offset {
                    continue;
                }
                offset = r.offset + 1;
                let key = String::from_utf8(r.key.unwrap_or_default().to_vec()).unwrap();
                let value = r.value.map(|v| String::from_utf8(v.to_vec()).unwrap());
                latest.insert(key, value);
            }
        }
    }
    latest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rejoining_below_the_leaders_cleaned_point_catches_up_to_the_same_latest_values()
{
    use crate::cluster::{ids, ThreeNodes};
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    use rdkafka::producer::FutureRecord;
    let mut c = ThreeNodes::start(&["--log-cleaner-backoff-ms", "200"]);
    let t = NewTopic::new("cc", 1, TopicReplication::Fixed(3))
        .set("cleanup.policy", "compact")
        .set("min.insync.replicas", "2")
        .set("segment.bytes", "2048")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("delete.retention.ms", "1000");
    let r = crate::harness::admin(&c.bootstrap())
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    assert!(r[0].is_ok(), "{r:?}");
    let p = c.wait_partition(1, "cc", 0, "ISR of three", |p| ids(&p["isr"]).len() == 3);
    let leader = p["leader"].as_u64().expect("leader");
    let victim = (1..=3).find(|&n| n != leader).expect("a follower");
    // The follower goes before anything is written: it rejoins with an empty log.
    c.node(victim).kill9();
    let prod = crate::harness::producer(
        &c.bootstrap(),
        &[("linger.ms", "2"), ("message.timeout.ms", "60000")],
    );
    let mut want: HashMap<String, Option<String>> = HashMap::new();
    for round in 0..30 {
        let sends: Vec<_> = (0..20)
            .map(|k| {
                let key = format!("k{k}");
                let value = format!("{round}-{k}-{}", "v".repeat(40));
                want.insert(key.clone(), Some(value.clone()));
                (key, value)
            })
            .collect();
        for (key, value) in &sends {
            prod.send(
                FutureRecord::to("cc").partition(0).key(key).payload(value),
                Duration::from_secs(60),
            )
            .await
            .expect("acknowledged");
        }
    }
    for k in 0..5 {
        let key = format!("k{k}");
        prod.send(
            FutureRecord::<_, ()>::to("cc").partition(0).key(&key),
            Duration::from_secs(60),
        )
        .await
        .expect("tombstone acknowledged");
        want.insert(key, None);
    }
    // The leader cleans past where the follower stopped (offset 0).
    let leader_http = c.node(leader).http.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = http(&leader_http, "GET", "/admin/topics/cc", &[], "");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let cl = &v["partition_details"][0]["cleaner"];
        if cl["clean_point"].as_i64().unwrap_or(0) > 100
            && cl["last_clean"]["bytes_removed"].as_u64().unwrap_or(0) > 0
        {
            break;
        }
        assert!(Instant::now() < deadline, "leader did not clean: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.node(victim).restart();
    c.wait_partition(
        leader,
        "cc",
        0,
        "the follower caught up from below the cleaned point and rejoined the ISR",
        |p| {
            ids(&p["isr"]).contains(&victim)
                && p["follower_lag"][victim.to_string()]["log_end_offset"] == p["log_end_offset"]
        },
    );
    // Both replicas' files hold every key's latest value (a tombstone may be gone already).
    let dirs: Vec<_> = [leader, victim]
        .into_iter()
        .map(|id| {
            let n = c.node(id);
            n.stop();
            n.data_dir().join("topics").join("cc").join("0")
        })
        .collect();
    let live = |m: HashMap<String, Option<String>>| -> HashMap<String, String> {
        m.into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    };
    let want = live(want);
    assert_eq!(want.len(), 15);
    for dir in dirs {
        assert_eq!(live(latest_on_disk(&dir)), want, "{}", dir.display());
    }
}

/// One pass over partition 0 of `topic` with librdkafka, from the start to the high
/// watermark seen when it began: (offset, key, value) in order.
fn rdkafka_pass(addr: &str, topic: &str) -> Vec<(i64, String, Option<String>)> {
    use rdkafka::consumer::Consumer;
    use rdkafka::Message;
    let c = crate::harness::consumer(addr, topic, &[0], 0);
    let (_, hw) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.last().is_none_or(|(o, _, _)| *o < hw - 1) {
        assert!(Instant::now() < deadline, "a pass to {hw} took over 30 s");
        let Some(m) = c.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = m.expect("message");
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
        out.push((
            m.offset(),
            text(m.key()).unwrap_or_default(),
            text(m.payload()),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_20000_keyed_records_compact_to_the_latest_per_key_by_the_max_lag_while_read() {
    use rdkafka::producer::FutureRecord;
    let spate = Spate::start(&["--log-cleaner-backoff-ms", "500"]);
    let mut raw = Raw::connect(&spate.addr);
    // The dirty ratio never triggers: max.compaction.lag.ms makes the cleaner come.
    create(
        &mut raw,
        "kv",
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.bytes", "65536"),
            ("segment.ms", "1000"),
            ("min.cleanable.dirty.ratio", "0.99"),
            ("max.compaction.lag.ms", "3000"),
            ("delete.retention.ms", "2000"),
        ],
    );
    let prod = crate::harness::producer(&spate.addr, &[("linger.ms", "5")]);
    let mut want: HashMap<String, Option<String>> = HashMap::new();
    for chunk in 0..20 {
        let batch: Vec<(String, String)> = (chunk * 1000..(chunk + 1) * 1000)
            .map(|i| {
                (
                    format!("key-{}", i % 200),
                    format!("{}-{}", i / 200, i % 200),
                )
            })
            .collect();
        let sends = batch.iter().map(|(k, v)| {
            prod.send(
                FutureRecord::to("kv").partition(0).key(k).payload(v),
                Duration::from_secs(30),
            )
        });
        for r in futures::future::join_all(sends).await {
            r.expect("acknowledged");
        }
        for (k, v) in batch {
            want.insert(k, Some(v));
        }
    }
    for k in 0..20 {
        let key = format!("key-{k}");
        prod.send(
            FutureRecord::<_, ()>::to("kv").partition(0).key(&key),
            Duration::from_secs(30),
        )
        .await
        .expect("tombstone acknowledged");
        want.insert(key, None);
    }
    // Readers during cleaning: within each pass a key's rounds only grow. A later record
    // rolls the active segment (segment.ms) so its records can be cleaned too.
    let addr = spate.addr.clone();
    let deadline = Instant::now() + Duration::from_secs(90);
    let last = loop {
        let pass = tokio::task::spawn_blocking({
            let addr = addr.clone();
            move || rdkafka_pass(&addr, "kv")
        })
        .await
        .unwrap();
        let mut seen: HashMap<&str, i64> = HashMap::new();
        for (offset, key, value) in &pass {
            let Some(v) = value else { continue };
            if key == "tick" {
                continue;
            }
            let round: i64 = v.split('-').next().unwrap().parse().unwrap();
            let prev = seen.insert(key, round);
            assert!(
                prev.is_none_or(|p| p < round),
                "{key}: round {round} at offset {offset} after round {prev:?}"
            );
        }
        let keyed = pass.iter().filter(|r| r.1 != "tick").count();
        if keyed == 180 && pass.iter().all(|r| r.2.is_some()) {
            break pass;
        }
        assert!(
            Instant::now() < deadline,
            "not compacted within 90 s: {keyed} keyed records of 20,020 left"
        );
        prod.send(
            FutureRecord::to("kv").partition(0).key("tick").payload("t"),
            Duration::from_secs(30),
        )
        .await
        .expect("tick");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let got: HashMap<String, Option<String>> = last
        .into_iter()
        .filter(|r| r.1 != "tick")
        .map(|(_, k, v)| (k, v))
        .collect();
    let want: HashMap<String, Option<String>> =
        want.into_iter().filter(|(_, v)| v.is_some()).collect();
    assert_eq!(
        got, want,
        "the latest of each of 180 live keys, tombstones gone"
    );
}

#[test]
fn compact_delete_still_deletes_segments_past_retention_even_with_latest_values_in_them() {
    let spate = Spate::start(&[
        "--log-cleaner-backoff-ms",
        "200",
        "--retention-check-interval-ms",
        "200",
    ]);
    let mut raw = Raw::connect(&spate.addr);
    create(
        &mut raw,
        "both",
        1,
        &[
            ("cleanup.policy", "compact,delete"),
            ("retention.ms", "1500"),
            ("segment.ms", "300"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    );
    // Keys a..j once each: compaction alone would keep them for ever.
    let old: Vec<String> = (b'a'..=b'j').map(|c| (c as char).to_string()).collect();
    let recs: Vec<(Option<&str>, Option<&str>)> = old
        .iter()
        .map(|k| (Some(k.as_str()), Some("old")))
        .collect();
    assert_eq!(send(&mut raw, "both", records(&recs, false)), 0);
    // Later writes of other keys roll segments; retention then deletes the old ones.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert_eq!(
            send(
                &mut raw,
                "both",
                records(&[(Some("new"), Some("n"))], false)
            ),
            0
        );
        let all = read_all(&mut raw, "both");
        if all.iter().all(|r| r.2.as_deref() != Some("old")) {
            assert!(all.first().is_some_and(|r| r.0 > 0), "log start moved");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "records past retention.ms still there after 60 s: {all:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn log_cleanup_policy_compact_makes_topics_without_their_own_policy_compacted() {
    let spate = Spate::start(&["--log-cleanup-policy", "compact"]);
    let mut raw = Raw::connect(&spate.addr);
    create(&mut raw, "by-default", 1, &[]);
    create(&mut raw, "own-policy", 1, &[("cleanup.policy", "delete")]);
    let keyless = || records(&[(None, Some("v"))], false);
    assert_eq!(
        send(&mut raw, "by-default", keyless()),
        ResponseError::InvalidRecord.code(),
        "compacted by the broker's default"
    );
    assert_eq!(send(&mut raw, "own-policy", keyless()), 0);
    let (_, body) = http(&spate.http, "GET", "/admin/topics/by-default", &[], "");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["configs"]["cleanup.policy"]["value"], "compact", "{body}");
    // A policy the broker cannot have is refused at start, naming the flag.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["--log-cleanup-policy", "shred", "--listen", "127.0.0.1:0"])
        .args(["--http-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run spate");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--log-cleanup-policy"), "{err}");
}
