use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;

use crate::harness::{consumer, producer, Spate};
use crate::produce_consume::create_topic;

/// Reads partition 0 of `topic` from the start up to its high watermark: offset -> value.
fn read_all(addr: &str, topic: &str) -> BTreeMap<i64, Vec<u8>> {
    let c = consumer(addr, topic, &[0], 0);
    let (_, hi) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(20))
        .expect("watermarks");
    let mut out = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (out.len() as i64) < hi && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.expect("consume");
            out.insert(m.offset(), m.payload().unwrap_or_default().to_vec());
        }
    }
    assert_eq!(
        out.len() as i64,
        hi,
        "read every record below the high watermark"
    );
    out
}

/// A process crash mid-load: recovery keeps every acknowledged record and offsets stay whole.
/// This does not prove fsync (the kernel's page cache survives kill -9, so it would pass
/// with `--fsync never` too); the power-loss tests on the simulated disk do
/// (crates/log/src/log/contract.rs).
#[tokio::test]
async fn kill_9_during_acks_all_recovers_every_acknowledged_record() {
    let mut spate = Spate::start(&["--fsync", "always"]);
    create_topic(&spate.addr, "durable", 1, &[]).await;
    let acked: Arc<Mutex<Vec<(u64, i64)>>> = Arc::default();
    let p = producer(
        &spate.addr,
        &[("linger.ms", "1"), ("message.timeout.ms", "5000")],
    );
    let sink = acked.clone();
    let task = tokio::spawn(async move {
        let mut in_flight = FuturesUnordered::new();
        for i in 0u64..200_000 {
            let value = format!("record-{i}");
            let p = &p;
            in_flight.push(async move {
                let r = p
                    .send(
                        FutureRecord::to("durable")
                            .partition(0)
                            .key("k")
                            .payload(&value),
                        Duration::from_secs(5),
                    )
                    .await;
                (i, r)
            });
            if in_flight.len() >= 100 {
                if let Some((i, Ok(d))) = in_flight.next().await {
                    sink.lock().unwrap().push((i, d.offset));
                }
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < 3_000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    spate.kill9();
    let acked_at_kill: Vec<(u64, i64)> = acked.lock().unwrap().clone();
    task.abort();
    assert!(
        acked_at_kill.len() >= 100,
        "only {} acks before the kill",
        acked_at_kill.len()
    );

    spate.restart();
    let stored = read_all(&spate.addr, "durable");
    for (i, offset) in &acked_at_kill {
        let want = format!("record-{i}").into_bytes();
        assert_eq!(
            stored.get(offset),
            Some(&want),
            "acked record {i} at offset {offset}"
        );
    }
}

#[tokio::test]
async fn segment_cut_mid_batch_recovers_to_the_last_whole_batch() {
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "cut", 1, &[]).await;
    let p = producer(&spate.addr, &[("linger.ms", "0")]);
    for i in 0..10 {
        // One record per batch: each send waits for its ack.
        p.send(
            FutureRecord::to("cut").key("k").payload(&format!("v{i}")),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
    drop(p);
    spate.kill9();
    let segment = spate
        .data_dir()
        .join("topics/cut/0/00000000000000000000.log");
    let len = std::fs::metadata(&segment).expect("segment").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    f.set_len(len - 10).unwrap();
    drop(f);

    spate.restart();
    assert!(
        spate.log().contains("truncated"),
        "recovery reports the cut"
    );
    let stored = read_all(&spate.addr, "cut");
    assert_eq!(stored.len(), 9);
    assert_eq!(stored.get(&8).map(Vec::as_slice), Some(&b"v8"[..]));
    let p = producer(&spate.addr, &[("linger.ms", "0")]);
    let d = p
        .send(
            FutureRecord::to("cut").key("k").payload("after"),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    assert_eq!(d.offset, 9, "appends continue after the last whole batch");
}

#[tokio::test]
async fn graceful_restart_keeps_everything_without_a_recovery_scan() {
    let mut spate = Spate::start(&[]);
    create_topic(&spate.addr, "graceful", 1, &[]).await;
    let p = producer(&spate.addr, &[("linger.ms", "0")]);
    for i in 0..20 {
        p.send(
            FutureRecord::to("graceful")
                .key("k")
                .payload(&format!("v{i}")),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
    drop(p);
    spate.stop();
    let data = spate.data_dir();
    assert!(
        data.join("topics/graceful/0/clean_shutdown").exists(),
        "shutdown saved the log"
    );
    assert!(
        data.join("topics/graceful/0/producer_state.snapshot")
            .exists(),
        "and the producer states"
    );
    spate.restart();
    assert_eq!(
        std::fs::read(data.join("topics/graceful/0/clean_shutdown")).ok(),
        Some(Vec::new()),
        "the marker is used once: emptied, kept for the next shutdown"
    );
    let stored = read_all(&spate.addr, "graceful");
    assert_eq!(stored.len(), 20);
    assert_eq!(stored.get(&19).map(Vec::as_slice), Some(&b"v19"[..]));
    let p = producer(&spate.addr, &[("linger.ms", "0")]);
    let d = p
        .send(
            FutureRecord::to("graceful").key("k").payload("after"),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    assert_eq!(d.offset, 20);
}

async fn send_values(addr: &str, topic: &str, values: std::ops::Range<u32>) {
    let p = producer(addr, &[]);
    for i in values {
        p.send(
            FutureRecord::to(topic)
                .partition(0)
                .key("k")
                .payload(&format!("{topic}-{i}")),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
}

#[tokio::test]
async fn topics_named_like_deletion_markers_keep_their_data_through_delete_recreate_and_restarts() {
    use rdkafka::admin::AdminOptions;

    let mut spate = Spate::start(&[]);
    // The last name is exactly what older versions renamed a deleted topic to.
    let lookalike = format!("victim-{}.deleted", uuid_like_hex());
    let names = ["x.deleted", "a.deleted.deleted", lookalike.as_str()];
    for name in names {
        create_topic(&spate.addr, name, 1, &[]).await;
        send_values(&spate.addr, name, 0..5).await;
    }
    create_topic(&spate.addr, "short-lived", 1, &[]).await;
    let a = crate::harness::admin(&spate.addr);
    for gone in ["x.deleted", "short-lived"] {
        let r = a
            .delete_topics(&[gone], &AdminOptions::new())
            .await
            .unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    }
    create_topic(&spate.addr, "x.deleted", 1, &[]).await;
    send_values(&spate.addr, "x.deleted", 100..103).await;
    let expect = |name: &str| -> Vec<Vec<u8>> {
        let range = if name == "x.deleted" { 100..103 } else { 0..5 };
        range.map(|i| format!("{name}-{i}").into_bytes()).collect()
    };
    // A crash, then a clean restart: neither may remove a live topic's data.
    for clean in [false, true] {
        if clean {
            spate.stop();
        }
        spate.restart();
        for name in names {
            let got: Vec<Vec<u8>> = read_all(&spate.addr, name).into_values().collect();
            assert_eq!(got, expect(name), "{name} after restart (clean: {clean})");
        }
    }
    let trash = spate.data_dir().join("trash");
    assert_eq!(std::fs::read_dir(trash).unwrap().count(), 0);
}

/// 32 lowercase hex digits, as a topic id prints in a directory name.
fn uuid_like_hex() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos:032x}")
}
