//! Runs one benchmark: preflight, topic setup, the mode's phases, summaries and cleanup.
//! Worker threads do the I/O; the calling thread supervises (progress, stop conditions).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::client;
use crate::config::{Acks, Mode, RunConfig};
use crate::consumer::{run_consumer, spread, ConsumerPlan, ConsumerShared};
use crate::error::{BenchError, Result};
use crate::histogram::LatencyHistogram;
use crate::payload::{mix64, MessageFactory};
use crate::producer::{run_producer, ProducerPlan};
use crate::progress::{Progress, Snapshot};
use crate::prometheus::{self, PromState};
use crate::report::{ClientUsage, ConsumeSummary, ProduceSummary, RunReport, MIB};
use crate::stats::{ConsumeStats, ErrorCounts, ProduceStats, Shared, StartGate};
use crate::sysinfo::{cpu_seconds, rss_mib, ProcessSampler};
use crate::validate::{ValidationPolicy, Validator};

/// How often the supervisor wakes up to check stop conditions.
const TICK: Duration = Duration::from_millis(100);
/// Consumers that make no progress for this long are stopped (topic drained or broker stuck).
const IDLE_STOP: Duration = Duration::from_secs(10);
/// Upper bound for filling a topic before a consume run.
const FILL_LIMIT: Duration = Duration::from_secs(600);
/// Upper bound for reading a topic back for validation.
const VERIFY_LIMIT: Duration = Duration::from_secs(300);

/// Progress output and the Prometheus endpoint, fed by whichever phase is running.
pub struct Supervisor {
    progress: Progress,
    interval: Duration,
    last_publish: Option<Instant>,
    prom: Option<(PromState, Arc<AtomicBool>, Option<JoinHandle<()>>)>,
}

impl Supervisor {
    /// Starts the Prometheus endpoint if configured.
    pub fn new(cfg: &RunConfig) -> Result<Self> {
        let prom = match cfg.prometheus {
            Some(addr) => {
                let state: PromState = Arc::new(Mutex::new(Snapshot::default()));
                let stop = Arc::new(AtomicBool::new(false));
                let h = prometheus::serve(addr, Arc::clone(&state), Arc::clone(&stop))?;
                Some((state, stop, Some(h)))
            }
            None => None,
        };
        Ok(Self {
            progress: Progress::new(cfg.progress),
            interval: cfg.report_interval,
            last_publish: None,
            prom,
        })
    }

    /// True when the next snapshot should be published (then p99 is worth computing).
    pub fn due(&self) -> bool {
        self.last_publish
            .is_none_or(|t| t.elapsed() >= self.interval)
    }

    /// Shows `snap` on the progress line and the Prometheus endpoint.
    pub fn publish(&mut self, snap: &Snapshot) {
        self.progress.update(snap);
        if let Some((state, _, _)) = &self.prom {
            *state.lock().unwrap_or_else(|p| p.into_inner()) = snap.clone();
        }
        self.last_publish = Some(Instant::now());
    }

    /// Ends the current progress line.
    pub fn end_phase(&mut self) {
        self.progress.finish();
        self.last_publish = None;
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some((_, stop, handle)) = self.prom.as_mut() {
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

/// What one phase runs.
pub(crate) struct PhaseSpec {
    /// Phase name for progress lines.
    pub name: &'static str,
    /// Producers to run.
    pub producers: Vec<ProducerPlan>,
    /// Consumers to run.
    pub consumers: Vec<ConsumerPlan>,
    /// Keep acknowledged sequences (validation).
    pub track_acks: bool,
    /// Feed consumed messages to this validator.
    pub validator: Option<Arc<Mutex<Validator>>>,
    /// Record produce-to-consume latency.
    pub record_latency: bool,
    /// After producers finish, let consumers catch up with what was delivered.
    pub drain: bool,
}

/// What one phase measured.
pub(crate) struct PhaseResult {
    /// Per-producer counters.
    pub produce: Vec<ProduceStats>,
    /// Per-consumer counters.
    pub consume: Vec<ConsumeStats>,
    /// Set when the broker rejected every message.
    pub abort: Option<String>,
    /// Set when the user interrupted.
    pub interrupted: bool,
    /// Set when consumers were stopped for making no progress.
    pub idle_stopped: bool,
}

fn counters(
    name: &str,
    epoch: Instant,
    prod: &[Shared<ProduceStats>],
    cons: &[Shared<ConsumeStats>],
) -> Snapshot {
    let mut s = Snapshot {
        phase: name.to_string(),
        elapsed: epoch.elapsed(),
        ..Snapshot::default()
    };
    for p in prod {
        let p = p.lock();
        s.delivered += p.delivered + p.warmup_delivered;
        s.delivered_bytes += p.delivered_bytes;
        s.errors += p.failed + p.warmup_failed;
    }
    for c in cons {
        let c = c.lock();
        s.consumed += c.consumed + c.warmup_consumed;
        s.consumed_bytes += c.consumed_bytes;
        s.errors += c.errors.total();
    }
    s
}

/// p99 so far: of round-trip latency when consumers record it, else of produce latency.
fn p99_so_far(
    prod: &[Shared<ProduceStats>],
    cons: &[Shared<ConsumeStats>],
    consumer_latency: bool,
) -> Option<u64> {
    let mut h = LatencyHistogram::new();
    if consumer_latency {
        cons.iter().for_each(|c| h.merge(&c.lock().latency));
    } else {
        prod.iter().for_each(|p| h.merge(&p.lock().latency));
    }
    (!h.is_empty()).then(|| h.percentile_us(99.0))
}

/// Runs the measured phase of a mode: samples the broker's CPU and RSS around it (when given
/// its pid) and records an interruption in the report.
pub(crate) fn run_measured_phase(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    spec: PhaseSpec,
    factory: &Arc<MessageFactory>,
    stop: &AtomicBool,
    report: &mut RunReport,
) -> Result<PhaseResult> {
    let sampler = cfg.broker_pid.and_then(ProcessSampler::start);
    let res = run_phase(cfg, sup, spec, factory, stop);
    report.broker_resources = sampler.and_then(ProcessSampler::finish);
    let res = res?;
    report.interrupted |= res.interrupted;
    Ok(res)
}

/// Runs producers and consumers of one phase to completion while supervising them.
pub(crate) fn run_phase(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    spec: PhaseSpec,
    factory: &Arc<MessageFactory>,
    user_stop: &AtomicBool,
) -> Result<PhaseResult> {
    let gate = Arc::new(StartGate::default());
    let prod_stats: Vec<Shared<ProduceStats>> =
        spec.producers.iter().map(|_| Shared::new()).collect();
    let cons_stats: Vec<Shared<ConsumeStats>> =
        spec.consumers.iter().map(|_| Shared::new()).collect();
    let prod_stop = AtomicBool::new(false);
    let cons_stop = AtomicBool::new(false);
    let prod_done = AtomicUsize::new(0);
    let cons_done = AtomicUsize::new(0);
    let total = AtomicU64::new(0);
    let mut abort = None;
    let mut interrupted = false;
    let mut idle_stopped = false;

    let shared = ConsumerShared {
        stop: &cons_stop,
        total: &total,
        factory: Arc::clone(factory),
        validator: spec.validator.clone(),
        record_latency: spec.record_latency,
    };
    let outcome: Result<()> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (plan, st) in spec.producers.iter().zip(&prod_stats) {
            let (f, st, stop, done, gate) = (
                Arc::clone(factory),
                st.clone(),
                &prod_stop,
                &prod_done,
                &gate,
            );
            let track = spec.track_acks;
            handles.push(s.spawn(move || {
                let r = run_producer(cfg, plan, f, gate, stop, st, track);
                done.fetch_add(1, Ordering::Relaxed);
                r
            }));
        }
        let shared = &shared;
        for (plan, st) in spec.consumers.iter().zip(&cons_stats) {
            let (st, done, gate) = (st.clone(), &cons_done, &gate);
            handles.push(s.spawn(move || {
                let r = run_consumer(cfg, plan, gate, shared, st);
                done.fetch_add(1, Ordering::Relaxed);
                r
            }));
        }

        let (n_prod, n_cons) = (spec.producers.len(), spec.consumers.len());
        // Start the clock once every worker is connected (or failed, or setup timed out).
        let setup_started = Instant::now();
        while gate.ready() + prod_done.load(Ordering::Relaxed) + cons_done.load(Ordering::Relaxed)
            < n_prod + n_cons
            && setup_started.elapsed() < cfg.timeout
            && !user_stop.load(Ordering::Relaxed)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let epoch = gate.open();
        let mut last_consumed = (0u64, Instant::now());
        let mut producers_done_at: Option<Instant> = None;
        let drain_limit = cfg.timeout.max(Duration::from_secs(10));
        loop {
            std::thread::sleep(TICK);
            let mut snap = counters(spec.name, epoch, &prod_stats, &cons_stats);
            if user_stop.load(Ordering::Relaxed) && !interrupted {
                interrupted = true;
                prod_stop.store(true, Ordering::Relaxed);
                cons_stop.store(true, Ordering::Relaxed);
            }
            // Honest failure: if the broker rejects everything, stop instead of hammering it.
            if abort.is_none() && n_prod > 0 && snap.delivered == 0 {
                let failed: u64 = prod_stats
                    .iter()
                    .map(|p| {
                        let p = p.lock();
                        p.failed + p.warmup_failed
                    })
                    .sum();
                if failed > 0 {
                    let reason = prod_stats
                        .iter()
                        .find_map(|p| p.lock().last_client_error.clone())
                        .unwrap_or_else(|| "unknown error".into());
                    abort = Some(reason);
                    prod_stop.store(true, Ordering::Relaxed);
                    cons_stop.store(true, Ordering::Relaxed);
                }
            }
            if snap.consumed != last_consumed.0 {
                last_consumed = (snap.consumed, Instant::now());
            }
            let producers_finished = prod_done.load(Ordering::Relaxed) == n_prod;
            if producers_finished && producers_done_at.is_none() {
                producers_done_at = Some(Instant::now());
            }
            if n_cons > 0 && !cons_stop.load(Ordering::Relaxed) {
                let idle = last_consumed.1.elapsed() >= IDLE_STOP;
                if n_prod == 0 && idle {
                    idle_stopped = true;
                    cons_stop.store(true, Ordering::Relaxed);
                } else if n_prod > 0 && producers_finished {
                    let caught_up = spec.drain && snap.consumed >= snap.delivered;
                    let too_long = producers_done_at.is_some_and(|t| t.elapsed() >= drain_limit);
                    if caught_up || !spec.drain || idle || too_long {
                        idle_stopped = !caught_up && spec.drain;
                        cons_stop.store(true, Ordering::Relaxed);
                    }
                }
            }
            let finished = producers_finished && cons_done.load(Ordering::Relaxed) == n_cons;
            if sup.due() || finished {
                snap.p99_us = p99_so_far(&prod_stats, &cons_stats, spec.record_latency);
                sup.publish(&snap);
            }
            if finished {
                break;
            }
        }
        sup.end_phase();
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(BenchError::Client("a worker thread panicked".into()));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    });
    outcome?;
    Ok(PhaseResult {
        produce: prod_stats
            .iter()
            .map(|s| std::mem::take(&mut *s.lock()))
            .collect(),
        consume: cons_stats
            .iter()
            .map(|s| std::mem::take(&mut *s.lock()))
            .collect(),
        abort,
        interrupted,
        idle_stopped,
    })
}

/// Splits a total over `n` workers, giving the remainder to the first ones.
pub(crate) fn split(total: u64, n: usize, i: usize) -> u64 {
    let n = n.max(1) as u64;
    total / n + u64::from((i as u64) < total % n)
}

/// Producer plans for `n` producers sharing the run's count, rate and deadline.
pub(crate) fn producer_plans(
    n: usize,
    count: Option<u64>,
    rate: Option<u64>,
    warmup: Duration,
    end: Option<Duration>,
) -> Vec<ProducerPlan> {
    (0..n)
        .map(|i| ProducerPlan {
            id: i as u32,
            quota: count.map(|c| split(c, n, i)),
            rate: rate.map(|r| r as f64 / n as f64),
            end,
            measure_from_ns: warmup.as_nanos() as u64,
        })
        .collect()
}

/// Adds up producer counters into the report's summary.
pub(crate) fn summarize_produce(stats: &[ProduceStats], measure_from_ns: u64) -> ProduceSummary {
    let mut latency = LatencyHistogram::new();
    let mut errors = ErrorCounts::default();
    let mut s = ProduceSummary::default();
    let mut last_ns = 0u64;
    let mut rejected = 0u64;
    let mut enqueued = 0u64;
    for p in stats {
        latency.merge(&p.latency);
        errors.merge(&p.errors);
        s.delivered += p.delivered;
        s.failed += p.failed;
        s.bytes += p.delivered_bytes;
        s.warmup_delivered += p.warmup_delivered;
        rejected += p.rejected;
        enqueued += p.enqueued;
        last_ns = last_ns.max(p.last_delivery_ns);
    }
    s.attempted = (enqueued + rejected).max(s.delivered + s.failed);
    s.errors = errors;
    s.latency_us = latency.summary();
    // Rates from the exact window; only the reported numbers are rounded.
    let elapsed = last_ns.saturating_sub(measure_from_ns) as f64 / 1e9;
    s.elapsed_s = round3(elapsed);
    if elapsed > 0.0 {
        s.msgs_per_sec = round3(s.delivered as f64 / elapsed);
        s.mib_per_sec = round3(s.bytes as f64 / MIB / elapsed);
    }
    let settled = s.delivered + s.failed;
    s.success_rate = if settled == 0 {
        0.0
    } else {
        s.delivered as f64 / settled as f64
    };
    s
}

/// Adds up consumer counters. The window starts at warm-up end, or at the first measured
/// message when `from_first_message` (consume mode: excludes connection setup).
pub(crate) fn summarize_consume(
    stats: &[ConsumeStats],
    measure_from_ns: u64,
    from_first_message: bool,
) -> ConsumeSummary {
    let mut latency = LatencyHistogram::new();
    let mut s = ConsumeSummary::default();
    let mut last_ns = 0u64;
    let mut first_ns = u64::MAX;
    for c in stats {
        latency.merge(&c.latency);
        s.errors.merge(&c.errors);
        s.consumed += c.consumed;
        s.bytes += c.consumed_bytes;
        last_ns = last_ns.max(c.last_message_ns);
        if let Some(f) = c.first_message_ns {
            first_ns = first_ns.min(f);
        }
    }
    let start = if from_first_message && first_ns != u64::MAX {
        first_ns
    } else {
        measure_from_ns
    };
    s.latency_us = latency.summary();
    let elapsed = last_ns.saturating_sub(start) as f64 / 1e9;
    s.elapsed_s = round3(elapsed);
    if elapsed > 0.0 {
        s.msgs_per_sec = round3(s.consumed as f64 / elapsed);
        s.mib_per_sec = round3(s.bytes as f64 / MIB / elapsed);
    }
    s
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// What the run's delivery semantics allow the validator to see.
pub fn validation_policy(cfg: &RunConfig) -> ValidationPolicy {
    let idempotent = client::producer_is_idempotent(cfg);
    let one_in_flight = cfg.extra.iter().any(|(k, v)| {
        (k == "max.in.flight" || k == "max.in.flight.requests.per.connection") && v == "1"
    });
    ValidationPolicy {
        duplicates_allowed: !idempotent,
        reorder_allowed: !idempotent && !one_in_flight,
        loss_allowed: cfg.acks == Acks::None,
    }
}

/// A run id that differs between runs (so old data in a topic is recognised as foreign).
fn new_run_id() -> u32 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix64(t ^ (u64::from(std::process::id()) << 32)) as u32
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A report with nothing measured yet.
pub fn empty_report(cfg: &RunConfig) -> RunReport {
    RunReport {
        tool: "spate-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        mode: cfg.mode,
        started_unix_ms: unix_ms(),
        interrupted: false,
        config: cfg.clone(),
        produce: None,
        consume: None,
        operations: Vec::new(),
        validation: None,
        client: ClientUsage::default(),
        broker_resources: None,
        notes: Vec::new(),
    }
}

/// Runs one benchmark and returns its report. `stop` (Ctrl-C) ends it early; it still reports.
pub fn run(cfg: &RunConfig, stop: &AtomicBool) -> Result<RunReport> {
    cfg.validate()?;
    let cpu0 = cpu_seconds("self").unwrap_or(0.0);
    let mut sup = Supervisor::new(cfg)?;
    let mut report = empty_report(cfg);
    client::preflight(cfg)?;
    if cfg.acks == Acks::None {
        report.notes.push(
            "acks=0: a delivery report only means the message was written to the socket".into(),
        );
    }
    let result = match cfg.mode {
        Mode::Metadata => {
            let sampler = cfg.broker_pid.and_then(ProcessSampler::start);
            let r = crate::metadata::run(cfg, &mut sup, stop, &mut report);
            report.broker_resources = sampler.and_then(ProcessSampler::finish);
            r
        }
        _ => {
            let partitions = ensure_topic(cfg, &mut report)?;
            let factory = Arc::new(
                MessageFactory::new(
                    new_run_id(),
                    cfg.message_size,
                    cfg.key_pattern,
                    cfg.payload_pattern,
                    cfg.needs_header(),
                )
                .with_key_space(cfg.key_space),
            );
            let r = match cfg.mode {
                Mode::Produce => {
                    produce_mode(cfg, &mut sup, stop, &factory, &partitions, &mut report)
                }
                Mode::Consume => {
                    consume_mode(cfg, &mut sup, stop, &factory, &partitions, &mut report)
                }
                _ => crate::roundtrip::run(cfg, &mut sup, stop, &factory, &partitions, &mut report),
            };
            if cfg.delete_topic_after {
                if let Err(e) = client::delete_topic(cfg, &cfg.topic) {
                    report.notes.push(format!("cleanup failed: {e}"));
                }
            }
            r
        }
    };
    result?;
    report.client = ClientUsage {
        cpu_seconds: round3((cpu_seconds("self").unwrap_or(0.0) - cpu0).max(0.0)),
        rss_peak_mib: round3(rss_mib("self", "VmHWM").unwrap_or(0.0)),
        librdkafka: client::librdkafka_version(),
    };
    Ok(report)
}

/// Creates the topic if asked; returns its partition ids.
fn ensure_topic(cfg: &RunConfig, report: &mut RunReport) -> Result<Vec<i32>> {
    let md = client::metadata_client(cfg)?;
    let existing = client::topic_partitions(&md, &cfg.topic, cfg.timeout)?;
    match existing {
        Some(p) => {
            if cfg.create_topic {
                report.notes.push(format!(
                    "topic '{}' already existed with {} partition(s); reused",
                    cfg.topic,
                    p.len()
                ));
            }
            Ok(p)
        }
        None if cfg.create_topic => {
            client::create_topic(cfg, &cfg.topic, cfg.partitions, cfg.replication_factor)?;
            client::topic_partitions(&md, &cfg.topic, cfg.timeout)?.ok_or_else(|| {
                BenchError::TopicCreate {
                    topic: cfg.topic.clone(),
                    reason: "created but not visible in metadata".into(),
                }
            })
        }
        None => Err(BenchError::TopicMissing(cfg.topic.clone())),
    }
}

/// Turns a phase abort into the one-line error the user sees.
fn check_abort(res: &PhaseResult) -> Result<()> {
    match &res.abort {
        Some(reason) => Err(BenchError::AllRejected {
            reason: reason.clone(),
            failed: res.produce.iter().map(|p| p.failed + p.warmup_failed).sum(),
        }),
        None => Ok(()),
    }
}

/// Merges every producer's acknowledged set into the validator.
pub(crate) fn merge_acks(validator: &Arc<Mutex<Validator>>, produce: &[ProduceStats]) {
    let mut v = validator.lock().unwrap_or_else(|p| p.into_inner());
    for (i, p) in produce.iter().enumerate() {
        if let Some(acked) = &p.acked {
            v.acknowledge_all(i as u32, acked);
        }
    }
}

/// Takes the finished validation report out of the shared validator.
pub(crate) fn finish_validation(
    validator: Arc<Mutex<Validator>>,
) -> Option<crate::validate::ValidationReport> {
    Arc::into_inner(validator).map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).finish())
}

fn produce_mode(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    stop: &AtomicBool,
    factory: &Arc<MessageFactory>,
    partitions: &[i32],
    report: &mut RunReport,
) -> Result<()> {
    let spec = PhaseSpec {
        name: "produce",
        producers: producer_plans(
            cfg.concurrency,
            cfg.message_count,
            cfg.rate_limit,
            cfg.warmup,
            cfg.measured_limit(),
        ),
        consumers: Vec::new(),
        track_acks: cfg.validate,
        validator: None,
        record_latency: false,
        drain: false,
    };
    let res = run_measured_phase(cfg, sup, spec, factory, stop, report)?;
    report.produce = Some(summarize_produce(
        &res.produce,
        cfg.warmup.as_nanos() as u64,
    ));
    check_abort(&res)?;
    if cfg.validate {
        if res.interrupted {
            report
                .notes
                .push("validation skipped: run interrupted".into());
            return Ok(());
        }
        let validator = Arc::new(Mutex::new(Validator::new(
            validation_policy(cfg),
            Arc::clone(factory),
        )));
        merge_acks(&validator, &res.produce);
        verify_phase(cfg, sup, stop, factory, partitions, &validator, report)?;
        report.validation = finish_validation(validator);
    }
    Ok(())
}

/// Reads the whole topic back (up to the current end offsets) through the validator.
pub(crate) fn verify_phase(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    stop: &AtomicBool,
    factory: &Arc<MessageFactory>,
    partitions: &[i32],
    validator: &Arc<Mutex<Validator>>,
    report: &mut RunReport,
) -> Result<()> {
    let md = client::metadata_client(cfg)?;
    let wm = client::watermarks(&md, &cfg.topic, partitions, cfg.timeout)?;
    let ends: std::collections::HashMap<i32, i64> = wm.iter().map(|&(p, _, hi)| (p, hi)).collect();
    let starts: Vec<(i32, i64)> = wm.iter().map(|&(p, lo, _)| (p, lo)).collect();
    let n = cfg.concurrency.min(starts.len()).max(1);
    let consumers = spread(&starts, n)
        .into_iter()
        .map(|assignment| ConsumerPlan {
            assignment,
            end_offsets: Some(ends.clone()),
            measure_from_ns: 0,
            deadline: Some(VERIFY_LIMIT),
            target_total: None,
        })
        .collect();
    let spec = PhaseSpec {
        name: "verify",
        producers: Vec::new(),
        consumers,
        track_acks: false,
        validator: Some(Arc::clone(validator)),
        record_latency: false,
        drain: false,
    };
    let res = run_phase(cfg, sup, spec, factory, stop)?;
    report.interrupted |= res.interrupted;
    if res.idle_stopped {
        report.notes.push(format!(
            "verification stopped: no progress for {IDLE_STOP:?} before reaching the end offsets"
        ));
    }
    Ok(())
}

fn consume_mode(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    stop: &AtomicBool,
    factory: &Arc<MessageFactory>,
    partitions: &[i32],
    report: &mut RunReport,
) -> Result<()> {
    let md = client::metadata_client(cfg)?;
    let wm = client::watermarks(&md, &cfg.topic, partitions, cfg.timeout)?;
    let available: i64 = wm.iter().map(|&(_, lo, hi)| hi - lo).sum();
    let validator = cfg.validate.then(|| {
        Arc::new(Mutex::new(Validator::new(
            validation_policy(cfg),
            Arc::clone(factory),
        )))
    });
    // Validation needs data this run wrote (it knows what to expect); otherwise fill only
    // an empty topic.
    if cfg.validate || available == 0 {
        let count = cfg.message_count.unwrap_or(cfg.fill_count);
        let spec = PhaseSpec {
            name: "fill",
            producers: producer_plans(
                cfg.concurrency.min(4),
                Some(count),
                None,
                Duration::ZERO,
                Some(FILL_LIMIT),
            ),
            consumers: Vec::new(),
            track_acks: cfg.validate,
            validator: None,
            record_latency: false,
            drain: false,
        };
        let res = run_phase(cfg, sup, spec, factory, stop)?;
        check_abort(&res)?;
        if let Some(v) = &validator {
            merge_acks(v, &res.produce);
        }
        let filled: u64 = res.produce.iter().map(|p| p.delivered).sum();
        report.notes.push(format!(
            "filled the topic with {filled} messages before consuming"
        ));
        if res.interrupted {
            report.interrupted = true;
            return Ok(());
        }
    }
    let wm = client::watermarks(&md, &cfg.topic, partitions, cfg.timeout)?;
    let ends: std::collections::HashMap<i32, i64> = wm.iter().map(|&(p, _, hi)| (p, hi)).collect();
    let starts: Vec<(i32, i64)> = wm.iter().map(|&(p, lo, _)| (p, lo)).collect();
    if cfg.concurrency > starts.len() {
        report.notes.push(format!(
            "{} consumers for {} partition(s): {} consumer(s) idle",
            cfg.concurrency,
            starts.len(),
            cfg.concurrency - starts.len()
        ));
    }
    let consumers = spread(&starts, cfg.concurrency)
        .into_iter()
        .map(|assignment| ConsumerPlan {
            assignment,
            end_offsets: Some(ends.clone()),
            measure_from_ns: cfg.warmup.as_nanos() as u64,
            deadline: cfg.measured_limit(),
            target_total: cfg.message_count,
        })
        .collect();
    let spec = PhaseSpec {
        name: "consume",
        producers: Vec::new(),
        consumers,
        track_acks: false,
        validator: validator.clone(),
        record_latency: false,
        drain: false,
    };
    let res = run_measured_phase(cfg, sup, spec, factory, stop, report)?;
    let warm: u64 = res.consume.iter().map(|c| c.warmup_consumed).sum();
    if warm > 0 && res.consume.iter().all(|c| c.consumed == 0) {
        report.notes.push(format!(
            "all {warm} messages were read during the warm-up; use -w 0 or a larger topic"
        ));
    }
    report.consume = Some(summarize_consume(
        &res.consume,
        cfg.warmup.as_nanos() as u64,
        true,
    ));
    if let Some(v) = validator {
        let consumed: u64 = res
            .consume
            .iter()
            .map(|c| c.consumed + c.warmup_consumed)
            .sum();
        let expected: i64 = wm.iter().map(|&(_, lo, hi)| hi - lo).sum();
        // A run cut short by -d/-n or Ctrl-C did not read everything: unread is not lost.
        if (consumed as i64) < expected {
            report.notes.push(
                "consume run ended before the topic was drained: 'lost' includes unread messages"
                    .into(),
            );
        }
        report.validation = finish_validation(v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_exact() {
        assert_eq!(
            (0..3).map(|i| split(10, 3, i)).collect::<Vec<_>>(),
            vec![4, 3, 3]
        );
        assert_eq!((0..4).map(|i| split(2, 4, i)).sum::<u64>(), 2);
    }

    #[test]
    fn produce_summary_counts_only_acknowledged() {
        let mut a = ProduceStats {
            enqueued: 10,
            delivered: 7,
            failed: 1,
            delivered_bytes: 7 * 1024,
            last_delivery_ns: 2_000_000_000,
            ..ProduceStats::default()
        };
        a.errors.add("MessageTimedOut");
        for v in 1..=7 {
            a.latency.record_us(v * 100);
        }
        let s = summarize_produce(&[a], 1_000_000_000);
        assert_eq!(s.attempted, 10);
        assert_eq!(s.delivered, 7);
        assert_eq!(s.elapsed_s, 1.0);
        assert_eq!(s.msgs_per_sec, 7.0);
        assert_eq!(s.success_rate, 7.0 / 8.0);
        assert_eq!(s.errors.total(), 1);
        assert_eq!(s.latency_us.map(|l| l.count), Some(7));
    }

    #[test]
    fn empty_summary_is_zero_not_nan() {
        let s = summarize_produce(&[], 0);
        assert_eq!((s.msgs_per_sec, s.success_rate), (0.0, 0.0));
        let c = summarize_consume(&[], 0, true);
        assert_eq!(c.msgs_per_sec, 0.0);
    }
}
