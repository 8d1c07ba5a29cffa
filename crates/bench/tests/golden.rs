//! Golden-file tests of the report writers: fixed reports rendered to console text, JSON, CSV
//! and HTML must match the files in tests/golden/. `UPDATE_GOLDEN=1 cargo test` rewrites them.

use std::path::PathBuf;
use std::time::Duration;

use spate_bench::apiversions::ApiRange;
use spate_bench::config::{Acks, Compression, Mode, RunConfig};
use spate_bench::histogram::LatencyHistogram;
use spate_bench::report::{
    console, csv, html, json, CaseReport, CaseResult, ClientUsage, CompareReport, ConsumeSummary,
    OpSummary, ProduceSummary, RunReport, TargetReport,
};
use spate_bench::stats::ErrorCounts;
use spate_bench::sysinfo::{BrokerInfo, ResourceUsage, SystemInfo};
use spate_bench::validate::{ValidationPolicy, ValidationReport, Violation, ViolationKind};

fn latency(scale: u64) -> LatencyHistogram {
    let mut h = LatencyHistogram::new();
    for i in 1..=1000u64 {
        h.record_us(scale * i + (i * i) % 97);
    }
    h
}

fn config(mode: Mode) -> RunConfig {
    RunConfig {
        bootstrap: "127.0.0.1:19092".into(),
        topic: "golden".into(),
        mode,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
        acks: Acks::Leader,
        compression: Compression::Lz4,
        validate: true,
        linger_ms: Some(5),
        extra: vec![("queue.buffering.max.kbytes".into(), "65536".into())],
        ..RunConfig::default()
    }
}

fn produce_run(rate: f64, scale: u64) -> RunReport {
    let mut errors = ErrorCounts::default();
    errors.add_n("MessageTimedOut", 3);
    RunReport {
        tool: "spate-bench".into(),
        version: "0.1.0".into(),
        mode: Mode::Produce,
        started_unix_ms: 1_700_000_000_000,
        interrupted: false,
        config: config(Mode::Produce),
        produce: Some(ProduceSummary {
            attempted: 1_000_003,
            delivered: 1_000_000,
            failed: 3,
            success_rate: 1_000_000.0 / 1_000_003.0,
            bytes: 1_024_000_000,
            msgs_per_sec: rate,
            mib_per_sec: rate * 1024.0 / 1_048_576.0,
            elapsed_s: 10.0,
            errors,
            warmup_delivered: 5_000,
            latency_us: latency(scale).summary(),
        }),
        consume: None,
        operations: Vec::new(),
        validation: Some(ValidationReport {
            passed: true,
            policy: ValidationPolicy {
                duplicates_allowed: true,
                reorder_allowed: true,
                loss_allowed: false,
            },
            acknowledged: 1_005_000,
            consumed_unique: 1_005_000,
            lost: 0,
            duplicates: 2,
            reordered: 0,
            corrupted: 0,
            foreign: 0,
            consumed_unacknowledged: 3,
            violations: vec![Violation {
                kind: ViolationKind::Duplicate,
                producer: Some(0),
                seq: Some(41),
                partition: Some(0),
                offset: Some(99),
                detail: "consumed more than once".into(),
                is_violation: false,
            }],
        }),
        client: ClientUsage {
            cpu_seconds: 4.25,
            rss_peak_mib: 96.5,
            librdkafka: "2.12.1".into(),
        },
        broker_resources: None,
        notes: vec!["a note with <html> & \"quotes\", and commas".into()],
    }
}

fn round_trip_run() -> RunReport {
    let mut r = produce_run(5_000.0, 3);
    r.mode = Mode::RoundTrip;
    r.config = config(Mode::RoundTrip);
    r.consume = Some(ConsumeSummary {
        consumed: 50_000,
        bytes: 51_200_000,
        msgs_per_sec: 5_000.0,
        mib_per_sec: 4.883,
        elapsed_s: 10.0,
        errors: ErrorCounts::default(),
        latency_us: latency(4).summary(),
    });
    r
}

fn metadata_run() -> RunReport {
    let mut r = produce_run(0.0, 1);
    r.mode = Mode::Metadata;
    r.config = config(Mode::Metadata);
    r.produce = None;
    r.validation = None;
    r.notes.clear();
    let mut errs = ErrorCounts::default();
    errs.add("RequestTimedOut");
    r.operations = vec![
        OpSummary {
            op: "CreateTopics".into(),
            ok: 120,
            errors: errs,
            ops_per_sec: 12.0,
            latency_us: latency(60).summary(),
        },
        OpSummary {
            op: "Metadata".into(),
            ok: 130,
            errors: ErrorCounts::default(),
            ops_per_sec: 13.0,
            latency_us: latency(2).summary(),
        },
    ];
    r
}

fn compare_report() -> CompareReport {
    let broker = BrokerInfo {
        cluster_id: Some("abc123".into()),
        brokers: vec!["1@127.0.0.1:19092".into()],
        api_versions: vec![
            ApiRange {
                api_key: 0,
                name: "Produce".into(),
                min: 3,
                max: 12,
            },
            ApiRange {
                api_key: 18,
                name: "ApiVersions".into(),
                min: 0,
                max: 4,
            },
        ],
        api_versions_error: None,
    };
    let res = |target: &str, run: RunReport, cpu: f64| CaseResult {
        target: target.into(),
        broker_resources: Some(ResourceUsage {
            cpu_seconds: cpu,
            avg_cores: cpu / 10.0,
            rss_peak_mib: 812.0,
            rss_avg_mib: 790.5,
            samples: 50,
        }),
        run: Some(run),
        error: None,
    };
    let mut failed_validation = produce_run(90_000.0, 3);
    if let Some(v) = failed_validation.validation.as_mut() {
        v.passed = false;
        v.lost = 7;
    }
    CompareReport {
        tool: "spate-bench".into(),
        version: "0.1.0".into(),
        suite: "quick".into(),
        started_unix_ms: 1_700_000_000_000,
        system: SystemInfo {
            os: "Debian GNU/Linux 13 (trixie)".into(),
            kernel: "6.1.0".into(),
            arch: "x86_64".into(),
            cpu_model: "Example CPU @ 2.00GHz".into(),
            cpu_count: 2,
            memory_mib: 23_000,
            librdkafka: "2.12.1".into(),
            spate_bench: "0.1.0".into(),
        },
        targets: vec![
            TargetReport {
                name: "kafka".into(),
                bootstrap: "127.0.0.1:19092".into(),
                pid: Some(123),
                broker: Some(broker.clone()),
            },
            TargetReport {
                name: "spate".into(),
                bootstrap: "127.0.0.1:9092".into(),
                pid: None,
                broker: Some(BrokerInfo {
                    api_versions_error: Some("connection refused".into()),
                    ..BrokerInfo::default()
                }),
            },
        ],
        cases: vec![
            CaseReport {
                name: "produce-1kb".into(),
                description: "1 producer, 1024 B messages".into(),
                results: vec![
                    res("kafka", produce_run(100_000.0, 2), 12.5),
                    res("spate", produce_run(150_000.0, 1), 6.25),
                ],
            },
            CaseReport {
                name: "round-trip-1kb".into(),
                description: "1 producer + 1 consumer".into(),
                results: vec![
                    res("kafka", round_trip_run(), 3.0),
                    CaseResult {
                        target: "spate".into(),
                        run: None,
                        error: Some(
                            "broker rejected every message: UnsupportedCompressionType".into(),
                        ),
                        broker_resources: None,
                    },
                ],
            },
            CaseReport {
                name: "produce-100b".into(),
                description: "1 producer, 100 B".into(),
                results: vec![
                    res("kafka", failed_validation, 9.0),
                    res("spate", produce_run(80_000.0, 2), 4.0),
                ],
            },
        ],
        interrupted: false,
    }
}

fn check(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{name} differs from golden file at line {}:\n  golden: {:?}\n  actual: {:?}\n(UPDATE_GOLDEN=1 to accept)",
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

#[test]
fn run_report_console() {
    let text = [produce_run(123_456.7, 2), round_trip_run(), metadata_run()]
        .iter()
        .map(console::render_run)
        .collect::<Vec<_>>()
        .join("\n");
    check("run.txt", &text);
}

#[test]
fn run_report_json() {
    check(
        "run.json",
        &json::to_json(&produce_run(123_456.7, 2)).expect("serialises"),
    );
    check(
        "metadata.json",
        &json::to_json(&metadata_run()).expect("serialises"),
    );
}

#[test]
fn run_report_csv() {
    let mut text = csv::run_csv(&produce_run(123_456.7, 2));
    text += &csv::row("", "", &round_trip_run(), None);
    text.push('\n');
    text += &csv::row("", "", &metadata_run(), None);
    text.push('\n');
    check("run.csv", &text);
}

#[test]
fn compare_report_all_formats() {
    let c = compare_report();
    check("compare.txt", &console::render_compare(&c));
    check("compare.json", &json::to_json(&c).expect("serialises"));
    check("compare.csv", &csv::compare_csv(&c));
    let page = html::render_compare(&c);
    assert!(
        !page.contains("<script"),
        "the report must not need JavaScript"
    );
    assert!(
        !page.contains("src=\"http"),
        "the report must not load anything"
    );
    check("compare.html", &page);
}
