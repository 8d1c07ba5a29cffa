//! `compare`: one suite against several brokers in the same run, interleaved case by case,
//! with fresh topics, warm-up, integrity checks and broker CPU/RSS sampling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::apiversions;
use crate::cli::{CompareArgs, Suite, Target};
use crate::client;
use crate::config::{Acks, Mode, RunConfig};
use crate::error::Result;
use crate::payload::mix64;
use crate::report::{CaseReport, CaseResult, CompareReport, TargetReport};
use crate::runner;
use crate::sysinfo::{system_info, BrokerInfo};

/// One case of a suite: a run configuration without target-specific fields.
#[derive(Clone, Debug)]
pub struct Case {
    /// Short id used in tables and topic names.
    pub name: String,
    /// What it measures.
    pub description: String,
    /// The run (bootstrap and topic are filled in per target).
    pub cfg: RunConfig,
}

impl Suite {
    /// The suite's name as spelled on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Suite::Quick => "quick",
            Suite::Standard => "standard",
            Suite::Full => "full",
        }
    }
}

/// The cases of a suite, in run order.
pub fn suite_cases(suite: Suite) -> Vec<Case> {
    let (d, sustained, warmup, fill) = match suite {
        Suite::Quick => (5, 15, 1, 1_000_000),
        Suite::Standard => (10, 60, 2, 2_000_000),
        Suite::Full => (30, 120, 3, 5_000_000),
    };
    let base = RunConfig {
        duration: Duration::from_secs(d),
        warmup: Duration::from_secs(warmup),
        fill_count: fill,
        // The Java client's default buffer.memory: without a bound, librdkafka queues up to
        // 1 GiB and saturated-producer latency measures that queue rather than the broker.
        extra: vec![("queue.buffering.max.kbytes".into(), "32768".into())],
        ..RunConfig::default()
    };
    let case = |name: &str, description: String, cfg: RunConfig| Case {
        name: name.to_string(),
        description,
        cfg,
    };
    let produce = |size: usize, producers: usize, partitions: i32, acks: Acks| RunConfig {
        mode: Mode::Produce,
        message_size: size,
        concurrency: producers,
        partitions,
        acks,
        ..base.clone()
    };
    let mut all = Vec::new();
    for (size, label) in [
        (100, "100b"),
        (1024, "1kb"),
        (10 * 1024, "10kb"),
        (100 * 1024, "100kb"),
    ] {
        all.push(case(
            &format!("produce-{label}"),
            format!("1 producer, {size} B messages, acks=all, 1 partition"),
            produce(size, 1, 1, Acks::All),
        ));
    }
    for n in [4, 8, 16] {
        all.push(case(
            &format!("produce-1kb-x{n}"),
            format!("{n} concurrent producers, 1 KiB messages, acks=all, 4 partitions"),
            produce(1024, n, 4, Acks::All),
        ));
    }
    all.push(case(
        "sustained-1kb",
        format!("1 producer, 1 KiB messages for {sustained} s"),
        RunConfig {
            duration: Duration::from_secs(sustained),
            ..produce(1024, 1, 1, Acks::All)
        },
    ));
    for (acks, label) in [(Acks::Leader, "acks1"), (Acks::All, "acksall")] {
        all.push(case(
            &format!("baseline-128x256b-{label}"),
            format!(
                "128 producers, 256 B messages, acks={}, 8 partitions",
                acks.as_str()
            ),
            produce(256, 128, 8, acks),
        ));
    }
    all.push(case(
        "consume-1kb",
        format!("1 consumer reading {fill} pre-filled 1 KiB messages"),
        RunConfig {
            mode: Mode::Consume,
            message_size: 1024,
            // A finite topic is read in seconds; a warm-up would swallow a large part of it.
            warmup: Duration::ZERO,
            ..base.clone()
        },
    ));
    all.push(case(
        "round-trip-1kb",
        "1 producer + 1 consumer, 1 KiB at 5,000 msg/s: produce timestamp to consumption".into(),
        RunConfig {
            mode: Mode::RoundTrip,
            message_size: 1024,
            rate_limit: Some(5_000),
            ..base.clone()
        },
    ));
    if suite == Suite::Quick {
        let keep = [
            "produce-100b",
            "produce-1kb",
            "produce-1kb-x4",
            "consume-1kb",
            "round-trip-1kb",
        ];
        all.retain(|c| keep.contains(&c.name.as_str()));
    }
    all
}

/// Asks a broker about itself (never fails: problems are recorded in the result).
pub fn broker_info(cfg: &RunConfig) -> Result<BrokerInfo> {
    let cluster = client::preflight(cfg)?;
    let (api_versions, api_versions_error) =
        match apiversions::fetch(&cfg.bootstrap, Duration::from_secs(5)) {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
    Ok(BrokerInfo {
        cluster_id: cluster.cluster_id,
        brokers: cluster
            .brokers
            .iter()
            .map(|(id, a)| format!("{id}@{a}"))
            .collect(),
        api_versions,
        api_versions_error,
    })
}

/// A `--case` filter: an exact case name, or a prefix ending in `*`.
pub fn case_matches(name: &str, filter: &str) -> bool {
    match filter.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == filter,
    }
}

fn target_config(template: &RunConfig, t: &Target, args: &CompareArgs, topic: String) -> RunConfig {
    let mut cfg = template.clone();
    cfg.bootstrap = t.bootstrap.clone();
    cfg.topic = topic;
    cfg.create_topic = true;
    cfg.delete_topic_after = true;
    cfg.validate = !args.no_validate;
    cfg.extra.extend(args.extra.iter().cloned());
    cfg.timeout = args.timeout;
    cfg.progress = !args.no_progress;
    cfg.broker_pid = t.pid;
    if let Some(d) = args.duration {
        cfg.duration = d;
    }
    if let Some(w) = args.warmup {
        cfg.warmup = w;
    }
    cfg
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs the comparison. Unreachable targets fail fast; a failing case is recorded and the
/// comparison continues. Ctrl-C stops after reporting what was measured.
pub fn run_compare(args: &CompareArgs, stop: &AtomicBool) -> Result<CompareReport> {
    args.check()?;
    let tag = format!(
        "{:08x}",
        mix64(unix_ms() ^ u64::from(std::process::id())) as u32
    );
    let mut cases = suite_cases(args.suite);
    if !args.cases.is_empty() {
        cases.retain(|c| args.cases.iter().any(|f| case_matches(&c.name, f)));
    }
    let mut report = CompareReport {
        tool: "spate-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        suite: args.suite.as_str().into(),
        started_unix_ms: unix_ms(),
        system: system_info(),
        targets: Vec::new(),
        cases: Vec::new(),
        interrupted: false,
    };
    for t in &args.targets {
        let cfg = target_config(&RunConfig::default(), t, args, String::new());
        let broker = broker_info(&cfg)?;
        report.targets.push(TargetReport {
            name: t.name.clone(),
            bootstrap: t.bootstrap.clone(),
            pid: t.pid,
            broker: Some(broker),
        });
    }
    // One unmeasured warm-up run per target (JIT, page cache, connection setup).
    for t in &args.targets {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let template = RunConfig {
            duration: Duration::from_secs(3),
            message_size: 1024,
            ..RunConfig::default()
        };
        let mut cfg = target_config(
            &template,
            t,
            args,
            format!("spate-cmp-{tag}-warmup-{}", t.name),
        );
        cfg.validate = false;
        cfg.broker_pid = None;
        eprintln!("== warm-up on {}", t.name);
        if let Err(e) = runner::run(&cfg, stop) {
            eprintln!("warm-up on {} failed: {e}", t.name);
        }
    }
    for (i, case) in cases.iter().enumerate() {
        let mut results: Vec<Option<CaseResult>> = vec![None; args.targets.len()];
        // Alternate the target order per case so neither broker always runs first.
        let order: Vec<usize> = if i % 2 == 0 {
            (0..args.targets.len()).collect()
        } else {
            (0..args.targets.len()).rev().collect()
        };
        for ti in order {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let t = &args.targets[ti];
            let topic = format!("spate-cmp-{tag}-{}-{}", case.name, t.name);
            let cfg = target_config(&case.cfg, t, args, topic);
            eprintln!("== {} on {}: {}", case.name, t.name, case.description);
            let r = runner::run(&cfg, stop);
            results[ti] = Some(match r {
                Ok(run) => CaseResult {
                    target: t.name.clone(),
                    broker_resources: run.broker_resources.clone(),
                    run: Some(run),
                    error: None,
                },
                Err(e) => {
                    eprintln!("   {} on {} failed: {e}", case.name, t.name);
                    CaseResult {
                        target: t.name.clone(),
                        run: None,
                        error: Some(e.to_string()),
                        broker_resources: None,
                    }
                }
            });
        }
        let done: Vec<CaseResult> = results.into_iter().flatten().collect();
        if !done.is_empty() {
            report.cases.push(CaseReport {
                name: case.name.clone(),
                description: case.description.clone(),
                results: done,
            });
        }
        if stop.load(Ordering::Relaxed) {
            report.interrupted = true;
            break;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_suite_has_the_matrix() {
        let names: Vec<String> = suite_cases(Suite::Standard)
            .into_iter()
            .map(|c| c.name)
            .collect();
        for want in [
            "produce-100b",
            "produce-1kb",
            "produce-10kb",
            "produce-100kb",
            "produce-1kb-x4",
            "produce-1kb-x8",
            "produce-1kb-x16",
            "sustained-1kb",
            "baseline-128x256b-acks1",
            "baseline-128x256b-acksall",
            "consume-1kb",
            "round-trip-1kb",
        ] {
            assert!(names.iter().any(|n| n == want), "missing {want}");
        }
        for c in suite_cases(Suite::Full) {
            assert!(c.cfg.validate().is_ok(), "{} invalid", c.name);
        }
        assert!(suite_cases(Suite::Quick).len() < names.len());
    }

    #[test]
    fn case_filters() {
        assert!(case_matches("produce-1kb", "produce-1kb"));
        assert!(!case_matches("produce-1kb-x4", "produce-1kb"));
        assert!(case_matches("produce-1kb-x4", "produce-1kb*"));
        assert!(case_matches("round-trip-1kb", "*"));
    }

    #[test]
    fn baseline_cases_use_128_producers() {
        let cases = suite_cases(Suite::Standard);
        let b: Vec<&Case> = cases
            .iter()
            .filter(|c| c.name.starts_with("baseline"))
            .collect();
        assert_eq!(b.len(), 2);
        assert!(b
            .iter()
            .all(|c| c.cfg.concurrency == 128 && c.cfg.message_size == 256));
        assert_eq!(b[0].cfg.acks, Acks::Leader);
        assert_eq!(b[1].cfg.acks, Acks::All);
    }
}
