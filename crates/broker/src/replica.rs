//! The replication steps one broker takes for one partition, free of I/O and of the clock:
//! the role a metadata image gives it, the leader's answers to its followers, a follower's
//! handling of its leader's answers, and the fate of a proposed ISR change.
//!
//! The cluster's async tasks (`cluster::reconcile`, `cluster::fetcher`, the Fetch and
//! OffsetForLeaderEpoch handlers, the ISR proposer) run these with real sockets and timers;
//! the replication simulation (`tests/replication_sim.rs`) runs the very same functions over
//! a simulated network, disk and clock, so a defect in them is found by seeds.

use std::collections::BTreeSet;

use bytes::Bytes;
use spate_cluster::metadata::{BrokerId, CommandError, PartitionState};
use spate_cluster::replication::{resolve_divergence, Divergence, IsrChange};
use spate_protocol::batch::Batches;
use spate_protocol::ResponseError;

use crate::partition::{AppendError, Leadership, Partition, ReplicaFetchError, Role};

/// Where a blocking step (an fsync of the epoch checkpoint, a truncation) runs: off the async
/// workers in the broker, inline in the simulation.
pub trait Blocking {
    /// Runs `f` where blocking is allowed.
    fn run<T>(&self, f: impl FnOnce() -> T) -> T;
}

/// Runs blocking steps inline (the simulation, tests, or code already on the blocking pool).
pub struct Inline;

impl Blocking for Inline {
    fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        f()
    }
}

// ---- the role an image gives ----

/// What a broker knows when it reads an image, the same for every partition in it.
pub struct RoleContext<'a> {
    /// This broker.
    pub me: BrokerId,
    /// Whether this process may lead: the image names its own live registration and its
    /// session lease holds.
    pub may_lead: bool,
    /// Brokers the image lists as fenced.
    pub fenced: &'a BTreeSet<BrokerId>,
    /// Monotonic ms.
    pub now_ms: u64,
    /// `replica.lag.time.max.ms`.
    pub lag_time_max_ms: u64,
    /// Count only what is on disk towards the high watermark (fsync profiles).
    pub sync_acks: bool,
}

/// What a partition became after an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleChange {
    /// Leads; `new` when this image started the leadership (a new epoch).
    Leads {
        /// The leadership is new.
        new: bool,
    },
    /// Follows `leader` at `epoch`: a fetcher should copy from it.
    Follows {
        /// The leader to fetch from.
        leader: BrokerId,
        /// Its leader epoch.
        epoch: i32,
    },
    /// Neither: no leader, or not a replica here. No fetcher.
    Idle,
}

/// Gives `p` the role the partition state `ps` of an image assigns this broker.
pub fn take_role(p: &Partition, ps: &PartitionState, cx: &RoleContext<'_>) -> RoleChange {
    match ps.leader {
        Some(leader) if leader == cx.me && cx.may_lead => {
            if p.role() == Role::Leader && p.leader_epoch() == ps.leader_epoch {
                p.leader_metadata(
                    ps.partition_epoch,
                    ps.replicas.clone(),
                    ps.isr.clone(),
                    cx.fenced.clone(),
                    cx.now_ms,
                );
                RoleChange::Leads { new: false }
            } else {
                let leadership = Leadership {
                    me: cx.me,
                    leader_epoch: ps.leader_epoch,
                    partition_epoch: ps.partition_epoch,
                    replicas: ps.replicas.clone(),
                    isr: ps.isr.clone(),
                    sync_acks: cx.sync_acks,
                };
                p.become_leader(leadership, cx.now_ms, cx.lag_time_max_ms);
                RoleChange::Leads { new: true }
            }
        }
        Some(leader) if leader != cx.me && ps.replicas.contains(&cx.me) => {
            if p.role() != Role::Follower || p.leader_epoch() != ps.leader_epoch {
                p.set_role(Role::Follower, ps.leader_epoch);
            }
            RoleChange::Follows {
                leader,
                epoch: ps.leader_epoch,
            }
        }
        _ => {
            if p.role() != Role::Follower || p.leader_epoch() != ps.leader_epoch {
                p.set_role(Role::Follower, ps.leader_epoch);
            }
            RoleChange::Idle
        }
    }
}

// ---- the fate of an ISR change ----

/// What the quorum's answer to a proposed ISR change means for the leader that proposed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsrAnswer {
    /// Applied: the image that carries it settles the pending change.
    Applied,
    /// The partition moved on (a newer partition or leader epoch, another leader), possibly
    /// because an earlier attempt of this very change was applied: the image settles it.
    Overtaken,
    /// Refused on its merits (an ineligible replica, an invalid ISR): never applied, so the
    /// leader forgets it and may decide again.
    NeverApplied,
    /// No answer: it may have been applied. Keep it pending and ask again; a repeat of an
    /// applied change is refused as stale and the image settles it.
    Unanswered,
}

/// Classifies the quorum's answer: `Ok(Ok(()))` applied, `Ok(Err(e))` refused with `e`,
/// `Err(())` no answer.
pub fn isr_answer(answer: Result<Result<(), &CommandError>, ()>) -> IsrAnswer {
    match answer {
        Ok(Ok(())) => IsrAnswer::Applied,
        Ok(Err(
            CommandError::StalePartitionEpoch { .. }
            | CommandError::FencedLeaderEpoch { .. }
            | CommandError::UnknownLeaderEpoch { .. }
            | CommandError::NotLeader { .. },
        )) => IsrAnswer::Overtaken,
        Ok(Err(_)) => IsrAnswer::NeverApplied,
        Err(()) => IsrAnswer::Unanswered,
    }
}

/// Acts on an answer for `p`: only a change proven never applied is forgotten, and only
/// that change (another one may be pending by now).
pub fn settle_isr_change(p: &Partition, change: &IsrChange, answer: IsrAnswer) {
    if answer == IsrAnswer::NeverApplied {
        p.isr_change_failed(change);
    }
}

// ---- the leader's side ----

/// Admits a follower's fetch at the leader: this broker must lead, the follower must be a
/// replica, and a fetch in the current epoch counts as the follower's progress (it may move
/// the high watermark and return an ISR expansion to propose). A fetch naming another epoch
/// is admitted without counting; [`fence`] answers it when reading.
pub fn admit_replica_fetch(
    p: &Partition,
    follower: BrokerId,
    current_leader_epoch: i32,
    fetch_offset: i64,
    follower_log_start: i64,
    now_ms: u64,
) -> Result<Option<IsrChange>, ResponseError> {
    if p.role() != Role::Leader {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    if current_leader_epoch >= 0 && current_leader_epoch != p.leader_epoch() {
        return Ok(None);
    }
    p.on_replica_fetch(follower, fetch_offset, follower_log_start, now_ms)
        .map_err(|e| match e {
            ReplicaFetchError::NotLeader | ReplicaFetchError::Replica(_) => {
                ResponseError::NotLeaderOrFollower
            }
        })
}

/// KIP-320's fencing of a request carrying `current_leader_epoch` (-1: not checked).
pub fn fence(p: &Partition, current_leader_epoch: i32) -> Option<ResponseError> {
    let epoch = p.leader_epoch();
    if current_leader_epoch >= 0 && current_leader_epoch > epoch {
        Some(ResponseError::UnknownLeaderEpoch)
    } else if current_leader_epoch >= 0 && current_leader_epoch < epoch {
        Some(ResponseError::FencedLeaderEpoch)
    } else {
        None
    }
}

/// OffsetForLeaderEpoch at the leader: the largest epoch at most `epoch` and where it ends
/// here, `(-1, -1)` when none. With `leading_required` a follower does not answer (only a
/// debugging client may ask one).
pub fn epoch_end(
    p: &Partition,
    leading_required: bool,
    current_leader_epoch: i32,
    epoch: i32,
) -> Result<(i32, i64), ResponseError> {
    if leading_required && p.role() == Role::Follower {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    if p.is_offline() {
        return Err(ResponseError::KafkaStorageError);
    }
    let mine = p.leader_epoch();
    if current_leader_epoch >= 0 && current_leader_epoch < mine {
        return Err(ResponseError::FencedLeaderEpoch);
    }
    if current_leader_epoch > mine {
        return Err(ResponseError::UnknownLeaderEpoch);
    }
    Ok(p.end_offset_for_epoch(epoch).unwrap_or((-1, -1)))
}

// ---- the follower's side ----

/// Where a follower stands with its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Looking for the divergence point; `ask` is the epoch to ask about next (the latest
    /// local one when `None`).
    Truncating {
        /// The epoch to ask about.
        ask: Option<i32>,
    },
    /// Copying batches.
    Fetching,
}

impl Phase {
    /// Where a follower starts with a new leader or epoch.
    pub const START: Phase = Phase::Truncating { ask: None };
}

/// The epoch a truncating follower asks its leader about, or `None` when an empty log (or
/// one written before epochs were kept) has nothing to cut: it may fetch at once.
pub fn epoch_to_ask(p: &Partition, phase: Phase) -> Option<i32> {
    match (phase, p.epochs().last()) {
        (Phase::Truncating { ask: Some(e) }, _) => Some(e),
        (_, Some(last)) => Some(last.epoch),
        (_, None) => None,
    }
}

/// What a follower did with its leader's answer to OffsetForLeaderEpoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochStep {
    /// Ask again about an older epoch.
    AskAgain(i32),
    /// The logs agree up to the log end now; `cut` says what was truncated (from, to).
    Fetch {
        /// The divergent tail removed, if any: (old end, new end).
        cut: Option<(i64, i64)>,
    },
    /// The partition moved on to another epoch or role meanwhile: nothing done.
    Moved,
    /// Truncation failed on the disk.
    Failed,
}

/// Resolves a follower's divergence from its leader's answer `(epoch, end offset)` (`None`
/// when the leader knows no epoch at most the one asked), cutting the divergent tail.
pub fn on_epoch_answer(
    p: &Partition,
    leader_epoch: i32,
    answer: Option<(i32, i64)>,
    blocking: &impl Blocking,
) -> EpochStep {
    let first_epoch_start = p.epochs().first().map_or(0, |e| e.start_offset);
    let end = p.log_end_offset();
    match resolve_divergence(
        answer,
        |e| p.end_offset_for_epoch(e),
        end,
        first_epoch_start,
    ) {
        Divergence::AskAgain(epoch) => EpochStep::AskAgain(epoch),
        Divergence::TruncateTo(offset) => {
            let offset = offset.max(p.log_start_offset());
            if offset >= end {
                return EpochStep::Fetch { cut: None };
            }
            match blocking.run(|| p.truncate_following(offset, leader_epoch)) {
                Ok(Some(new_end)) => EpochStep::Fetch {
                    cut: Some((end, new_end)),
                },
                Ok(None) => EpochStep::Moved,
                Err(e) => {
                    tracing::error!(partition = p.index, error = %e, "truncation failed");
                    EpochStep::Failed
                }
            }
        }
    }
}

/// What a follower does after its leader refused a fetch with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchErrorStep {
    /// Behind the leader's log start (retention, DeleteRecords): emptied and restarted at
    /// the leader's first offset.
    Restarted {
        /// Where the log now starts.
        at: i64,
    },
    /// The log end is past the leader's: look for the divergence again.
    FindDivergence,
    /// Nothing to do here (a stale epoch, the leader moved on): wait for the metadata.
    Wait,
}

/// Handles the leader's error for one partition of a follower's fetch.
pub fn on_fetch_error(
    p: &Partition,
    leader_epoch: i32,
    error: ResponseError,
    leader_log_start: i64,
    blocking: &impl Blocking,
) -> FetchErrorStep {
    if error != ResponseError::OffsetOutOfRange {
        return FetchErrorStep::Wait;
    }
    let end = p.log_end_offset();
    if leader_log_start <= end {
        return FetchErrorStep::FindDivergence;
    }
    match blocking.run(|| p.reset_following(leader_log_start, leader_epoch)) {
        Ok(true) => FetchErrorStep::Restarted {
            at: leader_log_start,
        },
        Ok(false) => FetchErrorStep::Wait,
        Err(e) => {
            tracing::error!(partition = p.index, error = %e, "cannot restart the replica at the leader's log start");
            FetchErrorStep::Wait
        }
    }
}

/// What appending a fetch response's records did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// At least one batch was appended.
    pub appended: bool,
    /// The log end afterwards.
    pub end: i64,
    /// Why copying stopped early, if it did.
    pub stopped: Option<CopyStop>,
}

/// Why a follower stopped copying a response's batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyStop {
    /// The partition moved on (another epoch or role): the rest belongs to nobody.
    Refused(ResponseError),
    /// The disk failed.
    Storage,
    /// The disk is full (ENOSPC): nothing of the batch was kept, the log stays in service.
    Full,
}

/// Appends the batches of a fetch response as received (offsets and epochs kept), skipping
/// those already here (a response overlapping one that raced with a truncation).
pub fn copy_batches(
    p: &Partition,
    leader_epoch: i32,
    records: &Bytes,
    blocking: &impl Blocking,
) -> Copied {
    let mut appended = false;
    let mut stopped = None;
    for (pos, h) in Batches::new(records) {
        let Some(batch) = records.get(pos..pos + h.total_len()) else {
            break;
        };
        if h.last_offset() < p.log_end_offset() {
            continue;
        }
        // The first batch of a new epoch writes and fsyncs the epoch checkpoint: off the
        // async workers, like truncation.
        let result = if p.epoch_is_new(h.partition_leader_epoch) {
            blocking.run(|| p.append_replica(batch, leader_epoch))
        } else {
            p.append_replica(batch, leader_epoch)
        };
        match result {
            Ok(()) => appended = true,
            Err(AppendError::Refused(e)) => {
                stopped = Some(CopyStop::Refused(e));
                break;
            }
            Err(AppendError::Storage(e)) if e.is_storage_full() => {
                stopped = Some(CopyStop::Full);
                break;
            }
            Err(AppendError::Storage(e)) => {
                tracing::error!(partition = p.index, error = %e, "replica append failed");
                stopped = Some(CopyStop::Storage);
                break;
            }
        }
    }
    Copied {
        appended,
        end: p.log_end_offset(),
        stopped,
    }
}

/// Takes the leader's high watermark and log start from a fetch response (after its
/// records were copied and, under an fsync profile, synced). `false` when the partition has
/// since left that leader's epoch.
pub fn follow_leader(
    p: &Partition,
    leader_epoch: i32,
    leader_high_watermark: i64,
    leader_log_start: i64,
    blocking: &impl Blocking,
) -> bool {
    let end = p.log_end_offset();
    if !p.follow_high_watermark(leader_high_watermark.min(end), leader_epoch) {
        return false;
    }
    if leader_log_start > p.log_start_offset() {
        // DeleteRecords (or retention) moved the leader's start: follow it.
        if let Err(e) = blocking.run(|| p.follow_log_start(leader_log_start, leader_epoch)) {
            tracing::error!(partition = p.index, error = %e, "cannot move the replica's log start to the leader's");
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use spate_log::sim::SimDisk;
    use spate_log::{Flusher, FsyncPolicy, LogConfig};

    use super::*;

    fn partition() -> Partition {
        let (p, _) = Partition::open_replica_on(
            SimDisk::new().storage(),
            Path::new("/p"),
            0,
            LogConfig::default(),
            Flusher::manual(FsyncPolicy::Never),
        )
        .expect("open");
        p
    }

    #[test]
    fn fetches_naming_an_older_leader_epoch_are_fenced_and_newer_ones_unknown() {
        let p = partition();
        p.set_role(Role::Leader, 5);
        assert_eq!(fence(&p, 4), Some(ResponseError::FencedLeaderEpoch));
        assert_eq!(fence(&p, 6), Some(ResponseError::UnknownLeaderEpoch));
        assert_eq!(fence(&p, 5), None);
        assert_eq!(fence(&p, -1), None, "-1 asks for no check (old clients)");
    }

    #[test]
    fn a_follower_does_not_answer_epoch_lookups_unless_asked_by_a_debugging_client() {
        let p = partition();
        p.set_role(Role::Follower, 3);
        assert_eq!(
            epoch_end(&p, true, 3, 3),
            Err(ResponseError::NotLeaderOrFollower)
        );
        assert_eq!(epoch_end(&p, false, 3, 3), Ok((-1, -1)));
    }

    #[test]
    fn only_a_refusal_on_the_merits_proves_an_isr_change_was_never_applied() {
        let stale = CommandError::StalePartitionEpoch {
            topic: "t".into(),
            partition: 0,
            given: 1,
            current: 2,
        };
        assert_eq!(isr_answer(Ok(Err(&stale))), IsrAnswer::Overtaken);
        assert_eq!(isr_answer(Err(())), IsrAnswer::Unanswered);
        assert_eq!(isr_answer(Ok(Ok(()))), IsrAnswer::Applied);
        let invalid = CommandError::InvalidIsr {
            topic: "t".into(),
            partition: 0,
            isr: vec![],
            reason: "empty".into(),
        };
        assert_eq!(isr_answer(Ok(Err(&invalid))), IsrAnswer::NeverApplied);
    }
}
