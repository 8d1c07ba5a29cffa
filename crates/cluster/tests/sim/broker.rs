//! A simulated broker: its log, what it believes (the last image it saw, its role and leader
//! epoch) and the thin shell around the real `LeaderState` and `resolve_divergence`.

use std::collections::BTreeSet;
use std::rc::Rc;

use spate_cluster::metadata::{BrokerId, CommandError, MetadataImage};
use spate_cluster::replication::{
    resolve_divergence, AckState, Divergence, IsrChange, LeaderState,
};
use uuid::Uuid;

use super::log::{Record, SimLog};
use super::net::{KafkaError, Msg, NodeId, Out, Timer, CONTROLLER};
use super::*;

pub enum Role {
    /// No leader to follow (or the image names this broker's previous process).
    Idle,
    Leader(Box<LeaderState>),
    Follower {
        leader: BrokerId,
        epoch: i32,
        phase: Phase,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// OffsetForLeaderEpoch rounds, asking about this epoch.
    Truncating {
        asked: i32,
    },
    Fetching,
}

struct PendingAck {
    client: NodeId,
    client_incarnation: u64,
    req: u64,
    offset: i64,
    deadline_ms: u64,
}

pub struct Broker {
    pub id: BrokerId,
    pub up: bool,
    /// Process generation: bumped by every restart; timers and answers of an earlier process
    /// never reach this one.
    pub incarnation: u64,
    pub log: SimLog,
    pub hw: i64,
    pub role: Role,
    /// Durability mode (A): leaders count only synced records, followers sync before fetching.
    synced_acks: bool,
    image_version: u64,
    broker_epoch: Option<i64>,
    next_req: u64,
    /// The one follower request (OffsetForLeaderEpoch or Fetch) whose answer is awaited;
    /// any other answer is stale (a retry overtook it, or the role changed).
    outstanding: Option<u64>,
    /// Bumped on every role change so backoff timers of an earlier role do nothing.
    role_gen: u64,
    pending_acks: Vec<PendingAck>,
    alter_isr: Option<(IsrChange, u64)>,
    group_commit_scheduled: bool,
}

impl Broker {
    pub fn new(id: BrokerId, synced_acks: bool) -> Self {
        Broker {
            id,
            up: true,
            incarnation: 0,
            log: SimLog::default(),
            hw: 0,
            role: Role::Idle,
            synced_acks,
            image_version: 0,
            broker_epoch: None,
            next_req: 0,
            outstanding: None,
            role_gen: 0,
            pending_acks: Vec::new(),
            alter_isr: None,
            group_commit_scheduled: false,
        }
    }

    /// The registration id of the current process.
    pub fn uuid(&self) -> Uuid {
        incarnation_uuid(self.id, self.incarnation)
    }

    pub fn set_broker_epoch(&mut self, epoch: i64) {
        self.broker_epoch = Some(epoch);
    }

    pub fn leader_state(&self) -> Option<&LeaderState> {
        match &self.role {
            Role::Leader(ls) => Some(ls),
            _ => None,
        }
    }

    pub fn start(&mut self, out: &mut Out) {
        out.timer(1, Timer::Heartbeat);
        out.timer(LAG_CHECK_MS, Timer::LagCheck);
        out.timer(FLUSH_MS, Timer::Flush);
    }

    /// kill -9 (or the power going out): every bit of memory is gone.
    pub fn crash(&mut self) {
        self.up = false;
        self.role = Role::Idle;
        self.pending_acks.clear();
    }

    /// A new process on the same disk: it reloads the log, and follows nobody until an image
    /// tells it otherwise.
    pub fn restart(&mut self, out: &mut Out) {
        let (id, synced_acks, incarnation) = (self.id, self.synced_acks, self.incarnation + 1);
        let log = std::mem::take(&mut self.log);
        *self = Broker::new(id, synced_acks);
        self.incarnation = incarnation;
        self.log = log;
        self.log.reload();
        self.start(out);
    }

    /// What the high watermark may count of the local log.
    fn hw_end(&self) -> i64 {
        if self.synced_acks {
            self.log.synced_end()
        } else {
            self.log.end()
        }
    }

    fn req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    pub fn handle(&mut self, now: u64, from: NodeId, from_inc: u64, msg: Msg, out: &mut Out) {
        match msg {
            Msg::Image { version, image } => self.on_image(now, version, &image, out),
            Msg::RegisterResult { result: Ok(epoch) } => self.broker_epoch = Some(epoch),
            Msg::AlterIsrResult { change, result } => self.on_alter_isr_result(change, result),
            Msg::OffsetForEpoch {
                req,
                current_epoch,
                requested,
            } => {
                let result = self
                    .check_leader_epoch(current_epoch)
                    .map(|()| self.log.end_offset_for(requested));
                out.send(
                    from,
                    Some(from_inc),
                    Msg::OffsetForEpochResult { req, result },
                );
            }
            Msg::OffsetForEpochResult { req, result } => self.on_offset_for_epoch(req, result, out),
            Msg::Fetch {
                req,
                current_epoch,
                fetch_offset,
            } => {
                let result = self.on_fetch(now, from, current_epoch, fetch_offset, out);
                out.send(from, Some(from_inc), Msg::FetchResult { req, result });
                self.after_leader_change(now, out);
            }
            Msg::FetchResult { req, result } => self.on_fetch_result(req, result, out),
            Msg::Produce { req, payload } => {
                self.on_produce(now, from, from_inc, req, payload, out);
                self.after_leader_change(now, out);
            }
            Msg::ConsumerFetch { req, offset } => {
                // A consumer reads only below the high watermark, and only from a leader.
                let records = match &self.role {
                    Role::Leader(_) => self.read(offset, self.hw),
                    _ => Vec::new(),
                };
                out.send(
                    from,
                    Some(from_inc),
                    Msg::ConsumerFetchResult { req, records },
                );
            }
            _ => {}
        }
    }

    pub fn timer(&mut self, now: u64, timer: Timer, out: &mut Out) {
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
                self.lag_check(now, out);
                out.timer(LAG_CHECK_MS, Timer::LagCheck);
            }
            Timer::Flush => {
                // The page cache writes back now and then, in both modes.
                self.sync_and_advance(now, out);
                out.timer(FLUSH_MS, Timer::Flush);
            }
            Timer::GroupCommit => {
                self.group_commit_scheduled = false;
                self.sync_and_advance(now, out);
            }
            Timer::RequestTimeout { req } if self.outstanding == Some(req) => {
                self.outstanding = None;
                self.resume_follower(out);
            }
            Timer::FetchBackoff { req_gen }
                if req_gen == self.role_gen && self.outstanding.is_none() =>
            {
                self.resume_follower(out);
            }
            _ => {}
        }
    }

    fn sync_and_advance(&mut self, now: u64, out: &mut Out) {
        self.log.sync();
        let end = self.hw_end();
        if let Role::Leader(ls) = &mut self.role {
            ls.on_leader_append(end);
        }
        self.after_leader_change(now, out);
    }

    fn on_image(&mut self, now: u64, version: u64, image: &Rc<MetadataImage>, out: &mut Out) {
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
        // Leadership named in the image belongs to the registration it was given to: a
        // restarted process must not resume its predecessor's epoch (its log may have lost
        // records of that epoch that followers hold).
        let registered_live = registration.is_some_and(|r| !r.fenced);
        let Some(p) = image.partition(TOPIC, 0) else {
            return;
        };
        let fenced: BTreeSet<BrokerId> = image
            .brokers()
            .values()
            .filter(|b| b.fenced)
            .map(|b| b.id)
            .collect();
        let end = self.hw_end();
        match p.leader {
            Some(l) if l == self.id && registered_live => {
                match &mut self.role {
                    Role::Leader(ls) if ls.leader_epoch() == p.leader_epoch => {
                        ls.on_metadata(
                            p.partition_epoch,
                            p.replicas.clone(),
                            p.isr.clone(),
                            fenced,
                            end,
                            now,
                        );
                        if ls.pending_isr().is_none() {
                            self.alter_isr = None;
                        }
                    }
                    _ => {
                        self.step_down(out);
                        self.log.assign_epoch(p.leader_epoch, self.log.end());
                        let mut ls = LeaderState::new(
                            self.id,
                            p.leader_epoch,
                            p.partition_epoch,
                            p.replicas.clone(),
                            p.isr.clone(),
                            end,
                            self.hw,
                            now,
                            LAG_TIME_MAX_MS,
                        );
                        ls.on_metadata(
                            p.partition_epoch,
                            p.replicas.clone(),
                            p.isr.clone(),
                            fenced,
                            end,
                            now,
                        );
                        self.role = Role::Leader(Box::new(ls));
                    }
                }
                self.after_leader_change(now, out);
            }
            Some(l) if l != self.id => {
                if matches!(self.role, Role::Follower { leader, epoch, .. }
                    if leader == l && epoch == p.leader_epoch)
                {
                    return;
                }
                self.step_down(out);
                let asked = self.log.latest_epoch();
                self.role = Role::Follower {
                    leader: l,
                    epoch: p.leader_epoch,
                    phase: match asked {
                        Some(asked) => Phase::Truncating { asked },
                        None => Phase::Fetching,
                    },
                };
                self.resume_follower(out);
            }
            _ => {
                self.step_down(out);
            }
        }
    }

    /// Leaves the current role: produces waiting on this leadership fail, follower requests
    /// in flight are forgotten.
    fn step_down(&mut self, out: &mut Out) {
        for p in self.pending_acks.drain(..) {
            out.send(
                p.client,
                Some(p.client_incarnation),
                Msg::ProduceResult {
                    req: p.req,
                    result: Err(KafkaError::NotLeaderOrFollower),
                },
            );
        }
        self.alter_isr = None;
        self.outstanding = None;
        self.role_gen += 1;
        self.role = Role::Idle;
    }

    fn check_leader_epoch(&self, current_epoch: i32) -> Result<(), KafkaError> {
        match &self.role {
            Role::Leader(ls) if current_epoch < ls.leader_epoch() => {
                Err(KafkaError::FencedLeaderEpoch)
            }
            Role::Leader(ls) if current_epoch > ls.leader_epoch() => {
                Err(KafkaError::UnknownLeaderEpoch)
            }
            Role::Leader(_) => Ok(()),
            _ => Err(KafkaError::NotLeaderOrFollower),
        }
    }

    fn read(&self, from: i64, below: i64) -> Vec<Record> {
        let start = usize::try_from(from.max(0)).unwrap_or(0);
        let end = usize::try_from(below.max(0))
            .unwrap_or(0)
            .min(self.log.records().len())
            .min(start + MAX_FETCH_RECORDS);
        self.log.records().get(start..end).unwrap_or(&[]).to_vec()
    }

    // ---- follower side ----

    /// Sends the request the follower's phase calls for.
    fn resume_follower(&mut self, out: &mut Out) {
        let Role::Follower {
            leader,
            epoch,
            phase,
        } = self.role
        else {
            return;
        };
        let req = self.req();
        self.outstanding = Some(req);
        let msg = match phase {
            Phase::Truncating { asked } => Msg::OffsetForEpoch {
                req,
                current_epoch: epoch,
                requested: asked,
            },
            Phase::Fetching => {
                if self.synced_acks {
                    // Mode A: what a fetch reports to the leader is on disk.
                    self.log.sync();
                }
                Msg::Fetch {
                    req,
                    current_epoch: epoch,
                    fetch_offset: self.log.end(),
                }
            }
        };
        out.send(leader, None, msg);
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
        req: u64,
        result: Result<Option<(i32, i64)>, KafkaError>,
        out: &mut Out,
    ) {
        if self.outstanding != Some(req) {
            return;
        }
        self.outstanding = None;
        let Role::Follower {
            phase: Phase::Truncating { .. },
            ..
        } = self.role
        else {
            return;
        };
        let answer = match result {
            Ok(answer) => answer,
            Err(_) => return self.backoff(out),
        };
        let log = &self.log;
        let step = resolve_divergence(
            answer,
            |e| log.end_offset_for(e),
            log.end(),
            log.first_epoch_start(),
        );
        let next = match step {
            Divergence::TruncateTo(cut) => {
                if cut < self.hw {
                    out.violations.push(format!(
                        "broker {} truncates to {cut}, below its high watermark {}",
                        self.id, self.hw
                    ));
                }
                self.log.truncate(cut);
                self.hw = self.hw.min(self.log.end());
                Phase::Fetching
            }
            Divergence::AskAgain(asked) => Phase::Truncating { asked },
        };
        if let Role::Follower { phase, .. } = &mut self.role {
            *phase = next;
        }
        self.resume_follower(out);
    }

    fn on_fetch_result(
        &mut self,
        req: u64,
        result: Result<(Vec<Record>, i64), KafkaError>,
        out: &mut Out,
    ) {
        if self.outstanding != Some(req) {
            return;
        }
        self.outstanding = None;
        let Role::Follower {
            phase: Phase::Fetching,
            ..
        } = self.role
        else {
            return;
        };
        let (records, leader_hw) = match result {
            Ok(r) => r,
            Err(KafkaError::OffsetOutOfRange) => {
                // Our log is ahead of the leader's: find the divergence again.
                if let Some(asked) = self.log.latest_epoch() {
                    if let Role::Follower { phase, .. } = &mut self.role {
                        *phase = Phase::Truncating { asked };
                    }
                }
                return self.backoff(out);
            }
            Err(_) => return self.backoff(out),
        };
        let got = records.len();
        for r in records {
            if let Err(e) = self.log.append_replicated(r) {
                out.violations
                    .push(format!("broker {} follower append: {e}", self.id));
                return;
            }
        }
        self.hw = self.hw.max(leader_hw.min(self.log.end()));
        // The next round starts a moment later (right away when there was data), which is
        // the window where a follower holds records it has not synced.
        let delay = if got > 0 { 1 } else { FETCH_BACKOFF_MS };
        out.timer(
            delay,
            Timer::FetchBackoff {
                req_gen: self.role_gen,
            },
        );
    }

    // ---- leader side ----

    fn on_fetch(
        &mut self,
        now: u64,
        from: NodeId,
        current_epoch: i32,
        fetch_offset: i64,
        out: &mut Out,
    ) -> Result<(Vec<Record>, i64), KafkaError> {
        self.check_leader_epoch(current_epoch)?;
        if fetch_offset > self.log.end() || fetch_offset < 0 {
            return Err(KafkaError::OffsetOutOfRange);
        }
        let end = self.hw_end();
        let Role::Leader(ls) = &mut self.role else {
            return Err(KafkaError::NotLeaderOrFollower);
        };
        let Ok(outcome) = ls.on_follower_fetch(from, fetch_offset, end, now) else {
            return Err(KafkaError::NotLeaderOrFollower);
        };
        let hw = ls.high_watermark();
        if let Some(change) = outcome.expand {
            self.send_alter_isr(now, change, out);
        }
        Ok((self.read(fetch_offset, i64::MAX), hw))
    }

    fn on_produce(
        &mut self,
        now: u64,
        from: NodeId,
        from_inc: u64,
        req: u64,
        payload: u64,
        out: &mut Out,
    ) {
        let end_before_sync = self.hw_end();
        let refuse = match &self.role {
            Role::Leader(ls) if ls.accepts_acks_all(MIN_ISR) => None,
            Role::Leader(_) => Some(KafkaError::NotEnoughReplicas),
            _ => Some(KafkaError::NotLeaderOrFollower),
        };
        if let Some(e) = refuse {
            out.send(
                from,
                Some(from_inc),
                Msg::ProduceResult {
                    req,
                    result: Err(e),
                },
            );
            return;
        }
        let Role::Leader(ls) = &mut self.role else {
            return;
        };
        let epoch = ls.leader_epoch();
        let offset = match self.log.append(epoch, payload) {
            Ok(o) => o,
            Err(e) => {
                out.violations
                    .push(format!("broker {} leader append: {e}", self.id));
                return;
            }
        };
        out.appended.push((epoch, payload));
        let end = if self.synced_acks {
            end_before_sync
        } else {
            self.log.end()
        };
        ls.on_leader_append(end);
        self.pending_acks.push(PendingAck {
            client: from,
            client_incarnation: from_inc,
            req,
            offset,
            deadline_ms: now + PRODUCE_TIMEOUT_MS,
        });
        if self.synced_acks && !self.group_commit_scheduled {
            self.group_commit_scheduled = true;
            out.timer(GROUP_COMMIT_MS, Timer::GroupCommit);
        }
    }

    /// Publishes the leader's high watermark and answers the produces it settles.
    fn after_leader_change(&mut self, now: u64, out: &mut Out) {
        let Role::Leader(ls) = &self.role else {
            return;
        };
        self.hw = ls.high_watermark();
        self.pending_acks.retain(|p| {
            let result = match ls.ack_state(p.offset, MIN_ISR) {
                AckState::Done => Ok(p.offset),
                AckState::TooFewReplicas => Err(KafkaError::NotEnoughReplicasAfterAppend),
                AckState::Pending if now >= p.deadline_ms => Err(KafkaError::RequestTimedOut),
                AckState::Pending => return true,
            };
            out.send(
                p.client,
                Some(p.client_incarnation),
                Msg::ProduceResult { req: p.req, result },
            );
            false
        });
    }

    fn lag_check(&mut self, now: u64, out: &mut Out) {
        if let Role::Leader(ls) = &mut self.role {
            if let Some(change) = ls.check_lagging(now) {
                self.send_alter_isr(now, change, out);
            } else if let Some((change, sent)) = self.alter_isr.clone() {
                if now.saturating_sub(sent) >= ALTER_ISR_RETRY_MS {
                    // No answer (lost either way): send the same proposal again. If the first
                    // one was applied, this one is refused as stale and the image settles it.
                    self.send_alter_isr(now, change, out);
                }
            }
        }
        self.after_leader_change(now, out);
    }

    fn send_alter_isr(&mut self, now: u64, change: IsrChange, out: &mut Out) {
        self.alter_isr = Some((change.clone(), now));
        out.send(CONTROLLER, None, Msg::AlterIsr { change });
    }

    fn on_alter_isr_result(&mut self, change: IsrChange, result: Result<(), CommandError>) {
        if self.alter_isr.as_ref().map(|(c, _)| c) != Some(&change) {
            return;
        }
        self.alter_isr = None;
        let Err(e) = result else {
            // Applied: the image that carries it settles the proposal.
            return;
        };
        // Only a refusal that proves the proposal was never applied may drop it. A stale
        // partition epoch may be the answer to a retry of a proposal that was applied (its
        // first answer lost); dropping it then would let the high watermark pass a replica
        // that is already in the committed ISR. Wait for the image instead.
        let never_applied = matches!(
            e,
            CommandError::InvalidIsr { .. } | CommandError::IneligibleReplica { .. }
        );
        if let Role::Leader(ls) = &mut self.role {
            if never_applied {
                ls.on_isr_change_failed(&change);
            }
        }
    }
}

/// Registration id of process `incarnation` of broker `id`.
pub fn incarnation_uuid(id: BrokerId, incarnation: u64) -> Uuid {
    Uuid::from_u128(((id as u128) << 64) | u128::from(incarnation + 1))
}
