//! `spate-bench consume`: a long-running consumer group member (or several) that reads until
//! stopped and serves what it sees on a Prometheus endpoint: records and bytes consumed per
//! topic, lag per partition (from librdkafka's statistics), and end-to-end latency (now minus
//! each record's timestamp) as a histogram.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{Message, Timestamp};
use rdkafka::{ClientContext, Statistics};

use crate::error::{BenchError, Result};

/// Upper bounds (seconds) of the end-to-end latency histogram's buckets.
pub const LATENCY_BUCKETS_S: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// What `spate-bench consume` is asked to do.
#[derive(Clone, Debug)]
pub struct FollowConfig {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// Consumer group id.
    pub group: String,
    /// Group members in this process (one thread each).
    pub consumers: usize,
    /// Where to serve /metrics.
    pub prometheus: SocketAddr,
    /// Stop after this long; `None` runs until Ctrl-C.
    pub duration: Option<Duration>,
    /// Where a group without committed offsets starts: earliest or latest.
    pub start: String,
    /// How often progress is printed and lag refreshed.
    pub report_interval: Duration,
    /// Extra librdkafka properties, applied last.
    pub extra: Vec<(String, String)>,
}

/// Counters shared by the members and the endpoint. Updated with relaxed atomic adds.
#[derive(Default)]
pub struct FollowMetrics {
    consumed: Mutex<BTreeMap<String, Arc<TopicCounters>>>,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS_S.len() + 1],
    latency_sum_us: AtomicU64,
    latency_count: AtomicU64,
    errors: AtomicU64,
    /// (topic, partition) -> lag in records, from the latest statistics of its owner.
    lag: Mutex<BTreeMap<(String, i32), i64>>,
}

#[derive(Default)]
struct TopicCounters {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl FollowMetrics {
    fn topic(&self, topic: &str) -> Arc<TopicCounters> {
        let mut m = self.consumed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = m.get(topic) {
            return c.clone();
        }
        let c = Arc::new(TopicCounters::default());
        m.insert(topic.to_owned(), c.clone());
        c
    }

    /// Records one end-to-end latency.
    pub fn observe_latency(&self, seconds: f64) {
        let i = LATENCY_BUCKETS_S
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(LATENCY_BUCKETS_S.len());
        self.latency_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us
            .fetch_add((seconds.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records consumed so far, all topics.
    pub fn consumed_total(&self) -> u64 {
        self.consumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|c| c.records.load(Ordering::Relaxed))
            .sum()
    }

    /// Sum of the lag of every partition this process owns.
    pub fn lag_total(&self) -> i64 {
        self.lag
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        };
        family(
            "spate_bench_consumed_records_total",
            "counter",
            "Records consumed by this group's members in this process.",
        );
        let topics: Vec<(String, Arc<TopicCounters>)> = self
            .consumed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut body = String::new();
        for (t, c) in &topics {
            body.push_str(&format!(
                "spate_bench_consumed_records_total{{topic=\"{t}\"}} {}\n",
                c.records.load(Ordering::Relaxed)
            ));
        }
        out.push_str(&body);
        out.push_str("# HELP spate_bench_consumed_bytes_total Key and value bytes consumed.\n# TYPE spate_bench_consumed_bytes_total counter\n");
        for (t, c) in &topics {
            out.push_str(&format!(
                "spate_bench_consumed_bytes_total{{topic=\"{t}\"}} {}\n",
                c.bytes.load(Ordering::Relaxed)
            ));
        }
        out.push_str("# HELP spate_bench_consumer_lag_records Records between a partition's high watermark and this group's position, per owned partition.\n# TYPE spate_bench_consumer_lag_records gauge\n");
        for ((t, p), lag) in self.lag.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            out.push_str(&format!(
                "spate_bench_consumer_lag_records{{topic=\"{t}\",partition=\"{p}\"}} {lag}\n"
            ));
        }
        out.push_str("# HELP spate_bench_end_to_end_latency_seconds Consume time minus the record's timestamp.\n# TYPE spate_bench_end_to_end_latency_seconds histogram\n");
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_S.iter().enumerate() {
            cumulative += self.latency_buckets[i].load(Ordering::Relaxed);
            out.push_str(&format!(
                "spate_bench_end_to_end_latency_seconds_bucket{{le=\"{b}\"}} {cumulative}\n"
            ));
        }
        cumulative += self.latency_buckets[LATENCY_BUCKETS_S.len()].load(Ordering::Relaxed);
        out.push_str(&format!(
            "spate_bench_end_to_end_latency_seconds_bucket{{le=\"+Inf\"}} {cumulative}\n"
        ));
        out.push_str(&format!(
            "spate_bench_end_to_end_latency_seconds_sum {:.6}\nspate_bench_end_to_end_latency_seconds_count {}\n",
            self.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6,
            self.latency_count.load(Ordering::Relaxed)
        ));
        out.push_str(&format!(
            "# HELP spate_bench_consumer_errors_total Errors polled from the consumer.\n# TYPE spate_bench_consumer_errors_total counter\nspate_bench_consumer_errors_total {}\n",
            self.errors.load(Ordering::Relaxed)
        ));
        out
    }
}

/// Takes each member's librdkafka statistics: the lag of the partitions it owns.
struct LagContext {
    metrics: Arc<FollowMetrics>,
}

impl ClientContext for LagContext {
    fn stats(&self, stats: Statistics) {
        let mut lag = self.metrics.lag.lock().unwrap_or_else(|p| p.into_inner());
        for (name, t) in &stats.topics {
            for (p, ps) in &t.partitions {
                // -1 is librdkafka's internal UA partition; consumer_lag -1 means unknown.
                if *p < 0 {
                    continue;
                }
                let key = (name.clone(), *p);
                if ps.fetch_state == "active" && ps.consumer_lag >= 0 {
                    lag.insert(key, ps.consumer_lag);
                } else if ps.fetch_state == "active"
                    && ps.hi_offset >= 0
                    && ps.hi_offset == ps.lo_offset
                {
                    // An empty partition has no position to measure from: nothing to read.
                    lag.insert(key, 0);
                } else if ps.fetch_state == "none" {
                    lag.remove(&key);
                }
            }
        }
    }
}

impl ConsumerContext for LagContext {}

fn member(cfg: &FollowConfig, metrics: Arc<FollowMetrics>) -> Result<BaseConsumer<LagContext>> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.bootstrap)
        .set("group.id", &cfg.group)
        .set("auto.offset.reset", &cfg.start)
        .set("enable.auto.commit", "true")
        .set("enable.partition.eof", "false")
        .set(
            "statistics.interval.ms",
            cfg.report_interval
                .as_millis()
                .clamp(100, 60_000)
                .to_string(),
        );
    for (k, v) in &cfg.extra {
        c.set(k, v);
    }
    let consumer: BaseConsumer<LagContext> = c
        .create_with_context(LagContext { metrics })
        .map_err(|e| BenchError::Client(e.to_string()))?;
    let topics: Vec<&str> = cfg.topics.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| BenchError::Client(format!("subscribe: {e}")))?;
    Ok(consumer)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs the group members until `stop` is set or the duration passes, serving /metrics,
/// printing a line per report interval; returns the metrics at the end.
pub fn run(cfg: &FollowConfig, stop: &AtomicBool) -> Result<Arc<FollowMetrics>> {
    if cfg.topics.is_empty() {
        return Err(BenchError::Config("consume: no topic given".into()));
    }
    let metrics = Arc::new(FollowMetrics::default());
    let served = Arc::new(AtomicBool::new(false));
    let render = {
        let m = metrics.clone();
        Arc::new(move || m.render()) as crate::prometheus::Render
    };
    let endpoint = crate::prometheus::serve_with(cfg.prometheus, render, served.clone())?;
    eprintln!(
        "spate-bench consume: group {} on {} ({} member(s)); metrics at http://{}/metrics",
        cfg.group,
        cfg.topics.join(","),
        cfg.consumers,
        cfg.prometheus
    );
    let started = Instant::now();
    let deadline = cfg.duration.map(|d| started + d);
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for _ in 0..cfg.consumers.max(1) {
            let consumer = member(cfg, metrics.clone())?;
            let metrics = metrics.clone();
            let done = &done;
            handles.push(s.spawn(move || {
                let mut last: Option<(String, Arc<TopicCounters>)> = None;
                while !done.load(Ordering::Relaxed) {
                    let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let m = match m {
                        Ok(m) => m,
                        Err(_) => {
                            metrics.errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    // The counters of the last topic seen are kept, so the common case takes
                    // no lock.
                    let counters = match &last {
                        Some((t, c)) if t == m.topic() => c.clone(),
                        _ => {
                            let c = metrics.topic(m.topic());
                            last = Some((m.topic().to_owned(), c.clone()));
                            c
                        }
                    };
                    counters.records.fetch_add(1, Ordering::Relaxed);
                    let bytes = m.payload_len() + m.key().map_or(0, <[u8]>::len);
                    counters.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                    if let Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) = m.timestamp() {
                        metrics.observe_latency((now_ms() - t) as f64 / 1e3);
                    }
                }
                // Leaves the group now, so the others take its partitions at once.
                consumer.unsubscribe();
            }));
        }
        let mut prev = 0;
        let mut next = started + cfg.report_interval;
        loop {
            if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            if Instant::now() >= next {
                next += cfg.report_interval;
                let total = metrics.consumed_total();
                eprintln!(
                    "[{:>6.1}s] consumed {total} (+{}), lag {}",
                    started.elapsed().as_secs_f64(),
                    total - prev,
                    metrics.lag_total()
                );
                prev = total;
            }
        }
        done.store(true, Ordering::SeqCst);
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    });
    served.store(true, Ordering::SeqCst);
    let _ = endpoint.join();
    result?;
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_cumulative_buckets() {
        let m = FollowMetrics::default();
        m.observe_latency(0.0015);
        m.observe_latency(0.3);
        m.observe_latency(1000.0);
        m.topic("t").records.fetch_add(3, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("spate_bench_end_to_end_latency_seconds_bucket{le=\"0.001\"} 0\n"));
        assert!(text.contains("spate_bench_end_to_end_latency_seconds_bucket{le=\"0.002\"} 1\n"));
        assert!(text.contains("spate_bench_end_to_end_latency_seconds_bucket{le=\"0.5\"} 2\n"));
        assert!(text.contains("spate_bench_end_to_end_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("spate_bench_end_to_end_latency_seconds_count 3\n"));
        assert!(text.contains("spate_bench_consumed_records_total{topic=\"t\"} 3\n"));
    }
}
