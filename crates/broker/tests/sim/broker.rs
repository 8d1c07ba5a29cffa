//! A simulated broker: spate's real `Partition` (log, producer state, `LeaderState`) on a
//! simulated disk, driven through the same `replica` functions the cluster's tasks run
//! (`take_role` for each image, the leader's admission and fencing of follower fetches and
//! epoch lookups, the follower's divergence, copy and high watermark steps, the ISR change
//! verdict). What is the simulation's own: the messages, timers, and which step runs when.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use spate_broker::partition::{Appended, Partition, Role};
use spate_broker::replica::{
    self, copy_batches, epoch_to_ask, follow_leader, on_epoch_answer, on_fetch_error, take_role,
    CopyStop, EpochStep, FetchErrorStep, Inline, IsrAnswer, Phase, RoleChange, RoleContext,
};
use spate_cluster::metadata::{BrokerId, CommandError, MetadataImage};
use spate_cluster::replication::{AckState, IsrChange};
use spate_log::sim::{SimDisk, Tear};
use spate_log::{Flusher, FsyncPolicy, LogConfig, LogError};
use spate_protocol::batch::{
    build, validate, ControlKind, ControlRecord, NewRecord, ProducerFields,
};
use spate_protocol::records::Compression;
use spate_protocol::ResponseError;
use uuid::Uuid;

use super::log::{decode, ReplicaView};
use super::net::{FetchData, Msg, NodeId, Out, Timer, Write, CONTROLLER, TXN_PRODUCER_ID};
use super::*;

/// Bytes a follower or consumer fetch returns at most (a few batches).
const FETCH_MAX_BYTES: usize = 1_024;

/// A follower's place with its leader (the fetcher's `Follow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follow {
    pub leader: BrokerId,
    pub epoch: i32,
    pub phase: Phase,
}

struct PendingAck {
    client: NodeId,
    client_incarnation: u64,
    req: u64,
    epoch: i32,
    offset: i64,
    deadline_ms: u64,
}

/// A fetch response whose records were copied and wait for the fsync (mode A) before the
/// follower takes the leader's high watermark and fetches again.
struct AwaitingSync {
    epoch: i32,
    high_watermark: i64,
    log_start: i64,
}

pub struct Broker {
    pub id: BrokerId,
    pub up: bool,
    /// Process generation: bumped by every restart; timers and answers of an earlier process
    /// never reach this one.
    pub incarnation: u64,
    disk: SimDisk,
    flusher: Flusher,
    /// The partition while the process is up.
    part: Option<Arc<Partition>>,
    /// The checker's view of the log.
    pub log: ReplicaView,
    /// Durability mode (A): leaders count only synced records, followers sync before fetching.
    synced_acks: bool,
    /// How long a leader waits for an answer to an ISR change before asking again.
    alter_isr_retry_ms: u64,
    image_version: u64,
    broker_epoch: Option<i64>,
    next_req: u64,
    /// Follower requests (OffsetForLeaderEpoch or Fetch) in flight, each with the follow it
    /// was sent for. As in the fetcher, an answer is handled for that follow even when the
    /// partition moved on meanwhile: the partition's own checks must refuse what no longer
    /// applies. A request timed out or answered leaves the list.
    inflight: Vec<(u64, Follow)>,
    /// Bumped on every role change so backoff timers of an earlier role do nothing.
    role_gen: u64,
    pub follow: Option<Follow>,
    /// Copied records waiting for their fsync, by the request that fetched them.
    awaiting_sync: Vec<(u64, AwaitingSync)>,
    pending_acks: Vec<PendingAck>,
    alter_isr: Option<(IsrChange, u64)>,
    group_commit_scheduled: bool,
    /// Until then this broker's fsyncs do not complete (a slow or stalled disk): the
    /// fetcher's wait for its copied records to reach the disk times out, as it may in the
    /// broker, and it fetches again all the same.
    slow_disk_until: u64,
}

fn dir(id: BrokerId) -> PathBuf {
    PathBuf::from(format!("/sim/broker-{id}/{TOPIC}-0"))
}

fn log_config() -> LogConfig {
    LogConfig {
        // Small segments: rolls, sealing and truncation across segments all happen.
        segment_bytes: 2_048,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

impl Broker {
    pub fn new(id: BrokerId, synced_acks: bool, alter_isr_retry_ms: u64) -> Self {
        let mut b = Broker {
            id,
            up: true,
            incarnation: 0,
            disk: SimDisk::new(),
            flusher: Flusher::manual(policy(synced_acks)),
            part: None,
            log: ReplicaView::default(),
            synced_acks,
            alter_isr_retry_ms,
            image_version: 0,
            broker_epoch: None,
            next_req: 0,
            inflight: Vec::new(),
            role_gen: 0,
            follow: None,
            awaiting_sync: Vec::new(),
            pending_acks: Vec::new(),
            alter_isr: None,
            group_commit_scheduled: false,
            slow_disk_until: 0,
        };
        b.open();
        b
    }

    /// Opens the partition as the cluster does: a replica that follows no leader yet.
    fn open(&mut self) {
        self.flusher = Flusher::manual(policy(self.synced_acks));
        let opened = Partition::open_replica_on(
            self.disk.storage(),
            &dir(self.id),
            0,
            log_config(),
            self.flusher.clone(),
        );
        match opened {
            Ok((p, _notes)) => {
                let p = Arc::new(p);
                if let Err(e) = self.log.rebuild(&p) {
                    panic!(
                        "broker {}: cannot read its log after opening it: {e}",
                        self.id
                    );
                }
                self.part = Some(p);
            }
            Err(e) => panic!("broker {}: the partition does not open: {e}", self.id),
        }
    }

    /// The registration id of the current process.
    pub fn uuid(&self) -> Uuid {
        incarnation_uuid(self.id, self.incarnation)
    }

    pub fn set_broker_epoch(&mut self, epoch: i64) {
        self.broker_epoch = Some(epoch);
    }

    /// The real partition (while the process is up).
    pub fn partition(&self) -> Option<&Arc<Partition>> {
        self.part.as_ref()
    }

    /// (leader epoch, high watermark, ISR) while this process leads.
    pub fn leading(&self) -> Option<(i32, i64, Vec<BrokerId>)> {
        let p = self.part.as_ref()?;
        if p.role() != Role::Leader {
            return None;
        }
        let view = p.leader_view()?;
        Some((view.leader_epoch(), p.high_watermark(), view.isr().to_vec()))
    }

    /// The high watermark this process exposes (-1 while down).
    pub fn hw(&self) -> i64 {
        self.part.as_ref().map_or(-1, |p| p.high_watermark())
    }

    pub fn start(&mut self, out: &mut Out) {
        out.timer(1, Timer::Heartbeat);
        out.timer(LAG_CHECK_MS, Timer::LagCheck);
        out.timer(FLUSH_MS, Timer::Flush);
    }

    /// kill -9: every bit of memory is gone, the page cache stays.
    pub fn crash(&mut self) {
        self.up = false;
        self.part = None;
        self.pending_acks.clear();
        self.disk.crash_process();
    }

    /// The power goes out: what was not synced is lost, the last write may be torn.
    pub fn power_loss(&mut self, tear: Tear) {
        self.crash();
        self.disk.power_loss(tear);
    }

    /// A new process on the same disk: it recovers the log, and follows nobody until an
    /// image tells it otherwise.
    pub fn restart(&mut self, out: &mut Out) {
        let incarnation = self.incarnation + 1;
        self.up = true;
        self.incarnation = incarnation;
        self.image_version = 0;
        self.broker_epoch = None;
        self.inflight.clear();
        self.role_gen += 1;
        self.follow = None;
        self.awaiting_sync.clear();
        self.pending_acks.clear();
        self.alter_isr = None;
        self.group_commit_scheduled = false;
        self.open();
        self.start(out);
    }

    /// The disk stalls until `until`: fsyncs wait.
    pub fn slow_disk(&mut self, until: u64) {
        self.slow_disk_until = until;
    }

    /// Runs the queued fsyncs, unless the disk is stalled.
    fn flush(&mut self, now: u64) {
        if now >= self.slow_disk_until {
            self.flusher.flush_now();
        }
    }

    /// After every event: the checker's view follows the real log.
    pub fn refresh_view(&mut self) -> Result<(), String> {
        match &self.part {
            Some(p) => self.log.refresh(p),
            None => Ok(()),
        }
    }

    /// Re-reads the whole log to prove the view did not drift.
    pub fn verify_view(&self) -> Result<(), String> {
        match &self.part {
            Some(p) => self.log.verify(p),
            None => Ok(()),
        }
    }

    fn req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    pub fn handle(&mut self, now: u64, from: NodeId, from_inc: u64, msg: Msg, out: &mut Out) {
        let Some(p) = self.part.clone() else { return };
        match msg {
            Msg::Image { version, image } => self.on_image(&p, now, version, &image, out),
            Msg::RegisterResult { result: Ok(epoch) } => self.broker_epoch = Some(epoch),
            Msg::AlterIsrResult { change, result } => self.on_alter_isr_result(&p, change, result),
            Msg::OffsetForEpoch {
                req,
                current_epoch,
                requested,
            } => {
                let result = replica::epoch_end(&p, true, current_epoch, requested)
                    .map(|(e, end)| (e >= 0 && end >= 0).then_some((e, end)));
                out.send(
                    from,
                    Some(from_inc),
                    Msg::OffsetForEpochResult { req, result },
                );
            }
            Msg::OffsetForEpochResult { req, result } => {
                self.on_offset_for_epoch(&p, req, result, out)
            }
            Msg::Fetch {
                req,
                current_epoch,
                fetch_offset,
                log_start,
            } => {
                let result =
                    self.on_fetch(&p, now, from, current_epoch, fetch_offset, log_start, out);
                out.send(from, Some(from_inc), Msg::FetchResult { req, result });
                self.after_leader_change(&p, now, out);
            }
            Msg::FetchResult { req, result } => self.on_fetch_result(&p, req, result, out),
            Msg::Produce {
                req,
                payload,
                write,
            } => {
                self.on_produce(&p, now, from, from_inc, req, (payload, write), out);
                self.after_leader_change(&p, now, out);
            }
            Msg::ConsumerFetch {
                req,
                offset,
                committed,
            } => {
                // A consumer reads only below the high watermark (read_committed: the last
                // stable offset, as the Fetch handler), and only from a leader.
                let (mut records, mut aborted) = (Vec::new(), Vec::new());
                if p.role() == Role::Leader {
                    let limit = if committed {
                        p.last_stable_offset()
                    } else {
                        p.high_watermark()
                    };
                    records = p
                        .read_upto(offset, FETCH_MAX_BYTES, true, limit)
                        .map(|r| decode(&r.records))
                        .unwrap_or_default();
                    if committed {
                        let upto = records.last().map_or(limit, |r| r.offset + 1);
                        aborted = p
                            .aborted_in(offset, upto)
                            .into_iter()
                            .map(|a| (a.first_offset, a.last_offset))
                            .collect();
                    }
                }
                out.send(
                    from,
                    Some(from_inc),
                    Msg::ConsumerFetchResult {
                        req,
                        records,
                        aborted,
                    },
                );
            }
            _ => {}
        }
    }

    pub fn timer(&mut self, now: u64, timer: Timer, out: &mut Out) {
        let Some(p) = self.part.clone() else { return };
        match timer {
            Timer::Heartbeat => {
                let msg = match self.broker_epoch {
                    Some(broker_epoch) => Msg::Heartbeat { broker_epoch },
                    None => Msg::Register {
                        incarnation: self.uuid().as_u128(),
                    },
                };
                out.send(CONTROLLER, None, msg);
                out.timer(HEARTBEAT_MS, Timer::Heartbeat);
            }
            Timer::LagCheck => {
                self.lag_check(&p, now, out);
                out.timer(LAG_CHECK_MS, Timer::LagCheck);
            }
            Timer::Flush => {
                // The page cache writes back now and then, in both modes.
                self.sync_and_advance(&p, now, out);
                out.timer(FLUSH_MS, Timer::Flush);
            }
            Timer::GroupCommit => {
                self.group_commit_scheduled = false;
                self.sync_and_advance(&p, now, out);
            }
            Timer::FollowerSynced { req } => {
                // The fsync the fetcher waits for before it takes the leader's high watermark
                // and tells the leader it holds the records (`wait_durable` in the fetcher).
                let Some(i) = self.awaiting_sync.iter().position(|(r, _)| *r == req) else {
                    return;
                };
                let (_, a) = self.awaiting_sync.remove(i);
                self.flush(now);
                follow_leader(&p, a.epoch, a.high_watermark, a.log_start, &Inline);
                self.resume_follower(&p, out);
            }
            Timer::RequestTimeout { req } => {
                let before = self.inflight.len();
                self.inflight.retain(|(r, _)| *r != req);
                if self.inflight.len() != before {
                    self.resume_follower(&p, out);
                }
            }
            Timer::FetchBackoff { req_gen } if req_gen == self.role_gen => {
                self.resume_follower(&p, out);
            }
            _ => {}
        }
    }

    /// The flusher runs: what reached the disk may commit records (`Partition::on_durable`,
    /// which the broker calls on every durable-offset change while it leads).
    fn sync_and_advance(&mut self, p: &Partition, now: u64, out: &mut Out) {
        self.flush(now);
        if p.role() == Role::Leader {
            p.on_durable();
        }
        self.after_leader_change(p, now, out);
    }

    fn on_image(
        &mut self,
        p: &Partition,
        now: u64,
        version: u64,
        image: &Rc<MetadataImage>,
        out: &mut Out,
    ) {
        // Images are applied in log order: an older one that arrives late is ignored.
        if version <= self.image_version {
            return;
        }
        self.image_version = version;
        let uuid = self.uuid();
        let registration = image.broker(self.id).filter(|r| r.incarnation == uuid);
        if let Some(r) = registration {
            self.broker_epoch = Some(r.epoch);
        }
        let Some(ps) = image.partition(TOPIC, 0) else {
            return;
        };
        let fenced: BTreeSet<BrokerId> = image
            .brokers()
            .values()
            .filter(|b| b.fenced)
            .map(|b| b.id)
            .collect();
        let before = (p.role(), p.leader_epoch());
        // The cluster's rule (`Cluster::registered_in`): only the process whose own
        // registration the image names, unfenced, may lead.
        let cx = RoleContext {
            me: self.id,
            may_lead: registration.is_some_and(|r| !r.fenced),
            fenced: &fenced,
            now_ms: now,
            lag_time_max_ms: LAG_TIME_MAX_MS,
            sync_acks: self.synced_acks,
        };
        let change = take_role(p, ps, &cx);
        let still_leading = matches!(change, RoleChange::Leads { new: false });
        if before.0 == Role::Leader && !still_leading {
            self.fail_pending_acks(out);
        }
        match change {
            RoleChange::Leads { new } => {
                if new {
                    self.leave_follow();
                }
                if p.leader_view().is_some_and(|l| l.pending_isr().is_none()) {
                    self.alter_isr = None;
                }
                self.after_leader_change(p, now, out);
            }
            RoleChange::Follows { leader, epoch } => {
                if self
                    .follow
                    .is_some_and(|f| f.leader == leader && f.epoch == epoch)
                {
                    return;
                }
                self.leave_follow();
                self.follow = Some(Follow {
                    leader,
                    epoch,
                    phase: Phase::START,
                });
                self.resume_follower(p, out);
            }
            RoleChange::Idle => self.leave_follow(),
        }
    }

    /// Produces waiting on a leadership that ended fail (the partition's `ack_state` says
    /// so too; this answers them at once instead of at their deadline).
    fn fail_pending_acks(&mut self, out: &mut Out) {
        for a in self.pending_acks.drain(..) {
            out.send(
                a.client,
                Some(a.client_incarnation),
                Msg::ProduceResult {
                    req: a.req,
                    result: Err(ResponseError::NotLeaderOrFollower),
                },
            );
        }
        self.alter_isr = None;
    }

    /// Stops following. Requests in flight are not recalled (a fetcher finishes its round).
    fn leave_follow(&mut self) {
        self.follow = None;
        self.role_gen += 1;
    }

    /// Whether `f` is still what this broker follows (same leader and epoch).
    fn still_follows(&self, f: &Follow) -> bool {
        self.follow
            .is_some_and(|cur| cur.leader == f.leader && cur.epoch == f.epoch)
    }

    /// Takes the in-flight request `req` and the follow it was sent for.
    fn answered(&mut self, req: u64) -> Option<Follow> {
        let i = self.inflight.iter().position(|(r, _)| *r == req)?;
        Some(self.inflight.remove(i).1)
    }

    // ---- follower side (the fetcher) ----

    /// Sends the request the follower's phase calls for.
    fn resume_follower(&mut self, p: &Partition, out: &mut Out) {
        let Some(mut f) = self.follow else { return };
        // One request at a time per follow, and none while copied records wait for disk.
        let busy = self
            .inflight
            .iter()
            .any(|(_, g)| g.leader == f.leader && g.epoch == f.epoch)
            || self.awaiting_sync.iter().any(|(_, a)| a.epoch == f.epoch);
        if busy {
            return;
        }
        if let Phase::Truncating { .. } = f.phase {
            if epoch_to_ask(p, f.phase).is_none() {
                f.phase = Phase::Fetching;
                self.follow = Some(f);
            }
        }
        let req = self.req();
        let msg = match f.phase {
            Phase::Truncating { .. } => {
                let Some(requested) = epoch_to_ask(p, f.phase) else {
                    return;
                };
                Msg::OffsetForEpoch {
                    req,
                    current_epoch: f.epoch,
                    requested,
                }
            }
            Phase::Fetching => {
                // What a fetch reports is on disk under an fsync profile.
                let Some(fetch_offset) = p.replica_fetch_offset(self.synced_acks) else {
                    // The log failed: the replica is out of service until restart.
                    return;
                };
                Msg::Fetch {
                    req,
                    current_epoch: f.epoch,
                    fetch_offset,
                    log_start: p.log_start_offset(),
                }
            }
        };
        self.inflight.push((req, f));
        out.send(f.leader, None, msg);
        out.timer(REQUEST_TIMEOUT_MS, Timer::RequestTimeout { req });
    }

    fn backoff(&mut self, out: &mut Out) {
        out.timer(
            FETCH_BACKOFF_MS,
            Timer::FetchBackoff {
                req_gen: self.role_gen,
            },
        );
    }

    fn on_offset_for_epoch(
        &mut self,
        p: &Partition,
        req: u64,
        result: Result<Option<(i32, i64)>, ResponseError>,
        out: &mut Out,
    ) {
        let Some(sent) = self.answered(req) else {
            return;
        };
        let answer = match result {
            Ok(answer) => answer,
            Err(_) => return self.backoff(out),
        };
        let hw_before = p.high_watermark();
        let next = match on_epoch_answer(p, sent.epoch, answer, &Inline) {
            EpochStep::AskAgain(epoch) => Phase::Truncating { ask: Some(epoch) },
            EpochStep::Fetch { cut } => {
                if let Some((_, to)) = cut {
                    if to < hw_before {
                        out.violations.push(format!(
                            "broker {} truncated to {to}, below its high watermark {hw_before}",
                            self.id
                        ));
                    }
                }
                Phase::Fetching
            }
            EpochStep::Moved | EpochStep::Failed => return self.backoff(out),
        };
        if !self.still_follows(&sent) {
            return;
        }
        if let Some(f) = self.follow.as_mut() {
            f.phase = next;
        }
        self.resume_follower(p, out);
    }

    fn on_fetch_result(
        &mut self,
        p: &Partition,
        req: u64,
        result: Result<FetchData, (ResponseError, i64)>,
        out: &mut Out,
    ) {
        let Some(sent) = self.answered(req) else {
            return;
        };
        let data = match result {
            Ok(d) => d,
            Err((e, leader_start)) => {
                let step = on_fetch_error(p, sent.epoch, e, leader_start, &Inline);
                if step == FetchErrorStep::FindDivergence && self.still_follows(&sent) {
                    if let Some(f) = self.follow.as_mut() {
                        f.phase = Phase::START;
                    }
                }
                return self.backoff(out);
            }
        };
        let copied = copy_batches(p, sent.epoch, &data.records, &Inline);
        if let Some(CopyStop::Storage) = copied.stopped {
            out.violations.push(format!(
                "broker {} follower append failed on the disk",
                self.id
            ));
            return;
        }
        if copied.appended && self.synced_acks {
            // The fetcher waits for these records to reach the disk before it takes the
            // leader's high watermark and fetches again: the window where a follower holds
            // records it has not synced.
            self.awaiting_sync.push((
                req,
                AwaitingSync {
                    epoch: sent.epoch,
                    high_watermark: data.high_watermark,
                    log_start: data.log_start,
                },
            ));
            out.timer(GROUP_COMMIT_MS, Timer::FollowerSynced { req });
            return;
        }
        follow_leader(p, sent.epoch, data.high_watermark, data.log_start, &Inline);
        // The next round starts a moment later (right away when there was data).
        let delay = if copied.appended { 1 } else { FETCH_BACKOFF_MS };
        out.timer(
            delay,
            Timer::FetchBackoff {
                req_gen: self.role_gen,
            },
        );
    }

    // ---- leader side ----

    #[allow(clippy::too_many_arguments)]
    fn on_fetch(
        &mut self,
        p: &Partition,
        now: u64,
        from: NodeId,
        current_epoch: i32,
        fetch_offset: i64,
        log_start: i64,
        out: &mut Out,
    ) -> Result<FetchData, (ResponseError, i64)> {
        let start = p.log_start_offset();
        match replica::admit_replica_fetch(p, from, current_epoch, fetch_offset, log_start, now) {
            Ok(Some(change)) => self.send_alter_isr(now, change, out),
            Ok(None) => {}
            Err(e) => return Err((e, start)),
        }
        // As the Fetch handler: the high watermark is taken before the read.
        let high_watermark = p.high_watermark();
        if let Some(e) = replica::fence(p, current_epoch) {
            return Err((e, start));
        }
        match p.read_replica(fetch_offset, FETCH_MAX_BYTES, true) {
            Ok(r) => Ok(FetchData {
                records: r.records,
                high_watermark,
                log_start: start,
            }),
            Err(LogError::OffsetOutOfRange { .. }) => Err((ResponseError::OffsetOutOfRange, start)),
            Err(_) => Err((ResponseError::KafkaStorageError, start)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_produce(
        &mut self,
        p: &Partition,
        now: u64,
        from: NodeId,
        from_inc: u64,
        req: u64,
        (payload, write): (u64, Write),
        out: &mut Out,
    ) {
        let refuse = if p.role() != Role::Leader {
            Some(ResponseError::NotLeaderOrFollower)
        } else if p.accepts_acks_all(MIN_ISR) == Some(false) {
            Some(ResponseError::NotEnoughReplicas)
        } else {
            None
        };
        let reply = |result, out: &mut Out| {
            out.send(from, Some(from_inc), Msg::ProduceResult { req, result });
        };
        if let Some(e) = refuse {
            return reply(Err(e), out);
        }
        let epoch = p.leader_epoch();
        let txn = match write {
            Write::Plain => None,
            Write::TxnData { epoch, seq } => Some(txn_batch(payload, epoch, seq).and_then(|b| {
                // The coordinator is the producer's own: a verification always finds the
                // partition added (it only writes inside an open transaction).
                let h = validate(&b).map_err(|e| format!("invalid txn batch: {e:?}"))?;
                let ticket = p.begin_verification(TXN_PRODUCER_ID);
                Ok(p.append_verified(&b, &h, None, Some(ticket)))
            })),
            Write::Marker {
                epoch,
                commit,
                coordinator_epoch,
            } => {
                let kind = if commit {
                    ControlKind::Commit
                } else {
                    ControlKind::Abort
                };
                let marker = ControlRecord {
                    kind,
                    coordinator_epoch,
                };
                Some(Ok(p.append_marker(TXN_PRODUCER_ID, epoch, marker)))
            }
        };
        if let Some(appended) = txn {
            let offset = match appended {
                Err(e) => {
                    out.violations.push(e);
                    return;
                }
                Ok(Ok(
                    Appended::New { last_offset, .. } | Appended::Duplicate { last_offset, .. },
                )) => last_offset,
                // Fenced epochs, stale coordinators, refused sequences: the client's answer.
                Ok(Err(spate_broker::partition::AppendError::Refused(e))) => {
                    return reply(Err(e), out)
                }
                Ok(Err(e)) => {
                    out.violations
                        .push(format!("broker {} leader txn append: {e:?}", self.id));
                    return;
                }
            };
            out.appended.push((epoch, payload));
            self.await_ack(now, (from, from_inc), req, (epoch, offset), out);
            return;
        }
        let batch = match produce_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                out.violations.push(e);
                return;
            }
        };
        let header = match validate(&batch) {
            Ok(h) => h,
            Err(e) => {
                out.violations
                    .push(format!("the sim built an invalid batch: {e:?}"));
                return;
            }
        };
        let offset = match p.append(&batch, &header, None) {
            Ok(Appended::New { last_offset, .. }) => last_offset,
            Ok(Appended::Duplicate { .. }) => {
                out.violations
                    .push("a non-idempotent produce was taken for a duplicate".into());
                return;
            }
            Err(e) => {
                out.violations
                    .push(format!("broker {} leader append: {e:?}", self.id));
                return;
            }
        };
        out.appended.push((epoch, payload));
        self.await_ack(now, (from, from_inc), req, (epoch, offset), out);
    }

    /// Holds the answer to a produce appended at `offset` in leader epoch `epoch` until the
    /// replicas commit it (acks=all), and schedules the group commit under synced acks.
    fn await_ack(
        &mut self,
        now: u64,
        (client, client_incarnation): (NodeId, u64),
        req: u64,
        (epoch, offset): (i32, i64),
        out: &mut Out,
    ) {
        self.pending_acks.push(PendingAck {
            client,
            client_incarnation,
            req,
            epoch,
            offset,
            deadline_ms: now + PRODUCE_TIMEOUT_MS,
        });
        if self.synced_acks && !self.group_commit_scheduled {
            self.group_commit_scheduled = true;
            out.timer(GROUP_COMMIT_MS, Timer::GroupCommit);
        }
    }

    /// Answers the produces the leader's state settles (the produce handler's wait).
    fn after_leader_change(&mut self, p: &Partition, now: u64, out: &mut Out) {
        self.pending_acks.retain(|a| {
            let result = match p.ack_state(a.epoch, a.offset, MIN_ISR) {
                // The leadership of that epoch is gone.
                None => Err(ResponseError::NotLeaderOrFollower),
                Some(AckState::Done) => Ok(a.offset),
                Some(AckState::TooFewReplicas) => Err(ResponseError::NotEnoughReplicasAfterAppend),
                Some(AckState::Pending) if now >= a.deadline_ms => {
                    Err(ResponseError::RequestTimedOut)
                }
                Some(AckState::Pending) => return true,
            };
            out.send(
                a.client,
                Some(a.client_incarnation),
                Msg::ProduceResult { req: a.req, result },
            );
            false
        });
    }

    fn lag_check(&mut self, p: &Partition, now: u64, out: &mut Out) {
        if let Some(change) = p.check_isr(now) {
            self.send_alter_isr(now, change, out);
        } else if let Some((change, sent)) = self.alter_isr.clone() {
            // No answer (lost either way): while the leader still waits for this very change,
            // ask again (the ISR proposer's retry). If the first one was applied, this one is
            // refused as stale and the image settles it.
            let still_pending = p.leader_view().is_some_and(|l| {
                l.leader_epoch() == change.leader_epoch
                    && l.pending_isr() == Some(change.isr.as_slice())
            });
            if !still_pending {
                self.alter_isr = None;
            } else if now.saturating_sub(sent) >= self.alter_isr_retry_ms {
                self.send_alter_isr(now, change, out);
            }
        }
        self.after_leader_change(p, now, out);
    }

    fn send_alter_isr(&mut self, now: u64, change: IsrChange, out: &mut Out) {
        self.alter_isr = Some((change.clone(), now));
        out.send(CONTROLLER, None, Msg::AlterIsr { change });
    }

    fn on_alter_isr_result(
        &mut self,
        p: &Partition,
        change: IsrChange,
        result: Result<(), CommandError>,
    ) {
        // Every answer is judged, even one for a change this shell stopped waiting for (a
        // duplicate, or one overtaken by a retry): the partition settles only the change it
        // names.
        let verdict = replica::isr_answer(Ok(result.as_ref().map(|_| ())));
        replica::settle_isr_change(p, &change, verdict);
        if self.alter_isr.as_ref().map(|(c, _)| c) == Some(&change)
            && verdict != IsrAnswer::Unanswered
        {
            self.alter_isr = None;
        }
    }
}

fn policy(synced_acks: bool) -> FsyncPolicy {
    if synced_acks {
        FsyncPolicy::Always
    } else {
        FsyncPolicy::Interval {
            every: std::time::Duration::from_millis(FLUSH_MS),
        }
    }
}

/// A producer's batch of one record carrying `payload` as its timestamp.
fn produce_batch(payload: u64) -> Result<Bytes, String> {
    let record = NewRecord {
        key: None,
        value: Some(Bytes::from_static(b"v")),
        timestamp: payload as i64,
    };
    build(&[record], None, Compression::None).map_err(|e| format!("cannot build a batch: {e:?}"))
}

/// A record of the transactional producer's open transaction, its payload id in the
/// timestamp as [`produce_batch`]'s.
fn txn_batch(payload: u64, epoch: i16, seq: i32) -> Result<Bytes, String> {
    let record = NewRecord {
        key: None,
        value: Some(Bytes::from_static(b"t")),
        timestamp: payload as i64,
    };
    let producer = ProducerFields {
        id: TXN_PRODUCER_ID,
        epoch,
        base_sequence: seq,
        transactional: true,
    };
    build(&[record], Some(producer), Compression::None)
        .map_err(|e| format!("cannot build a batch: {e:?}"))
}

/// Registration id of process `incarnation` of broker `id`.
pub fn incarnation_uuid(id: BrokerId, incarnation: u64) -> Uuid {
    Uuid::from_u128(((id as u128) << 64) | u128::from(incarnation + 1))
}

/// A power loss's tear: all unsynced bytes lost, or a seeded prefix of them kept.
pub fn tear(torn: bool, seed: u64) -> Tear {
    if torn {
        Tear::RandomPrefix(seed)
    } else {
        Tear::LoseAll
    }
}
