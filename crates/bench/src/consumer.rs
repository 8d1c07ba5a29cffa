//! One consumer: a librdkafka instance with a manual partition assignment (no consumer group,
//! so no rebalance delay and nothing the broker must coordinate), driven by its own thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{consumer_config, error_code_name};
use crate::config::RunConfig;
use crate::error::{BenchError, Result};
use crate::payload::MessageFactory;
use crate::stats::{ConsumeStats, Shared, StartGate};
use crate::validate::Validator;

/// Poll timeout: short enough that stop flags are noticed quickly.
const POLL: Duration = Duration::from_millis(100);

/// What one consumer does.
#[derive(Clone, Debug, Default)]
pub struct ConsumerPlan {
    /// (partition, start offset) pairs to read.
    pub assignment: Vec<(i32, i64)>,
    /// Stop reading a partition once this offset (exclusive) is reached; all done = exit.
    pub end_offsets: Option<HashMap<i32, i64>>,
    /// Messages consumed before this (ns since epoch) are warm-up.
    pub measure_from_ns: u64,
    /// Hard stop this long after the epoch.
    pub deadline: Option<Duration>,
    /// Exit when the shared counter of measured messages reaches this.
    pub target_total: Option<u64>,
}

/// Everything a consumer thread shares with the runner.
pub struct ConsumerShared<'a> {
    /// Set to stop this consumer.
    pub stop: &'a AtomicBool,
    /// Measured messages consumed by all consumers.
    pub total: &'a AtomicU64,
    /// Message builder of the run (for headers and validation).
    pub factory: Arc<MessageFactory>,
    /// Validator, when validating.
    pub validator: Option<Arc<Mutex<Validator>>>,
    /// Record produce-to-consume latency from message headers.
    pub record_latency: bool,
}

/// Reads until a stop condition holds. Never blocks longer than one poll past a stop.
pub fn run_consumer(
    cfg: &RunConfig,
    plan: &ConsumerPlan,
    gate: &StartGate,
    shared: &ConsumerShared<'_>,
    stats: Shared<ConsumeStats>,
) -> Result<()> {
    if plan.assignment.is_empty() {
        // Still pass the gate so the phase does not wait for this consumer.
        gate.arrive_and_wait(shared.stop);
        return Ok(());
    }
    let consumer: BaseConsumer = consumer_config(cfg)
        .create()
        .map_err(|e| BenchError::Client(e.to_string()))?;
    let mut tpl = TopicPartitionList::new();
    for &(p, off) in &plan.assignment {
        tpl.add_partition_offset(&cfg.topic, p, Offset::Offset(off))
            .map_err(|e| BenchError::Client(e.to_string()))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| BenchError::Client(format!("assign: {e}")))?;

    // Connect before the clock starts (see StartGate).
    let _ = consumer.fetch_metadata(Some(&cfg.topic), cfg.timeout);
    let Some(epoch) = gate.arrive_and_wait(shared.stop) else {
        return Ok(());
    };
    let deadline = plan.deadline.map(|d| epoch + d);
    // Partitions still to read up to their end offset (empty start ranges are done already).
    let mut pending: HashMap<i32, i64> = match &plan.end_offsets {
        Some(ends) => plan
            .assignment
            .iter()
            .filter_map(|&(p, start)| ends.get(&p).filter(|&&e| e > start).map(|&e| (p, e)))
            .collect(),
        None => HashMap::new(),
    };
    if plan.end_offsets.is_some() && pending.is_empty() {
        return Ok(());
    }

    loop {
        if shared.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if plan
            .target_total
            .is_some_and(|t| shared.total.load(Ordering::Relaxed) >= t)
        {
            break;
        }
        let msg = match consumer.poll(POLL) {
            None => continue,
            Some(Err(e)) => {
                stats.lock().errors.add(&error_code_name(&e));
                continue;
            }
            Some(Ok(m)) => m,
        };
        let now_ns = epoch.elapsed().as_nanos() as u64;
        let value = msg.payload().unwrap_or(&[]);
        let key = msg.key();
        let (partition, offset) = (msg.partition(), msg.offset());
        if let Some(v) = &shared.validator {
            v.lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(partition, offset, key, value);
        }
        {
            let mut s = stats.lock();
            if now_ns >= plan.measure_from_ns {
                s.consumed += 1;
                s.consumed_bytes += (value.len() + key.map_or(0, <[u8]>::len)) as u64;
                s.last_message_ns = now_ns;
                s.first_message_ns.get_or_insert(now_ns);
                shared.total.fetch_add(1, Ordering::Relaxed);
                if shared.record_latency {
                    if let Some(h) = shared.factory.header(value) {
                        // Only messages sent after warm-up count (their send time is in the header).
                        if h.send_ts_ns >= plan.measure_from_ns {
                            s.latency.record_ns(now_ns.saturating_sub(h.send_ts_ns));
                        }
                    }
                }
            } else {
                s.warmup_consumed += 1;
            }
        }
        if let Some(end) = pending.get(&partition) {
            if offset + 1 >= *end {
                pending.remove(&partition);
                if pending.is_empty() {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Spreads partitions round-robin over `consumers` consumers.
pub fn spread(partitions: &[(i32, i64)], consumers: usize) -> Vec<Vec<(i32, i64)>> {
    let mut out = vec![Vec::new(); consumers.max(1)];
    for (i, &p) in partitions.iter().enumerate() {
        out[i % consumers.max(1)].push(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_round_robin() {
        let parts = [(0, 0), (1, 5), (2, 0)];
        let s = spread(&parts, 2);
        assert_eq!(s, vec![vec![(0, 0), (2, 0)], vec![(1, 5)]]);
        let s = spread(&parts, 5);
        assert_eq!(s.iter().filter(|a| a.is_empty()).count(), 2);
    }
}
