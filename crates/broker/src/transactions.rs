//! The shell around the pure transaction coordinator ([`TxnCoordinator`]): keeps transaction
//! state durable in the internal topic `__transaction_state`, writes the commit and abort
//! markers of ending transactions, and aborts transactions past their timeout.
//!
//! As in Kafka, `__transaction_state` has `transaction.state.log.num.partitions` partitions
//! (50 by default) and a transactional id lives in the one its id hashes to; the node holding
//! (in a cluster: leading) that partition coordinates it. Every decision is applied in memory
//! and appended under the partitions lock, so the log holds decisions in the order they were
//! made, and a request is answered only once its record is committed (durable as acks
//! promise; in a cluster on every in-sync replica). A new leader rebuilds the state from its
//! replica and writes the markers of every transaction that was ending, then completes them.
//!
//! Markers go to each partition of the transaction: appended here when this node holds the
//! partition's leader (or, for `__consumer_offsets`, through the group service, which settles
//! the transaction's offset commits with it), sent as WriteTxnMarkers to the leader
//! otherwise. They are retried until written, or until this node stops coordinating.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use spate_log::Flusher;
use spate_metrics::{Counter, Histogram};
use spate_protocol::batch::{self, ControlKind, ControlRecord, NewRecord};
use spate_protocol::records::{Compression, RecordBatchDecoder};
use spate_protocol::ResponseError;
use spate_txn::record::{decode_key, decode_value, encode_key, encode_value};
use spate_txn::{
    txn_partition_for, Ended, InitAnswer, Markers, TxnConfig, TxnCoordinator, TxnMeta, Write,
    TXN_LOG,
};

use crate::error::BrokerError;
use crate::groups::{wait_committed, Written, OFFSETS_LOG};
use crate::partition::{AppendError, Appended, Partition, Role};
use crate::registry::TopicRegistry;
use crate::time::SharedClock;
use crate::Broker;

/// How often open transactions are checked against their timeout (Kafka checks every 10 s
/// by default; a second costs nothing here and aborts stalled transactions sooner).
const TIMEOUT_CHECK: Duration = Duration::from_secs(1);
/// Pause between attempts to write a marker that could not be written.
const MARKER_RETRY: Duration = Duration::from_millis(100);
/// Longest pause between marker attempts.
const MARKER_RETRY_MAX: Duration = Duration::from_secs(2);

/// Transaction settings from the broker configuration.
#[derive(Debug, Clone)]
pub struct TxnSettings {
    /// Partitions of `__transaction_state` (`transaction.state.log.num.partitions`).
    pub partitions: i32,
    /// Segment size of `__transaction_state`.
    pub segment_bytes: u64,
    /// The coordinator's limits.
    pub coordinator: TxnConfig,
}

impl Default for TxnSettings {
    fn default() -> Self {
        Self {
            partitions: spate_txn::DEFAULT_TXN_PARTITIONS,
            segment_bytes: 100 << 20,
            coordinator: TxnConfig::default(),
        }
    }
}

/// Transaction metrics, read by the Prometheus endpoint.
#[derive(Debug)]
pub struct TxnMetrics {
    /// Transactions committed (every marker written).
    pub commits: Counter,
    /// Transactions aborted (every marker written), by the producer or by the coordinator.
    pub aborts: Counter,
    /// Transactions aborted by the coordinator because they outlived their timeout.
    pub timed_out: Counter,
    /// From a transaction's first partition to its last marker (µs).
    pub duration: Histogram,
    /// Time to rebuild one `__transaction_state` partition's state (µs).
    pub load: Histogram,
}

impl Default for TxnMetrics {
    fn default() -> Self {
        Self {
            commits: Counter::default(),
            aborts: Counter::default(),
            timed_out: Counter::default(),
            duration: Histogram::latency(),
            load: Histogram::latency(),
        }
    }
}

/// A `__transaction_state` partition this node writes to.
struct Led {
    partition: Arc<Partition>,
    /// The leader epoch it was taken over at: the coordinator epoch its markers carry.
    epoch: i32,
}

/// The transaction state partitions, by index. Its lock orders every write.
struct TxnPartitions {
    count: usize,
    led: Vec<Option<Led>>,
}

/// Transactions and their coordinator.
pub struct TxnService {
    settings: TxnSettings,
    /// Lock order: `partitions`, then `coordinator`.
    coordinator: Mutex<TxnCoordinator>,
    partitions: Mutex<TxnPartitions>,
    /// Transactional ids whose markers a task is writing now.
    writing: Mutex<HashSet<String>>,
    flusher: Flusher,
    clock: SharedClock,
    /// Metrics.
    pub metrics: TxnMetrics,
    clustered: AtomicBool,
    /// The broker, for the marker writers (set once it exists: [`TxnService::attach`]).
    broker: std::sync::OnceLock<Weak<Broker>>,
}

/// Where a decision's record went, and the coordinator epoch it was made under.
pub struct Decided<T> {
    /// The answer.
    pub answer: T,
    /// The record to wait for before answering.
    pub written: Written,
    /// Markers to write once the record is committed.
    pub markers: Option<(Markers, usize, i32)>,
}

/// InitProducerId's answer: the producer id and epoch, or the error to answer with.
pub type InitOutcome = Result<(i64, i16), ResponseError>;

/// Whether `topic` is the transaction state topic.
pub fn is_txn_log(topic: &str) -> bool {
    topic == TXN_LOG
}

impl TxnService {
    /// A service with no partitions yet: a cluster node, until it leads some.
    pub fn new(settings: TxnSettings, flusher: Flusher, clock: SharedClock) -> Self {
        Self {
            coordinator: Mutex::new(TxnCoordinator::new(settings.coordinator.clone())),
            settings,
            partitions: Mutex::new(TxnPartitions {
                count: 0,
                led: Vec::new(),
            }),
            writing: Mutex::new(HashSet::new()),
            flusher,
            clock,
            metrics: TxnMetrics::default(),
            clustered: AtomicBool::new(false),
            broker: std::sync::OnceLock::new(),
        }
    }

    /// Standalone: opens `__transaction_state` in `topics` when it exists and rebuilds every
    /// transactional id from it; otherwise it is created on first use
    /// ([`TxnService::ensure_standalone`]), as Kafka creates it.
    pub fn open_standalone(
        topics: &TopicRegistry,
        settings: TxnSettings,
        flusher: Flusher,
        clock: SharedClock,
    ) -> Result<Self, BrokerError> {
        let svc = Self::new(settings, flusher, clock);
        if topics.get(TXN_LOG).is_some() {
            svc.ensure_standalone(topics)?;
        }
        Ok(svc)
    }

    /// Standalone: creates `__transaction_state` if it does not exist yet and coordinates
    /// every id of it. Creating it makes its partitions' directories and fsyncs them, once.
    pub fn ensure_standalone(&self, topics: &TopicRegistry) -> Result<(), BrokerError> {
        if self.partitions.lock().count > 0 {
            return Ok(());
        }
        let topic = match topics.get(TXN_LOG) {
            Some(t) => {
                crate::groups::compact_internal_topic(topics, &t)?;
                t
            }
            None => match topics.create(
                TXN_LOG,
                self.settings.partitions.max(1),
                crate::groups::offsets_topic_config(self.settings.segment_bytes),
                false,
            ) {
                Ok(Some(t)) => t,
                // Created meanwhile by a concurrent first use.
                Ok(None) | Err(_) => topics
                    .get(TXN_LOG)
                    .ok_or_else(|| BrokerError::Cluster(format!("cannot create {TXN_LOG}")))?,
            },
        };
        let count = topic.partition_count().max(0) as usize;
        let started = Instant::now();
        for p in topic.partitions() {
            let index = p.index.max(0) as usize;
            let epoch = p.leader_epoch();
            self.take_over(index, count, p, epoch)?;
        }
        let ids = self.coordinator.lock().list().len();
        tracing::info!(
            ids,
            took_ms = started.elapsed().as_millis() as u64,
            "coordinating transactions from {TXN_LOG}"
        );
        Ok(())
    }

    /// Cluster mode: ids are coordinated only for the partitions this node leads.
    pub fn set_clustered(&self) {
        self.clustered.store(true, Ordering::SeqCst);
    }

    /// The settings in force.
    pub fn settings(&self) -> &TxnSettings {
        &self.settings
    }

    /// Whether this node coordinates `txn_id` now.
    pub fn is_coordinator(&self, txn_id: &str) -> bool {
        let parts = self.partitions.lock();
        parts.count > 0 && leading(&parts, txn_partition_for(txn_id, parts.count)).is_some()
    }

    /// This node now leads partition `index` (of `count`) at `epoch`: rebuilds its ids from the
    /// replica of the log. Markers of transactions that were ending must then be written
    /// again: [`TxnService::resume`]. Does nothing when already taken over at that epoch.
    pub fn take_over(
        &self,
        index: usize,
        count: usize,
        partition: Arc<Partition>,
        epoch: i32,
    ) -> Result<(), BrokerError> {
        {
            let parts = self.partitions.lock();
            if parts.count == count
                && parts
                    .led
                    .get(index)
                    .and_then(Option::as_ref)
                    .is_some_and(|l| l.epoch == epoch)
            {
                return Ok(());
            }
        }
        let started = Instant::now();
        let records = replay(&partition)?;
        let mut parts = self.partitions.lock();
        if parts.count != count {
            parts.count = count;
            parts.led.resize_with(count, || None);
        }
        let mut c = self.coordinator.lock();
        c.forget(|id| txn_partition_for(id, count) == index);
        let ids = records.len();
        for (id, meta) in records {
            c.replay(id, meta);
        }
        drop(c);
        parts.led[index] = Some(Led { partition, epoch });
        let took = started.elapsed();
        self.metrics.load.observe(took.as_micros() as u64);
        if self.clustered.load(Ordering::Relaxed) {
            tracing::info!(
                partition = index,
                epoch,
                ids,
                took_ms = took.as_millis() as u64,
                "coordinating the transactions of a {TXN_LOG} partition: rebuilt from its log"
            );
        }
        Ok(())
    }

    /// This node no longer leads partition `index`: forgets its ids.
    pub fn step_down(&self, index: usize) {
        let mut parts = self.partitions.lock();
        let count = parts.count;
        if parts.led.get_mut(index).and_then(Option::take).is_some() {
            self.coordinator
                .lock()
                .forget(|id| txn_partition_for(id, count) == index);
            tracing::info!(
                partition = index,
                "no longer coordinating the transactions of a {TXN_LOG} partition"
            );
        }
    }

    /// Gives the marker writers the broker they write through.
    pub fn attach(&self, b: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(b));
    }

    /// Writes the markers of every transaction that was ending when its partition was taken
    /// over (or the broker stopped), then completes them. Does nothing before
    /// [`TxnService::attach`] (the broker's start resumes then).
    pub fn resume(self: &Arc<Self>) {
        let Some(b) = self.broker.get().and_then(Weak::upgrade) else {
            return;
        };
        let in_flight = self.coordinator.lock().in_flight();
        for m in in_flight {
            let Some((index, epoch)) = self.led_epoch(&m.txn_id) else {
                continue;
            };
            self.spawn_markers(&b, m, index, epoch, None);
        }
    }

    fn led_epoch(&self, txn_id: &str) -> Option<(usize, i32)> {
        let parts = self.partitions.lock();
        if parts.count == 0 {
            return None;
        }
        let index = txn_partition_for(txn_id, parts.count);
        leading(&parts, index).map(|l| (index, l.epoch))
    }

    /// Runs a coordinator decision for `txn_id` under the locks and appends its records:
    /// NOT_COORDINATOR when this node does not coordinate the id.
    fn decide<T>(
        &self,
        txn_id: &str,
        f: impl FnOnce(&mut TxnCoordinator) -> Result<(T, Vec<Write>, Option<Markers>), ResponseError>,
    ) -> Result<Decided<T>, ResponseError> {
        let parts = self.partitions.lock();
        if parts.count == 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let index = txn_partition_for(txn_id, parts.count);
        let led = leading(&parts, index).ok_or(ResponseError::NotCoordinator)?;
        let mut c = self.coordinator.lock();
        let (answer, writes, markers) = f(&mut c)?;
        drop(c);
        let written = append(led, &writes, self.clock.now_ms())?;
        Ok(Decided {
            answer,
            written,
            markers: markers.map(|m| (m, index, led.epoch)),
        })
    }

    /// Waits until a decision's record is committed.
    pub fn committed(
        &self,
        written: &Written,
    ) -> impl std::future::Future<Output = Result<(), ResponseError>> + Send + 'static {
        wait_committed(written, self.flusher.policy().acks_wait_for_fsync())
    }

    /// InitProducerId with a transactional id: the producer id and epoch, or
    /// CONCURRENT_TRANSACTIONS while an open transaction of the id is being aborted (its
    /// markers are written once the abort is committed).
    pub fn init_producer_id(
        &self,
        b: &Broker,
        txn_id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<Decided<InitOutcome>, ResponseError> {
        let now = self.clock.now_ms();
        let topology = b.topology();
        self.decide(txn_id, |c| {
            let mut allocate = || topology.allocate_producer_id(b);
            match c.init_producer_id(txn_id, timeout_ms, expected, now, &mut allocate)? {
                InitAnswer::Ready {
                    producer_id,
                    producer_epoch,
                    write,
                } => Ok((Ok((producer_id, producer_epoch)), vec![write], None)),
                InitAnswer::Aborting { write, markers } => Ok((
                    Err(ResponseError::ConcurrentTransactions),
                    vec![write],
                    Some(markers),
                )),
            }
        })
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn.
    pub fn add_partitions(
        &self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
    ) -> Result<Decided<()>, ResponseError> {
        let now = self.clock.now_ms();
        self.decide(txn_id, |c| {
            let write = c.add_partitions(txn_id, producer_id, epoch, partitions, now)?;
            Ok(((), write.into_iter().collect(), None))
        })
    }

    /// KIP-890 verification of a partition (see [`TxnCoordinator::verify`]).
    pub fn verify(
        &self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        topic: &str,
        partition: i32,
    ) -> Result<(), ResponseError> {
        let parts = self.partitions.lock();
        if parts.count == 0 {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        let index = txn_partition_for(txn_id, parts.count);
        leading(&parts, index).ok_or(ResponseError::NotCoordinator)?;
        self.coordinator
            .lock()
            .verify(txn_id, producer_id, epoch, topic, partition)
    }

    /// EndTxn: the prepare record to wait for, and the markers to write after it. `bump`
    /// (EndTxn v5, transaction.version 2) moves the producer to the next epoch; the answer is
    /// the producer id and epoch the producer goes on with.
    pub fn end_txn(
        &self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        bump: bool,
    ) -> Result<Decided<(i64, i16)>, ResponseError> {
        let now = self.clock.now_ms();
        self.decide(txn_id, |c| {
            let ended = c.end_txn(txn_id, producer_id, epoch, commit, now, bump)?;
            let held = c
                .describe(txn_id)
                .map_or((producer_id, epoch), |m| (m.producer_id, m.producer_epoch));
            match ended {
                Ended::Prepared { write, markers } => Ok((held, vec![write], Some(markers))),
                Ended::AlreadyDone => Ok((held, Vec::new(), None)),
            }
        })
    }

    /// Writes a decision's markers once its record is committed (a background task).
    pub fn after_commit(self: &Arc<Self>, b: &Arc<Broker>, d: &Decided<impl Sized>) {
        if let Some((m, index, epoch)) = &d.markers {
            self.spawn_markers(b, m.clone(), *index, *epoch, Some(d.written.clone()));
        }
    }

    /// One transactional id's state (DescribeTransactions, the admin API); NOT_COORDINATOR
    /// when another node coordinates it, None when unknown here.
    pub fn describe(&self, txn_id: &str) -> Result<Option<TxnMeta>, ResponseError> {
        if !self.is_coordinator(txn_id) {
            return Err(ResponseError::NotCoordinator);
        }
        Ok(self.coordinator.lock().describe(txn_id).cloned())
    }

    /// Every id this node coordinates.
    pub fn list(&self) -> Vec<(String, TxnMeta)> {
        self.coordinator
            .lock()
            .list()
            .into_iter()
            .map(|(id, m)| (id.to_string(), m.clone()))
            .collect()
    }

    /// Transactions open now on this node's coordinator.
    pub fn open_count(&self) -> usize {
        self.coordinator.lock().open_count()
    }

    /// Checks open transactions against their timeouts every second until the broker stops.
    pub fn spawn_ticker(self: &Arc<Self>, b: &Arc<Broker>) {
        let svc = Arc::downgrade(self);
        let broker = Arc::downgrade(b);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TIMEOUT_CHECK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Some(s), Some(b)) = (svc.upgrade(), broker.upgrade()) else {
                    return;
                };
                s.tick(&b);
            }
        });
    }

    /// Aborts transactions past their timeout and forgets expired ids.
    pub fn tick(self: &Arc<Self>, b: &Arc<Broker>) {
        let now = self.clock.now_ms();
        let parts = self.partitions.lock();
        if parts.count == 0 {
            return;
        }
        let (aborts, forgotten) = self.coordinator.lock().expire(now);
        let mut spawn = Vec::new();
        for (write, markers) in aborts {
            let index = txn_partition_for(&write.txn_id, parts.count);
            let Some(led) = leading(&parts, index) else {
                continue;
            };
            tracing::info!(
                txn_id = %write.txn_id,
                producer_id = markers.producer_id,
                "aborting a transaction past its timeout; its producer is fenced"
            );
            self.metrics.timed_out.inc();
            match append(led, std::slice::from_ref(&write), now) {
                Ok(written) => spawn.push((markers, index, led.epoch, written)),
                Err(e) => tracing::warn!(error = ?e, "cannot record a timed-out transaction"),
            }
        }
        for write in forgotten {
            let index = txn_partition_for(&write.txn_id, parts.count);
            if let Some(led) = leading(&parts, index) {
                if let Err(e) = append(led, std::slice::from_ref(&write), now) {
                    tracing::warn!(error = ?e, "cannot forget an expired transactional id");
                }
            }
        }
        drop(parts);
        for (m, index, epoch, written) in spawn {
            self.spawn_markers(b, m, index, epoch, Some(written));
        }
    }

    /// Writes `m`'s markers (after `after` is committed) and completes the transaction; one
    /// writer per transactional id at a time.
    fn spawn_markers(
        self: &Arc<Self>,
        b: &Arc<Broker>,
        m: Markers,
        index: usize,
        epoch: i32,
        after: Option<Written>,
    ) {
        if !self.writing.lock().insert(m.txn_id.clone()) {
            return;
        }
        let svc = self.clone();
        let b = Arc::downgrade(b);
        tokio::spawn(async move {
            let id = m.txn_id.clone();
            svc.write_markers(b, m, index, epoch, after).await;
            svc.writing.lock().remove(&id);
        });
    }

    async fn write_markers(
        self: &Arc<Self>,
        b: Weak<Broker>,
        m: Markers,
        index: usize,
        epoch: i32,
        after: Option<Written>,
    ) {
        if let Some(w) = after {
            if let Err(e) = self.committed(&w).await {
                // Not committed: the next leader of the partition decides from its log.
                tracing::warn!(txn_id = %m.txn_id, error = ?e, "transaction record not committed; its markers wait for the next coordinator");
                return;
            }
        }
        let marker = ControlRecord {
            kind: if m.commit {
                ControlKind::Commit
            } else {
                ControlKind::Abort
            },
            coordinator_epoch: epoch,
        };
        let writes = m.partitions.iter().map(|(topic, partition)| {
            let (b, svc) = (b.clone(), self.clone());
            let (topic, partition) = (topic.clone(), *partition);
            let (pid, pepoch) = (m.producer_id, m.producer_epoch);
            async move {
                let mut pause = MARKER_RETRY;
                loop {
                    if !svc.still_leads(index, epoch) {
                        return false;
                    }
                    let Some(broker) = b.upgrade() else {
                        return false;
                    };
                    let result = broker
                        .topology()
                        .write_marker(&broker, &topic, partition, pid, pepoch, marker)
                        .await;
                    drop(broker);
                    match result {
                        Ok(()) => return true,
                        // The partition is gone: nothing is left to mark (as Kafka does).
                        Err(ResponseError::UnknownTopicOrPartition) => return true,
                        // A newer coordinator or producer epoch wrote there: this one is stale.
                        Err(
                            ResponseError::TransactionCoordinatorFenced
                            | ResponseError::InvalidProducerEpoch,
                        ) => {
                            tracing::warn!(%topic, partition, "transaction marker refused as stale");
                            return true;
                        }
                        Err(e) => {
                            tracing::debug!(%topic, partition, error = ?e, "transaction marker not written yet; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(MARKER_RETRY_MAX);
                        }
                    }
                }
            }
        });
        let done = futures::future::join_all(writes).await;
        if !done.iter().all(|d| *d) {
            return;
        }
        let now = self.clock.now_ms();
        let parts = self.partitions.lock();
        let Some(led) = leading(&parts, index).filter(|l| l.epoch == epoch) else {
            return;
        };
        let mut c = self.coordinator.lock();
        let started = c.describe(&m.txn_id).map_or(-1, |t| t.start_ms);
        let Some(write) = c.markers_written(&m.txn_id, m.producer_id, m.producer_epoch, now) else {
            return;
        };
        drop(c);
        if let Err(e) = append(led, std::slice::from_ref(&write), now) {
            tracing::warn!(txn_id = %m.txn_id, error = ?e, "cannot record a completed transaction");
            return;
        }
        if m.commit {
            self.metrics.commits.inc();
        } else {
            self.metrics.aborts.inc();
        }
        if started >= 0 {
            let us = now.saturating_sub(started).max(0) as u64 * 1000;
            self.metrics.duration.observe(us);
        }
    }

    fn still_leads(&self, index: usize, epoch: i32) -> bool {
        let parts = self.partitions.lock();
        leading(&parts, index).is_some_and(|l| l.epoch == epoch)
    }
}

/// How long a partition added on a producer's behalf waits for the previous transaction's
/// markers (CONCURRENT_TRANSACTIONS) before the producer is told to retry.
const ADD_RETRY_FOR: Duration = Duration::from_secs(2);

/// Adds partitions to `txn_id`'s open transaction on its producer's behalf (transaction
/// version 2: a Produce v12+ or a TxnOffsetCommit v5 enrols its partition), through the
/// coordinator here or AddPartitionsToTxn to its node, and waits until the transaction's record
/// is committed. `asks` are (topic, partition, producer id, epoch) of one producer. Each
/// partition's refusal, `None` when it is in; while the previous transaction's markers are
/// still being written the add is retried for up to two seconds.
pub async fn add_on_behalf(
    b: &Arc<Broker>,
    txn_id: &str,
    asks: &[(String, i32, i64, i16)],
) -> Result<HashMap<(String, i32), Option<ResponseError>>, ResponseError> {
    let Some(&(_, _, pid, epoch)) = asks.first() else {
        return Ok(HashMap::new());
    };
    let parts: Vec<(String, i32)> = asks.iter().map(|(t, p, _, _)| (t.clone(), *p)).collect();
    let deadline = Instant::now() + ADD_RETRY_FOR;
    let mut pause = Duration::from_millis(20);
    loop {
        let outcome = if b.txns.is_coordinator(txn_id) {
            let (b2, id, list) = (b.clone(), txn_id.to_string(), parts.clone());
            let decided =
                tokio::task::spawn_blocking(move || b2.txns.add_partitions(&id, pid, epoch, &list))
                    .await
                    .map_err(|_| ResponseError::UnknownServerError)
                    .and_then(|d| d);
            match decided {
                Ok(d) => {
                    b.txns.after_commit(b, &d);
                    b.txns.committed(&d.written).await.map(|()| HashMap::new())
                }
                Err(e) => Err(e),
            }
        } else {
            match b.topology().cluster() {
                None => Err(ResponseError::CoordinatorNotAvailable),
                Some(c) => crate::cluster::ask_coordinator(c, txn_id, asks, false).await,
            }
        };
        let concurrent = match &outcome {
            Err(e) => *e == ResponseError::ConcurrentTransactions,
            Ok(errors) => errors
                .values()
                .any(|e| *e == Some(ResponseError::ConcurrentTransactions)),
        };
        if !concurrent || Instant::now() + pause > deadline {
            return outcome;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Writes a marker to a partition this node leads, and waits until it is committed as acks
/// promise. `__consumer_offsets` markers go through the group service, which settles the
/// transaction's offset commits with them.
pub(crate) async fn write_marker_here(
    b: &Broker,
    topic: &str,
    partition: i32,
    producer_id: i64,
    producer_epoch: i16,
    marker: ControlRecord,
) -> Result<(), ResponseError> {
    let written = if topic == OFFSETS_LOG {
        b.groups.write_marker(
            partition.max(0) as usize,
            producer_id,
            producer_epoch,
            marker,
        )
    } else {
        let t = b
            .topics
            .get(topic)
            .ok_or(ResponseError::UnknownTopicOrPartition)?;
        let p = t.lookup(partition)?;
        p.append_marker(producer_id, producer_epoch, marker)
            .map(|a| Written {
                end: match a {
                    Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. } => {
                        last_offset + 1
                    }
                },
                epoch: p.leader_epoch(),
                partition: p,
            })
    };
    let written = written.map_err(|e| match e {
        AppendError::Refused(code) => code,
        AppendError::Storage(e) => {
            tracing::error!(%topic, partition, error = %e, "transaction marker append failed");
            ResponseError::KafkaStorageError
        }
    })?;
    wait_committed(&written, b.config.fsync.acks_wait_for_fsync())
        .await
        .map_err(|e| {
            if e == ResponseError::NotCoordinator {
                ResponseError::NotLeaderOrFollower
            } else {
                e
            }
        })
}

fn leading(parts: &TxnPartitions, index: usize) -> Option<&Led> {
    parts
        .led
        .get(index)?
        .as_ref()
        .filter(|l| match l.partition.role() {
            Role::Standalone => true,
            Role::Leader => l.partition.leader_epoch() == l.epoch,
            Role::Follower => false,
        })
}

/// Appends `writes` as one batch to `led`'s partition; where the batch ends, for waits. No
/// writes: the partition's current end (an answer that changed nothing still waits for what
/// it read to be committed).
fn append(led: &Led, writes: &[Write], now: i64) -> Result<Written, ResponseError> {
    if writes.is_empty() {
        return Ok(Written {
            end: led.partition.log_end_offset(),
            partition: led.partition.clone(),
            epoch: led.epoch,
        });
    }
    let records = writes
        .iter()
        .map(|w| {
            let key = encode_key(&w.txn_id).map_err(|_| ResponseError::InvalidRequest)?;
            let value = match &w.meta {
                Some(m) => Some(encode_value(m).map_err(|_| ResponseError::InvalidRequest)?),
                None => None,
            };
            Ok(NewRecord {
                key: Some(key),
                value,
                timestamp: now,
            })
        })
        .collect::<Result<Vec<_>, ResponseError>>()?;
    let batch = batch::build(&records, None, Compression::None).map_err(|e| {
        tracing::error!(error = %e, "cannot build a transaction state batch");
        ResponseError::UnknownServerError
    })?;
    let header = batch::validate(&batch).map_err(|_| ResponseError::UnknownServerError)?;
    match led.partition.append(&batch, &header, None) {
        Ok(Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. }) => {
            Ok(Written {
                partition: led.partition.clone(),
                epoch: led.epoch,
                end: last_offset + 1,
            })
        }
        Err(AppendError::Refused(_)) => Err(ResponseError::NotCoordinator),
        Err(AppendError::Storage(e)) => {
            tracing::error!(error = %e, "{TXN_LOG} append failed");
            Err(ResponseError::KafkaStorageError)
        }
    }
}

/// Every record of a transaction state partition's replica, in log order (the last one per
/// id wins). Unreadable records are skipped and counted.
fn replay(partition: &Partition) -> Result<Vec<(String, Option<TxnMeta>)>, BrokerError> {
    let (mut offset, end) = (partition.log_start_offset(), partition.log_end_offset());
    let mut latest: HashMap<String, Option<TxnMeta>> = HashMap::new();
    let mut order = Vec::new();
    let mut skipped = 0usize;
    while offset < end {
        let chunk = partition.read_replica(offset, 1 << 20, true)?;
        if chunk.records.is_empty() {
            break;
        }
        let mut buf: Bytes = chunk.records.clone();
        let sets =
            RecordBatchDecoder::decode_all(&mut buf).map_err(|e| BrokerError::CorruptMetadata {
                path: TXN_LOG.into(),
                reason: e.to_string(),
            })?;
        for set in sets {
            for r in set.records {
                offset = offset.max(r.offset + 1);
                let Some(Ok(id)) = r.key.map(decode_key) else {
                    skipped += 1;
                    continue;
                };
                let meta = match r.value.map(decode_value) {
                    None => None,
                    Some(Ok(m)) => Some(m),
                    Some(Err(_)) => {
                        skipped += 1;
                        continue;
                    }
                };
                if !latest.contains_key(&id) {
                    order.push(id.clone());
                }
                latest.insert(id, meta);
            }
        }
    }
    if skipped > 0 {
        tracing::warn!(skipped, "unreadable records in {TXN_LOG} were ignored");
    }
    Ok(order
        .into_iter()
        .filter_map(|id| latest.remove(&id).map(|m| (id, m)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BrokerConfig;

    fn open(dir: &std::path::Path) -> Arc<Broker> {
        let mut config = BrokerConfig::new(dir.join("data"), "127.0.0.1", 9092);
        config.txns.partitions = 1;
        config.txns.segment_bytes = 4096;
        Broker::open(config).unwrap().0
    }

    fn init(b: &Broker, id: &str) -> (i64, i16) {
        let d = b.txns.init_producer_id(b, id, 10_000, None).unwrap();
        d.answer.unwrap()
    }

    #[test]
    fn the_log_cleaner_keeps_the_latest_state_of_each_id_and_it_rebuilds_the_same_ids() {
        let dir = tempfile::tempdir().unwrap();
        let b = open(dir.path());
        b.txns.ensure_standalone(&b.topics).unwrap();
        let t = b.topics.get(TXN_LOG).unwrap();
        assert!(
            t.with_config(|c| c.compacted()),
            "created compacted, as Kafka's"
        );
        // Every InitProducerId writes a record: 400 of them for 2 ids.
        for _ in 0..200 {
            init(&b, "a");
            init(&b, "b");
        }
        let p = t.partition(0).unwrap();
        let before = p.size_bytes();
        b.clean_compacted();
        assert!(
            p.size_bytes() < before / 4,
            "{} of {before} bytes left",
            p.size_bytes()
        );
        let states = b.txns.list();
        b.shutdown();
        drop(b);
        let b = open(dir.path());
        assert_eq!(
            b.txns.list(),
            states,
            "the cleaned records rebuild the same ids"
        );
        assert_eq!(init(&b, "a").1, 200, "and the epochs go on from there");
    }
}
