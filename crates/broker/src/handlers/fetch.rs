//! Fetch: read whole batches from the logs, long-polling until `min_bytes` are available or
//! `max_wait_ms` passes. Incremental fetch sessions (KIP-227, `fetch_sessions`) cut what an
//! unchanged partition costs a fetch to nothing on the wire.
//!
//! Memory: a response is at most the broker's `fetch.max.bytes` (and the client's `max_bytes`
//! and per-partition `partition_max_bytes`, each clamped to 0..=fetch.max.bytes), plus the one
//! whole batch KIP-74 lets the first partition exceed by. Before reading, a fetch takes that
//! much from the memory budget (at most half the budget, so one fetch cannot take it all),
//! gives back what it did not read, and holds the rest until its response is written. When
//! the budget is spent the fetch waits for memory, at most until its max_wait, and then
//! answers without records; it never reads more than it holds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::select_all;
use spate_log::LogError;
use spate_protocol::batch::Batches;
use spate_protocol::messages::fetch_request::FetchPartition;
use spate_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use spate_protocol::messages::{ApiKey, FetchRequest, FetchResponse};
use spate_protocol::ResponseError;
use tokio::sync::watch;

use crate::budget::Permit;
use crate::fetch_sessions::Begun;
use crate::partition::{Partition, Role};
use crate::registry::Topic;
use crate::replica;
use crate::topology::Topology;
use crate::Broker;

/// Upper bound on how long a fetch may wait, whatever the client asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(60);
/// A fetch reserves at least this much (the default max.message.bytes, rounded down to 1 MiB),
/// so the one batch KIP-74 lets it return past a small `max_bytes` is normally covered.
const MIN_RESERVE_BYTES: usize = 1 << 20;

/// A requested partition, resolved once.
struct Slot {
    topic: usize,
    partition: Option<Arc<Partition>>,
    index: i32,
    fetch_offset: i64,
    max_bytes: usize,
    current_leader_epoch: i32,
    /// A follower's fetch: reads up to the log end, not the high watermark.
    replica: bool,
    /// A read_committed consumer: reads up to the last stable offset, and is told which
    /// transactions aborted so it drops their records.
    committed: bool,
    /// A follower's fetch of a replica under the leader-side replication throttle.
    throttled: bool,
    /// Throttled with the rate used up: answered without records this time.
    held: bool,
    /// Error found while resolving (unknown topic or partition).
    error: Option<ResponseError>,
}

/// A fetch resolved against the registry, not yet read.
pub struct Prepared {
    version: i16,
    /// The fetch session the request belongs to, if any.
    session: Begun,
    /// Answer at once with this top-level error (an unknown fetch session or a wrong epoch).
    refused: Option<ResponseError>,
    topics: Vec<FetchableTopicResponse>,
    handles: Vec<Option<Arc<Topic>>>,
    slots: Vec<Slot>,
    limits: Bounds,
    min_bytes: usize,
    wait: Duration,
}

impl Prepared {
    /// Memory to take before the fetch starts, when it has records to read right away: the
    /// connection takes it before reading its next request, which is where waiting for
    /// memory cannot hold up anything queued behind the fetch. A fetch with nothing to read
    /// yet takes memory only when records arrive during its long poll.
    pub fn memory_wanted(&self) -> Option<usize> {
        (self.refused.is_none() && self.slots.iter().any(has_data)).then_some(self.limits.reserve)
    }
}

/// Resolves a fetch's topics and partitions and works out its limits.
pub fn prepare(
    b: &Broker,
    who: Option<&crate::security::Session>,
    version: i16,
    mut req: FetchRequest,
) -> Prepared {
    let fetch_max = b.config.fetch_max_bytes;
    // A session's incremental fetch is served for every partition of the session.
    let (session, refused) = match b.fetch_sessions.begin(&mut req, version) {
        Ok(begun) => (begun, None),
        Err(e) => (Begun::Sessionless, Some(e)),
    };
    let mut topics = Vec::with_capacity(req.topics.len());
    let mut handles = Vec::with_capacity(req.topics.len());
    let mut slots = Vec::new();
    let mut partition_max = Vec::new();
    let replica_id = if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    };
    let replica = (replica_id >= 0).then_some(replica_id);
    let topology = b.topology();
    // A follower's fetch with a leader-side replication throttle set.
    let leader_throttle = replica.and_then(|_| topology.leader_throttle_rate());
    let now_ms = b.clock.monotonic_ms().max(0) as u64;
    // ACLs: a follower needs ClusterAction on the cluster, a consumer Read on each topic.
    use spate_auth::acl::{Operation, ResourceType, CLUSTER_NAME};
    let follower_allowed = replica.is_none()
        || b.authorizer.allows(
            who,
            Operation::ClusterAction,
            ResourceType::Cluster,
            CLUSTER_NAME,
        );
    for (ti, ft) in req.topics.iter().enumerate() {
        if refused.is_some() {
            break;
        }
        let mut tr = FetchableTopicResponse::default();
        let topic = if version >= 13 {
            tr.topic_id = ft.topic_id;
            b.topics.get_by_id(&ft.topic_id)
        } else {
            tr.topic = ft.topic.clone();
            b.topics.get(&ft.topic)
        };
        topics.push(tr);
        handles.push(topic.clone());
        let denied = match &topic {
            Some(t) if replica.is_some() => !follower_allowed && !t.name.is_empty(),
            Some(t) => !b
                .authorizer
                .allows(who, Operation::Read, ResourceType::Topic, &t.name),
            None => false,
        };
        for fp in &ft.partitions {
            let partition = topic.as_ref().and_then(|t| t.partition(fp.partition));
            let error = match (&topic, &partition) {
                _ if denied && replica.is_some() => Some(ResponseError::ClusterAuthorizationFailed),
                _ if denied => Some(ResponseError::TopicAuthorizationFailed),
                (None, _) if version >= 13 => Some(ResponseError::UnknownTopicId),
                (None, _) => Some(ResponseError::UnknownTopicOrPartition),
                (Some(t), None) => t.lookup(fp.partition).err(),
                (Some(t), Some(p)) => admit(&topology, t, p, replica, fp, now_ms),
            };
            partition_max.push(fp.partition_max_bytes);
            let mut max_bytes = clamp_limit(fp.partition_max_bytes, fetch_max);
            // As Kafka: a throttle never slows a replica in the ISR (it would hold back the
            // high watermark and could drop the replica from the ISR); it is for replicas
            // catching up, such as a reassignment's new ones.
            let budget = match (leader_throttle, &topic, &partition, replica) {
                (Some(rate), Some(t), Some(p), Some(follower))
                    if !p.leads_with_in_sync(follower) =>
                {
                    topology.leader_throttle_budget(rate, t, fp.partition)
                }
                _ => None,
            };
            if let Some(budget) = budget {
                max_bytes = max_bytes.min(budget);
            }
            slots.push(Slot {
                topic: ti,
                partition,
                index: fp.partition,
                fetch_offset: fp.fetch_offset,
                max_bytes,
                current_leader_epoch: fp.current_leader_epoch,
                replica: replica.is_some(),
                committed: replica.is_none() && req.isolation_level == 1,
                throttled: budget.is_some(),
                held: budget == Some(0),
                error,
            });
        }
    }
    Prepared {
        version,
        session,
        refused,
        topics,
        handles,
        slots,
        limits: bounds(req.max_bytes, &partition_max, fetch_max, b.budget.limit()),
        min_bytes: req.min_bytes.max(0) as usize,
        wait: Duration::from_millis(req.max_wait_ms.max(0) as u64).min(MAX_WAIT_CAP),
    }
}

/// Checks that this broker may serve the partition to this fetcher: consumers read from the
/// leader only (a follower never serves); a replica's fetch is the topology's to admit.
fn admit(
    topology: &Topology,
    t: &Topic,
    p: &Arc<Partition>,
    replica: Option<i32>,
    fp: &FetchPartition,
    now_ms: u64,
) -> Option<ResponseError> {
    if p.role() == Role::Follower {
        return Some(ResponseError::NotLeaderOrFollower);
    }
    let follower = replica?;
    topology.admit_replica_fetch(t, p, follower, fp, now_ms)
}

/// The record bytes a fetch response carries: what a consumer byte-rate quota counts.
pub fn records_bytes(resp: &FetchResponse) -> usize {
    resp.responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
        .sum()
}

/// Serves a prepared fetch, waiting as the request allows. `memory` is what the connection
/// took for it ([`Prepared::memory_wanted`]) and `throttle_ms` how long the request waited
/// for memory so far. Returns the response and the memory its records hold, which must stay
/// held until the response has been written.
pub async fn serve(
    b: Arc<Broker>,
    fetch: Prepared,
    memory: Option<Permit>,
    throttle_ms: i32,
) -> (FetchResponse, Option<Permit>) {
    let (session, version) = (fetch.session, fetch.version);
    let (mut resp, memory, waited) = match fetch.refused {
        Some(e) => {
            let mut resp = FetchResponse::default();
            resp.error_code = e.code();
            (resp, None, Duration::ZERO)
        }
        None => read_and_wait(&b, fetch, memory).await,
    };
    b.fetch_sessions.finish(session, version, &mut resp);
    let waited_ms = waited.as_millis().min(i32::MAX as u128) as i32;
    resp.throttle_time_ms = throttle_ms.saturating_add(waited_ms);
    for p in resp.responses.iter().flat_map(|t| t.partitions.iter()) {
        b.metrics.error(ApiKey::Fetch as i16, p.error_code);
    }
    b.metrics.error(ApiKey::Fetch as i16, resp.error_code);
    (resp, memory)
}

/// A limit from the request, clamped to 0..=`cap`: negative means nothing (but KIP-74's one
/// batch), huge means the broker's cap.
fn clamp_limit(requested: i32, cap: usize) -> usize {
    usize::try_from(requested).unwrap_or(0).min(cap)
}

/// How much a fetch may read, and how much memory it reserves for that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bounds {
    /// Most record bytes in the response (before KIP-74's one batch).
    response: usize,
    /// Memory to hold before reading.
    reserve: usize,
}

fn bounds(max_bytes: i32, partition_max: &[i32], fetch_max: usize, budget: usize) -> Bounds {
    let partitions = partition_max.iter().fold(0usize, |sum, p| {
        sum.saturating_add(clamp_limit(*p, fetch_max))
    });
    let response = clamp_limit(max_bytes, fetch_max).min(partitions);
    let ceiling = (budget / 2).max(1);
    Bounds {
        response: response.min(ceiling),
        reserve: response.max(MIN_RESERVE_BYTES).min(ceiling),
    }
}

async fn read_and_wait(
    b: &Arc<Broker>,
    fetch: Prepared,
    mut memory: Option<Permit>,
) -> (FetchResponse, Option<Permit>, Duration) {
    let Prepared {
        version,
        topics,
        handles,
        slots,
        limits,
        min_bytes,
        wait,
        ..
    } = fetch;
    let deadline = tokio::time::Instant::now() + wait;
    let mut waited = Duration::ZERO;
    // Each round ends in an answer or waits for an append, for memory or for the deadline,
    // and a round that starts at or past the deadline answers.
    loop {
        // Subscribe before reading so an append between the read and the wait still wakes us.
        let mut watches: Vec<watch::Receiver<i64>> = slots
            .iter()
            .filter_map(|s| {
                s.partition.as_ref().map(|p| {
                    if s.replica {
                        p.watch_log_end()
                    } else {
                        p.watch_high_watermark()
                    }
                })
            })
            .collect();
        let now = tokio::time::Instant::now();
        // Memory is taken only when there is something to read, and before reading it. Here,
        // inside the fetch, it is waited for only until the deadline: requests queued behind
        // this fetch on its connection may hold the memory it waits for.
        if memory.is_none() && slots.iter().any(has_data) {
            memory = b.budget.try_acquire(limits.reserve);
            if memory.is_none() && now < deadline {
                match b
                    .budget
                    .acquire_before(limits.reserve, Some(deadline))
                    .await
                {
                    Some((p, w)) => {
                        waited += w;
                        memory = Some(p);
                    }
                    None => {
                        waited += deadline.saturating_duration_since(now);
                        continue;
                    }
                }
            }
        }
        let (read_max, min_one) = match &memory {
            Some(p) => (limits.response.min(p.bytes()), true),
            // Nothing to read, or no memory to read it with: errors and watermarks only.
            None => (0, false),
        };
        let (parts, bytes, errors) = read_all(&slots, version, read_max, min_one);
        let now = tokio::time::Instant::now();
        if bytes >= min_bytes.max(1) || errors || now >= deadline || watches.is_empty() {
            if let Some(p) = memory.as_mut() {
                // Keep what was read (more than reserved only for KIP-74's one big batch).
                p.resize(bytes);
            }
            let throttled: usize = slots
                .iter()
                .zip(&parts)
                .filter(|(s, _)| s.throttled)
                .map(|(_, (_, pd))| pd.records.as_ref().map_or(0, Bytes::len))
                .sum();
            if throttled > 0 {
                b.topology().record_leader_throttled(throttled);
            }
            return (assemble(topics, &handles, parts), memory, waited);
        }
        // Not enough yet: keep the memory (it stays accounted) and wait for appends.
        drop(parts);
        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        // On timeout the next round answers with what there is.
        let _ = tokio::time::timeout_at(deadline, changed).await;
    }
}

/// The aborted transactions a read_committed consumer needs for `records` read from `from`:
/// those that may hold records below the end of what was read.
fn aborted_in(p: &Partition, from: i64, records: &Bytes, lso: i64) -> Vec<AbortedTransaction> {
    let upto = Batches::new(records)
        .last()
        .map_or(lso, |(_, h)| h.last_offset() + 1);
    p.aborted_in(from, upto)
        .into_iter()
        .map(|a| {
            let mut t = AbortedTransaction::default();
            t.producer_id = a.producer_id.into();
            t.first_offset = a.first_offset;
            t
        })
        .collect()
}

/// True when the slot's partition has records past the fetch position to read.
fn has_data(s: &Slot) -> bool {
    s.error.is_none()
        && !s.held
        && s.partition.as_ref().is_some_and(|p| {
            let end = if s.replica {
                p.log_end_offset()
            } else if s.committed {
                p.last_stable_offset()
            } else {
                p.high_watermark()
            };
            end > s.fetch_offset
        })
}

fn assemble(
    mut topics: Vec<FetchableTopicResponse>,
    handles: &[Option<Arc<Topic>>],
    parts: Vec<(usize, PartitionData)>,
) -> FetchResponse {
    for (ti, pd) in parts {
        if let (Some(Some(t)), Some(records)) = (handles.get(ti), &pd.records) {
            if !records.is_empty() {
                t.metrics.bytes_out.add(records.len() as u64);
                let n: i64 = Batches::new(records)
                    .map(|(_, h)| h.records_count as i64)
                    .sum();
                t.metrics.records_out.add(n.max(0) as u64);
            }
        }
        topics[ti].partitions.push(pd);
    }
    let mut resp = FetchResponse::default();
    resp.responses = topics;
    resp
}

/// Reads every slot once, at most `max_bytes` in all (plus, with `min_one`, KIP-74's one whole
/// batch for the first partition with data); returns the partition data, bytes gathered and
/// whether any partition carries an error (which makes the fetch answer at once, as Kafka
/// does).
fn read_all(
    slots: &[Slot],
    version: i16,
    max_bytes: usize,
    min_one: bool,
) -> (Vec<(usize, PartitionData)>, usize, bool) {
    let mut out = Vec::with_capacity(slots.len());
    let mut total = 0usize;
    let mut errors = false;
    for s in slots {
        let mut pd = PartitionData::default();
        pd.partition_index = s.index;
        pd.high_watermark = -1;
        pd.last_stable_offset = -1;
        if version >= 5 {
            pd.log_start_offset = -1;
        }
        pd.records = Some(Bytes::new());
        let code = match (&s.error, &s.partition) {
            (Some(e), _) => Some(*e),
            (None, Some(p)) => {
                let hw = p.high_watermark();
                let lso = p.last_stable_offset();
                pd.high_watermark = hw;
                pd.last_stable_offset = lso;
                if version >= 5 {
                    pd.log_start_offset = p.log_start_offset();
                }
                if version >= 4 {
                    pd.aborted_transactions = Some(Vec::new());
                }
                if let Some(e) = replica::fence(p, s.current_leader_epoch) {
                    Some(e)
                } else if s.held {
                    // Under a leader throttle whose rate is used up: no records this time.
                    None
                } else {
                    // KIP-74: the first partition with data may exceed the remaining budget by
                    // one batch so that progress is always possible.
                    let budget = s.max_bytes.min(max_bytes.saturating_sub(total));
                    let read = if s.replica {
                        p.read_replica(s.fetch_offset, budget, min_one && total == 0)
                    } else if s.committed {
                        p.read_upto(s.fetch_offset, budget, min_one && total == 0, lso)
                    } else {
                        p.read(s.fetch_offset, budget, min_one && total == 0)
                    };
                    match read {
                        Ok(r) => {
                            total += r.records.len();
                            if s.committed && version >= 4 && !r.records.is_empty() {
                                pd.aborted_transactions =
                                    Some(aborted_in(p, s.fetch_offset, &r.records, lso));
                            }
                            pd.records = Some(r.records);
                            None
                        }
                        Err(LogError::OffsetOutOfRange { .. }) => {
                            Some(ResponseError::OffsetOutOfRange)
                        }
                        Err(e) => {
                            tracing::error!(partition = s.index, error = %e, "fetch read failed");
                            Some(ResponseError::KafkaStorageError)
                        }
                    }
                }
            }
            (None, None) => Some(ResponseError::UnknownTopicOrPartition),
        };
        if let Some(c) = code {
            pd.error_code = c.code();
            errors = true;
        }
        out.push((s.topic, pd));
    }
    (out, total, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FETCH_MAX: usize = 55 << 20;

    #[test]
    fn negative_limits_read_nothing_but_reserve_for_one_batch() {
        let b = bounds(-1, &[-5, i32::MIN], FETCH_MAX, 64 << 20);
        assert_eq!(b.response, 0);
        assert_eq!(b.reserve, MIN_RESERVE_BYTES);
    }

    #[test]
    fn huge_limits_are_capped_by_fetch_max_bytes_and_half_the_budget() {
        let b = bounds(i32::MAX, &[i32::MAX; 4], FETCH_MAX, 1 << 30);
        assert_eq!(
            b,
            Bounds {
                response: FETCH_MAX,
                reserve: FETCH_MAX
            }
        );
        let b = bounds(i32::MAX, &[i32::MAX; 4], FETCH_MAX, 16 << 20);
        assert_eq!(
            b,
            Bounds {
                response: 8 << 20,
                reserve: 8 << 20
            }
        );
    }

    #[test]
    fn the_response_is_bounded_by_the_sum_of_partition_limits() {
        let b = bounds(50 << 20, &[1 << 20, 1 << 20], FETCH_MAX, 1 << 30);
        assert_eq!(b.response, 2 << 20);
        let many = vec![i32::MAX; 100_000];
        let b = bounds(i32::MAX, &many, FETCH_MAX, 1 << 30);
        assert_eq!(
            b.response, FETCH_MAX,
            "the sum saturates instead of overflowing"
        );
    }

    #[test]
    fn a_tiny_budget_still_lets_a_fetch_reserve_something() {
        let b = bounds(i32::MAX, &[i32::MAX], FETCH_MAX, 1);
        assert_eq!(
            b,
            Bounds {
                response: 1,
                reserve: 1
            }
        );
    }
}
