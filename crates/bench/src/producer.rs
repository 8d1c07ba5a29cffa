//! One producer: a librdkafka instance driven by its own thread. Latency is enqueue to
//! delivery report; only successful delivery reports count as delivered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::types::RDKafkaErrorCode;

use crate::client::{error_code_name, producer_config};
use crate::config::RunConfig;
use crate::error::{BenchError, Result};
use crate::payload::{KeyBuf, MessageFactory};
use crate::stats::{ProduceStats, Shared, StartGate};
use crate::validate::SeqSet;

/// Serve delivery reports every this many sends so the report queue never grows large.
const POLL_EVERY: u64 = 256;
/// How long one producer may wait for outstanding delivery reports after it stops sending.
const MIN_FLUSH: Duration = Duration::from_secs(10);
/// A rate-limited producer sleeps only once it is this far ahead of its schedule, and sends
/// what is due in between (as Kafka's own perf tool's throttler does, with 2 ms). Sleeping
/// before every message instead cost 1.5 of this machine's 2 cores in nanosleep wake-ups at
/// 100,000 msg/s, starving the broker being measured and piling seconds of queue into the
/// client.
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// What one producer does.
#[derive(Clone, Debug)]
pub struct ProducerPlan {
    /// Producer id (0-based), written into message headers.
    pub id: u32,
    /// Measured messages to send (None = until the deadline).
    pub quota: Option<u64>,
    /// Messages per second for this producer.
    pub rate: Option<f64>,
    /// Stop sending this long after the epoch.
    pub end: Option<Duration>,
    /// Messages enqueued before this (ns since epoch) are warm-up and not measured.
    pub measure_from_ns: u64,
}

/// Delivery-report handler; owns nothing but a handle to the producer's stats.
struct ReportContext {
    stats: Shared<ProduceStats>,
    gate: Arc<StartGate>,
    measure_from_ns: u64,
    factory: Arc<MessageFactory>,
}

impl ClientContext for ReportContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // Connection-level trouble (e.g. all brokers down); kept for the final message.
        self.stats.lock().last_client_error = Some(format!("{error}: {reason}"));
    }

    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {
        // librdkafka logs are noise on a benchmark's terminal; errors arrive via `error`.
    }
}

impl ProducerContext for ReportContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, enqueued_ns: usize) {
        // Reports only arrive for messages sent after the gate opened.
        let now_ns = self
            .gate
            .epoch()
            .map_or(0, |e| e.elapsed().as_nanos() as u64);
        let enqueued_ns = enqueued_ns as u64;
        let measured = enqueued_ns >= self.measure_from_ns;
        let mut s = self.stats.lock();
        match result {
            Ok(msg) => {
                if measured {
                    s.delivered += 1;
                    s.delivered_bytes += (msg.payload_len() + msg.key_len()) as u64;
                    s.latency.record_ns(now_ns.saturating_sub(enqueued_ns));
                    s.last_delivery_ns = now_ns;
                } else {
                    s.warmup_delivered += 1;
                }
                if s.acked.is_some() {
                    if let Some(h) = msg.payload().and_then(|p| self.factory.header(p)) {
                        if let Some(acked) = s.acked.as_mut() {
                            acked.insert(h.seq);
                        }
                    }
                }
            }
            Err((e, _)) => {
                if measured {
                    s.failed += 1;
                    s.errors.add(&error_code_name(e));
                } else {
                    s.warmup_failed += 1;
                }
                s.last_client_error = Some(e.to_string());
            }
        }
    }
}

/// Serves every delivery report waiting, without blocking. `poll(Duration::ZERO)` serves one
/// event (the reports of one produce response) per call: called once per message sent, it
/// served reports no faster than messages were sent, so a backlog from any hiccup never
/// drained and showed as seconds of latency that no broker caused.
fn serve_reports(producer: &BaseProducer<ReportContext>) {
    // Bounded so a producer always gets back to sending.
    for _ in 0..10_000 {
        let before = producer.in_flight_count();
        producer.poll(Duration::ZERO);
        if producer.in_flight_count() == before {
            return;
        }
    }
}

/// Runs one producer to completion: send until the plan's limits, then wait (bounded) for
/// every outstanding delivery report. Messages still unacknowledged after that are purged
/// and counted as failed.
pub fn run_producer(
    cfg: &RunConfig,
    plan: &ProducerPlan,
    factory: Arc<MessageFactory>,
    gate: &Arc<StartGate>,
    stop: &AtomicBool,
    stats: Shared<ProduceStats>,
    track_acks: bool,
) -> Result<()> {
    if track_acks {
        stats.lock().acked = Some(SeqSet::default());
    }
    let ctx = ReportContext {
        stats: stats.clone(),
        gate: Arc::clone(gate),
        measure_from_ns: plan.measure_from_ns,
        factory: Arc::clone(&factory),
    };
    let producer: BaseProducer<ReportContext> = producer_config(cfg)
        .create_with_context(ctx)
        .map_err(|e| BenchError::Client(e.to_string()))?;

    // Connect (and learn the partition leaders) before the clock starts; a failure here
    // shows up as failed deliveries, which is where it belongs.
    let _ = producer
        .client()
        .fetch_metadata(Some(&cfg.topic), cfg.timeout);
    let Some(epoch) = gate.arrive_and_wait(stop) else {
        return Ok(());
    };
    let end = plan.end.map(|d| epoch + d);
    let mut scratch = Vec::with_capacity(factory.message_size());
    let mut key_buf = KeyBuf::default();
    let interval = plan
        .rate
        .map(|r| Duration::from_secs_f64(1.0 / r.max(1e-3)));
    let mut next_due = Instant::now();
    let mut seq = 0u64;
    let mut measured_sent = 0u64;
    let mut published = 0u64;

    'send: loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut now = Instant::now();
        if end.is_some_and(|end| now >= end) {
            break;
        }
        if plan.quota.is_some_and(|q| measured_sent >= q) {
            break;
        }
        if let Some(iv) = interval {
            if next_due > now && next_due - now >= MIN_SLEEP {
                // Waiting in poll serves delivery reports the moment they arrive; short
                // slices keep Ctrl-C and deadlines responsive.
                producer.poll((next_due - now).min(Duration::from_millis(5)));
                continue;
            }
            // A producer that fell more than a second behind does not burst to catch up.
            next_due = if now.saturating_duration_since(next_due) > Duration::from_secs(1) {
                now + iv
            } else {
                next_due + iv
            };
        }
        let mut ts_ns = now.duration_since(epoch).as_nanos() as u64;
        let key = factory.key(plan.id, seq, &mut key_buf);
        loop {
            // Without a header this borrows the pool (no copy); with one it is one memcpy.
            let value = factory.value(plan.id, seq, ts_ns, key, &mut scratch);
            let mut record =
                BaseRecord::<[u8], [u8], usize>::with_opaque_to(&cfg.topic, ts_ns as usize)
                    .payload(value);
            if let Some(k) = key {
                record = record.key(k);
            }
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    // Back-pressure from the client queue: serve reports, then retry with a
                    // fresh timestamp so queueing inside our own loop is not hidden.
                    producer.poll(Duration::from_millis(5));
                    now = Instant::now();
                    if stop.load(Ordering::Relaxed) || end.is_some_and(|end| now >= end) {
                        break 'send;
                    }
                    ts_ns = now.duration_since(epoch).as_nanos() as u64;
                }
                Err((e, _)) => {
                    let mut s = stats.lock();
                    if ts_ns >= plan.measure_from_ns {
                        s.failed += 1;
                        s.rejected += 1;
                        s.errors.add(&error_code_name(&e));
                    } else {
                        s.warmup_failed += 1;
                    }
                    s.last_client_error = Some(e.to_string());
                    break;
                }
            }
        }
        seq += 1;
        if ts_ns >= plan.measure_from_ns {
            measured_sent += 1;
        }
        if seq.is_multiple_of(POLL_EVERY) {
            serve_reports(&producer);
            stats.lock().enqueued += measured_sent - published;
            published = measured_sent;
        }
    }
    stats.lock().enqueued += measured_sent - published;

    // Wait (bounded) for outstanding reports, also after Ctrl-C: they decide what counts.
    let flush_for = cfg.timeout.max(MIN_FLUSH);
    let deadline = Instant::now() + flush_for;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        producer.poll(Duration::from_millis(50));
    }
    if producer.in_flight_count() > 0 {
        // Purged messages get failed delivery reports (PurgeQueue / PurgeInflight), so they
        // are counted as failed rather than silently forgotten.
        producer.purge(PurgeConfig::default().queue().inflight());
        let _ = producer.flush(Duration::from_secs(1));
    }
    Ok(())
}
