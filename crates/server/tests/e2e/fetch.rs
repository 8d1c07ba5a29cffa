use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::FutureRecord;

use crate::harness::{producer, Raw, Spate};
use crate::operations::scrape;
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

/// A fetch of partition 0 from offset 0 with these limits, answered at once.
fn fetch_with_limits(topic: &str, max_bytes: i32, partition_max_bytes: i32) -> FetchRequest {
    let mut r = fetch(topic, 0, 0, 1);
    r.max_bytes = max_bytes;
    r.topics[0].partitions[0].partition_max_bytes = partition_max_bytes;
    r
}

/// Produces `count` records of `size` bytes to partition 0, in batches of up to `batch` bytes.
async fn fill(addr: &str, topic: &str, count: usize, size: usize, batch: usize) {
    let batch = batch.to_string();
    let p = producer(addr, &[("linger.ms", "20"), ("batch.size", batch.as_str())]);
    let value = vec![b'v'; size];
    let sends = (0..count).map(|_| {
        let p = &p;
        let value = &value;
        async move {
            p.send(
                FutureRecord::to(topic).partition(0).key("k").payload(value),
                Duration::from_secs(60),
            )
            .await
            .expect("delivery")
        }
    });
    futures::future::join_all(sends).await;
}

/// VmHWM (peak resident memory) of a process, in bytes.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

#[tokio::test]
async fn many_connections_fetching_2_gib_at_once_stay_within_the_memory_budget() {
    const BUDGET: usize = 8 << 20;
    let spate = Spate::start(&["--memory-limit-bytes", &BUDGET.to_string()]);
    create_topic(&spate.addr, "wide", 1, &[]).await;
    // 16 MiB in one segment: without a broker-side bound every fetch below reads all of it.
    fill(&spate.addr, "wide", 160, 100 << 10, 1_000_000).await;
    let pid = spate.pid().expect("running");
    let peak_before = peak_rss_bytes(pid);
    let addr = spate.addr.clone();
    // Six connections, each with six fetches of max_bytes = partition_max_bytes = 2 GiB - 1
    // in flight at once.
    let sizes: Vec<usize> = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let conns: Vec<_> = (0..6)
                .map(|_| {
                    let addr = &addr;
                    s.spawn(move || {
                        let mut raw = Raw::connect(addr);
                        let req = fetch_with_limits("wide", i32::MAX, i32::MAX);
                        for _ in 0..6 {
                            raw.send(ApiKey::Fetch, 12, &req);
                        }
                        (0..6)
                            .map(|_| {
                                let (_, resp): (i32, FetchResponse) = raw.recv(ApiKey::Fetch, 12);
                                let part = &resp.responses[0].partitions[0];
                                assert_eq!(part.error_code, 0);
                                part.records.as_ref().map_or(0, |r| r.len())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            conns
                .into_iter()
                .flat_map(|c| c.join().expect("fetching connection"))
                .collect()
        })
    })
    .await
    .unwrap();
    assert_eq!(sizes.len(), 36);
    assert!(
        sizes.iter().all(|n| *n > 0),
        "every fetch made progress: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|n| *n <= BUDGET / 2),
        "no fetch holds more than half the budget: {sizes:?}"
    );
    let m = scrape(&spate.http);
    let peak = m["spate_memory_in_use_peak_bytes"];
    assert!(
        peak <= (BUDGET + (256 << 10)) as f64,
        "accounted memory peaked at {peak} bytes with a budget of {BUDGET}"
    );
    // The broker lets go of a response's memory just after writing it, which the client can
    // see first: give it a moment.
    let released = (0..200).any(|_| {
        let in_use = scrape(&spate.http)["spate_memory_in_use_bytes"];
        in_use == 0.0 || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(released, "all fetch memory is given back");
    // What the kernel saw: 36 fetches of the whole 16 MiB log would have needed over 500 MiB.
    let grown = peak_rss_bytes(pid).saturating_sub(peak_before);
    assert!(
        grown < 96 << 20,
        "peak RSS grew by {} MiB while fetching",
        grown >> 20
    );
}

#[tokio::test]
async fn negative_and_huge_fetch_limits_are_clamped_not_refused() {
    let spate = Spate::start(&["--fetch-max-bytes", "1048576"]);
    create_topic(&spate.addr, "limits", 1, &[]).await;
    // Batches of a few 10 KiB records: many fit in 1 MiB.
    fill(&spate.addr, "limits", 400, 10 << 10, 50_000).await;
    let mut raw = Raw::connect(&spate.addr);
    let answer = |raw: &mut Raw, max: i32, part_max: i32| {
        let resp: FetchResponse = raw.call(
            ApiKey::Fetch,
            12,
            &fetch_with_limits("limits", max, part_max),
        );
        let part = &resp.responses[0].partitions[0];
        assert_eq!(
            (resp.error_code, part.error_code),
            (0, 0),
            "{max}/{part_max}"
        );
        part.records.as_ref().map_or(0, |r| r.len())
    };
    // Negative limits are 0: KIP-74 still returns the first whole batch, and only it.
    let one_batch = answer(&mut raw, -1, -1);
    assert!(one_batch > 0);
    assert_eq!(answer(&mut raw, i32::MIN, 1 << 20), one_batch);
    assert_eq!(answer(&mut raw, 1 << 20, i32::MIN), one_batch);
    // Huge limits are the broker's fetch.max.bytes (1 MiB here), plus at most one batch.
    let huge = answer(&mut raw, i32::MAX, i32::MAX);
    assert!(huge > one_batch, "more than one batch fits in 1 MiB");
    assert!(huge <= 1 << 20, "{huge} bytes");
    // Negative waits and minimums answer at once.
    let mut r = fetch_with_limits("limits", i32::MAX, i32::MAX);
    r.max_wait_ms = i32::MIN;
    r.min_bytes = i32::MIN;
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &r);
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
}

/// Partitions of a fetch response: (partition, error, records bytes).
fn answered(resp: &FetchResponse) -> Vec<(i32, i16, usize)> {
    resp.responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            let bytes = p.records.as_ref().map_or(0, |r| r.len());
            (p.partition_index, p.error_code, bytes)
        })
        .collect()
}

#[tokio::test]
async fn an_incremental_fetch_session_answers_only_partitions_with_news_and_refuses_a_wrong_epoch()
{
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "sessions", 2, &[]).await;
    let p = producer(&spate.addr, &[]);
    for partition in 0..2 {
        p.send(
            FutureRecord::to("sessions")
                .partition(partition)
                .key("k")
                .payload("first"),
            Duration::from_secs(20),
        )
        .await
        .expect("delivery");
    }
    let mut raw = Raw::connect(&spate.addr);
    // A new session (epoch 0) over both partitions: a full answer and the session's id.
    let mut full = fetch("sessions", 0, 100, 1);
    let mut second = full.topics[0].partitions[0].clone();
    second.partition = 1;
    full.topics[0].partitions.push(second);
    full.session_epoch = 0;
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &full);
    assert_eq!(resp.error_code, 0);
    let id = resp.session_id;
    assert_ne!(id, 0, "the broker should have opened a session");
    let first = answered(&resp);
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|&(_, e, bytes)| e == 0 && bytes > 0));

    // Both partitions read to their end: the client names them at their new positions.
    let mut moved = fetch("sessions", 1, 100, 1);
    let mut second = moved.topics[0].partitions[0].clone();
    second.partition = 1;
    moved.topics[0].partitions.push(second);
    moved.session_id = id;
    moved.session_epoch = 1;
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &moved);
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.session_id, id);
    assert!(
        answered(&resp).is_empty(),
        "nothing changed: nothing answered, got {:?}",
        answered(&resp)
    );

    // An empty incremental fetch: only partition 1, which got a record, is answered.
    p.send(
        FutureRecord::to("sessions")
            .partition(1)
            .key("k")
            .payload("second"),
        Duration::from_secs(20),
    )
    .await
    .expect("delivery");
    let mut idle = fetch("sessions", 0, 100, 1);
    idle.topics.clear();
    idle.session_id = id;
    idle.session_epoch = 2;
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &idle);
    let news = answered(&resp);
    assert_eq!(news.len(), 1, "{news:?}");
    assert_eq!(news[0].0, 1);
    assert!(news[0].2 > 0);

    // A repeated epoch and an unknown session are refused at the top level.
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &idle);
    assert_eq!(resp.error_code, 71, "INVALID_FETCH_SESSION_EPOCH");
    idle.session_id = id + 1000;
    idle.session_epoch = 1;
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &idle);
    assert_eq!(resp.error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");
}
