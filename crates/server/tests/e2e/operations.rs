//! The operator's view: metrics, readiness, the admin API, limits and configuration errors.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use kafka_protocol::records::Compression;
use rdkafka::consumer::Consumer;
use rdkafka::producer::FutureRecord;
use spate_protocol::batch::{build, NewRecord};

use crate::harness::{consumer, http, producer, Raw, Spate};
use crate::produce_consume::create_topic;

/// Parses Prometheus text into "name{labels}" -> value, checking every sample line.
pub(crate) fn scrape(addr: &str) -> HashMap<String, f64> {
    let (status, text) = http(addr, "GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        out.insert(series.to_string(), v);
    }
    out
}

#[tokio::test]
async fn metrics_count_exactly_the_records_produced() {
    let spate = Spate::start(&[]);
    create_topic(&spate.addr, "metered", 2, &[]).await;
    let p = producer(&spate.addr, &[("linger.ms", "2")]);
    let sends = (0..500).map(|i| {
        let p = &p;
        async move {
            p.send(
                FutureRecord::to("metered")
                    .partition(i % 2)
                    .key("k")
                    .payload("some bytes"),
                Duration::from_secs(20),
            )
            .await
            .expect("delivery")
        }
    });
    futures::future::join_all(sends).await;
    let c = consumer(&spate.addr, "metered", &[0, 1], 0);
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < 500 && Instant::now() < deadline {
        if let Some(Ok(_)) = c.poll(Duration::from_millis(100)) {
            got += 1;
        }
    }
    assert_eq!(got, 500);
    let m = scrape(&spate.http);
    assert_eq!(m["spate_topic_records_in_total{topic=\"metered\"}"], 500.0);
    assert!(m["spate_topic_records_out_total{topic=\"metered\"}"] >= 500.0);
    assert!(m["spate_topic_bytes_in_total{topic=\"metered\"}"] > 500.0 * 10.0);
    let leo: f64 = (0..2)
        .map(|p| {
            m[&format!("spate_partition_log_end_offset{{topic=\"metered\",partition=\"{p}\"}}")]
        })
        .sum();
    assert_eq!(leo, 500.0);
    assert!(m["spate_requests_total{api=\"Produce\"}"] >= 1.0);
    assert!(m["spate_request_duration_seconds_count{api=\"Fetch\"}"] >= 1.0);
    assert!(m["spate_connections_accepted_total"] >= 2.0);
    assert!(m["process_resident_memory_bytes"] > 0.0);
    drop(c);
}

/// Writes a topic of `batches` 1 MiB batches straight into a data dir, for recovery to scan.
fn write_big_log(data: &std::path::Path, batches: usize) {
    let dir = data.join("topics/big/0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        data.join("topics/big/topic.json"),
        r#"{"id":"5f6c8e2a-3a1b-4c6e-9d2f-0a1b2c3d4e5f","partitions":1,"config":{"overrides":{}}}"#,
    )
    .unwrap();
    let record = NewRecord {
        key: None,
        value: Some(vec![7u8; 1 << 20].into()),
        timestamp: 1_000,
    };
    let mut one = build(&[record], None, Compression::None).unwrap().to_vec();
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(dir.join("00000000000000000000.log")).unwrap(),
    );
    for i in 0..batches {
        // The CRC does not cover the base offset, so one encoded batch serves for all.
        one[0..8].copy_from_slice(&(i as i64).to_be_bytes());
        f.write_all(&one).unwrap();
    }
    f.flush().unwrap();
}

#[test]
fn ready_turns_true_only_after_recovery() {
    let dir = tempfile::tempdir().unwrap();
    write_big_log(&dir.path().join("data"), 128);
    let port = crate::harness::free_ports(1)[0];
    let http_addr = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            &http_addr,
            "--data-dir",
        ])
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(&http_addr).is_ok() {
            let (status, _) = http(&http_addr, "GET", "/ready", &[], "");
            if seen.last() != Some(&status) {
                seen.push(status);
            }
            if status == 200 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        seen,
        vec![503, 200],
        "not ready while recovering 128 MiB, then ready"
    );
}

#[test]
fn admin_api_mutations_need_the_token() {
    let spate = Spate::start(&["--admin-token", "t0ken"]);
    let body = r#"{"name": "via-http", "partitions": 2}"#;
    let (status, _) = http(
        &spate.http,
        "POST",
        "/admin/topics",
        &[("Content-Type", "application/json")],
        body,
    );
    assert_eq!(status, 401);
    let auth = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer t0ken"),
    ];
    let (status, created) = http(&spate.http, "POST", "/admin/topics", &auth, body);
    assert_eq!(status, 201, "{created}");
    let (status, listed) = http(&spate.http, "GET", "/admin/topics", &[], "");
    assert_eq!(status, 200);
    assert!(listed.contains("\"via-http\""));
    let (status, err) = http(&spate.http, "POST", "/admin/topics", &auth, "{");
    assert_eq!(status, 400);
    assert!(err.contains("INVALID_BODY"), "{err}");
    let (status, _) = http(&spate.http, "DELETE", "/admin/topics/via-http", &auth, "");
    assert_eq!(status, 204);
}

#[test]
fn connections_past_the_per_ip_limit_are_refused_with_a_log_line() {
    let spate = Spate::start(&["--max-connections-per-ip", "2"]);
    let mut a = Raw::connect(&spate.addr);
    let mut b = Raw::connect(&spate.addr);
    let mut c = Raw::connect(&spate.addr);
    assert!(c.is_closed(), "the third connection is closed");
    let v = kafka_protocol::messages::ApiVersionsRequest::default();
    let _: kafka_protocol::messages::ApiVersionsResponse =
        a.call(kafka_protocol::messages::ApiKey::ApiVersions, 3, &v);
    let _: kafka_protocol::messages::ApiVersionsResponse =
        b.call(kafka_protocol::messages::ApiKey::ApiVersions, 3, &v);
    assert!(
        spate.wait_for_log("connection limit reached"),
        "{}",
        spate.log()
    );
    let m = scrape(&spate.http);
    assert_eq!(m["spate_connections_rejected_total"], 1.0);
}

#[tokio::test]
async fn a_tiny_memory_budget_throttles_producers_without_losing_anything() {
    // Acks wait for fsync, so a connection's requests hold their memory a while and the
    // pipelined ones behind them must wait for budget.
    let spate = Spate::start(&["--memory-limit-bytes", "1048576", "--fsync", "always"]);
    create_topic(&spate.addr, "squeezed", 1, &[]).await;
    // Eight producers at once, each sending ~900 KB requests into a 1 MiB budget.
    let producers: Vec<_> = (0..8)
        .map(|_| {
            producer(
                &spate.addr,
                &[("linger.ms", "20"), ("batch.size", "900000")],
            )
        })
        .collect();
    let value = vec![b'x'; 10_000];
    let sends = (0..2_000).map(|i| {
        let p = &producers[i % producers.len()];
        let value = &value;
        async move {
            p.send(
                FutureRecord::to("squeezed").key("k").payload(value),
                Duration::from_secs(60),
            )
            .await
            .expect("every record is acknowledged")
        }
    });
    futures::future::join_all(sends).await;
    let c = consumer(&spate.addr, "squeezed", &[0], 0);
    let (_, hi) = c
        .fetch_watermarks("squeezed", 0, Duration::from_secs(10))
        .unwrap();
    assert_eq!(hi, 2_000);
    let m = scrape(&spate.http);
    assert_eq!(m["spate_memory_limit_bytes"], 1_048_576.0);
    assert!(
        m["spate_throttled_requests_total"] >= 1.0,
        "producers were held back at least once"
    );
}

#[test]
fn bad_configuration_stops_start_up_with_a_message_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = {
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        vec![
            (
                vec![
                    "--config".into(),
                    file("unknown.toml", "data-dirr = \"x\"\n"),
                ],
                "data-dirr",
            ),
            (
                vec!["--config".into(), file("broken.toml", "listen = \n")],
                "not valid TOML",
            ),
            (
                vec![
                    "--config".into(),
                    file("type.toml", "default-partitions = \"six\"\n"),
                ],
                "default-partitions",
            ),
            (
                vec!["--produce-profile".into(), "ludicrous".into()],
                "produce-profile",
            ),
            (vec!["--memory-limit-bytes=-5".into()], "memory-limit-bytes"),
            (
                vec!["--memory-limit-bytes".into(), "999999999999999999".into()],
                "memory-limit-bytes",
            ),
            (vec!["--fsync".into(), "sometimes".into()], "--fsync"),
            (
                vec![
                    "--config".into(),
                    dir.path().join("missing.toml").display().to_string(),
                ],
                "missing.toml",
            ),
        ]
    };
    for (args, expected) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir.path().join("data"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // A good file is honoured, and a flag wins over it.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "default-partitions = 4\nauto-create-topics = false\n",
    )
    .unwrap();
    let spate = Spate::start(&[
        "--config",
        good.to_str().unwrap(),
        "--default-partitions",
        "3",
    ]);
    let (_, body) = http(&spate.http, "GET", "/admin/broker", &[], "");
    assert!(body.contains("\"default_partitions\":3"), "{body}");
    assert!(body.contains("\"auto_create_topics\":false"), "{body}");
}
