//! Metadata mode: each worker repeats a cycle of CreateTopics, Metadata (until the new
//! topic has a leader), ListOffsets and DeleteTopics on a throw-away topic, timing each call.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::Consumer;

use crate::client::{self, error_code_name};
use crate::config::RunConfig;
use crate::error::{BenchError, Result};
use crate::histogram::LatencyHistogram;
use crate::payload::mix64;
use crate::progress::Snapshot;
use crate::report::{OpSummary, RunReport};
use crate::runner::Supervisor;
use crate::stats::{ErrorCounts, Shared};

/// The timed operations, in report order.
pub const OPS: [&str; 4] = ["CreateTopics", "Metadata", "ListOffsets", "DeleteTopics"];
/// Metadata polls per cycle while waiting for the new topic's leader.
const MAX_METADATA_POLLS: usize = 50;

/// One operation kind's counters.
#[derive(Debug, Default)]
struct OpStats {
    latency: LatencyHistogram,
    ok: u64,
    errors: ErrorCounts,
}

/// A worker's counters, indexed like [`OPS`].
#[derive(Debug, Default)]
struct MetaStats {
    ops: [OpStats; 4],
}

impl MetaStats {
    fn record(
        &mut self,
        op: usize,
        measured: bool,
        started: Instant,
        result: std::result::Result<(), String>,
    ) {
        if !measured {
            return;
        }
        let s = &mut self.ops[op];
        match result {
            Ok(()) => {
                s.ok += 1;
                s.latency.record_ns(started.elapsed().as_nanos() as u64);
            }
            Err(code) => s.errors.add(&code),
        }
    }
}

/// Runs the metadata mode and fills `report.operations`.
pub fn run(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    stop: &AtomicBool,
    report: &mut RunReport,
) -> Result<()> {
    let epoch = Instant::now();
    let measure_from = epoch + cfg.warmup;
    let end = cfg.measured_limit().map(|d| epoch + d);
    let stats: Vec<Shared<MetaStats>> = (0..cfg.concurrency).map(|_| Shared::new()).collect();
    let cycles = AtomicU64::new(0);
    let done = AtomicUsize::new(0);
    let tag = mix64(epoch.elapsed().as_nanos() as u64 ^ u64::from(std::process::id())) as u32;
    let mut interrupted = false;

    let outcome: Result<()> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (w, st) in stats.iter().enumerate() {
            let (cycles, done) = (&cycles, &done);
            handles.push(s.spawn(move || {
                let r = worker(cfg, w, tag, st, stop, end, measure_from, cycles);
                done.fetch_add(1, Ordering::Relaxed);
                r
            }));
        }
        loop {
            std::thread::sleep(Duration::from_millis(100));
            interrupted |= stop.load(Ordering::Relaxed);
            let finished = done.load(Ordering::Relaxed) == cfg.concurrency;
            if sup.due() || finished {
                let mut snap = Snapshot {
                    phase: "metadata".into(),
                    elapsed: epoch.elapsed(),
                    ..Snapshot::default()
                };
                let mut all = LatencyHistogram::new();
                for st in &stats {
                    let st = st.lock();
                    for o in &st.ops {
                        snap.operations += o.ok;
                        snap.errors += o.errors.total();
                        all.merge(&o.latency);
                    }
                }
                snap.p99_us = (!all.is_empty()).then(|| all.percentile_us(99.0));
                sup.publish(&snap);
            }
            if finished {
                break;
            }
        }
        sup.end_phase();
        let mut first = None;
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first.get_or_insert(e);
                }
                Err(_) => {
                    first.get_or_insert(BenchError::Client("a worker thread panicked".into()));
                }
            }
        }
        first.map_or(Ok(()), Err)
    });
    outcome?;
    report.interrupted |= interrupted;
    let elapsed = epoch.elapsed().saturating_sub(cfg.warmup).as_secs_f64();
    for (i, name) in OPS.iter().enumerate() {
        let mut latency = LatencyHistogram::new();
        let mut errors = ErrorCounts::default();
        let mut ok = 0;
        for st in &stats {
            let st = st.lock();
            latency.merge(&st.ops[i].latency);
            errors.merge(&st.ops[i].errors);
            ok += st.ops[i].ok;
        }
        report.operations.push(OpSummary {
            op: (*name).to_string(),
            ok,
            errors,
            ops_per_sec: if elapsed > 0.0 {
                (ok as f64 / elapsed * 1000.0).round() / 1000.0
            } else {
                0.0
            },
            latency_us: latency.summary(),
        });
    }
    if report.operations.iter().all(|o| o.ok == 0) {
        if let Some((code, _)) = report.operations.iter().find_map(|o| o.errors.top()) {
            return Err(BenchError::AllRejected {
                reason: format!("every metadata operation failed ({code})"),
                failed: report.error_total(),
            });
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn worker(
    cfg: &RunConfig,
    w: usize,
    tag: u32,
    stats: &Shared<MetaStats>,
    stop: &AtomicBool,
    end: Option<Instant>,
    measure_from: Instant,
    cycles: &AtomicU64,
) -> Result<()> {
    let admin = client::admin_client(cfg)?;
    let md = client::metadata_client(cfg)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| BenchError::io("tokio runtime", e))?;
    let opts = AdminOptions::new()
        .operation_timeout(Some(cfg.timeout))
        .request_timeout(Some(cfg.timeout));
    let bound = cfg.timeout + Duration::from_secs(5);
    for i in 0u64.. {
        if stop.load(Ordering::Relaxed) || end.is_some_and(|e| Instant::now() >= e) {
            break;
        }
        if let Some(n) = cfg.message_count {
            if cycles.fetch_add(1, Ordering::Relaxed) >= n {
                break;
            }
        }
        let name = format!("{}-meta-{tag:08x}-{w}-{i}", cfg.topic);
        let measured = Instant::now() >= measure_from;

        let t = Instant::now();
        let topic = NewTopic::new(&name, 1, TopicReplication::Fixed(cfg.replication_factor));
        let created = rt.block_on(async {
            match tokio::time::timeout(bound, admin.create_topics([&topic], &opts)).await {
                Err(_) => Err("Timeout".to_string()),
                Ok(Err(e)) => Err(error_code_name(&e)),
                Ok(Ok(rs)) => rs
                    .into_iter()
                    .try_for_each(|r| r.map(|_| ()).map_err(|(_, c)| format!("{c:?}"))),
            }
        });
        let ok = created.is_ok();
        stats.lock().record(0, measured, t, created);
        if !ok {
            continue;
        }

        for _ in 0..MAX_METADATA_POLLS {
            let t = Instant::now();
            let r = md.fetch_metadata(Some(&name), cfg.timeout);
            let ready = match &r {
                Ok(m) => m.topics().iter().any(|tp| {
                    tp.error().is_none()
                        && !tp.partitions().is_empty()
                        && tp.partitions().iter().all(|p| p.leader() >= 0)
                }),
                Err(_) => false,
            };
            stats.lock().record(
                1,
                measured,
                t,
                r.map(|_| ()).map_err(|e| error_code_name(&e)),
            );
            if ready {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }

        let t = Instant::now();
        let r = md.fetch_watermarks(&name, 0, cfg.timeout);
        stats.lock().record(
            2,
            measured,
            t,
            r.map(|_| ()).map_err(|e| error_code_name(&e)),
        );

        let t = Instant::now();
        let deleted = rt.block_on(async {
            match tokio::time::timeout(bound, admin.delete_topics(&[&name], &opts)).await {
                Err(_) => Err("Timeout".to_string()),
                Ok(Err(e)) => Err(error_code_name(&e)),
                Ok(Ok(rs)) => rs
                    .into_iter()
                    .try_for_each(|r| r.map(|_| ()).map_err(|(_, c)| format!("{c:?}"))),
            }
        });
        stats.lock().record(3, measured, t, deleted);
    }
    Ok(())
}
