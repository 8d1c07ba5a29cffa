//! Replica fetchers: a follower copies its leader's batches with the Kafka Fetch API.
//!
//! One fetcher task per leader broker serves every partition this node follows from it, as
//! Kafka's replica fetcher threads do. A partition starts in the truncating phase: the
//! fetcher asks the leader (OffsetForLeaderEpoch) where the follower's latest epoch ends in
//! the leader's log, cuts any divergent tail, and only then fetches. Batches are appended as
//! received, offsets and epochs included; nothing is re-encoded.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use spate_cluster::metadata::BrokerId;
use spate_log::wait_durable;
use spate_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use spate_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use spate_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
    TopicName,
};
use spate_protocol::{ResponseError, StrBytes};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::peer::{PeerConnection, PeerError};
use super::Cluster;
use crate::partition::Partition;
use crate::replica::{
    copy_batches, epoch_to_ask, follow_leader, on_epoch_answer, on_fetch_error, Blocking, CopyStop,
    EpochStep, FetchErrorStep, Phase,
};

/// Fetch v12: the last version naming topics (not ids), with leader epochs for fencing.
const FETCH_VERSION: i16 = 12;
/// OffsetForLeaderEpoch v4: with the replica id and the current leader epoch.
const EPOCH_VERSION: i16 = 4;
/// Longest pause between attempts to reach a leader.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

type Key = (String, i32);

/// What a fetch session's leader holds for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sent {
    fetch_offset: i64,
    leader_epoch: i32,
    log_start: i64,
    max_bytes: i32,
}

impl Sent {
    fn of(p: &FetchPartition) -> Self {
        Self {
            fetch_offset: p.fetch_offset,
            leader_epoch: p.current_leader_epoch,
            log_start: p.log_start_offset,
            max_bytes: p.partition_max_bytes,
        }
    }
}

/// This follower's side of its fetch session with one leader (KIP-227): after a first full
/// fetch, a round names only the partitions whose position moved, and the leader answers
/// only partitions with news. An idle follower of thousands of partitions then costs a few
/// bytes per round instead of every partition both ways.
#[derive(Debug, Default)]
struct FetchSession {
    /// 0: none yet (the next fetch asks for one).
    id: i32,
    next_epoch: i32,
    sent: std::collections::HashMap<Key, Sent>,
}

impl FetchSession {
    /// Sets the request's session fields and returns what it must name: everything for a
    /// new session (or without one), otherwise the partitions the leader does not know in
    /// this state, and the ones to forget.
    fn prepare(
        &mut self,
        req: &mut FetchRequest,
        wanted: Vec<(Key, Uuid, FetchPartition)>,
        sessionless: bool,
    ) -> (Vec<FetchTopic>, Vec<ForgottenTopic>) {
        if sessionless {
            // Closes a session the leader may hold, and fetches without one.
            req.session_id = self.id;
            req.session_epoch = -1;
            self.close();
            return (group(wanted), Vec::new());
        }
        if self.id == 0 {
            req.session_id = 0;
            req.session_epoch = 0;
            self.sent = wanted
                .iter()
                .map(|(k, _, p)| (k.clone(), Sent::of(p)))
                .collect();
            return (group(wanted), Vec::new());
        }
        req.session_id = self.id;
        req.session_epoch = self.next_epoch;
        let mut forgotten: BTreeMap<String, (Uuid, Vec<i32>)> = BTreeMap::new();
        let named: std::collections::HashSet<&Key> = wanted.iter().map(|(k, _, _)| k).collect();
        let ids: std::collections::HashMap<&str, Uuid> = wanted
            .iter()
            .map(|((t, _), id, _)| (t.as_str(), *id))
            .collect();
        self.sent.retain(|k, _| {
            let keep = named.contains(k);
            if !keep {
                let id = ids.get(k.0.as_str()).copied().unwrap_or_default();
                forgotten
                    .entry(k.0.clone())
                    .or_insert((id, Vec::new()))
                    .1
                    .push(k.1);
            }
            keep
        });
        let changed: Vec<(Key, Uuid, FetchPartition)> = wanted
            .into_iter()
            .filter(|(k, _, p)| self.sent.get(k) != Some(&Sent::of(p)))
            .collect();
        for (k, _, p) in &changed {
            self.sent.insert(k.clone(), Sent::of(p));
        }
        let forgotten = forgotten
            .into_iter()
            .map(|(t, (id, partitions))| {
                let mut f = ForgottenTopic::default();
                f.topic = TopicName(StrBytes::from_string(t));
                f.topic_id = id;
                f.partitions = partitions;
                f
            })
            .collect();
        (group(changed), forgotten)
    }

    /// The leader answered without error, with `session_id` (0: it keeps no session).
    fn answered(&mut self, session_id: i32) {
        if session_id == 0 {
            self.close();
            return;
        }
        if self.id != session_id {
            self.id = session_id;
            self.next_epoch = 1;
        } else {
            self.next_epoch = if self.next_epoch == i32::MAX {
                1
            } else {
                self.next_epoch + 1
            };
        }
    }

    /// Forgets the session: the next fetch is a full one that asks for a new session.
    fn close(&mut self) {
        self.id = 0;
        self.next_epoch = 0;
        self.sent.clear();
    }
}

/// Partitions grouped by topic, as a Fetch request carries them.
fn group(partitions: Vec<(Key, Uuid, FetchPartition)>) -> Vec<FetchTopic> {
    let mut by_topic: BTreeMap<String, (Uuid, Vec<FetchPartition>)> = BTreeMap::new();
    for ((topic, _), id, p) in partitions {
        by_topic.entry(topic).or_insert((id, Vec::new())).1.push(p);
    }
    by_topic
        .into_iter()
        .map(|(t, (id, partitions))| {
            let mut ft = FetchTopic::default();
            ft.topic = TopicName(StrBytes::from_string(t));
            ft.topic_id = id;
            ft.partitions = partitions;
            ft
        })
        .collect()
}

/// Blocking steps of the fetcher (truncation, a new epoch's checkpoint) leave the async
/// workers.
struct OffWorkers;

impl Blocking for OffWorkers {
    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        tokio::task::block_in_place(f)
    }
}

#[derive(Clone)]
struct Follow {
    leader: BrokerId,
    epoch: i32,
    topic_id: Uuid,
    partition: Arc<Partition>,
    phase: Phase,
    /// The leader's high watermark as of the last fetch (-1 before the first).
    leader_high_watermark: i64,
}

struct Fetcher {
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Inner {
    follows: BTreeMap<Key, Follow>,
    fetchers: BTreeMap<BrokerId, Fetcher>,
}

/// The partitions this node follows, and a fetcher per leader.
pub(super) struct Follows {
    inner: Mutex<Inner>,
}

/// One followed partition's state, for status pages and readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerStatus {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The leader fetched from.
    pub leader: BrokerId,
    /// Leader epoch followed.
    pub leader_epoch: i32,
    /// This replica's log end.
    pub log_end_offset: i64,
    /// The leader's high watermark at the last fetch (-1 before the first).
    pub leader_high_watermark: i64,
    /// Still looking for where its log diverges from the leader's.
    pub truncating: bool,
}

impl Follows {
    pub(super) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Follows `partition` from `leader` at `epoch`; a change of leader or epoch starts over
    /// with truncation.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assign(
        &self,
        cluster: &Weak<Cluster>,
        topic: &str,
        topic_id: Uuid,
        partition: Arc<Partition>,
        leader: BrokerId,
        epoch: i32,
    ) {
        let key = (topic.to_owned(), partition.index);
        let mut inner = self.inner.lock();
        if let Some(f) = inner.follows.get(&key) {
            if f.leader == leader && f.epoch == epoch {
                return;
            }
        }
        inner.follows.insert(
            key,
            Follow {
                leader,
                epoch,
                topic_id,
                partition,
                phase: Phase::START,
                leader_high_watermark: -1,
            },
        );
        let fetcher = inner.fetchers.entry(leader).or_insert_with(|| {
            let wake = Arc::new(Notify::new());
            let task = tokio::spawn(run(cluster.clone(), leader, wake.clone()));
            Fetcher { wake, task }
        });
        fetcher.wake.notify_one();
    }

    /// Stops following a partition (this node leads it now, or it is gone).
    pub(super) fn unassign(&self, topic: &str, partition: i32) {
        self.inner
            .lock()
            .follows
            .remove(&(topic.to_owned(), partition));
    }

    /// Stops every fetcher.
    pub(super) fn stop_all(&self) {
        let mut inner = self.inner.lock();
        inner.follows.clear();
        for (_, f) in std::mem::take(&mut inner.fetchers) {
            f.task.abort();
        }
    }

    /// Followed partitions not yet caught up to the leader's high watermark.
    pub(super) fn lagging(&self) -> Vec<String> {
        self.status()
            .into_iter()
            .filter(|s| {
                s.truncating
                    || s.log_end_offset < s.leader_high_watermark
                    || s.leader_high_watermark < 0
            })
            .map(|s| format!("{}-{}", s.topic, s.partition))
            .collect()
    }

    pub(super) fn status(&self) -> Vec<FollowerStatus> {
        self.inner
            .lock()
            .follows
            .iter()
            .map(|((topic, partition), f)| FollowerStatus {
                topic: topic.clone(),
                partition: *partition,
                leader: f.leader,
                leader_epoch: f.epoch,
                log_end_offset: f.partition.log_end_offset(),
                leader_high_watermark: f.leader_high_watermark,
                truncating: matches!(f.phase, Phase::Truncating { .. }),
            })
            .collect()
    }

    fn work_for(&self, leader: BrokerId) -> Vec<(Key, Follow)> {
        self.inner
            .lock()
            .follows
            .iter()
            .filter(|(_, f)| f.leader == leader)
            .map(|(k, f)| (k.clone(), f.clone()))
            .collect()
    }

    /// Updates a follow if it is still the same assignment (leader and epoch).
    fn update(&self, key: &Key, seen: &Follow, f: impl FnOnce(&mut Follow)) {
        if let Some(cur) = self.inner.lock().follows.get_mut(key) {
            if cur.leader == seen.leader && cur.epoch == seen.epoch {
                f(cur);
            }
        }
    }
}

/// A fetcher's life: fetch from `leader` for as long as some partition follows it.
async fn run(cluster: Weak<Cluster>, leader: BrokerId, wake: Arc<Notify>) {
    let mut conn: Option<PeerConnection> = None;
    let mut session = FetchSession::default();
    let mut backoff = Duration::from_millis(50);
    let mut last_error = String::new();
    loop {
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        if cluster.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let work = cluster.follows.work_for(leader);
        if work.is_empty() {
            conn = None;
            drop(cluster);
            let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
            continue;
        }
        if conn.is_none() {
            let image = cluster.image();
            let Some(reg) = image.broker(leader) else {
                drop(cluster);
                tokio::time::sleep(backoff).await;
                continue;
            };
            let addr = reg.inter_node_addr.clone();
            let client_id = format!("spate-replica-{}", cluster.broker_id);
            let transport = cluster.transport().clone();
            match PeerConnection::connect(&transport, &addr, client_id, Duration::from_secs(3))
                .await
            {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    note(&mut last_error, leader, &e.to_string());
                    drop(cluster);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match round(&cluster, c, &mut session, work).await {
            Ok(true) => {
                backoff = Duration::from_millis(50);
                last_error.clear();
            }
            Ok(false) => {
                // Only errors the leader answered with (a stale or unknown epoch): wait for
                // the metadata to move on.
                drop(cluster);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(e) => {
                note(&mut last_error, leader, &e.to_string());
                conn = None;
                drop(cluster);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Logs a fetcher error once until it changes, so a dead leader does not flood the log.
fn note(last: &mut String, leader: BrokerId, error: &str) {
    if last != error {
        tracing::warn!(
            leader,
            error,
            "replica fetcher cannot reach its leader; retrying"
        );
        *last = error.to_owned();
    }
}

/// One round against the leader: epoch lookups for truncating partitions, then a fetch for
/// the others. Returns whether anything moved forward.
async fn round(
    cluster: &Cluster,
    conn: &mut PeerConnection,
    session: &mut FetchSession,
    work: Vec<(Key, Follow)>,
) -> Result<bool, PeerError> {
    let (truncating, fetching): (Vec<_>, Vec<_>) = work
        .into_iter()
        .partition(|(_, f)| matches!(f.phase, Phase::Truncating { .. }));
    let mut progress = false;
    if !truncating.is_empty() {
        progress |= truncate(cluster, conn, truncating).await?;
    }
    if !fetching.is_empty() {
        progress |= fetch(cluster, conn, session, fetching).await?;
    }
    Ok(progress)
}

/// Asks the leader where our latest epochs end in its log and cuts what diverges.
async fn truncate(
    cluster: &Cluster,
    conn: &mut PeerConnection,
    work: Vec<(Key, Follow)>,
) -> Result<bool, PeerError> {
    let mut progress = false;
    let mut asks = Vec::new();
    for (key, f) in work {
        let Some(ask) = epoch_to_ask(&f.partition, f.phase) else {
            // An empty log (or one written before epochs were kept) has nothing to cut.
            cluster
                .follows
                .update(&key, &f, |cur| cur.phase = Phase::Fetching);
            progress = true;
            continue;
        };
        asks.push((key, f, ask));
    }
    if asks.is_empty() {
        return Ok(progress);
    }
    let mut by_topic: BTreeMap<&str, Vec<OffsetForLeaderPartition>> = BTreeMap::new();
    for ((topic, index), f, ask) in &asks {
        let mut p = OffsetForLeaderPartition::default();
        p.partition = *index;
        p.current_leader_epoch = f.epoch;
        p.leader_epoch = *ask;
        by_topic.entry(topic.as_str()).or_default().push(p);
    }
    let mut req = OffsetForLeaderEpochRequest::default();
    req.replica_id = cluster.broker_id.into();
    req.topics = by_topic
        .into_iter()
        .map(|(t, partitions)| {
            let mut ot = OffsetForLeaderTopic::default();
            ot.topic = TopicName(StrBytes::from_string(t.to_owned()));
            ot.partitions = partitions;
            ot
        })
        .collect();
    let resp: OffsetForLeaderEpochResponse = conn
        .call(
            ApiKey::OffsetForLeaderEpoch,
            EPOCH_VERSION,
            &req,
            Duration::from_secs(10),
        )
        .await?;
    let by_key: std::collections::HashMap<(&str, i32), _> = asks
        .iter()
        .map(|entry| ((entry.0 .0.as_str(), entry.0 .1), entry))
        .collect();
    for t in resp.topics {
        for r in t.partitions {
            let Some((key, f, _)) = by_key.get(&(t.topic.as_str(), r.partition)).copied() else {
                continue;
            };
            if r.error_code != 0 {
                tracing::debug!(topic = %key.0, partition = key.1, error = ?ResponseError::try_from_code(r.error_code), "epoch lookup refused by the leader");
                continue;
            }
            let answer = (r.leader_epoch >= 0 && r.end_offset >= 0)
                .then_some((r.leader_epoch, r.end_offset));
            match on_epoch_answer(&f.partition, f.epoch, answer, &OffWorkers) {
                EpochStep::AskAgain(epoch) => {
                    cluster.follows.update(key, f, |cur| {
                        cur.phase = Phase::Truncating { ask: Some(epoch) }
                    });
                    progress = true;
                }
                EpochStep::Fetch { cut } => {
                    if let Some((from, to)) = cut {
                        cluster
                            .metrics
                            .truncated_records
                            .add((from - to).max(0) as u64);
                        tracing::info!(topic = %key.0, partition = key.1, from, to, leader = f.leader, epoch = f.epoch, "truncated divergent tail");
                    }
                    cluster
                        .follows
                        .update(key, f, |cur| cur.phase = Phase::Fetching);
                    progress = true;
                }
                EpochStep::Moved | EpochStep::Failed => {}
            }
        }
    }
    Ok(progress)
}

/// One replica fetch: appends what the leader sent and takes its high watermark.
async fn fetch(
    cluster: &Cluster,
    conn: &mut PeerConnection,
    session: &mut FetchSession,
    work: Vec<(Key, Follow)>,
) -> Result<bool, PeerError> {
    let settings = cluster.settings();
    // Replicas under a follower throttle sit out this fetch while its rate is used up.
    let me = cluster.broker_id;
    let image = cluster.image();
    let rate =
        super::broker_configs::throttle_rate(&image, me, "follower.replication.throttled.rate");
    // As Kafka: only replicas outside the ISR are throttled; slowing an in-sync one would
    // hold back the high watermark and drop it from the ISR.
    let in_sync = |topic: &str, index: i32| {
        image
            .partition(topic, index)
            .is_some_and(|p| p.isr.contains(&me))
    };
    let mut throttled_keys: std::collections::BTreeSet<Key> = match rate {
        None => Default::default(),
        Some(_) => work
            .iter()
            .filter(|((topic, index), _)| !in_sync(topic, *index))
            .filter(|((topic, index), _)| {
                cluster.local.topics.get(topic).is_some_and(|t| {
                    t.with_config(|c| {
                        c.get("follower.replication.throttled.replicas")
                            .is_some_and(|(v, _)| crate::topic_config::throttles(v, *index, me))
                    })
                })
            })
            .map(|(k, _)| k.clone())
            .collect(),
    };
    let held_back = match rate {
        Some(rate) => !cluster
            .follower_throttle
            .may_fetch(rate, std::time::Instant::now()),
        None => false,
    };
    let work: Vec<(Key, Follow)> = if held_back && !throttled_keys.is_empty() {
        cluster.metrics.throttled_fetches.inc();
        let kept: Vec<(Key, Follow)> = work
            .into_iter()
            .filter(|(k, _)| !throttled_keys.contains(k))
            .collect();
        if kept.is_empty() {
            // Only throttled replicas: wait a little for the rate to pay back the debt.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(false);
        }
        // What is left is not throttled.
        throttled_keys.clear();
        kept
    } else {
        work
    };
    let wait_fsync = cluster.local.sync_acks;
    // Below the free-space watermark this replica stops copying client topics, as a lagging
    // replica would: its fetch offset stands still, the leader drops it from the ISR after
    // replica.lag.time.max.ms, and it catches up once space is back. It keeps fetching them
    // (at most a batch) for the leader's log start, so a DeleteRecords frees space here too.
    // The internal topics (offsets, transactions) keep replicating on the watermark's
    // reserve, so consumers can still commit.
    let disk_full = cluster.local.disk.is_full();
    let paused = |topic: &str| disk_full && !crate::groups::is_internal(topic);
    let mut wanted: Vec<(Key, Uuid, FetchPartition)> = Vec::with_capacity(work.len());
    for ((topic, index), f) in &work {
        // Under an fsync profile the fetch offset tells the leader what is on disk here, not
        // the log end: after a failed or slow fsync the leader must not count the rest.
        let Some(fetch_offset) = f.partition.replica_fetch_offset(wait_fsync) else {
            // The log failed: this replica is offline until the broker restarts.
            continue;
        };
        let mut p = FetchPartition::default();
        p.partition = *index;
        p.current_leader_epoch = f.epoch;
        p.fetch_offset = fetch_offset;
        p.last_fetched_epoch = -1;
        p.log_start_offset = f.partition.log_start_offset();
        p.partition_max_bytes = if paused(topic) {
            0
        } else {
            settings.replica_fetch_max_bytes
        };
        if let (Some(rate), true) = (rate, throttled_keys.contains(&(topic.clone(), *index))) {
            // One response never borrows more than a second of the rate.
            let cap = i32::try_from(rate).unwrap_or(i32::MAX).max(1);
            p.partition_max_bytes = p.partition_max_bytes.min(cap);
        }
        wanted.push(((topic.clone(), *index), f.topic_id, p));
    }
    if wanted.is_empty() {
        // Every replica here is offline: nothing to ask the leader for.
        session.close();
        tokio::time::sleep(Duration::from_millis(100)).await;
        return Ok(false);
    }
    let mut req = FetchRequest::default();
    req.replica_id = cluster.broker_id.into();
    req.max_wait_ms = settings.replica_fetch_wait_max_ms;
    req.min_bytes = 1;
    req.max_bytes = settings.replica_fetch_response_max_bytes;
    // Under a follower throttle the partitions fetched change from one round to the next:
    // those fetches go without a session.
    let sessionless = rate.is_some() && !throttled_keys.is_empty();
    let (topics, forgotten) = session.prepare(&mut req, wanted, sessionless);
    req.topics = topics;
    req.forgotten_topics_data = forgotten;
    let timeout = Duration::from_millis(settings.replica_fetch_wait_max_ms.max(0) as u64)
        + Duration::from_secs(10);
    let resp: FetchResponse = match conn.call(ApiKey::Fetch, FETCH_VERSION, &req, timeout).await {
        Ok(resp) => resp,
        Err(e) => {
            session.close();
            return Err(e);
        }
    };
    match ResponseError::try_from_code(resp.error_code) {
        None => session.answered(resp.session_id),
        Some(ResponseError::FetchSessionIdNotFound | ResponseError::InvalidFetchSessionEpoch) => {
            // The leader lost the session (restarted, or evicted it): start a new one.
            session.close();
            return Ok(true);
        }
        Some(e) => {
            session.close();
            return Err(PeerError::Protocol {
                addr: conn.addr().to_owned(),
                reason: format!("fetch refused with error {e:?}"),
            });
        }
    }
    // In a session an answer without partitions means nothing changed: a healthy idle round,
    // not a refusal to back off from.
    let mut progress = resp.responses.iter().all(|t| t.partitions.is_empty());
    // A fetcher follows every partition its leader leads here (thousands in a large
    // cluster): matching the response to its partitions by scanning was quadratic, and the
    // largest cost of an idle cluster.
    let by_key: std::collections::HashMap<(&str, i32), &(Key, Follow)> = work
        .iter()
        .map(|entry| ((entry.0 .0.as_str(), entry.0 .1), entry))
        .collect();
    for t in resp.responses {
        for pd in t.partitions {
            let Some((key, f)) = by_key.get(&(t.topic.as_str(), pd.partition_index)).copied()
            else {
                continue;
            };
            let p = &f.partition;
            if let Some(e) = ResponseError::try_from_code(pd.error_code) {
                match on_fetch_error(p, f.epoch, e, pd.log_start_offset, &OffWorkers) {
                    FetchErrorStep::Restarted { at } => {
                        tracing::warn!(topic = %key.0, partition = key.1, to = at, "replica behind the leader's log start: emptied and restarted at it");
                        progress = true;
                    }
                    FetchErrorStep::FindDivergence => {
                        tracing::info!(topic = %key.0, partition = key.1, log_end = p.log_end_offset(), "replica fetch out of range; looking for the divergence again");
                        cluster
                            .follows
                            .update(key, f, |cur| cur.phase = Phase::START);
                    }
                    FetchErrorStep::Wait => {
                        tracing::debug!(topic = %key.0, partition = key.1, error = ?e, "replica fetch refused by the leader");
                    }
                }
                continue;
            }
            let mut copied = None;
            let records = pd.records.as_ref().filter(|r| !r.is_empty());
            if let Some(records) = records.filter(|_| !paused(&key.0)) {
                if throttled_keys.contains(key) {
                    cluster.follower_throttle.record(records.len());
                    cluster.metrics.throttled_bytes.add(records.len() as u64);
                }
                let c = copy_batches(p, f.epoch, records, &OffWorkers);
                if c.appended {
                    cluster.local.disk.charge(records.len());
                }
                match c.stopped {
                    Some(CopyStop::Refused(e)) => {
                        tracing::debug!(topic = %key.0, partition = key.1, error = ?e, "replica append refused; the partition moved on");
                    }
                    // ENOSPC despite the watermark: stop copying until space shows.
                    Some(CopyStop::Full) => cluster.local.disk.mark_enospc(),
                    _ => {}
                }
                copied = Some(c);
            }
            if let (Some(c), true) = (copied.filter(|c| c.appended), wait_fsync) {
                // Under an fsync profile the next fetch, which tells the leader we hold these
                // records, goes out only once they are on disk: acks=all then means on disk
                // on every in-sync replica.
                let mut durable = p.durable_offset();
                if tokio::time::timeout(Duration::from_secs(30), wait_durable(&mut durable, c.end))
                    .await
                    .map_or(true, |r| r.is_err())
                {
                    // The next fetch reports only what is on disk (nothing, if the fsync
                    // failed and took the log out of service).
                    tracing::error!(topic = %key.0, partition = key.1, "replica data did not reach disk");
                }
            }
            let start_before = p.log_start_offset();
            if !follow_leader(
                p,
                f.epoch,
                pd.high_watermark,
                pd.log_start_offset,
                &OffWorkers,
            ) {
                // This partition left that leader's epoch while the fetch was out.
                continue;
            }
            if disk_full && p.log_start_offset() > start_before {
                // The leader's DeleteRecords freed space here too: copying resumes at once.
                let d = cluster.local.disk.clone();
                let _ = tokio::task::spawn_blocking(move || d.resample()).await;
            }
            let hw = pd.high_watermark;
            cluster
                .follows
                .update(key, f, |cur| cur.leader_high_watermark = hw);
            progress = true;
        }
    }
    if disk_full {
        // What a paused partition's fetch brings is dropped: do not spin on it.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(progress)
}
