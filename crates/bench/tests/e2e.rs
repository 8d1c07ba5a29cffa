//! End-to-end tests: short runs of every mode against a real broker at $SPATE_BENCH_BOOTSTRAP
//! (Apache Kafka via scripts/bench-e2e.sh and scripts/kafka, or spate). Without the variable the broker
//! tests print a note and pass. Assertions check counts and structure, never timings.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Hang guard for one spate-bench invocation (not a performance threshold).
const CHILD_LIMIT: Duration = Duration::from_secs(240);

fn bootstrap() -> Option<String> {
    match std::env::var("SPATE_BENCH_BOOTSTRAP") {
        Ok(b) if !b.trim().is_empty() => Some(b),
        _ => {
            eprintln!("SKIP: SPATE_BENCH_BOOTSTRAP is not set (run scripts/bench-e2e.sh)");
            None
        }
    }
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("e2e-{name}-{}-{nanos}", std::process::id())
}

/// Runs spate-bench with `args`, killing it if it outlives the hang guard.
fn bench(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate-bench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spate-bench");
    let started = Instant::now();
    loop {
        match child.try_wait().expect("wait for spate-bench") {
            Some(_) => break,
            None if started.elapsed() > CHILD_LIMIT => {
                let _ = child.kill();
                break;
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let out = child.wait_with_output().expect("collect output");
    eprintln!(
        "spate-bench {}\n--- stdout\n{}--- stderr (tail)\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        tail(&String::from_utf8_lossy(&out.stderr), 5)
    );
    out
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("JSON report written");
    serde_json::from_str(&text).expect("JSON report parses")
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected unsigned integer, got {v}"))
}

/// Common checks of a latency summary: ordered percentiles and a full curve.
fn check_latency(l: &Value) {
    let (p50, p90, p99, p999, max) = (
        u(&l["p50_us"]),
        u(&l["p90_us"]),
        u(&l["p99_us"]),
        u(&l["p999_us"]),
        u(&l["max_us"]),
    );
    assert!(
        p50 <= p90 && p90 <= p99 && p99 <= p999 && p999 <= max,
        "{l}"
    );
    assert!(u(&l["count"]) > 0);
    assert_eq!(l["curve"].as_array().map(Vec::len), Some(13));
}

fn run_json(dir: &Path, name: &str, args: &[&str]) -> (Output, Value) {
    let path: PathBuf = dir.join(format!("{name}.json"));
    let p = path.to_str().expect("utf-8 path").to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json-output", &p, "--no-progress", "--timeout", "20s"]);
    let out = bench(&all);
    assert!(out.status.success(), "spate-bench failed: {:?}", out.status);
    let v = json(&path);
    (out, v)
}

#[test]
fn produce_mode_counts_acknowledged_and_validates() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let topic = unique("produce");
    let (_, v) = run_json(
        dir.path(),
        "produce",
        &[
            "-b",
            &b,
            "-t",
            &topic,
            "--create-topic",
            "--delete-topic-after",
            "-p",
            "2",
            "-c",
            "2",
            "-s",
            "512",
            "-d",
            "2s",
            "--key-pattern",
            "random",
            "--validate",
            "--acks",
            "all",
        ],
    );
    assert_eq!(v["tool"], "spate-bench");
    assert_eq!(v["mode"], "produce");
    assert_eq!(v["interrupted"], false);
    let p = &v["produce"];
    assert!(u(&p["delivered"]) > 0);
    assert_eq!(u(&p["failed"]), 0);
    assert_eq!(p["success_rate"].as_f64(), Some(1.0));
    assert!(p["msgs_per_sec"].as_f64().is_some_and(|r| r > 0.0));
    check_latency(&p["latency_us"]);
    let val = &v["validation"];
    assert_eq!(val["passed"], true, "{val}");
    assert_eq!(
        u(&val["acknowledged"]),
        u(&p["delivered"]) + u(&p["warmup_delivered"])
    );
    assert_eq!(u(&val["lost"]), 0);
    assert_eq!(u(&val["duplicates"]), 0);
    assert_eq!(u(&val["reordered"]), 0);
    assert_eq!(u(&val["corrupted"]), 0);
    assert_eq!(v["config"]["message_size"], 512);
    assert!(v["client"]["librdkafka"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
}

#[test]
fn every_compression_codec_delivers() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = unique(&format!("codec-{codec}"));
        let (_, v) = run_json(
            dir.path(),
            codec,
            &[
                "-b",
                &b,
                "-t",
                &topic,
                "--create-topic",
                "--delete-topic-after",
                "-n",
                "2000",
                "-s",
                "300",
                "--payload-pattern",
                "text",
                "--compression",
                codec,
                "--acks",
                "1",
                "--linger-ms",
                "5",
                "--batch-size",
                "65536",
            ],
        );
        assert_eq!(u(&v["produce"]["delivered"]), 2000, "codec {codec}");
        assert_eq!(v["config"]["compression"], codec);
    }
}

#[test]
fn consume_mode_reads_every_filled_message() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let topic = unique("consume");
    let (_, v) = run_json(
        dir.path(),
        "consume",
        &[
            "-b",
            &b,
            "-t",
            &topic,
            "--create-topic",
            "--delete-topic-after",
            "-m",
            "consume",
            "-p",
            "2",
            "-c",
            "2",
            "-s",
            "256",
            "--fill-count",
            "20000",
            "-d",
            "60s",
            "--validate",
        ],
    );
    let c = &v["consume"];
    assert_eq!(u(&c["consumed"]), 20_000);
    assert!(c["msgs_per_sec"].as_f64().is_some_and(|r| r > 0.0));
    assert_eq!(v["validation"]["passed"], true);
    assert_eq!(u(&v["validation"]["consumed_unique"]), 20_000);
}

/// GETs /metrics from a Prometheus endpoint; `None` while it does not answer.
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    Some(out)
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn consume_subcommand_follows_a_group_and_serves_records_lag_and_latency() {
    let Some(b) = bootstrap() else { return };
    let topic = unique("follow");
    let out = bench(&[
        "-b",
        &b,
        "-t",
        &topic,
        "--create-topic",
        "-p",
        "2",
        "-n",
        "3000",
        "-s",
        "100",
    ]);
    assert!(out.status.success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate-bench"))
        .args([
            "consume",
            "-b",
            &b,
            "-t",
            &topic,
            "-g",
            &unique("group"),
            "--start",
            "earliest",
            "--prometheus-port",
            &port.to_string(),
            "--report-interval",
            "500ms",
            "-d",
            "120s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn spate-bench consume");
    let series = format!("spate_bench_consumed_records_total{{topic=\"{topic}\"}}");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(text) = scrape(&addr) {
            // Every owned partition reports its lag, and all of it was read.
            let lags: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("spate_bench_consumer_lag_records{"))
                .collect();
            let lag_zero = !lags.is_empty() && lags.iter().all(|l| l.ends_with(" 0"));
            last = text;
            if sample(&last, &series) == Some(3000.0) && lag_zero {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() && started.elapsed() < CHILD_LIMIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    assert_eq!(sample(&last, &series), Some(3000.0), "{last}");
    assert_eq!(
        sample(&last, "spate_bench_end_to_end_latency_seconds_count"),
        Some(3000.0),
        "{last}"
    );
    assert!(
        last.contains("spate_bench_consumer_lag_records{topic="),
        "{last}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("consumed 3000 records"));
}

#[test]
fn round_trip_mode_measures_end_to_end() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let topic = unique("rt");
    let (_, v) = run_json(
        dir.path(),
        "rt",
        &[
            "-b",
            &b,
            "-t",
            &topic,
            "--create-topic",
            "--delete-topic-after",
            "-m",
            "round-trip",
            "-d",
            "2s",
            "-w",
            "500ms",
            "--rate-limit",
            "1000",
            "--validate",
        ],
    );
    let (p, c) = (&v["produce"], &v["consume"]);
    assert!(u(&p["delivered"]) > 0);
    check_latency(&c["latency_us"]);
    check_latency(&p["latency_us"]);
    assert_eq!(v["validation"]["passed"], true);
    assert_eq!(u(&v["validation"]["lost"]), 0);
}

#[test]
fn metadata_mode_times_admin_calls() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let topic = unique("meta");
    let (_, v) = run_json(
        dir.path(),
        "meta",
        &["-b", &b, "-t", &topic, "-m", "metadata", "-n", "3"],
    );
    let ops = v["operations"].as_array().expect("operations array");
    let names: Vec<&str> = ops.iter().filter_map(|o| o["op"].as_str()).collect();
    assert_eq!(
        names,
        ["CreateTopics", "Metadata", "ListOffsets", "DeleteTopics"]
    );
    for o in ops {
        assert!(u(&o["ok"]) >= 3, "{o}");
        check_latency(&o["latency_us"]);
    }
    assert_eq!(u(&ops[0]["ok"]), 3);
}

#[test]
fn csv_output_appends_rows() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let csv = dir.path().join("runs.csv");
    let c = csv.to_str().expect("utf-8").to_string();
    let topic = unique("csv");
    for _ in 0..2 {
        let out = bench(&[
            "-b",
            &b,
            "-t",
            &topic,
            "--create-topic",
            "-n",
            "500",
            "--csv-output",
            &c,
            "--no-progress",
        ]);
        assert!(out.status.success());
    }
    let text = std::fs::read_to_string(&csv).expect("csv written");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "header + 2 rows:\n{text}");
    assert!(lines[0].starts_with("case,target,mode,"));
    assert!(lines[1].contains(",produce,1024,1,all,none,500,500,0,"));
}

#[test]
fn missing_topic_is_a_clear_error() {
    let Some(b) = bootstrap() else { return };
    let topic = unique("missing");
    let out = bench(&["-b", &b, "-t", &topic, "-d", "1s", "--no-progress"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
}

#[test]
fn compare_writes_json_csv_and_html() {
    let Some(b) = bootstrap() else { return };
    let dir = tmp();
    let (j, c, h) = (
        dir.path().join("c.json"),
        dir.path().join("c.csv"),
        dir.path().join("c.html"),
    );
    let ta = format!("first={b}");
    let tb = format!("second={b}");
    let out = bench(&[
        "compare",
        "--target",
        &ta,
        "--target",
        &tb,
        "--suite",
        "quick",
        "--case",
        "produce-1kb",
        "--case",
        "round-trip*",
        "-d",
        "1s",
        "-w",
        "0s",
        "--no-progress",
        "--json-output",
        j.to_str().expect("utf-8"),
        "--csv-output",
        c.to_str().expect("utf-8"),
        "--html-output",
        h.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{:?}", out.status);
    let v = json(&j);
    assert_eq!(v["suite"], "quick");
    assert_eq!(v["targets"].as_array().map(Vec::len), Some(2));
    let apis = v["targets"][0]["broker"]["api_versions"]
        .as_array()
        .expect("api versions");
    assert!(apis.iter().any(|a| a["name"] == "Produce"));
    let cases = v["cases"].as_array().expect("cases");
    let names: Vec<&str> = cases.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["produce-1kb", "round-trip-1kb"]);
    for case in cases {
        let results = case["results"].as_array().expect("results");
        assert_eq!(results.len(), 2);
        for r in results {
            assert_eq!(r["run"]["validation"]["passed"], true, "{r}");
        }
    }
    assert!(v["system"]["cpu_count"].as_u64().is_some_and(|n| n >= 1));
    let csv = std::fs::read_to_string(&c).expect("csv");
    assert_eq!(csv.lines().count(), 5);
    let html = std::fs::read_to_string(&h).expect("html");
    assert!(html.contains("<svg") && html.contains("round-trip-1kb"));
    assert!(
        !html.contains("<script") && !html.contains("http://")
            || html.contains("xmlns=\"http://www.w3.org/2000/svg\"")
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("vs first"));
}

/// Needs no broker: a closed port on loopback must fail fast with one line, never hang.
#[test]
fn unreachable_bootstrap_fails_with_one_line() {
    let out = bench(&[
        "-b",
        "127.0.0.1:1",
        "-t",
        "x",
        "-d",
        "1s",
        "--timeout",
        "3s",
        "--no-progress",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach bootstrap servers 127.0.0.1:1"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
}

/// Needs no broker: bad flags are rejected before anything connects.
#[test]
fn invalid_flags_exit_non_zero() {
    let out = bench(&["--validate", "-s", "8", "-b", "127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--message-size must be at least"));
}
